package elastic

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu"
)

const (
	devices = 4
	width   = 64 // float64s in the state
	steps   = 12
)

// tcpRanks starts an n-rank job over TCP in this process (communicators
// that can grow) and returns its ranks and the job's secret.
func tcpRanks(t *testing.T, n int, opts engine.Options) ([]*engine.Comm, []byte) {
	t.Helper()
	id, err := engine.NewUniqueID(opts)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := engine.JoinSecret(&id, nil)
	if err != nil {
		t.Fatal(err)
	}
	comms, errs := make([]*engine.Comm, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = engine.NewComm(id, n, r, opts) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return comms, secret
}

// train is a loop that keeps the guarantee: the state ("w", shared) is
// updated in place only from the average of the devices' gradients,
// each a function of (device, step, w). hook runs after each step.
func train(hook func(s *State) error) func(s *State) error {
	return func(s *State) error {
		for s.Step < steps {
			local := s.V.Local()
			w := f64s(buffer(s.V, "w"))
			grads := make([][]byte, len(local))
			for k, d := range local {
				g := make([]float64, width)
				for i := range g {
					g[i] = math.Sin(float64(d*131+int(s.Step)*17+i)) + 0.01*w[i]
				}
				grads[k] = bytesOf(g)
			}
			if err := s.V.AllReduce(grads, grads, width, engine.Float64, engine.Avg); err != nil {
				return err
			}
			for i, g := range f64s(grads[0]) {
				w[i] -= 0.1 * g
			}
			s.Commit()
			if hook != nil {
				if err := hook(s); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

func buffer(v *vppu.Comm, name string) []byte {
	b, _ := v.Buffer(v.Local()[0], name)
	return b
}

func f64s(b []byte) []float64 {
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func bytesOf(xs []float64) []byte {
	var b []byte
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

var errDied = errors.New("died on purpose")

// member starts the elastic state of a rank: the devices in blocks, the
// state registered shared.
func member(c *engine.Comm, opts Options) (*State, error) {
	l, _ := vppu.ParseLogical("ring", devices)
	v, err := vppu.New(c, l, vppu.Block(devices, c.Size()))
	if err != nil {
		return nil, err
	}
	if err := v.RegisterShared("w", make([]byte, 8*width)); err != nil {
		return nil, err
	}
	return New(c, v, opts)
}

// runJob trains on n ranks over TCP; rank victim (if ≥ 0) dies after
// step dieAt. It returns the final state of every rank that finished.
func runJob(t *testing.T, n, victim int, dieAt uint64, jobFile string) map[int][]byte {
	t.Helper()
	comms, _ := tcpRanks(t, n, engine.Options{Transport: "tcp", Timeout: 10 * time.Second, DumpDir: t.TempDir()})
	var mu sync.Mutex
	final := map[int][]byte{}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			s, err := member(c, Options{JobFile: jobFile, MinRanks: 1})
			if err != nil {
				errs[r] = err
				return
			}
			defer s.Close()
			defer s.V.Destroy()
			err = s.Run(train(func(s *State) error {
				if r == victim && s.Step == dieAt {
					s.V.Destroy() // its process is gone: connections closed
					s.Comm.Abort()
					s.Comm.Destroy()
					return errDied
				}
				return nil
			}))
			if r == victim && errors.Is(err, errDied) {
				return
			}
			if err == nil && victim >= 0 && len(s.Recoveries) != 1 {
				err = fmt.Errorf("%d recoveries, want 1", len(s.Recoveries))
			}
			if errs[r] = err; err == nil {
				mu.Lock()
				final[r] = bytes.Clone(buffer(s.V, "w"))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, c := range comms {
		c.Destroy()
	}
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return final
}

// TestRunSameState: a rank of 3 dies after step 5; the survivors' Run
// recovers and they end with the state of an uninterrupted 2-rank run,
// bit for bit; the job file holds the survivors' view, one epoch on.
func TestRunSameState(t *testing.T) {
	want := runJob(t, 2, -1, 0, "")[0]
	jobFile := filepath.Join(t.TempDir(), "job")
	got := runJob(t, 3, 2, 5, jobFile)
	if len(got) != 2 {
		t.Fatalf("%d ranks finished, want 2", len(got))
	}
	for r, w := range got {
		if !bytes.Equal(w, want) {
			t.Errorf("rank %d: the state differs from the uninterrupted run's", r)
		}
	}
	j, err := readJob(jobFile)
	if err != nil || j.epoch != 1 || len(j.pids) != 2 {
		t.Errorf("job file after the recovery: %+v, %v", j, err)
	}
}

// TestSupersededViewStops: a rank that was left out and decided a view of
// its own (here: a communicator of its own) cannot publish it once the
// others published theirs, and stops (ErrSuperseded, an ErrExcluded);
// the file still names the others' view, which a replacement then
// joins. Before, the left-out rank rewrote the file and replacements
// joined it.
func TestSupersededViewStops(t *testing.T) {
	opts := engine.Options{Transport: "tcp", Timeout: 10 * time.Second, DumpDir: t.TempDir()}
	jobFile := filepath.Join(t.TempDir(), "job")
	comms, _ := tcpRanks(t, 3, opts)
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	states := make([]*State, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { states[r], errs[r] = member(c, Options{JobFile: jobFile}) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// Ranks 0 and 1 go on without rank 2 and publish their view.
	for r := range 2 {
		wg.Go(func() {
			s := states[r]
			nc, err := s.Comm.Shrink([]int{2})
			if err == nil {
				s.setComm(nc)
				_, err = s.recoverOnto(nc)
			}
			errs[r] = err
		})
	}
	wg.Wait()
	for r, err := range errs[:2] {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	survivors, err := readJob(jobFile)
	if err != nil || survivors.epoch != 1 {
		t.Fatalf("job file: %+v, %v", survivors, err)
	}
	// Rank 2 resumes alone with a view of its own.
	alone, _ := tcpRanks(t, 1, opts)
	defer alone[0].Destroy()
	zombie := states[2]
	zombie.Comm = alone[0]
	if err := zombie.publish(); !errors.Is(err, ErrSuperseded) || !errors.Is(err, engine.ErrExcluded) || IsPeerFailure(err) {
		t.Fatalf("the left-out rank's publish: %v, want ErrSuperseded", err)
	}
	if j, err := readJob(jobFile); err != nil || j.info != survivors.info || j.epoch != 1 {
		t.Fatalf("the left-out rank changed the job file: %+v, %v", j, err)
	}
	for _, s := range states[:2] {
		s.V.Destroy()
		s.Close()
	}
	states[2].V.Destroy()
}

// TestSwapJob: the job file's compare-and-swap: a successor only of the
// view the file holds, one winner among racers from the same view.
func TestSwapJob(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job")
	v := func(k int) job {
		return job{info: fmt.Sprintf("gocoll-join:1:%02x:127.0.0.1:1", k), pids: []int{k, k + 1}}
	}
	if _, err := swapJob(path, v(0).info, v(1)); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("a successor with no file: %v, want ErrSuperseded", err)
	}
	if e, err := swapJob(path, "", v(0)); err != nil || e != 0 {
		t.Fatalf("the first view: %d, %v", e, err)
	}
	if e, err := swapJob(path, v(0).info, v(1)); err != nil || e != 1 {
		t.Fatalf("the successor: %d, %v", e, err)
	}
	// A second successor of view 0 (a left-out rank's) is refused.
	if _, err := swapJob(path, v(0).info, v(2)); !errors.Is(err, ErrSuperseded) || !strings.Contains(err.Error(), "epoch 1") {
		t.Fatalf("a second successor of view 0: %v, want ErrSuperseded", err)
	}
	// Racers from view 1: one wins.
	var wins, refused int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for k := range 16 {
		wg.Go(func() {
			_, err := swapJob(path, v(1).info, v(10+k))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, ErrSuperseded):
				refused++
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if wins != 1 || refused != 15 {
		t.Fatalf("%d racers won, %d were refused; want 1 and 15", wins, refused)
	}
	j, err := readJob(path)
	if err != nil || j.epoch != 2 {
		t.Fatalf("%+v, %v", j, err)
	}
	// A damaged file is not taken for the parent.
	os.WriteFile(path, []byte("garbage"), 0o600)
	if _, err := swapJob(path, j.info, v(3)); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("over a damaged file: %v", err)
	}
}

// TestGrowRefusesBadJoiner: two processes join a 2-rank job through its
// job file, one with another device count. At a step boundary the
// members Grow; the bad joiner is refused (vppu.ErrJoinRefused) and the
// others shrink it out and finish, the good joiner included, with the
// state of an uninterrupted run. Before, the bad joiner ended the job.
func TestGrowRefusesBadJoiner(t *testing.T) {
	want := runJob(t, 2, -1, 0, "")[0]
	opts := engine.Options{Transport: "tcp", Timeout: 10 * time.Second, DumpDir: t.TempDir()}
	jobFile := filepath.Join(t.TempDir(), "job")
	comms, secret := tcpRanks(t, 2, opts)
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	errs := make([]error, 4)
	final := make([][]byte, 4)
	var wg sync.WaitGroup
	published := make(chan struct{})
	for r, c := range comms {
		wg.Go(func() {
			s, err := member(c, Options{JobFile: jobFile})
			if r == 0 {
				close(published)
			}
			if err != nil {
				errs[r] = err
				return
			}
			defer s.Close()
			defer s.V.Destroy()
			errs[r] = s.Run(train(func(s *State) error {
				if s.Step != 3 || s.Comm.Size() != 2 {
					return nil
				}
				waiting := make([]byte, 8)
				if s.Comm.Rank() == 0 {
					for deadline := time.Now().Add(10 * time.Second); s.Joiners() < 2 && time.Now().Before(deadline); {
						time.Sleep(5 * time.Millisecond)
					}
					binary.LittleEndian.PutUint64(waiting, uint64(s.Joiners()))
				}
				if err := s.Comm.Broadcast(waiting, waiting, 8, engine.Uint8, 0); err != nil {
					return err
				}
				return s.Grow(int(binary.LittleEndian.Uint64(waiting)))
			}))
			final[r] = bytes.Clone(buffer(s.V, "w"))
		})
	}
	<-published
	for k, m := range []int{devices, devices + 1} {
		wg.Go(func() {
			errs[2+k] = func() error {
				c, view, err := JoinJob(jobFile, 0, secret, opts)
				if err != nil {
					return err
				}
				defer c.Destroy()
				l, _ := vppu.ParseLogical("ring", m)
				s, err := Join(c, view, l, Options{JobFile: jobFile})
				if m != devices {
					if !errors.Is(err, vppu.ErrJoinRefused) {
						return fmt.Errorf("the bad joiner: %v, want ErrJoinRefused", err)
					}
					return nil
				}
				if err != nil {
					return err
				}
				defer s.Close()
				defer s.V.Destroy()
				if err := s.Run(train(nil)); err != nil {
					return err
				}
				final[2+k] = bytes.Clone(buffer(s.V, "w"))
				return nil
			}()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("process %d: %v", r, err)
		}
	}
	for _, r := range []int{0, 1, 2} {
		if !bytes.Equal(final[r], want) {
			t.Errorf("process %d: the state differs from the uninterrupted run's", r)
		}
	}
	if j, err := readJob(jobFile); err != nil || len(j.pids) != 3 {
		t.Errorf("job file: %+v, %v; want the 3 processes that went on", j, err)
	}
}

// TestGrowThenFailedRecoveryFreesOld: when Grow succeeds and the recovery
// onto the grown communicator fails, the communicator it grew from is
// destroyed all the same (before, the sgd loop kept it: a leak per
// failed admission); the grown one is the State's, for the next
// recovery.
func TestGrowThenFailedRecoveryFreesOld(t *testing.T) {
	opts := engine.Options{Transport: "tcp", Timeout: 10 * time.Second, DumpDir: t.TempDir()}
	jobFile := filepath.Join(t.TempDir(), "job")
	comms, secret := tcpRanks(t, 2, opts)
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	published := make(chan struct{})
	publish := sync.OnceFunc(func() { close(published) })
	// Nobody destroys anything before all saw the recovery fail: a rank
	// that closed its grown communicator early would fail the others'
	// recovery with a peer loss instead.
	var checked sync.WaitGroup
	checked.Add(3)
	for r, c := range comms {
		wg.Go(func() {
			finish := sync.OnceFunc(func() { checked.Done(); checked.Wait() })
			defer finish()
			errs[r] = func() error {
				if r == 0 {
					defer publish() // also on a failure: the joiner must not wait forever
				}
				s, err := member(c, Options{JobFile: jobFile})
				if err != nil {
					return err
				}
				defer s.Close()
				defer s.V.Destroy()
				defer finish() // before those
				// A first view of the State's own (a shrink with nobody
				// lost), so that the one Grow replaces is not the caller's.
				err = s.Recover(errors.New("test"))
				if r == 0 {
					publish() // the joiner joins this view
				}
				if err != nil {
					return err
				}
				before := s.Comm
				for s.Comm.Rank() == 0 && s.Joiners() < 1 {
					time.Sleep(5 * time.Millisecond)
				}
				s.opts.MinRanks = 4 // the recovery onto 3 processes fails, on every rank
				if err := s.Grow(1); !errors.Is(err, vppu.ErrTooFewRanks) {
					return fmt.Errorf("grow: %v, want ErrTooFewRanks", err)
				}
				if s.Comm == before || s.Comm.Size() != 3 {
					return errors.New("the State is not on the grown communicator")
				}
				if err := before.Barrier(); !errors.Is(err, engine.ErrDestroyed) {
					return fmt.Errorf("the communicator grown from: %v, want it destroyed", err)
				}
				return nil
			}()
		})
	}
	<-published
	wg.Go(func() {
		finish := sync.OnceFunc(func() { checked.Done(); checked.Wait() })
		defer finish()
		c, view, err := JoinJob(jobFile, 0, secret, opts)
		if err != nil {
			errs[2] = err
			return
		}
		defer c.Destroy()
		defer finish() // before that
		l, _ := vppu.ParseLogical("ring", devices)
		if _, err := Join(c, view, l, Options{JobFile: jobFile, MinRanks: 4}); !errors.Is(err, vppu.ErrTooFewRanks) {
			errs[2] = fmt.Errorf("the joiner: %v, want ErrTooFewRanks", err)
		}
	})
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("process %d: %v", r, err)
		}
	}
}
