package vppu

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
)

// onRanksOpts is onRanks with the engine options given (a short timeout
// makes a test that would hang fail soon).
func onRanksOpts(t *testing.T, n int, opts engine.Options, f func(c *engine.Comm) error) []error {
	t.Helper()
	comms, err := engine.NewLocalComms(n, opts)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(c) })
	}
	wg.Wait()
	for _, c := range comms {
		c.Destroy()
	}
	return errs
}

// settleJob is the job of TestRecoverAfterShrink: 8 devices on 4 ranks,
// rank 0 a step ahead of ranks 1 and 2, each device with its own "rng".
// It returns the virtual communicator, the shared params, the devices'
// own buffers and the step this rank is at.
func settleJob(pc *engine.Comm, l Logical, ahead, before []byte) (*Comm, []byte, map[int][]byte, uint64, error) {
	c, err := New(pc, l, Block(l.M, 4))
	if err != nil {
		return nil, nil, nil, 0, err
	}
	params, step := slices.Clone(before), uint64(4)
	if pc.Rank() == 0 {
		params, step = slices.Clone(ahead), 5 // only rank 0 got step 4's result
	}
	if err := c.RegisterShared("params", params); err != nil {
		return nil, nil, nil, 0, err
	}
	own := map[int][]byte{}
	for _, v := range c.Local() {
		own[v] = bytes.Repeat([]byte{0xaa}, 16)
		if err := c.Register(v, "rng", own[v]); err != nil {
			return nil, nil, nil, 0, err
		}
	}
	return c, params, own, step, nil
}

// TestRecoverAllOrNothing: a rank fails its part of a recovery after
// the others received their state (its Rebuild fails); every rank's
// Recover fails and every rank's registered buffers and placement are as
// they were (before the fix, the ranks whose transfers had arrived
// committed the step ahead and the others did not). The retry, on a
// communicator shrunk again, redoes it all and settles the step.
func TestRecoverAllOrNothing(t *testing.T) {
	const m = 8
	l, _ := ParseLogical("ring", m)
	ahead, before := contribution(5, 200, 64), contribution(5, 201, 64)
	errs := onRanksOpts(t, 4, engine.Options{Timeout: 5 * time.Second}, func(pc *engine.Comm) error {
		c, params, own, step, err := settleJob(pc, l, ahead, before)
		if err != nil {
			return err
		}
		defer c.Destroy()
		if pc.Rank() == 3 {
			return nil // gone
		}
		np, err := pc.Shrink([]int{3})
		if err != nil {
			return err
		}
		defer np.Destroy()
		failing := func(dev int, name string, buf []byte, step uint64) error {
			if np.Rank() == 2 {
				return errors.New("disk full")
			}
			return rebuildFill(dev, name, buf, step)
		}
		kept := slices.Clone(params)
		_, err = c.Recover(np, RecoverOptions{Step: step, Rebuild: failing})
		switch {
		case err == nil:
			return errors.New("recover succeeded although rank 2 failed its part")
		case np.Rank() == 2 && !strings.Contains(err.Error(), "disk full"),
			// Rank 2's message, or its revocation of np when it was done
			// first (np is for a shrink now).
			np.Rank() != 2 && !strings.Contains(err.Error(), "rank 2 could not do its part") && !errors.Is(err, engine.ErrRevoked):
			return fmt.Errorf("recover: %v", err)
		}
		// Nothing changed here.
		if !bytes.Equal(params, kept) {
			return errors.New("the failed recovery changed the shared params")
		}
		for v, b := range own {
			if !bytes.Equal(b, bytes.Repeat([]byte{0xaa}, 16)) {
				return fmt.Errorf("the failed recovery changed device %d's own buffer", v)
			}
		}
		if !slices.Equal(c.Place(), Block(m, 4)) || c.Parent() != pc {
			return fmt.Errorf("the failed recovery changed the placement (%v) or the parent", c.Place())
		}
		// The caller's retry, as after another death: shrink, recover.
		np2, err := np.Shrink(nil)
		if err != nil {
			return err
		}
		defer np2.Destroy()
		rec, err := c.Recover(np2, RecoverOptions{Step: step, Rebuild: rebuildFill})
		if err != nil {
			return fmt.Errorf("retry: %w", err)
		}
		if rec.Step != 5 || !slices.Equal(rec.Behind, []int{1, 2}) || !slices.Equal(rec.Lost, []int{6, 7}) {
			return fmt.Errorf("retry: %+v", rec)
		}
		for _, v := range c.Local() {
			if b, _ := c.Buffer(v, "params"); !bytes.Equal(b, ahead) {
				return fmt.Errorf("device %d: shared state is not the step ahead's", v)
			}
			want := bytes.Repeat([]byte{0xaa}, 16)
			if np2.Rank() != 0 || v >= 6 {
				rebuildFill(v, "rng", want, 5)
			}
			if b, _ := c.Buffer(v, "rng"); !bytes.Equal(b, want) {
				return fmt.Errorf("device %d: own buffer %v, want %v", v, b, want)
			}
		}
		return checkAllReduce(c, 9)
	})
	noErrors(t, errs)
}

