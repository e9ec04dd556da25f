package shmcoll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport"
)

// vLayout is an AllToAllv every rank can compute: sizes[i][j] bytes from
// rank i to rank j, each rank's blocks in a shuffled order with gaps.
type vLayout struct {
	sizes  [][]int
	sb, rb [][]sched.Block
	sn, rn []int // buffer lengths
}

func newVLayout(rng *rand.Rand, n int, size func(i, j int) int) *vLayout {
	l := &vLayout{sizes: make([][]int, n), sb: make([][]sched.Block, n), rb: make([][]sched.Block, n), sn: make([]int, n), rn: make([]int, n)}
	for i := range n {
		l.sizes[i] = make([]int, n)
		for j := range n {
			l.sizes[i][j] = size(i, j)
		}
	}
	place := func(size func(peer int) int) ([]sched.Block, int) {
		b := make([]sched.Block, n)
		off := 0
		for _, p := range rng.Perm(n) {
			off += rng.Intn(3)
			b[p] = sched.Block{Off: off, Len: size(p)}
			off += b[p].Len
		}
		return b, off + rng.Intn(2)
	}
	for r := range n {
		l.sb[r], l.sn[r] = place(func(p int) int { return l.sizes[r][p] })
		l.rb[r], l.rn[r] = place(func(p int) int { return l.sizes[p][r] })
	}
	return l
}

// pattern is byte e of the block from rank i to rank j in call seq.
func pattern(seq uint64, i, j, e int) byte { return byte(int(seq)*17 + i*131 + j*31 + e*7) }

func (l *vLayout) send(seq uint64, r int) []byte {
	buf := garbage(l.sn[r])
	for j, b := range l.sb[r] {
		for e := range b.Len {
			buf[b.Off+e] = pattern(seq, r, j, e)
		}
	}
	return buf
}

// check compares rank r's receive buffer (filled with garbage before the
// call) with what it must hold: every block in place, the gaps untouched.
func (l *vLayout) check(seq uint64, r int, got []byte) error {
	want := garbage(l.rn[r])
	for i, b := range l.rb[r] {
		for e := range b.Len {
			want[b.Off+e] = pattern(seq, i, r, e)
		}
	}
	if !bytes.Equal(got, want) {
		for k := range got {
			if got[k] != want[k] {
				return fmt.Errorf("rank %d, call %d: byte %d is %#x, want %#x", r, seq, k, got[k], want[k])
			}
		}
	}
	return nil
}

// runVCalls has every rank of w make one AllToAllv per layout, in order
// (call numbers from 0), and fails t on an error or a wrong result; a rank
// whose result was wrong goes on calling, so that no peer waits for it.
// after, if not nil, gets each call's send buffer once the call returned.
func runVCalls(t *testing.T, w *world, layouts []*vLayout, after func(send []byte)) {
	t.Helper()
	errs := w.run(func(r int, a *Arena) error {
		var wrong error
		for k, l := range layouts {
			seq := uint64(k)
			send, got := l.send(seq, r), garbage(l.rn[r])
			if err := a.AllToAllv(context.Background(), Call{Seq: seq, Sig: 7}, send, l.sb[r], got, l.rb[r]); err != nil {
				return err
			}
			if after != nil {
				after(send)
			}
			if err := l.check(seq, r, got); err != nil && wrong == nil {
				wrong = err
			}
		}
		return wrong
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(errorsText(errs))
		}
	}
}

// AllToAllv through small slots, so that blocks take several pieces, at
// several rank counts; the calls follow each other without a barrier
// between them (the slot sets alternate across calls), zero-byte blocks
// and calls with nothing to send included.
func TestAllToAllv(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			w := newWorld(t, n, MinSlotBytes)
			rng := rand.New(rand.NewSource(int64(n)))
			bs := w.arenas[0].vColumn()
			var layouts []*vLayout
			for k := range 12 {
				most := []int{0, 1, 64, bs, 3*bs + 5}[k%5] // up to four pieces
				layouts = append(layouts, newVLayout(rng, n, func(int, int) int {
					if most == 0 || rng.Intn(4) == 0 {
						return 0
					}
					return rng.Intn(most + 1)
				}))
			}
			runVCalls(t, w, layouts, nil)
		})
	}
}

// Blocks of a whole number of columns take that many pieces, a barrier
// each: the sizes lines live outside the slots (with them at the head of
// each column, a 2-column block took 3 pieces).
func TestAllToAllvPieces(t *testing.T) {
	for _, n := range []int{2, 4} {
		w := newWorld(t, n, MinSlotBytes)
		col := w.arenas[0].slot / n &^ (lineBytes - 1) // a column's bytes
		for _, cols := range []int{1, 2, 3} {
			var before []uint64
			for _, a := range w.arenas {
				before = append(before, a.phase)
			}
			l := newVLayout(rand.New(rand.NewSource(int64(cols))), n, func(i, j int) int { return cols * col })
			runVCalls(t, w, []*vLayout{l}, nil)
			for r, a := range w.arenas {
				if got := a.phase - before[r]; got != uint64(cols) {
					t.Errorf("%d ranks, blocks of %d columns: rank %d passed %d barriers", n, cols, r, got)
				}
			}
		}
	}
}

