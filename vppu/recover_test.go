package vppu

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/gocoll/gocoll/engine"
)

// rebuildFill is a per-device buffer as a pure function of (device,
// step), as a Rebuild must be.
func rebuildFill(dev int, _ string, buf []byte, step uint64) error {
	for i := range buf {
		buf[i] = byte(dev*31 + int(step)*7 + i)
	}
	return nil
}

// TestRecoverAfterShrink: rank 3 of 4 leaves for good; the survivors
// shrink, recover its two devices from their shared copies, settle a step
// only rank 0 completed, and the virtual allreduce gives the reference
// results on the new placement.
func TestRecoverAfterShrink(t *testing.T) {
	const m = 8
	l, _ := ParseLogical("ring", m)
	ahead, before := contribution(5, 200, 64), contribution(5, 201, 64)
	for _, tc := range []struct {
		name    string
		opts    RecoverOptions
		wantErr error
	}{
		{"settle", RecoverOptions{Rebuild: rebuildFill}, nil},
		{"too-few", RecoverOptions{MinRanks: 4, Rebuild: rebuildFill}, ErrTooFewRanks},
		{"own-state-lost", RecoverOptions{}, ErrStateLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onRanks(t, 4, func(pc *engine.Comm) error {
				c, err := New(pc, l, Block(m, 4))
				if err != nil {
					return err
				}
				defer c.Destroy()
				params := slices.Clone(before)
				step := uint64(4)
				if pc.Rank() == 0 {
					params, step = slices.Clone(ahead), 5 // only rank 0 got step 4's result
				}
				if err := c.RegisterShared("params", params); err != nil {
					return err
				}
				for _, v := range c.Local() {
					if err := c.Register(v, "rng", make([]byte, 16)); err != nil {
						return err
					}
				}
				if pc.Rank() == 3 {
					return nil // gone: it never calls again
				}
				np, err := pc.Shrink([]int{3})
				if err != nil {
					return err
				}
				defer np.Destroy()
				opts := tc.opts
				opts.Step = step
				rec, err := c.Recover(np, opts)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						return fmt.Errorf("recover: %v, want %v", err, tc.wantErr)
					}
					return nil
				}
				if err != nil {
					return err
				}
				if want := (Place{0, 0, 1, 1, 2, 2, 0, 1}); !slices.Equal(rec.Place, want) || !slices.Equal(c.Place(), want) {
					return fmt.Errorf("placement %v (comm %v), want %v", rec.Place, c.Place(), want)
				}
				if rec.Step != 5 || !slices.Equal(rec.Lost, []int{6, 7}) || !slices.Equal(rec.Behind, []int{1, 2}) {
					return fmt.Errorf("recovery %+v: want step 5, lost [6 7], behind [1 2]", rec)
				}
				if c.Parent() != np {
					return errors.New("the parent is not the new communicator")
				}
				for _, v := range c.Local() {
					if b, _ := c.Buffer(v, "params"); !bytes.Equal(b, ahead) {
						return fmt.Errorf("device %d: shared state is not the step ahead's", v)
					}
					want := make([]byte, 16)
					if np.Rank() == 0 && v < 6 {
						want = make([]byte, 16) // rank 0 was not behind: kept as it was
					} else {
						rebuildFill(v, "rng", want, 5)
					}
					if b, _ := c.Buffer(v, "rng"); !bytes.Equal(b, want) {
						return fmt.Errorf("device %d: own buffer %v, want %v", v, b, want)
					}
				}
				if b, _ := c.Buffer(0, "params"); np.Rank() == 0 && &b[0] != &params[0] {
					return errors.New("the registered shared buffer was replaced, not kept")
				}
				// The collectives go on, placement-independent.
				return checkAllReduce(c, 9)
			})
			noErrors(t, errs)
		})
	}
}

func TestRebalance(t *testing.T) {
	for _, tc := range []struct {
		owner []int
		n     int
		want  Place
	}{
		{[]int{0, 0, 1, 1, 2, 2, -1, -1}, 3, Place{0, 0, 1, 1, 2, 2, 0, 1}},
		{[]int{0, 0, 0, 1, 1, 1, -1, -1}, 3, Place{0, 0, 0, 1, 1, 1, 2, 2}},
		{[]int{0, 0, 1, 1, 2, 2, 3, 3}, 5, Place{0, 0, 1, 1, 2, 2, 3, 4}},
		{[]int{-1, -1, 0, 0}, 1, Place{0, 0, 0, 0}},
	} {
		if got := Rebalance(tc.owner, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("Rebalance(%v, %d) = %v, want %v", tc.owner, tc.n, got, tc.want)
		}
	}
}

// TestRecoverCycles: 30 shrink+recover cycles on a healthy job (every
// rank goes on, the devices stay) leave the goroutines where the first
// cycle left them: the old sub-communicators are destroyed each time.
func TestRecoverCycles(t *testing.T) {
	const m, count, cycles = 6, 64, 30
	l, _ := ParseLogical("ring", m)
	var baseline int
	var mu sync.Mutex
	errs := onRanks(t, 3, func(pc *engine.Comm) error {
		c, err := New(pc, l, Block(m, 3))
		if err != nil {
			return err
		}
		defer c.Destroy()
		if err := c.RegisterShared("w", make([]byte, 64)); err != nil {
			return err
		}
		cur := pc
		for i := range cycles {
			np, err := cur.Shrink(nil)
			if err != nil {
				return fmt.Errorf("cycle %d: %w", i, err)
			}
			rec, err := c.Recover(np, RecoverOptions{Step: uint64(i), MinRanks: 3})
			if err != nil {
				return fmt.Errorf("cycle %d: %w", i, err)
			}
			if rec.Step != uint64(i) || len(rec.Lost) != 0 || rec.Bytes != 0 || !slices.Equal(rec.Place, Block(m, 3)) {
				return fmt.Errorf("cycle %d: %+v", i, rec)
			}
			if cur != pc {
				cur.Destroy()
			}
			cur = np
			local := c.Local()
			bufs := make([][]byte, len(local))
			for k, v := range local {
				bufs[k] = contribution(i, v, count)
			}
			if err := c.AllReduce(bufs, bufs, count, engine.Float32, engine.Sum); err != nil {
				return fmt.Errorf("cycle %d: %w", i, err)
			}
			if i == 1 && pc.Rank() == 0 {
				mu.Lock()
				baseline = runtime.NumGoroutine()
				mu.Unlock()
			}
		}
		if cur != pc {
			c.Destroy()
			cur.Destroy()
		}
		return nil
	})
	noErrors(t, errs)
	// The other ranks may be a cycle apart at the baseline: allow their share.
	if n := runtime.NumGoroutine(); n > baseline+20 {
		t.Errorf("%d goroutines after %d cycles, %d after the second", n, cycles, baseline)
	}
}
