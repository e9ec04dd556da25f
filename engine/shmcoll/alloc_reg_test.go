//go:build linux

package shmcoll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/kernel"
)

// regCases: reductions whose send buffers lie in registered memory on the
// even ranks (peers read them in place), and AllReduce's recv buffers on
// ranks 0, 2 and 3, for the sizes that use it.
func regCases(n, slot int) []tcase {
	var out []tcase
	for _, kind := range []string{"allreduce", "reduce", "reducescatter"} {
		for _, dt := range []kernel.DataType{kernel.Float32, kernel.Bfloat16, kernel.Int8} {
			for _, op := range []kernel.RedOp{kernel.Sum, kernel.Avg} {
				counts := []int{7, 64<<10/dt.Size() + 3, 2*slot/dt.Size() + 5}
				switch kind {
				case "reducescatter":
					counts = []int{7, 64<<10/dt.Size() + 3, 2*slot/n/dt.Size() + 5}
				case "allreduce":
					// 64 KiB per rank and more: results in registered
					// recv buffers are read in place, over many pieces.
					counts = append(counts, n*(64<<10)/dt.Size()+5)
				}
				for _, count := range counts {
					for _, inPlace := range []bool{false, true} {
						out = append(out, tcase{kind: kind, dt: dt, op: op, count: count, root: n - 1, inPlace: inPlace, random: dt != kernel.Int8, reg: true})
					}
				}
			}
		}
	}
	// Copy-only collectives: the root's buf (Broadcast), the send buffers
	// (AllGather, AllToAll) are read in place.
	for _, kind := range []string{"broadcast", "allgather", "alltoall"} {
		counts := []int{7, 64<<10/4 + 3, 2*slot/4 + 5}
		if kind == "alltoall" {
			counts = []int{7, 64<<10/4 + 3, 2*slot/n/4 + 5}
		}
		for _, count := range counts {
			for _, inPlace := range []bool{false, true} {
				for _, root := range []int{0, n - 1} {
					if kind != "broadcast" && root != 0 {
						continue
					}
					out = append(out, tcase{kind: kind, dt: kernel.Float32, op: kernel.Sum, count: count, root: root, inPlace: inPlace, reg: true})
				}
			}
		}
	}
	return out
}

func TestRegistered(t *testing.T) {
	ranks := []int{2, 3, 4}
	if raceEnabled {
		ranks = ranks[:2] // (as TestDefaultSlot)
	}
	for _, n := range ranks {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			w := newWorld(t, n, testSlot)
			checkWorld(t, w, regCases(n, w.arenas[0].SlotBytes()), 1)
		})
	}
}

// TestRegisteredReuse: one allocation used by many calls is mapped by the
// peers once, it never has a file in /dev/shm, a freed allocation's
// mapping is dropped when the next one is mapped, and no call allocates.
func TestRegisteredReuse(t *testing.T) {
	const n, size = 3, 5 * testSlot
	w := newWorld(t, n, testSlot)
	bufs := make([][]byte, n)
	for r, a := range w.arenas {
		b, err := a.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		bufs[r] = b
		if len(b) != size || cap(b) != size {
			t.Fatalf("Alloc(%d) gave len %d cap %d", size, len(b), cap(b))
		}
	}
	if files := shmtest.Files(allocPrefix(w.tag)); len(files) != 0 {
		t.Fatalf("allocations have files: %v", files)
	}
	if fds := shmtest.Fds(allocPrefix(w.tag)); len(fds) != n {
		t.Fatalf("%d allocations open, want %d: %v", len(fds), n, fds)
	}
	ctx := context.Background()
	call := func(seq uint64) {
		errs := w.run(func(r int, a *Arena) error {
			for i := range bufs[r] {
				bufs[r][i] = byte(r + 1)
			}
			if err := a.AllReduce(ctx, Call{Seq: seq}, bufs[r], bufs[r], kernel.Int8, kernel.Sum); err != nil {
				return err
			}
			if want := bytes.Repeat([]byte{byte(n * (n + 1) / 2)}, size); !bytes.Equal(bufs[r], want) {
				return fmt.Errorf("rank %d: wrong result", r)
			}
			return nil
		})
		for _, err := range errs {
			if err != nil {
				t.Fatal(errorsText(errs))
			}
		}
	}
	call(1)
	for r, a := range w.arenas {
		for j, m := range a.peerRegs {
			if j != r && len(m) != 1 {
				t.Fatalf("rank %d maps %d allocations of rank %d, want 1", r, len(m), j)
			}
		}
	}
	// Zero allocations once mapped (every rank's calls count).
	if !raceEnabled {
		allocs := allocsPerCall(t, w, 20, 101, func(r int, a *Arena, seq uint64) error {
			return a.AllReduce(ctx, Call{Seq: seq}, bufs[r], bufs[r], kernel.Int8, kernel.Sum)
		})
		if allocs != 0 {
			t.Errorf("%v allocations per call with registered buffers", allocs)
		}
	}
	// Free and allocate again: the peers drop the old mapping.
	for r, a := range w.arenas {
		if err := a.Free(bufs[r]); err != nil {
			t.Fatal(err)
		}
		if err := a.Free(bufs[r]); !errors.Is(err, ErrInvalid) {
			t.Fatalf("double free: err = %v", err)
		}
		b, err := a.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		bufs[r] = b
	}
	call(200)
	for r, a := range w.arenas {
		for j, m := range a.peerRegs {
			if j != r && len(m) != 1 {
				t.Fatalf("after free: rank %d maps %d allocations of rank %d, want 1", r, len(m), j)
			}
		}
	}
	// Close leaves the memory usable; Free works after it.
	for r, a := range w.arenas {
		a.Close()
		bufs[r][0] = 1
		if err := a.Free(bufs[r]); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Alloc(10); !errors.Is(err, ErrClosed) {
			t.Fatalf("Alloc after Close: err = %v", err)
		}
	}
}

