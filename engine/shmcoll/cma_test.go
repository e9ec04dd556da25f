//go:build linux

package shmcoll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport"
)

// canCMA says whether this process may read its own memory with
// process_vm_readv, which decides, in these tests, whether arenas should
// turn cross-memory reads on (a seccomp profile may forbid it).
func canCMA() bool {
	src := []byte("gocoll")
	dst := make([]byte, len(src))
	return readRemote(os.Getpid(), dst, addrOf(src)) == nil && string(dst) == "gocoll"
}

// cmaSlot: slots just large enough for every rank count's threshold, so
// that the cases run in several pieces without taking long (under -race).
const cmaSlot = 256 << 10

// cmaCases: the collectives that read peers' buffers out of their
// processes, with blocks above every rank count's threshold (the first
// count leaves a last piece of 12 bytes, which goes through the slot), in
// several pieces and in place, from plain and (on even ranks) registered
// memory.
func cmaCases(n int) []tcase {
	var out []tcase
	for _, kind := range []string{"allgather", "alltoall", "broadcast"} {
		for _, count := range []int{(64<<10)/4 + 3, (cmaSlot/n)/4*2 + 5} {
			for _, inPlace := range []bool{false, true} {
				for _, reg := range []bool{false, true} {
					out = append(out, tcase{kind: kind, dt: kernel.Float32, op: kernel.Sum, count: count, root: n - 1, inPlace: inPlace, reg: reg})
				}
			}
		}
	}
	return out
}

// TestCMA: every rank turns cross-memory reads on at the first barrier
// exactly when the process may use them, the collectives that use them
// deliver the reference results, and they did use them, unless the ranks
// outnumber the cores (cmaMin).
func TestCMA(t *testing.T) {
	want := canCMA()
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			w := newWorld(t, n, cmaSlot)
			checkWorld(t, w, cmaCases(n), 1)
			used := want && n <= runtime.NumCPU()
			for r, a := range w.arenas {
				if a.cma != want {
					t.Errorf("rank %d: cross-memory reads %v, process_vm_readv works: %v", r, a.cma, want)
				}
				if used != (a.cmaReads > 0) {
					t.Errorf("rank %d: %d process_vm_readv copies made; %d ranks, %d cores", r, a.cmaReads, n, runtime.NumCPU())
				}
				// A 2-rank broadcast's root writes half of the data.
				if isRoot := r == n-1; want && n == 2 && isRoot != (a.cmaWrites > 0) {
					t.Errorf("rank %d: %d process_vm_writev copies made, root %v", r, a.cmaWrites, isRoot)
				}
			}
		})
	}
}

// TestCMAMax: with 2 ranks, a call that reads cmaMax bytes or more of each
// peer goes through the slots, not out of the peer's process, without
// asking the path chooser (whose first pick of a size class is the
// cross-memory copy). (The test lowers the bound; the default is too large
// to run here often.)
func TestCMAMax(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	const max = 1 << 20 // bytes each rank reads of its peer
	w := newWorld(t, 2, cmaSlot)
	if got := w.arenas[0].cmaMax; got <= max {
		t.Fatalf("cmaMax %d, want it above the test's %d", got, max)
	}
	for _, a := range w.arenas {
		a.cmaMax = max
	}
	cases := []tcase{
		{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4, root: 1}, // the first call decides
		{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: max / 4, root: 1},
		{kind: "allgather", dt: kernel.Float32, op: kernel.Sum, count: max / 4},
		{kind: "alltoall", dt: kernel.Float32, op: kernel.Sum, count: max / 4},
	}
	checkWorld(t, w, cases, 1)
	runVCalls(t, w, []*vLayout{newVLayout(rand.New(rand.NewSource(1)), 2, func(i, j int) int { return max })}, nil)
	for r, a := range w.arenas {
		if !a.cma || a.cmaReads != 0 || a.cmaWrites != 0 {
			t.Errorf("rank %d: cross-memory copies on: %v, %d reads, %d writes; want on, none made", r, a.cma, a.cmaReads, a.cmaWrites)
		}
	}
	// Just below the bound they are made.
	checkWorld(t, w, []tcase{{kind: "allgather", dt: kernel.Float32, op: kernel.Sum, count: max/4 - 1}}, 1)
	for r, a := range w.arenas {
		if a.cmaReads == 0 {
			t.Errorf("rank %d: no cross-memory read below the bound", r)
		}
	}
}

