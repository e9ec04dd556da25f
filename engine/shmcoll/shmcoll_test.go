//go:build linux

package shmcoll

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
)

const testSlot = 16 << 10 // small slots: multi-piece paths at modest counts

// TestConformance runs every collective × type × op × count, in place and
// out of place, with ranks as goroutines, for 1 to 6 ranks, against
// kernel.ReferenceReduce folded in rank order; results that every rank
// receives must be identical on every rank, and random-float cases
// identical from run to run.
func TestConformance(t *testing.T) {
	for n := 1; n <= 6; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			if testing.Short() && n > 3 {
				t.Skip("short")
			}
			w := newWorld(t, n, testSlot)
			if n%2 == 0 {
				for _, a := range w.arenas {
					a.copyBlock = 1000 // copies into the slots in pieces, not line-aligned
				}
			}
			cases := matrix(n, w.arenas[0].SlotBytes(), testTypes, kernel.AllRedOps())
			runs := 2 // the second with the state the first left
			if raceEnabled {
				runs = 1 // (as TestDefaultSlot)
			}
			checkWorld(t, w, cases, runs)
		})
	}
}

// TestDefaultSlot: the default 4 MiB slot, with pieces of several MiB.
func TestDefaultSlot(t *testing.T) {
	ranks := []int{2, 3}
	if raceEnabled {
		// The race detector needs each path once, not each rank count:
		// the data it checks by value are the plain run's.
		ranks = ranks[:1]
	}
	for _, n := range ranks {
		w := newWorld(t, n, 0)
		slot := w.arenas[0].SlotBytes()
		if slot != DefaultSlotBytes {
			t.Fatalf("slot %d", slot)
		}
		var cases []tcase
		for _, kind := range testKinds {
			count := slot/4 + 1000 // two pieces (of a block, for the block-wise ones: more)
			cases = append(cases, tcase{kind: kind, dt: kernel.Float32, op: kernel.Sum, count: count, root: n - 1, random: isReduction(kind)})
			cases = append(cases, tcase{kind: kind, dt: kernel.Float32, op: kernel.Avg, count: 60 << 8, root: 0, inPlace: true, random: isReduction(kind)})
		}
		checkWorld(t, w, cases, 1)
	}
}

// checkWorld runs cases runs times on every rank and compares the hashes.
func checkWorld(t *testing.T, w *world, cases []tcase, runs int) {
	t.Helper()
	n := len(w.arenas)
	var first [][]uint64
	for run := range runs {
		hashes := make([][]uint64, n)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		errs := w.run(func(r int, a *Arena) error {
			hashes[r] = make([]uint64, len(cases))
			return runMatrix(ctx, a, cases, hashes[r])
		})
		cancel()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("run %d:%s", run, errorsText(errs))
			}
		}
		for i, c := range cases {
			if c.kind == "allreduce" || c.kind == "broadcast" || c.kind == "allgather" {
				for r := 1; r < n; r++ {
					if hashes[r][i] != hashes[0][i] {
						t.Errorf("%v: rank %d received other bytes than rank 0", c, r)
					}
				}
			}
			if run > 0 && c.random {
				for r := range n {
					if hashes[r][i] != first[r][i] {
						t.Errorf("%v: rank %d: run %d differs from run 0", c, r, run)
					}
				}
			}
		}
		if run == 0 {
			first = hashes
		}
	}
}

// TestCompositionsAgree: AllReduce equals ReduceScatter then AllGather, and
// Reduce then Broadcast, bit for bit (every path folds in rank order), on
// both sides of the small-message threshold and across pieces.
func TestCompositionsAgree(t *testing.T) {
	const n = 3
	w := newWorld(t, n, testSlot)
	for _, count := range []int{3 * 5, 3 * 1000, 3 * 20000} { // elements, a multiple of n
		c := tcase{dt: kernel.Float32, op: kernel.Sum, random: true}
		ctx := context.Background()
		results := make([][3][]byte, n)
		errs := w.run(func(r int, a *Arena) error {
			send := input(c, uint64(count), r, count)
			size := len(send)
			ar := make([]byte, size)
			if err := a.AllReduce(ctx, Call{Seq: 1}, send, ar, c.dt, c.op); err != nil {
				return err
			}
			blk := make([]byte, size/n)
			if err := a.ReduceScatter(ctx, Call{Seq: 2}, send, blk, c.dt, c.op); err != nil {
				return err
			}
			ag := make([]byte, size)
			if err := a.AllGather(ctx, Call{Seq: 3}, blk, ag); err != nil {
				return err
			}
			rb := make([]byte, size)
			if err := a.Reduce(ctx, Call{Seq: 4}, send, rb, c.dt, c.op, 1); err != nil {
				return err
			}
			if err := a.Broadcast(ctx, Call{Seq: 5}, rb, 1); err != nil {
				return err
			}
			results[r] = [3][]byte{ar, ag, rb}
			return nil
		})
		for _, err := range errs {
			if err != nil {
				t.Fatal(errorsText(errs))
			}
		}
		for r := range n {
			for k, name := range []string{"allreduce", "reducescatter+allgather", "reduce+broadcast"} {
				if !bytes.Equal(results[r][k], results[0][0]) {
					t.Errorf("count %d rank %d: %s differs from rank 0's allreduce", count, r, name)
				}
			}
		}
	}
}

// TestWaitPolicy: a call's waits yield to other goroutines unless the
// caller is locked to its thread (C callers).
func TestWaitPolicy(t *testing.T) {
	w := newWorld(t, 2, 0)
	for _, locked := range []bool{false, true} {
		errs := w.run(func(r int, a *Arena) error {
			if err := a.Barrier(context.Background(), Call{Seq: 1, Locked: locked}); err != nil {
				return err
			}
			if a.wait.Goroutines == locked || a.wait.Yield <= 0 {
				return fmt.Errorf("rank %d, caller locked %v: wait policy %+v", r, locked, a.wait)
			}
			return nil
		})
		if errs[0] != nil || errs[1] != nil {
			t.Fatal(errorsText(errs))
		}
	}
}

// TestSmallPath: which allreduce sizes take the one-barrier path (every
// rank folds every slot) and which the two-barrier one: up to 64 KiB over
// all ranks, and at 2 ranks up to 8 KiB buffers (smallBytes2).
func TestSmallPath(t *testing.T) {
	for _, tc := range []struct {
		n, bytes, barriers int
	}{{2, 8 << 10, 1}, {2, 16 << 10, 2}, {2, 32 << 10, 2}, {4, 16 << 10, 1}, {4, 32 << 10, 2}} {
		w := newWorld(t, tc.n, 0)
		checkWorld(t, w, []tcase{{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4}}, 1) // the first call decides cross-memory reads
		before := w.arenas[0].phase
		checkWorld(t, w, []tcase{{kind: "allreduce", dt: kernel.Float32, op: kernel.Sum, count: tc.bytes / 4}}, 1)
		if got := int(w.arenas[0].phase - before); got != tc.barriers {
			t.Errorf("%d ranks, %d bytes: %d barriers, want %d", tc.n, tc.bytes, got, tc.barriers)
		}
	}
}
