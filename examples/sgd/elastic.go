package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu"
)

// elastic keeps a virtual-device run going when rank processes die: on a
// failed collective the survivors agree who is gone (engine Shrink), the
// virtual devices are re-placed on them with their state (vppu Recover),
// and training goes on at the step they all are at. Since every device's
// data depends only on (seed, device, step) and every reduction folds the
// devices in order, the run ends with the weights of an uninterrupted one.
type elastic struct {
	c     *engine.Comm // the communicator the run is on now
	orig  *engine.Comm // the one it started on (its owner destroys it)
	out   io.Writer    // the log of whichever rank is rank 0
	min   int
	Stats []Recovery
}

// Recovery is what one recovery cost, as this rank saw it.
type Recovery struct {
	Step      int     `json:"step"`       // step being run when it failed
	Resumed   int     `json:"resumed"`    // step every rank went on from
	Lost      []int   `json:"lost"`       // ranks of the communicator that failed
	Ranks     int     `json:"ranks"`      // processes that went on
	Devices   []int   `json:"devices"`    // virtual devices re-placed from lost ranks
	ShrinkMS  float64 `json:"shrink_ms"`  // from the failed call to the new communicator
	RecoverMS float64 `json:"recover_ms"` // devices re-placed and state restored
	Bytes     int64   `json:"bytes"`      // registered bytes sent between processes
	Attempts  int     `json:"attempts"`   // shrink+recover rounds (more when a rank died during one)
}

// maxAttempts bounds the shrink+recover rounds of one recovery: each lost
// process costs at most one.
const maxAttempts = 8

// recover runs after cause, a failed collective of step: the survivors
// shrink c (again if another rank dies meanwhile), recover v on the new
// communicator and return the step they all go on from.
func (el *elastic) recover(v *vppu.Comm, cause error, step int, what string) (int, error) {
	if !isPeerLoss(cause) {
		return 0, fmt.Errorf("rank %d step %d: %s: %w", el.c.Rank(), step, what, cause)
	}
	start := time.Now()
	r := Recovery{Step: step}
	var errs []error
	for r.Attempts < maxAttempts {
		r.Attempts++
		old := el.c
		nc, err := old.Shrink(nil)
		if err != nil {
			return 0, fmt.Errorf("rank %d step %d: shrinking after %v: %w", old.Rank(), step, cause, errors.Join(append(errs, err)...))
		}
		r.Lost = append(r.Lost, old.Failed()...) // ranks of old: after a first recovery, of the shrunk one
		el.c = nc
		if old != el.orig {
			_ = old.Destroy() // failed on purpose: its errors tell nothing new
		}
		r.ShrinkMS = 1e3 * time.Since(start).Seconds()
		t := time.Now()
		var at uint64
		if local := v.Local(); len(local) > 0 {
			b, _ := v.Buffer(local[0], "step")
			at = binary.LittleEndian.Uint64(b)
		}
		rec, err := v.Recover(nc, vppu.RecoverOptions{Step: at, MinRanks: el.min})
		if err != nil {
			if errors.Is(err, vppu.ErrTooFewRanks) || errors.Is(err, vppu.ErrStateLost) || !isPeerLoss(err) {
				return 0, fmt.Errorf("rank %d step %d: recovering: %w", nc.Rank(), step, err)
			}
			errs = append(errs, err) // another rank died during the recovery: shrink again
			continue
		}
		r.RecoverMS = 1e3 * time.Since(t).Seconds()
		r.Resumed, r.Ranks, r.Devices, r.Bytes = int(rec.Step), nc.Size(), rec.Lost, rec.Bytes
		el.Stats = append(el.Stats, r)
		if nc.Rank() == 0 {
			fmt.Fprintf(el.out, "step %d: lost rank(s) %v (%s failed); %d processes go on from step %d: shrink %.1f ms, recover %.1f ms, %d bytes moved, devices %v re-placed\n",
				step, r.Lost, what, r.Ranks, r.Resumed, r.ShrinkMS, r.RecoverMS, r.Bytes, r.Devices)
		}
		return int(rec.Step), nil
	}
	return 0, fmt.Errorf("rank %d step %d: %d recoveries failed: %w", el.c.Rank(), step, maxAttempts, errors.Join(errs...))
}

// isPeerLoss says whether err is what a lost rank makes a collective
// return (a peer's connection broke, a timeout, a revocation), after which
// a shrink lets the survivors go on.
func isPeerLoss(err error) bool {
	for _, e := range []error{engine.ErrPeerLost, engine.ErrRemoteAbort, engine.ErrTimeout, engine.ErrRevoked, engine.ErrAborted} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// weightsHash is the sha256 of the parameters as little-endian float64s,
// layer by layer: equal hashes, bitwise equal weights.
func weightsHash(params [][]float64) string {
	h := sha256.New()
	var b [8]byte
	for _, p := range params {
		for _, x := range p {
			binary.LittleEndian.PutUint64(b[:], math.Float64bits(x))
			h.Write(b[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
