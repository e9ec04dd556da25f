//go:build linux

package shmcoll

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
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
// deliver the reference results, and they did use them.
func TestCMA(t *testing.T) {
	want := canCMA()
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			w := newWorld(t, n, cmaSlot)
			checkWorld(t, w, cmaCases(n), 1)
			for r, a := range w.arenas {
				if a.cma != want {
					t.Errorf("rank %d: cross-memory reads %v, process_vm_readv works: %v", r, a.cma, want)
				}
				if want && a.cmaReads == 0 {
					t.Errorf("rank %d: no process_vm_readv copy made", r)
				}
			}
		})
	}
}

// TestNoCMA: one rank configured without cross-memory reads turns them off
// for all, and the data then goes through the slots.
func TestNoCMA(t *testing.T) {
	n := 3
	w := &world{tag: newTag(), arenas: make([]*Arena, n)}
	t.Cleanup(func() {
		w.close()
		checkNoFiles(t, w.tag)
	})
	peers := map[int]PeerInfo{}
	for r := range n {
		a, err := Create(Config{Rank: r, Size: n, Tag: w.tag, SlotBytes: cmaSlot, NoCMA: r == 1})
		if err != nil {
			t.Fatal(err)
		}
		w.arenas[r] = a
		peers[r] = a.Ref()
	}
	for _, a := range w.arenas {
		if err := a.Connect(context.Background(), peers); err != nil {
			t.Fatal(err)
		}
	}
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
