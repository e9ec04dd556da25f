// Package elastic keeps a training loop on virtual devices (vppu) going
// when rank processes die or join: the Go twin of Python's
// gocoll.elastic.
//
// On a failed collective the survivors agree who is gone (engine Shrink),
// the virtual devices are re-placed on them with their state (vppu
// Recover), and the loop goes on at the step they all are at. Since every
// device's data depends only on (seed, device, step) and every reduction
// folds the devices in order, the run ends with the weights of an
// uninterrupted one:
//
//	s, err := elastic.New(c, v, elastic.Options{MinRanks: 2})
//	err = s.Run(func(s *elastic.State) error {
//		for s.Step < steps {
//			grads := gradients(s.V.Local(), s.Step)    // of (seed, device, step) only
//			if err := s.V.AllReduce(grads, grads, n, engine.Float64, engine.Avg); err != nil {
//				return err                          // Run recovers, then calls this again
//			}
//			update(params, grads[0])                    // the registered shared state, in place
//			s.Commit()                                  // Step++
//		}
//		return nil
//	})
//
// What the loop must keep for the guarantee is in docs/elastic.md.
package elastic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu"
)

// Options say how a State recovers.
type Options struct {
	// MinRanks is the fewest processes to go on with (vppu
	// RecoverOptions.MinRanks; 0: any).
	MinRanks int
	// JobFile admits replacement processes: the current view is published
	// there (see JoinJob), and rewritten only as a compare-and-swap from
	// the view this rank came from (ErrSuperseded otherwise). "": none.
	JobFile string
	// Rebuild rebuilds a device's own buffers that cannot be copied (vppu
	// RecoverOptions.Rebuild).
	Rebuild func(dev int, name string, buf []byte, step uint64) error
	// MaxAttempts bounds the shrink+recover rounds of one recovery, each
	// lost process costing at most one (0: 8).
	MaxAttempts int
	// Log gets one line per recovery and per admission, on the rank 0 of
	// the communicator the job goes on with (nil: none).
	Log io.Writer
}