// checkAllReduce runs an allreduce over c's devices against the
// reference fold.
func checkAllReduce(c *Comm, seed int) error {
	const count = 100
	local := c.Local()
	all := make([][]byte, c.Size())
	for v := range all {
		all[v] = contribution(seed, v, count)
	}
	send, recv := make([][]byte, len(local)), make([][]byte, len(local))
	for k, v := range local {
		send[k], recv[k] = all[v], make([]byte, 4*count)
	}
	if err := c.AllReduce(send, recv, count, engine.Float32, engine.Sum); err != nil {
		return err
	}
	want := foldRef(all)
	for k := range local {
		if !bytes.Equal(recv[k], want) {
			return fmt.Errorf("device %d: allreduce differs from the reference", local[k])
		}
	}
	return nil
}

// TestRecoverOptionsDiffer: ranks passing different MinRanks or Place
// are refused on every rank with an error naming the difference, before
// anything moves; the same call with agreeing options then works.
func TestRecoverOptionsDiffer(t *testing.T) {
	const m = 6
	l, _ := ParseLogical("ring", m)
	errs := onRanksOpts(t, 3, engine.Options{Timeout: 5 * time.Second}, func(pc *engine.Comm) error {
		c, err := New(pc, l, Block(m, 3))
		if err != nil {
			return err
		}
		defer c.Destroy()
		if err := c.RegisterShared("w", make([]byte, 32)); err != nil {
			return err
		}
		np, err := pc.Shrink(nil)
		if err != nil {
			return err
		}
		defer np.Destroy()
		for _, tc := range []struct {
			opts RecoverOptions
			want string
		}{
			{RecoverOptions{MinRanks: pc.Rank()}, "another MinRanks"},
			{RecoverOptions{Place: map[bool]Place{true: {2, 2, 1, 1, 0, 0}, false: {0, 0, 1, 1, 2, 2}}[pc.Rank() == 1]}, "another Place"},
		} {
			_, err := c.Recover(np, tc.opts)
			if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("recover with %+v: %v, want %q", tc.opts, err, tc.want)
			}
			if !slices.Equal(c.Place(), Block(m, 3)) {
				return fmt.Errorf("a refused recovery changed the placement to %v", c.Place())
			}
		}
		rec, err := c.Recover(np, RecoverOptions{MinRanks: 3, Place: Place{2, 2, 1, 1, 0, 0}})
		if err != nil {
			return err
		}
		if !slices.Equal(rec.Place, Place{2, 2, 1, 1, 0, 0}) {
			return fmt.Errorf("placement %v", rec.Place)
		}
		return checkAllReduce(c, 3)
	})
	noErrors(t, errs)
}

