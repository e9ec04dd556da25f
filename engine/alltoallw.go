package engine

import (
	"slices"

	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/sched"
)

// BlockType is the layout of one block of an AllToAllw: Count runs of
// BlockLen elements of Type, each run starting Stride elements after the
// one before, like MPI_Type_vector(Count, BlockLen, Stride, Type). Count 1
// is a contiguous block of BlockLen elements; Count or BlockLen 0 is an
// empty block. Runs may not overlap (Stride ≥ BlockLen when Count > 1).
type BlockType struct {
	Type                    DataType
	Count, BlockLen, Stride int
}

// Contiguous is the block type of n consecutive elements of dt.
func Contiguous(dt DataType, n int) BlockType {
	return BlockType{Type: dt, Count: 1, BlockLen: n, Stride: n}
}

// Bytes is the size of the block's data, packed.
func (b BlockType) Bytes() int { return b.Count * b.BlockLen * b.Type.Size() }

// AllToAllw is AllToAll with a layout per block on each side: block j of
// send starts sdispls[j] bytes into send, laid out as sendtypes[j], and
// goes to rank j, which stores it rdispls[i] bytes into recv as
// recvtypes[i] (i this rank). Both sides must hold as many bytes of each
// block; their layouts and element types may differ (a strided block may
// arrive contiguous). Blocks travel packed: a strided block is packed
// where it leaves its buffer and unpacked where it lands, nowhere in
// between. A block whose sizes differ is reported as a mismatch naming
// both ranks. Receive blocks may not overlap each other or any send block.
//
//gocoll:forms
func (c *Comm) allToAllwReq(r *Request, send []byte, sdispls []int, sendtypes []BlockType, recv []byte, rdispls []int, recvtypes []BlockType) error {
	n := c.size
	if len(sdispls) != n || len(sendtypes) != n || len(rdispls) != n || len(recvtypes) != n {
		return invalidArg("alltoallw needs %d displacements and types per side, got %d and %d to send, %d and %d to receive",
			n, len(sdispls), len(sendtypes), len(rdispls), len(recvtypes))
	}
	lay := &exec.Layout{Send: send, Recv: recv, In: make([]exec.Span, n), Work: make([]exec.Span, n)}
	sent := 0
	for i := range n {
		var err error
		if lay.In[i], err = spanOf("send", i, send, sdispls[i], sendtypes[i]); err != nil {
			return err
		}
		if lay.Work[i], err = spanOf("recv", i, recv, rdispls[i], recvtypes[i]); err != nil {
			return err
		}
		sent += lay.In[i].Size()
	}
	if lay.In[c.rank].Size() != lay.Work[c.rank].Size() {
		return invalidArg("alltoallw: block sizes differ: rank %d sends itself %d bytes but expects %d", c.rank, lay.In[c.rank].Size(), lay.Work[c.rank].Size())
	}
	if err := checkRuns(send, lay.In, recv, lay.Work); err != nil {
		return err
	}
	r.args = args{send: send, recv: recv, dt: noType, root: -1, n: sent, lay: lay}
	return c.call(r, sched.AllToAllw)
}

// schedAllToAllw runs its schedule (on one rank too: see execCtx.alone).
func schedAllToAllw(x *execCtx, k args) error {
	return x.scheduleBlocks(k.a, x.c.params(sched.AllToAllw, Uint8, 1, 0, -1), k.lay)
}

// spanOf checks block i of one side and returns where it lies in buf.
func spanOf(side string, i int, buf []byte, disp int, t BlockType) (exec.Span, error) {
	if !t.Type.Valid() {
		return exec.Span{}, invalidArg("alltoallw %s type %d: unknown datatype %d", side, i, int32(t.Type))
	}
	if disp < 0 || t.Count < 0 || t.BlockLen < 0 || t.Stride < 0 {
		return exec.Span{}, invalidArg("alltoallw %s block %d: negative displacement, count, block length or stride (%d, %+v)", side, i, disp, t)
	}
	if t.Count == 0 || t.BlockLen == 0 {
		return exec.Span{Off: min(disp, len(buf))}, nil
	}
	if t.Count > 1 && t.Stride < t.BlockLen {
		return exec.Span{}, invalidArg("alltoallw %s block %d: stride %d is shorter than the block length %d: its runs overlap", side, i, t.Stride, t.BlockLen)
	}
	es := t.Type.Size()
	// In elements, without overflowing: (Count-1)·Stride + BlockLen must
	// fit in what follows disp.
	room := 0
	if disp <= len(buf) {
		room = (len(buf) - disp) / es
	}
	if t.BlockLen > room || t.Count > 1 && (t.Count-1) > (room-t.BlockLen)/t.Stride {
		return exec.Span{}, invalidArg("alltoallw %s block %d (%+v at byte %d) ends past the buffer (%d bytes)", side, i, t, disp, len(buf))
	}
	return exec.Span{Off: disp, N: t.BlockLen * es, Runs: t.Count, Stride: t.Stride * es}, nil
}

// checkRuns refuses receive blocks that overlap each other or a send
// block, run by run (strided blocks may interleave without touching).
func checkRuns(send []byte, in []exec.Span, recv []byte, work []exec.Span) error {
	type run struct {
		lo, hi uintptr
		block  int
		recv   bool
	}
	var runs []run
	add := func(buf []byte, spans []exec.Span, isRecv bool) {
		base := addr(buf)
		for b, sp := range spans {
			for k := range sp.Runs {
				if sp.N > 0 {
					lo := base + uintptr(sp.Off+k*sp.Stride)
					runs = append(runs, run{lo, lo + uintptr(sp.N), b, isRecv})
				}
			}
		}
	}
	add(recv, work, true)
	if overlap(send, len(send), recv, len(recv)) {
		add(send, in, false)
	}
	slices.SortFunc(runs, func(a, b run) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	// The furthest-reaching receive run and send run so far.
	var lastRecv, lastSend *run
	for i := range runs {
		r := &runs[i]
		if lastRecv != nil && r.lo < lastRecv.hi {
			if r.recv {
				return invalidArg("alltoallw receive blocks %d and %d overlap", lastRecv.block, r.block)
			}
			return invalidArg("alltoallw send block %d overlaps receive block %d", r.block, lastRecv.block)
		}
		if r.recv && lastSend != nil && r.lo < lastSend.hi {
			return invalidArg("alltoallw send block %d overlaps receive block %d", lastSend.block, r.block)
		}
		if r.recv && (lastRecv == nil || r.hi > lastRecv.hi) {
			lastRecv = r
		}
		if !r.recv && (lastSend == nil || r.hi > lastSend.hi) {
			lastSend = r
		}
	}
	return nil
}