// TestRegisteredAbandoned: allocations never used by a call go with Close
// (world's cleanup checks /dev/shm).
func TestRegisteredAbandoned(t *testing.T) {
	w := newWorld(t, 2, testSlot)
	for _, a := range w.arenas {
		if _, err := a.Alloc(1000); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.arenas[0].Alloc(0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Alloc(0): err = %v", err)
	}
}

// TestDirectOnePiece: when every rank's send buffer is readable in place
// (registered memory, or its address with cross-memory reads), AllGather
// and AllToAll move blocks of several slots in one piece: one barrier to
// publish, one closing barrier, not one per slot-sized piece.
func TestDirectOnePiece(t *testing.T) {
	ctx := context.Background()
	for _, mem := range []string{"registered", "plain"} {
		// Plain buffers are read out of processes where the kernel
		// allows it (the first call of a size class always tries it).
		n := 3
		if mem == "plain" && !canCMA() {
			continue
		}
		w := newWorld(t, n, cmaSlot)
		// The first call decides cross-memory reads.
		for _, err := range w.run(func(r int, a *Arena) error { return a.Barrier(ctx, Call{Seq: 1}) }) {
			if err != nil {
				t.Fatal(err)
			}
		}
		seq := uint64(2)
		for _, kind := range []string{"allgather", "alltoall"} {
			// Bytes per rank's block: four pieces, each above the
			// cross-memory threshold.
			blk := 3*cmaSlot + 64
			if kind == "alltoall" {
				blk = 3*(cmaSlot/n) + 64
			}
			errs := w.run(func(r int, a *Arena) error {
				sendLen := blk
				if kind == "alltoall" {
					sendLen = n * blk
				}
				send, recv := make([]byte, sendLen), make([]byte, n*blk)
				if mem == "registered" {
					var err error
					if send, err = a.Alloc(sendLen); err != nil {
						return err
					}
					defer a.Free(send)
				}
				// Byte i of the block from rank s to rank d.
				val := func(s, d, i int) byte { return byte(s*31 + d*7 + i*13 + i>>8) }
				for i := range send {
					d, k := 0, i
					if kind == "alltoall" {
						d, k = i/blk, i%blk
					}
					send[i] = val(r, d, k)
				}
				before := a.phase
				var err error
				if kind == "alltoall" {
					err = a.AllToAll(ctx, Call{Seq: seq}, send, recv)
				} else {
					err = a.AllGather(ctx, Call{Seq: seq}, send, recv)
				}
				if err != nil {
					return err
				}
				if got := a.phase - before; got != 2 {
					return fmt.Errorf("rank %d: %s of %s buffers took %d barriers, want 2", r, kind, mem, got)
				}
				for s := range n {
					d := 0
					if kind == "alltoall" {
						d = r
					}
					for k := range blk {
						if recv[s*blk+k] != val(s, d, k) {
							return fmt.Errorf("rank %d: %s of %s buffers: byte %d of rank %d's block wrong", r, kind, mem, k, s)
						}
					}
				}
				return nil
			})
			seq++
			for _, err := range errs {
				if err != nil {
					t.Fatal(errorsText(errs))
				}
			}
		}
	}
}