// State is a job's communicator, its virtual devices and the steps done.
// It is used by one goroutine.
type State struct {
	Comm       *engine.Comm // the communicator the job runs on now
	V          *vppu.Comm   // the virtual devices
	Step       uint64       // steps completed (Commit)
	Recoveries []Recovery   // what each recovery cost, as this rank saw it

	opts      Options
	orig      *engine.Comm // the one the caller passed: the caller's to destroy
	view      string       // the job file's view this rank belongs to ("" before the first)
	recovered time.Time    // end of the last recovery, until the next Commit
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

// New starts the elastic state of a job on c, whose virtual devices are v
// (made on c, with their state registered). With a job file it is a
// collective of c: the first view is published.
func New(c *engine.Comm, v *vppu.Comm, opts Options) (*State, error) {
	s := &State{Comm: c, V: v, opts: opts, orig: c}
	if err := s.publish(); err != nil {
		return nil, err
	}
	return s, nil
}

// Join is a replacement process's side of the members' Grow: c is what
// JoinJob returned (through the view view), l the job's virtual
// topology; the devices it receives and their state arrive in vppu's
// memory (see vppu.Join). It publishes the grown view with the members.
func Join(c *engine.Comm, view string, l vppu.Logical, opts Options) (*State, error) {
	s := &State{Comm: c, Step: 0, opts: opts, orig: c, view: view}
	v, rec, err := vppu.Join(c, l, s.recoverOptions())
	if err != nil {
		return nil, err
	}
	s.V, s.Step = v, rec.Step
	if _, err := s.settle(rec); err != nil {
		// A death meanwhile: this process is a member now, and recovers
		// with the others.
		if !IsPeerFailure(err) {
			s.Close()
			v.Destroy()
			return nil, err
		}
		if err := s.Recover(err); err != nil {
			s.Close()
			v.Destroy()
			return nil, err
		}
	}
	return s, nil
}

// Commit says a step is done: call it after the update of the registered
// state.
func (s *State) Commit() {
	s.Step++
	if !s.recovered.IsZero() {
		s.Recoveries[len(s.Recoveries)-1].FirstStepMS = 1e3 * time.Since(s.recovered).Seconds()
		s.recovered = time.Time{}
	}
}

// Joiners is how many processes wait to join (rank 0 only: elsewhere 0).
// The loop tells the other ranks (e.g. in its step's allreduce) and all
// call Grow at a step boundary.
func (s *State) Joiners() int { return s.Comm.Joiners() }

// Run calls body until it returns nil or an error other than a peer
// failure (IsPeerFailure); after a peer failure the survivors recover
// (Recover) and call body again, which resumes at s.Step with s.Comm and
// s.V as they are now.
func (s *State) Run(body func(*State) error) error {
	for {
		err := body(s)
		if err == nil || !IsPeerFailure(err) {
			return err
		}
		if err := s.Recover(err); err != nil {
			return err
		}
	}
}

// IsPeerFailure says whether err is what a lost rank makes a collective
// return (a peer's connection broke, a timeout, a revocation), after
// which a shrink lets the survivors go on. Bad input, lost state, being
// left out (engine.ErrExcluded, ErrSuperseded) and a shrink without quorum
// (engine.ErrNoQuorum) are not: trying again will not change them.
func IsPeerFailure(err error) bool {
	for _, e := range []error{engine.ErrInvalidArgument, engine.ErrInvalidUsage, engine.ErrExcluded, engine.ErrNoQuorum} {
		if errors.Is(err, e) {
			return false
		}
	}
	for _, e := range []error{engine.ErrPeerLost, engine.ErrRemoteAbort, engine.ErrTimeout, engine.ErrRevoked, engine.ErrAborted} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Recover is the survivors' side of a lost rank, after cause (a peer
// failure): shrink the communicator, recover the devices onto it (again,
// up to MaxAttempts rounds, if another rank dies meanwhile), publish the
// new view, and set Step to the step every rank goes on from.
func (s *State) Recover(cause error) error {
	start := time.Now()
	r := Recovery{Step: int(s.Step), DetectedUnixMS: start.UnixMilli()}
	var errs []error
	for r.Attempts < s.maxAttempts() {
		r.Attempts++
		old := s.Comm
		nc, err := old.Shrink(nil)
		if err != nil {
			return fmt.Errorf("rank %d step %d: shrinking after %v: %w", old.Rank(), s.Step, cause, errors.Join(append(errs, err)...))
		}
		r.Lost = append(r.Lost, old.Failed()...) // ranks of old: after a first round, of the shrunk one
		s.setComm(nc)
		r.ShrinkMS = 1e3 * time.Since(start).Seconds()
		t := time.Now()
		rec, err := s.recoverOnto(nc)
		if err != nil {
			if !IsPeerFailure(err) {
				return fmt.Errorf("rank %d step %d: recovering: %w", nc.Rank(), s.Step, err)
			}
			errs = append(errs, err) // another rank died during the recovery: shrink again
			continue
		}
		r.RecoverMS = 1e3 * time.Since(t).Seconds()
		r.Resumed, r.Ranks, r.Devices, r.Bytes = int(rec.Step), s.Comm.Size(), rec.Lost, rec.Bytes
		s.Recoveries = append(s.Recoveries, r)
		s.recovered = time.Now()
		s.logf("step %d: lost rank(s) %v; %d processes go on from step %d: shrink %.1f ms, recover %.1f ms, %d bytes moved, devices %v re-placed\n",
			r.Step, r.Lost, r.Ranks, r.Resumed, r.ShrinkMS, r.RecoverMS, r.Bytes, r.Devices)
		return nil
	}
	return fmt.Errorf("rank %d step %d: %d recoveries failed: %w", s.Comm.Rank(), s.Step, s.maxAttempts(), errors.Join(errs...))
}

// Grow admits n processes waiting to join, at a step boundary: every
// member grows the communicator and recovers the devices onto it (the
// balance gives the joiners devices and sends them the state). A failure
// is returned for Run to recover from (on the grown communicator when
// the grow itself succeeded).
func (s *State) Grow(n int) error {
	start := time.Now()
	old := s.Comm
	nc, err := old.Grow(n)
	if err != nil {
		return fmt.Errorf("rank %d step %d: admitting %d joiners: %w", s.Comm.Rank(), s.Step, n, err)
	}
	// The old communicator goes once the recovery onto the grown one is
	// over, whether it worked or not: not before, since members still in
	// their Grow talk to the others through it; not never (a leak).
	s.Comm = nc
	rec, err := s.recoverOnto(nc)
	if old != s.orig {
		_ = old.Destroy()
	}
	if err != nil {
		return fmt.Errorf("rank %d step %d: recovering onto the grown communicator: %w", s.Comm.Rank(), s.Step, err)
	}
	refused := ""
	if len(rec.Refused) > 0 {
		refused = fmt.Sprintf(" (refused %d: another topology, device count or options)", len(rec.Refused))
	}
	s.logf("step %d: admitted %d joining process(es)%s; %d processes go on: %.1f ms, %d bytes moved, placement %v\n",
		s.Step, n-len(rec.Refused), refused, s.Comm.Size(), 1e3*time.Since(start).Seconds(), rec.Bytes, rec.Place)
	return nil
}

func (s *State) recoverOptions() vppu.RecoverOptions {
	return vppu.RecoverOptions{Step: s.Step, MinRanks: s.opts.MinRanks, Rebuild: s.opts.Rebuild}
}

// recoverOnto recovers the devices onto nc and settles the outcome. Only
// a recovery that returned nil changed the state, so Step is always the
// step of the registered state.
func (s *State) recoverOnto(nc *engine.Comm) (vppu.Recovery, error) {
	rec, err := s.V.Recover(nc, s.recoverOptions())
	if err != nil {
		return rec, err
	}
	s.Step = rec.Step
	return s.settle(rec)
}

// settle follows a recovery that succeeded: it shrinks out the joiners
// the recovery refused (they left; a second recovery, which moves
// nothing) before anything of the communicator's own runs, and publishes
// the view.
func (s *State) settle(rec vppu.Recovery) (vppu.Recovery, error) {
	if len(rec.Refused) > 0 {
		nc, err := s.Comm.Shrink(rec.Refused)
		if err != nil {
			return rec, err
		}
		s.setComm(nc)
		again, err := s.V.Recover(nc, s.recoverOptions())
		if err != nil {
			return rec, err
		}
		rec.Place, rec.Bytes = again.Place, rec.Bytes+again.Bytes
	}
	return rec, s.publish()
}

// setComm makes c, shrunk from the job's communicator, the job's
// communicator and destroys the one before it (unless it is the
// caller's): it failed, or was replaced on purpose, and its errors tell
// nothing new; a shrunk communicator answers late ranks itself.
func (s *State) setComm(c *engine.Comm) {
	if s.Comm != s.orig {
		_ = s.Comm.Destroy()
	}
	s.Comm = c
}

// Close destroys the communicators the State made (not the caller's, nor
// the virtual communicator); Comm is then the caller's again.
func (s *State) Close() error {
	var err error
	if s.Comm != s.orig {
		err = s.Comm.Destroy()
	}
	s.Comm = s.orig
	return err
}

func (s *State) maxAttempts() int {
	if s.opts.MaxAttempts > 0 {
		return s.opts.MaxAttempts
	}
	return 8
}

func (s *State) logf(format string, args ...any) {
	if s.opts.Log != nil && s.Comm.Rank() == 0 {
		fmt.Fprintf(s.opts.Log, format, args...)
	}
}

// publish writes the current view to the job file (nothing without one).
// It is a collective of Comm: the members' pids are all-gathered, rank 0
// swaps the file from the view this rank came from (swapJob) and tells
// the others whether it could: a rank whose view was superseded stops
// with all the ranks of its view (ErrSuperseded).
func (s *State) publish() error {
	if s.opts.JobFile == "" {
		return nil
	}
	c := s.Comm
	n := c.Size()
	pids := make([]byte, 8*n)
	if err := c.AllGather(binary.LittleEndian.AppendUint64(nil, uint64(os.Getpid())), pids, 8, engine.Uint8); err != nil {
		return fmt.Errorf("rank %d: publishing the job: %w", c.Rank(), err)
	}
	info, err := c.JoinInfo()
	if err != nil {
		return err
	}
	var verdict []byte // rank 0's error, empty when the file now holds this view
	if c.Rank() == 0 {
		j := job{info: info}
		for r := range n {
			j.pids = append(j.pids, int(binary.LittleEndian.Uint64(pids[8*r:])))
		}
		if _, err := swapJob(s.opts.JobFile, s.view, j); err != nil {
			verdict = []byte(err.Error())
		}
	}
	if verdict, err = broadcastBlob(c, verdict); err != nil {
		return fmt.Errorf("rank %d: publishing the job: %w", c.Rank(), err)
	}
	if len(verdict) > 0 {
		return fmt.Errorf("rank %d: %w (rank 0: %s)", c.Rank(), ErrSuperseded, verdict)
	}
	s.view = info
	return nil
}

// broadcastBlob sends rank 0's blob (of any length) to every rank.
func broadcastBlob(c *engine.Comm, b []byte) ([]byte, error) {
	size := binary.LittleEndian.AppendUint64(nil, uint64(len(b)))
	if err := c.Broadcast(size, size, 8, engine.Uint8, 0); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(size)
	if n > 1<<20 {
		return nil, fmt.Errorf("rank 0 sent a damaged length %d", n)
	}
	if c.Rank() != 0 {
		b = make([]byte, n)
	}
	if n == 0 {
		return nil, nil
	}
	return b, c.Broadcast(b, b, int(n), engine.Uint8, 0)
}
