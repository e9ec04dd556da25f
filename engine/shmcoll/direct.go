//go:build linux

package shmcoll

import (
	"context"

	"github.com/gocoll/gocoll/engine/kernel"
)

// descDirect marks a record of a 2-rank AllReduce that goes by
// reduceDirect. It is part of the records' comparison: the two paths
// arrive at different barriers, so ranks that disagreed on the path must
// fail (ErrMismatch) rather than wait. They do not: the path is chosen
// from what both ranks hold alike (choosePath).
const descDirect = 1 << 62

// reduceDirect is the 2-rank AllReduce by cross-memory copies, for plain
// buffers one copy less per byte than the slots' three (into the slot, the
// fold, out of the peer's slot): each rank publishes the addresses of its
// send and recv, then, for its half of the elements (chunk), block by
// block, reads the peer's part of send out of its process, folds it with
// its own into recv, and writes the result into the peer's recv while the
// block is still in the cache. A closing barrier keeps both buffers alive
// until the peer is done with them. The fold is the slots' (the same terms
// in rank order, the same function), so the result does not depend on the
// path, bit for bit.
func (a *Arena) reduceDirect(ctx context.Context, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	set, err := a.nextSet(ctx)
	if err != nil {
		return err
	}
	a.cur.id.desc |= descDirect
	// (reg is 0: regOff carries recv's address.)
	a.cur.addr, a.cur.reg, a.cur.regOff = addrOf(send), 0, addrOf(recv)
	gate := a.phase + 1 // the peer may write into recv from this barrier on
	if err := a.reduceDirectData(ctx, a.me.slots[set], send, recv, dt, op); err != nil {
		// Not before the peer stopped writing into recv: the caller may
		// reuse it once this returns.
		a.closeGate(gate, 1-a.rank)
		return err
	}
	return nil
}

// reduceDirectData is reduceDirect's data movement, with scratch (the own
// slot) for the blocks read from the peer.
func (a *Arena) reduceDirectData(ctx context.Context, scratch, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	if err := a.barrier(ctx); err != nil {
		return err
	}
	peer := 1 - a.rank
	rec := a.segs[peer].recs[a.phase&1]
	lo, hi := a.chunk(len(send), a.rank, dt.Size())
	blk := min(directBlock, len(scratch)) &^ (lineBytes - 1)
	for off := lo; off < hi; off += blk {
		e := min(off+blk, hi)
		theirs := scratch[:e-off]
		if err := a.load(peer, theirs, rec.addr+uint64(off)); err != nil {
			return err
		}
		a.terms[a.rank], a.terms[peer] = send[off:e], theirs
		fold(recv[off:e], nil, nil, a.terms, dt, op, a.avg(op))
		if err := a.store(peer, recv[off:e], rec.regOff+uint64(off)); err != nil {
			return err
		}
	}
	return a.barrier(ctx)
}