// TestNoCMA: one rank configured without cross-memory reads turns them off
// for all, and the data then goes through the slots.
func TestNoCMA(t *testing.T) {
	n := 3
	w := newWorldOf(t, n, groupMaker{slot: cmaSlot, noCMA: func(r int) bool { return r == 1 }})
	checkWorld(t, w, cmaCases(n), 1)
	for r, a := range w.arenas {
		if a.cma || a.cmaReads != 0 {
			t.Errorf("rank %d: cross-memory reads on (%d copies) though rank 1 said no", r, a.cmaReads)
		}
	}
}

// TestCMAPeerGone: a read from a process that no longer exists fails the
// call with ErrPeerLost naming the peer, and aborts the arena.
func TestCMAPeerGone(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv not permitted here")
	}
	w := newWorld(t, 2, 0)
	if errs := w.run(func(r int, a *Arena) error { return a.Barrier(context.Background(), Call{Seq: 1}) }); errs[0] != nil || errs[1] != nil {
		t.Fatal(errorsText(errs))
	}
	// Pretend rank 1 lives in a process that has exited and published an
	// address for this piece.
	a := w.arenas[0]
	a.segs[1].proc.Pid = exitedPid(t)
	a.segs[1].recs[a.phase&1].addr = addrOf(make([]byte, 1))
	err := a.fetch(make([]byte, 64), 1, 0, 0, 0, 64, 64)
	var lost *transport.PeerLostError
	if !errors.As(err, &lost) || lost.Peer != 1 {
		t.Fatalf("fetch from an exited process: %v, want a PeerLostError for rank 1", err)
	}
	if err := a.Barrier(context.Background(), Call{Seq: 2}); !errors.Is(err, transport.ErrAborted) {
		t.Fatalf("next call: %v, want ErrAborted", err)
	}
}

// exitedPid returns the pid of a child that has exited and been reaped.
func exitedPid(t *testing.T) int {
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Skip(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	// Give a pid reuse no chance to matter: it would need the pid space to
	// wrap within the test.
	time.Sleep(time.Millisecond)
	if err := syscall.Kill(p.Pid, 0); err == nil {
		t.Skip("pid reused")
	}
	return p.Pid
}

// TestStoreGate: a 2-rank broadcast's root writes half of the data into
// its peer's buffer; the peer must not leave the call while that write may
// still run (its caller could free the buffer), and the root must not
// write once the peer left.
func TestStoreGate(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	const n = 64 << 10
	ctx := context.Background()
	setup := func(t *testing.T) *world {
		w := newWorld(t, 2, cmaSlot)
		// The first call decides cross-memory copies: every rank takes part.
		for _, err := range w.run(func(r int, a *Arena) error { return bcast(ctx, a, 1, n, 0) }) {
			if err != nil {
				t.Fatal(err)
			}
		}
		return w
	}
	// Rank 1 fails (its root does not come) while the root holds its gate,
	// as in the middle of the write: rank 1 returns only once the gate is
	// released.
	t.Run("peer waits", func(t *testing.T) {
		w := setup(t)
		p := w.arenas[1].phase + 1 // the phase rank 1 publishes its address at
		if !w.arenas[0].claimStore(1, p) {
			t.Fatal("gate closed before the call")
		}
		early, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- w.arenas[1].Broadcast(early, Call{Seq: 2, Sig: 7}, make([]byte, n), 0) }()
		proctest.Until(t, time.Minute, "rank 1 waiting at its gate or returned", func() bool {
			return w.arenas[1].gateWaits.Load() > 0 || len(done) > 0
		})
		select {
		case err := <-done:
			t.Fatalf("rank 1 returned (%v) while the root held its store gate", err)
		default:
		}
		w.arenas[1].segs[1].gate.Store(p << 2) // the root's release
		if err := <-done; err == nil {
			t.Fatal("rank 1's broadcast succeeded without its root")
		}
		if w.arenas[0].claimStore(1, p) {
			t.Error("the root could claim the gate of a phase rank 1 gave up on")
		}
	})
	// Once rank 1 gave up on the phase, the root does not write.
	t.Run("root refrains", func(t *testing.T) {
		w := setup(t)
		p := w.arenas[0].phase // the phase store writes for
		mine := make([]byte, n)
		w.arenas[1].me.recs[p&1].addr = addrOf(mine) // where rank 1's record would send the write
		w.arenas[1].closeGate(p, 0)
		if err := w.arenas[0].store(1, bytes.Repeat([]byte{0xab}, n), 0); err != nil {
			t.Fatal(err)
		}
		if i := bytes.IndexByte(mine, 0xab); i >= 0 || w.arenas[0].cmaWrites != 0 {
			t.Errorf("the root wrote (%d copies) after rank 1 gave up on the phase", w.arenas[0].cmaWrites)
		}
		runtime.KeepAlive(mine)
	})
}

