package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
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
	c       *engine.Comm // the communicator the run is on now
	orig    *engine.Comm // the one it started on (its owner destroys it)
	out     io.Writer    // the log of whichever rank is rank 0
	min     int
	jobFile string // rank 0 writes the JoinInfo of c here
	// recovered is when the last recovery ended, until the step after it
	// (stepDone) is done; zero otherwise.
	recovered time.Time
	Stats     []Recovery
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
	// When the failed call returned (Unix ms, to set against the kill's
	// time), and from the end of the recovery to the end of the first
	// step after it.
	DetectedUnixMS int64   `json:"detected_unix_ms"`
	FirstStepMS    float64 `json:"first_step_ms"`
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
	r := Recovery{Step: step, DetectedUnixMS: start.UnixMilli()}
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
			// Bad input or lost state will not change by trying again;
			// anything else is taken for another death during it.
			if errors.Is(err, engine.ErrInvalidArgument) || errors.Is(err, engine.ErrInvalidUsage) || errors.Is(err, engine.ErrExcluded) {
				return 0, fmt.Errorf("rank %d step %d: recovering: %w", nc.Rank(), step, err)
			}
			errs = append(errs, err) // another rank died during the recovery: shrink again
			continue
		}
		r.RecoverMS = 1e3 * time.Since(t).Seconds()
		if err := el.publish(); err != nil {
			return 0, err
		}
		r.Resumed, r.Ranks, r.Devices, r.Bytes = int(rec.Step), nc.Size(), rec.Lost, rec.Bytes
		el.Stats = append(el.Stats, r)
		el.recovered = time.Now()
		if nc.Rank() == 0 {
			fmt.Fprintf(el.out, "step %d: lost rank(s) %v (%s failed); %d processes go on from step %d: shrink %.1f ms, recover %.1f ms, %d bytes moved, devices %v re-placed\n",
				step, r.Lost, what, r.Ranks, r.Resumed, r.ShrinkMS, r.RecoverMS, r.Bytes, r.Devices)
		}
		return int(rec.Step), nil
	}
	return 0, fmt.Errorf("rank %d step %d: %d recoveries failed: %w", el.c.Rank(), step, maxAttempts, errors.Join(errs...))
}

// stepDone notes that a step finished: the first after a recovery gives
// its FirstStepMS.
func (el *elastic) stepDone() {
	if el.recovered.IsZero() {
		return
	}
	el.Stats[len(el.Stats)-1].FirstStepMS = 1e3 * time.Since(el.recovered).Seconds()
	el.recovered = time.Time{}
}

// report prints what each recovery cost (rank 0 at the end).
func (el *elastic) report(w io.Writer) {
	for _, r := range el.Stats {
		fmt.Fprintf(w, "recovery at step %d: lost %v, detected at %d (Unix ms), shrink %.1f ms, recover %.1f ms, first step %.1f ms, %d bytes moved, %d round(s), resumed at step %d on %d processes\n",
			r.Step, r.Lost, r.DetectedUnixMS, r.ShrinkMS, r.RecoverMS, r.FirstStepMS, r.Bytes, r.Attempts, r.Resumed, r.Ranks)
	}
}

// grow admits n joining processes at a step boundary: every member
// grows the communicator and recovers the devices onto it (the balance
// gives the joiners devices; their shared state is sent from a member).
func (el *elastic) grow(v *vppu.Comm, n, step int) error {
	start := time.Now()
	old := el.c
	nc, err := old.Grow(n)
	if err != nil {
		return fmt.Errorf("rank %d step %d: admitting %d joiners: %w", old.Rank(), step, n, err)
	}
	rec, err := v.Recover(nc, vppu.RecoverOptions{Step: uint64(step), MinRanks: el.min})
	if err != nil {
		el.c = nc // the caller shrinks the grown communicator
		return fmt.Errorf("rank %d step %d: recovering onto the grown communicator: %w", nc.Rank(), step, err)
	}
	el.c = nc
	if old != el.orig {
		_ = old.Destroy()
	}
	if nc.Rank() == 0 {
		fmt.Fprintf(el.out, "step %d: admitted %d joining process(es); %d processes go on: %.1f ms, %d bytes moved, placement %v\n",
			step, n, nc.Size(), 1e3*time.Since(start).Seconds(), rec.Bytes, rec.Place)
	}
	return el.publish()
}

// publish writes the current communicator's JoinInfo to the job file,
// with the pids of its members: a replacement for a dead process waits
// for a file without that pid, so it never joins the communicator that
// process was part of. It is a collective (the pids are all-gathered);
// rank 0 writes, atomically, so a joiner never reads half of it.
func (el *elastic) publish() error {
	if el.jobFile == "" {
		return nil
	}
	n := el.c.Size()
	pids := make([]byte, 8*n)
	if err := el.c.AllGather(binary.LittleEndian.AppendUint64(nil, uint64(os.Getpid())), pids, 8, engine.Uint8); err != nil {
		return fmt.Errorf("rank %d: publishing the job: %w", el.c.Rank(), err)
	}
	if el.c.Rank() != 0 {
		return nil
	}
	info, err := el.c.JoinInfo()
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\npids", info)
	for r := range n {
		fmt.Fprintf(&b, " %d", binary.LittleEndian.Uint64(pids[8*r:]))
	}
	b.WriteString("\n")
	tmp := el.jobFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, el.jobFile)
}

// readJob reads a job file publish wrote: the join info, and whether the
// process pid is among the members.
func readJob(path string, pid int) (info string, member bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false, err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "pids") {
		return "", false, fmt.Errorf("job file %s: not what the job writes", path)
	}
	return lines[0], slices.Contains(strings.Fields(lines[1])[1:], strconv.Itoa(pid)), nil
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