// A rank whose blocks are large enough publishes its send buffer and its
// peer reads its block out of its process (when the kernel allows it),
// while the other rank's blocks still go through the slots piece by piece;
// calls alternate the two ways as the path chooser explores.
func TestAllToAllvDirect(t *testing.T) {
	w := newWorld(t, 2, MinSlotBytes)
	big := cmaFloor + 3000 // rank 0 sends this much: direct
	small := 2*w.arenas[0].vColumn() + 100
	var layouts []*vLayout
	for seq := range 16 {
		layouts = append(layouts, newVLayout(rand.New(rand.NewSource(int64(seq))), 2, func(i, j int) int {
			switch {
			case i == j:
				return 10
			case i == 0:
				return big
			}
			return small
		}))
	}
	runVCalls(t, w, layouts, nil)
	if !canCMA() {
		return
	}
	if w.arenas[1].cmaReads == 0 || w.arenas[0].cmaReads != 0 {
		t.Errorf("cross-memory reads: rank 0 %d (rank 1 sends through the slots), rank 1 %d (rank 0 publishes its buffer); want none, some",
			w.arenas[0].cmaReads, w.arenas[1].cmaReads)
	}
}

// A rank that published its buffer keeps it until its peer has read it:
// rank 0's block is large, rank 1's small, both read out of the other's
// process in one piece, and rank 0 scribbles over its send buffer as soon
// as each call returns (without the closing barrier it returned while rank
// 1 still read).
func TestAllToAllvDirectKeepsBuffer(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	w := newWorld(t, 2, MinSlotBytes)
	big, small := 4<<20, cmaFloor
	l := newVLayout(rand.New(rand.NewSource(3)), 2, func(i, j int) int {
		switch {
		case i == j:
			return 0
		case i == 0:
			return big
		}
		return small
	})
	layouts := make([]*vLayout, 12)
	for k := range layouts {
		layouts[k] = l
	}
	runVCalls(t, w, layouts, func(send []byte) { copy(send, garbage(len(send))) })
	if w.arenas[1].cmaReads == 0 {
		t.Error("rank 1 read nothing out of rank 0's process")
	}
}

// Ranks 1 and 3 disagree on the size of the block from 1 to 3: both report
// it in that call, naming the pair, before the block is written; the other
// ranks either finish with every block right or report a failed peer.
func TestAllToAllvCountsDiffer(t *testing.T) {
	const n = 4
	w := newWorld(t, n, MinSlotBytes)
	l := newVLayout(rand.New(rand.NewSource(1)), n, func(int, int) int { return 100 })
	bad := l.rb[3][1]
	bad.Len-- // rank 3 expects a byte less from rank 1
	recvs := make([][]byte, n)
	errs := w.run(func(r int, a *Arena) error {
		rb := append([]sched.Block(nil), l.rb[r]...)
		if r == 3 {
			rb[1] = bad
		}
		recvs[r] = garbage(l.rn[r])
		return a.AllToAllv(context.Background(), Call{Seq: 0, Sig: 7}, l.send(0, r), l.sb[r], recvs[r], rb)
	})
	for _, r := range []int{1, 3} {
		var ce *CountsError
		if !errors.As(errs[r], &ce) || !errors.Is(errs[r], transport.ErrMismatch) {
			t.Fatalf("rank %d: %v, want a CountsError", r, errs[r])
		}
		if *ce != (CountsError{Rank: r, From: 1, To: 3, Sent: 100, Expected: 99}) {
			t.Errorf("rank %d: %+v", r, *ce)
		}
	}
	if blk := recvs[3][bad.Off : bad.Off+bad.Len]; !bytes.Equal(blk, garbage(bad.Len)) {
		t.Errorf("rank 3: the block from rank 1 was written: % x", blk)
	}
	for _, r := range []int{0, 2} {
		if errs[r] == nil {
			if err := l.check(0, r, recvs[r]); err != nil {
				t.Errorf("rank %d returned without error: %v", r, err)
			}
		}
	}
}

// With more ranks than the slot has columns for (128 ranks, 4 KiB slots:
// not an arena Create makes, which sizes its slots for a line per rank),
// AllToAllv says so before it starts, so the engine picks a schedule.
func TestAllToAllvFits(t *testing.T) {
	w := newWorld(t, 2, MinSlotBytes)
	if !w.arenas[0].FitsAllToAllv() {
		t.Fatal("2 ranks, 4 KiB slots: no room")
	}
	a := &Arena{size: 128, slot: MinSlotBytes}
	if a.FitsAllToAllv() {
		t.Fatalf("128 ranks, 4 KiB slots: %d-byte columns", a.vColumn())
	}
	blocks := make([]sched.Block, 128)
	// (An arena never connected refuses calls with ErrInvalid too: the
	// message tells the two apart.)
	if err := a.AllToAllv(context.Background(), Call{}, nil, blocks, nil, blocks); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no column") {
		t.Fatalf("got %v, want ErrInvalid: slots leave no column", err)
	}
}