// TestNoLockAcrossSplit: while Migrate and Recover wait in the split of
// the new hosting ranks (a collective that waits for every rank), the
// communicator's accessors still answer: no lock is held across a
// blocking engine call. Rank 2 holds the others in the split until a
// call to rank 0's Place has returned; before the fix rank 0 held its
// lock across the split, and that deadlock ended only with the engine's
// timeout, failing the move.
func TestNoLockAcrossSplit(t *testing.T) {
	const m = 4
	l, _ := ParseLogical("ring", m)
	var mu sync.Mutex
	comms := map[int]*Comm{}
	probe := func() {
		time.Sleep(200 * time.Millisecond) // rank 0 is in the split by now (not needed for the test to pass)
		mu.Lock()
		c0 := comms[0]
		mu.Unlock()
		c0.Place()
	}
	errs := onRanksOpts(t, 3, engine.Options{Timeout: 5 * time.Second}, func(pc *engine.Comm) error {
		c, err := New(pc, l, Place{0, 0, 1, 1})
		if err != nil {
			return err
		}
		defer c.Destroy()
		mu.Lock()
		comms[pc.Rank()] = c
		mu.Unlock()
		if len(c.Local()) > 0 {
			if err := c.RegisterShared("w", make([]byte, 32)); err != nil {
				return err
			}
		}
		for _, v := range c.Local() {
			if err := c.Register(v, "rng", make([]byte, 16)); err != nil {
				return err
			}
		}
		if pc.Rank() == 2 {
			c.SetAlloc(func(_ int, _ string, n int) ([]byte, error) {
				probe()
				return make([]byte, n), nil
			})
		}
		if err := c.Migrate(Place{0, 1, 1, 2}); err != nil {
			return err
		}
		c.SetAlloc(func(_ int, _ string, n int) ([]byte, error) { return make([]byte, n), nil })
		np, err := pc.Shrink(nil)
		if err != nil {
			return err
		}
		defer np.Destroy()
		probeOnce := sync.OnceFunc(probe)
		_, err = c.Recover(np, RecoverOptions{Step: uint64(2 - pc.Rank()/2), Rebuild: func(dev int, name string, buf []byte, step uint64) error {
			if pc.Rank() == 2 {
				probeOnce()
			}
			return nil
		}})
		if err != nil {
			return err
		}
		return checkAllReduce(c, 4)
	})
	noErrors(t, errs)
}

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

// TestJoinRefused: two processes join a 2-rank job of 4 devices, one of
// them with 5 devices. The members refuse it (Recovery.Refused), its
// Join fails with ErrJoinRefused, and the members and the good joiner go
// on: they shrink the bad one out, recover, and allreduce to the
// reference. Before the fix the bad joiner's description made every
// rank's Recover fail, ending the job.
func TestJoinRefused(t *testing.T) {
	const m = 4
	opts := engine.Options{Transport: "tcp", Timeout: 10 * time.Second}
	members, secret := tcpRanks(t, 2, opts)
	l4, _ := ParseLogical("ring", m)
	l5, _ := ParseLogical("ring", m+1)
	params := contribution(3, 0, 16)
	info, err := members[0].JoinInfo()
	if err != nil {
		t.Fatal(err)
	}
	// goOn is what every process that stays does once a recovery named the
	// refused: shrink them out and recover (nothing moves), then check.
	goOn := func(c *Comm, np *engine.Comm, refused []int) error {
		if len(refused) != 1 {
			return fmt.Errorf("refused %v, want one joiner", refused)
		}
		np2, err := np.Shrink(refused)
		if err != nil {
			return err
		}
		defer np2.Destroy()
		rec, err := c.Recover(np2, RecoverOptions{Step: 3})
		if err != nil || rec.Bytes != 0 || len(rec.Refused) != 0 {
			return fmt.Errorf("recover without the refused joiner: %+v, %v", rec, err)
		}
		if b, _ := c.Buffer(c.Local()[0], "params"); !bytes.Equal(b, params) {
			return errors.New("the shared state differs from the members'")
		}
		return checkAllReduce(c, 8)
	}
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for k, l := range []Logical{l4, l5} {
		wg.Go(func() {
			jc, err := engine.Join(info, secret, opts)
			if err != nil {
				errs[2+k] = err
				return
			}
			defer jc.Destroy()
			c, rec, err := Join(jc, l, RecoverOptions{})
			if l.M != m {
				if !errors.Is(err, ErrJoinRefused) || !strings.Contains(err.Error(), "5 devices, against 4") {
					errs[2+k] = fmt.Errorf("the bad joiner: %v, want ErrJoinRefused", err)
				}
				return
			}
			if err != nil {
				errs[2+k] = err
				return
			}
			defer c.Destroy()
			errs[2+k] = goOn(c, jc, rec.Refused)
		})
	}
	for r, pc := range members {
		wg.Go(func() {
			errs[r] = func() error {
				c, err := New(pc, l4, Block(m, 2))
				if err != nil {
					return err
				}
				defer c.Destroy()
				if err := c.RegisterShared("params", slices.Clone(params)); err != nil {
					return err
				}
				np, err := pc.Grow(2)
				if err != nil {
					return err
				}
				defer np.Destroy()
				rec, err := c.Recover(np, RecoverOptions{Step: 3})
				if err != nil {
					return err
				}
				return goOn(c, np, rec.Refused)
			}()
		})
	}
	wg.Wait()
	for _, c := range members {
		c.Destroy()
	}
	noErrors(t, errs)
}