// TestPathChooser: the first call of a size class copies out of the
// process, the second through the slots, then the faster estimate wins but
// every exploreEvery-th call tries the other; an estimate falls at once to
// a faster call and rises by an eighth of the difference on a slower one.
func TestPathChooser(t *testing.T) {
	var p pathChooser
	k, cma := p.pick(64 << 10)
	if k != bits.Len(64<<10) || !cma {
		t.Fatalf("first pick: class %d, cross-memory %v; want %d, true", k, cma, bits.Len(64<<10))
	}
	p.record(k, true, 200)
	if _, cma := p.pick(64 << 10); cma {
		t.Fatal("second pick: cross-memory again; want the slots once")
	}
	p.record(k, false, 100)
	var tried []int
	for c := 2; c < 2+2*exploreEvery; c++ {
		if _, cma := p.pick(64 << 10); cma {
			tried = append(tried, c)
		}
	}
	if want := []int{exploreEvery - 1, 2*exploreEvery - 1}; !slices.Equal(tried, want) {
		t.Errorf("slots faster: cross-memory in calls %v, want %v", tried, want)
	}
	// The slots get slower (the cores moved apart): their estimate rises
	// an eighth of the way per call, and the choice flips once it passes
	// the other.
	p.record(k, false, 900)
	if got := p.est[k][0]; got != 100+(900-100)/8 {
		t.Errorf("estimate after a slower call %d, want %d", got, 100+(900-100)/8)
	}
	p.record(k, false, 50)
	if got := p.est[k][0]; got != 50 {
		t.Errorf("estimate after a faster call %d, want 50", got)
	}
	p.est[k][0], p.calls[k] = 300, 0
	for range exploreEvery - 1 {
		if _, cma := p.pick(64 << 10); !cma {
			t.Fatal("cross-memory faster, slots picked outside exploration")
		}
	}
	// Classes are apart.
	if _, cma := p.pick(1 << 20); !cma {
		t.Error("a new class did not start with cross-memory copies")
	}
}

// TestPathChosen: a 2-rank allgather whose ranks learned that the slots are
// faster for its size copies nothing out of processes, except in the call
// that tries the other way.
func TestPathChosen(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	w := newWorld(t, 2, cmaSlot)
	const count = (64 << 10) / 4 // a 64 KiB block per rank
	// The first call decides cross-memory copies.
	checkWorld(t, w, []tcase{{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4}}, 1)
	k := bits.Len(count * 4)
	for _, a := range w.arenas {
		a.paths.est[k] = [2]int64{1, 1 << 40} // the slots far faster
		a.paths.calls[k] = 0
	}
	for c := range exploreEvery {
		checkWorld(t, w, []tcase{{kind: "allgather", dt: kernel.Float32, op: kernel.Sum, count: count}}, 1)
		for r, a := range w.arenas {
			if tries := c == exploreEvery-1; tries != (a.cmaReads > 0) {
				t.Fatalf("call %d, rank %d: %d cross-memory reads (the call tries them: %v)", c, r, a.cmaReads, tries)
			}
		}
	}
}
