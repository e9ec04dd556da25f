//go:build linux

package shmcoll

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/gocoll/gocoll/engine/kernel"
)

const (
	// foldBlock is the block the folds work in, so that partial results
	// stay in L1/L2 while all n operands stream through.
	foldBlock = 32 << 10
	// lineBytes aligns chunk boundaries.
	lineBytes = 64
)

// AllReduce sets recv to the reduction of every rank's send, identical on
// every rank. len(send) == len(recv), a multiple of dt.Size(); send may
// equal recv (in place) but not overlap it otherwise.
func (a *Arena) AllReduce(ctx context.Context, c Call, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	if err := checkReduce("allreduce", send, recv, dt, op); err != nil {
		return err
	}
	if err := a.begin(c, len(send), desc(kindAllReduce, dt, op, -1)); err != nil {
		return err
	}
	defer a.end()
	return a.reduce(ctx, send, recv, dt, op)
}

// Reduce sets recv on root to the reduction of every rank's send; recv is
// not used on other ranks (it may be nil there). On root len(recv) ==
// len(send) and send may equal recv.
func (a *Arena) Reduce(ctx context.Context, c Call, send, recv []byte, dt kernel.DataType, op kernel.RedOp, root int) error {
	if root < 0 || root >= a.size {
		return fmt.Errorf("%w: reduce: root %d out of range for size %d", ErrInvalid, root, a.size)
	}
	if a.rank != root {
		recv = nil
		if err := checkTypes("reduce", len(send), dt, op); err != nil {
			return err
		}
	} else if err := checkReduce("reduce", send, recv, dt, op); err != nil {
		return err
	}
	if err := a.begin(c, len(send), desc(kindReduce, dt, op, root)); err != nil {
		return err
	}
	defer a.end()
	return a.reduce(ctx, send, recv, dt, op)
}

// reduce is AllReduce and Reduce; recv is nil on ranks that do not want
// the result.
func (a *Arena) reduce(ctx context.Context, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	if a.size == 1 {
		if recv != nil {
			copyIfNot(recv, send)
		}
		return nil
	}
	if a.small(len(send)) {
		set, err := a.nextSet(ctx)
		if err != nil {
			return err
		}
		n := len(send)
		copy(a.me.slots[set][:n], send)
		if err := a.barrier(ctx); err != nil {
			return err
		}
		if recv != nil {
			for j, s := range a.segs {
				a.terms[j] = s.slots[set][:n]
			}
			fold(recv, nil, nil, a.terms, dt, op, a.avg(op))
		}
		return nil
	}
	k, timed := 0, false
	if a.size == 2 && a.cur.id.desc&0xff == kindAllReduce {
		k, timed = a.choosePath(chooseAllReduce, len(send)/2, 0)
	}
	start := a.pathStart(timed)
	var err error
	if timed && a.useCMA {
		err = a.reduceDirect(ctx, send, recv, dt, op)
	} else {
		err = a.reduceSlots(ctx, send, recv, dt, op)
	}
	a.pathEnd(chooseAllReduce, k, timed, start, err)
	return err
}

// reduceSlots is reduce's path through the slots, in pieces of a slot.
func (a *Arena) reduceSlots(ctx context.Context, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	reg, regOff := a.lookupReg(send)
	var rreg *regAlloc
	rregOff := 0
	if recv != nil && a.cur.id.desc&0xff == kindAllReduce && len(send)/a.size >= smallBytes {
		// (Below, the closing barrier costs more than the copy it saves.)
		rreg, rregOff = a.lookupReg(recv)
	}
	for off := 0; off < len(send); off += a.slot {
		m := min(a.slot, len(send)-off)
		var r []byte
		if recv != nil {
			r = recv[off : off+m]
		}
		if err := a.reducePiece(ctx, send[off:off+m], r, dt, op, reg, regOff+off, rreg, rregOff+off, off+m == len(send)); err != nil {
			return err
		}
	}
	return nil
}

// reducePiece reduces one piece of at most a slot: copy in the chunks the
// others own (unless send is registered memory, which the peers read in
// place: reg, at byte regOff of it), barrier, fold the own chunk into the
// own slot (and recv), barrier, copy the other chunks out of their owners'
// slots. recv is nil on the ranks that do not want the result (Reduce).
//
// The own chunk's result skips the slot when no peer reads it there:
// Reduce's root is the only rank that wants it, and an AllReduce into
// registered memory (rreg, at byte rregOff of it) publishes recv so that
// the peers copy the result out of it in place; the call then ends with a
// closing barrier after its last piece (last), as for registered send
// buffers. Earlier pieces need none: the peers finish reading before they
// arrive at the next piece's first barrier.
func (a *Arena) reducePiece(ctx context.Context, send, recv []byte, dt kernel.DataType, op kernel.RedOp, reg *regAlloc, regOff int, rreg *regAlloc, rregOff int, last bool) error {
	set, err := a.nextSet(ctx)
	if err != nil {
		return err
	}
	n := len(send)
	mine := a.me.slots[set]
	lo, hi := a.chunk(n, a.rank, dt.Size())
	if reg == nil {
		a.copyIn(mine[:lo], send[:lo])
		a.copyIn(mine[hi:n], send[hi:])
		a.cur.reg, a.cur.regOff = 0, 0 // (the last piece may have published recv)
	} else {
		a.cur.reg, a.cur.regOff = reg.id, uint64(regOff)
	}
	if err := a.barrier(ctx); err != nil {
		return err
	}
	if err := a.gather(set, send, 0, lo, hi, uint64(n)); err != nil {
		return err
	}
	a.cur.reg, a.cur.regOff = 0, 0 // the record of the next barrier
	switch {
	case recv == nil:
		fold(mine[lo:hi], nil, nil, a.terms, dt, op, a.avg(op))
	case rreg != nil || a.cur.id.desc&0xff == kindReduce:
		var acc []byte
		if same(send, recv) {
			acc = mine[lo:hi] // recv[lo:hi] is the own term; the slot's chunk is free
		}
		fold(recv[lo:hi], nil, acc, a.terms, dt, op, a.avg(op))
		if rreg != nil {
			a.cur.reg, a.cur.regOff = rreg.id, uint64(rregOff)
		}
	default:
		fold(mine[lo:hi], recv[lo:hi], nil, a.terms, dt, op, a.avg(op))
	}
	if err := a.barrier(ctx); err != nil {
		return err
	}
	if recv == nil {
		return nil
	}
	closing := last && a.anyReg() // some rank's result is in its recv
	for k := 1; k < a.size; k++ {
		j := (a.rank + k) % a.size
		lo, hi := a.chunk(n, j, dt.Size())
		src, err := a.source(j, set, 0, lo, hi, uint64(n))
		if err != nil {
			return err
		}
		copy(recv[lo:hi], src)
	}
	if closing {
		return a.closeReg(ctx, rreg)
	}
	return nil
}

// gather points a.terms at bytes [lo, hi) of every rank's data for the
// piece that just passed its first barrier: the own from own[lo:hi], a
// peer's from its slot of set at slotOff+lo, or, when the peer published a
// registered buffer, from that buffer at its offset+lo (need: bytes of it
// the piece may touch past the offset).
func (a *Arena) gather(set int, own []byte, slotOff, lo, hi int, need uint64) error {
	p := a.phase
	for j, s := range a.segs {
		if j == a.rank {
			a.terms[j] = own[lo:hi]
			continue
		}
		rec := s.recs[p&1]
		if rec.reg == 0 {
			a.terms[j] = s.slots[set][slotOff+lo : slotOff+hi]
			continue
		}
		m, err := a.peerReg(j, rec.reg, rec.regOff+need)
		if err != nil {
			return a.fail(fmt.Errorf("shmcoll: rank %d: %w", a.rank, err))
		}
		a.terms[j] = m[rec.regOff+uint64(lo) : rec.regOff+uint64(hi)]
	}
	return nil
}

// Broadcast copies root's buf into buf on every other rank.
func (a *Arena) Broadcast(ctx context.Context, c Call, buf []byte, root int) error {
	if root < 0 || root >= a.size {
		return fmt.Errorf("%w: broadcast: root %d out of range for size %d", ErrInvalid, root, a.size)
	}
	if err := a.begin(c, len(buf), desc(kindBroadcast, 0, 0, root)); err != nil {
		return err
	}
	defer a.end()
	if a.size == 1 {
		return nil
	}
	k, timed := 0, false
	if a.size == 2 {
		// The root learns its peer's last vote at the latest here, when
		// it waits for the peer to finish the previous call (settle).
		if err := a.settle(ctx); err != nil {
			return err
		}
		k, timed = a.choosePath(chooseBroadcast, len(buf), 1-root)
	}
	start := a.pathStart(timed)
	gate, err := a.broadcast(ctx, buf, root)
	a.pathEnd(chooseBroadcast, k, timed, start, err)
	if err != nil && gate != 0 {
		// The root may be writing into buf (bcastSplit): wait until it
		// no longer does before the caller gets buf back.
		a.closeGate(gate, root)
	}
	return err
}

// broadcast is Broadcast's data movement. gate is the phase at which this
// rank offered its buffer to the root's writes (0: it did not).
func (a *Arena) broadcast(ctx context.Context, buf []byte, root int) (gate uint64, _ error) {
	var reg *regAlloc
	regOff := 0
	if a.rank == root && len(buf) >= smallBytes {
		reg, regOff = a.lookupReg(buf)
	}
	for off := 0; off == 0 || off < len(buf); off += a.slot {
		m := min(a.slot, len(buf)-off)
		set, err := a.nextSet(ctx)
		if err != nil {
			return gate, err
		}
		if a.rank == root {
			switch {
			case reg != nil:
				a.cur.reg, a.cur.regOff = reg.id, uint64(regOff)
			case a.size == 2 && a.publishAddr(buf, len(buf)):
				// Only for one reader: with more, the one copy into
				// the slot serves them all, and their copies out of the
				// shared, cache-warm slot beat as many kernel copies,
				// each pinning the root's pages. AllToAll's blocks have one reader
				// each at any size.
			default:
				a.copyShared(a.me.slots[set], buf[off:off+m])
			}
		} else if a.size == 2 && a.publishAddr(buf, len(buf)) {
			gate = a.phase + 1 // the root may write half of it (bcastSplit)
		}
		if err := a.barrierFrom(ctx, root); err != nil {
			return gate, err
		}
		if rec := a.segs[root].recs[a.phase&1]; rec.reg != 0 || rec.addr != 0 {
			a.regRead = a.regRead || rec.reg != 0
			// The root's buf is registered memory or readable out of its
			// process: copy all of it in one go, then wait until every
			// rank did (closing barrier).
			split, err := a.bcastSplit(ctx, root, len(buf))
			if err != nil {
				return gate, err
			}
			if a.rank != root {
				if err := a.fetch(buf[:split], root, set, 0, 0, split, uint64(len(buf))); err != nil {
					return gate, err
				}
			} else if split < len(buf) {
				addr := a.segs[1-root].recs[a.phase&1].addr + uint64(split)
				if err := a.store(1-root, buf[split:], addr); err != nil {
					return gate, err
				}
			}
			return gate, a.closeReg(ctx, reg)
		}
		if a.rank != root {
			copy(buf[off:off+m], a.segs[root].slots[set][:m])
		}
	}
	if a.rank != root {
		// A non-root returns only once every rank arrived at this call
		// and its record agrees: a rank that passed another root would
		// otherwise leave this one with data the others do not have, and
		// no error. The root still returns at once; it learns of a
		// disagreement in its next call (settle).
		return gate, a.settle(ctx)
	}
	return gate, nil
}

// AllGather concatenates every rank's send, in rank order, into recv:
// len(recv) == Size*len(send). send may be recv's own block
// (recv[Rank*len(send):]) but not overlap recv otherwise.
func (a *Arena) AllGather(ctx context.Context, c Call, send, recv []byte) error {
	b := len(send)
	if len(recv) != a.size*b {
		return fmt.Errorf("%w: allgather: recv %d bytes, want %d ranks × %d", ErrInvalid, len(recv), a.size, b)
	}
	ownBlock := recv[a.rank*b : (a.rank+1)*b]
	if overlaps(send, recv) && !same(send, ownBlock) {
		return fmt.Errorf("%w: allgather: send overlaps recv other than at this rank's block", ErrInvalid)
	}
	if err := a.begin(c, b, desc(kindAllGather, 0, 0, -1)); err != nil {
		return err
	}
	defer a.end()
	if a.size == 1 {
		copyIfNot(ownBlock, send)
		return nil
	}
	k, timed := a.choosePath(chooseAllGather, b, 0)
	start := a.pathStart(timed)
	err := a.allGather(ctx, send, recv, func() { copyIfNot(ownBlock, send) })
	a.pathEnd(chooseAllGather, k, timed, start, err)
	return err
}

// allGather is AllGather's data movement; own copies this rank's block
// into recv while the first barrier waits for the peers.
func (a *Arena) allGather(ctx context.Context, send, recv []byte, own func()) error {
	b := len(send)
	var reg *regAlloc
	regOff := 0
	if b >= smallBytes {
		reg, regOff = a.lookupReg(send)
	}
	anyReg := false
	for off := 0; off == 0 || off < b; off += a.slot {
		m := min(a.slot, b-off)
		set, err := a.nextSet(ctx)
		if err != nil {
			return err
		}
		switch {
		case reg != nil:
			a.cur.reg, a.cur.regOff = reg.id, uint64(regOff)
		case a.publishAddr(send, m):
			// (With more than one reader per block the slot was faster
			// on the project's VM (docs/tuning.md); the chooser measures
			// it here.)
		default:
			a.copyIn(a.me.slots[set], send[off:off+m])
		}
		if err := a.barrierDoing(ctx, own); err != nil {
			return err
		}
		own = nil
		whole := off == 0 && a.allDirect()
		if whole {
			m = b
		}
		if off == 0 {
			anyReg = a.anyReg()
			a.noteRegistered()
		}
		if err := a.fetchBlocks(recv, b, off, m, set, -off, off, uint64(b)); err != nil {
			return err
		}
		if whole {
			break
		}
	}
	if anyReg {
		return a.closeReg(ctx, reg)
	}
	return nil
}

// bcastSplit is where a 2-rank broadcast whose root and peer both published
// their buffers' addresses divides the copy: the peer reads the bytes
// before it out of the root's process while the root writes those after it
// into the peer's, so that both cores copy at once instead of the root
// idling at the closing barrier (cross-memory copies run at a third of
// memcpy's rate here: the kernel pins the pages 16 at a time). Returns n
// (no split) otherwise. The root first waits for the peer's record of this
// phase, which also proves the peer is in this call before anything is
// written into its memory.
func (a *Arena) bcastSplit(ctx context.Context, root, n int) (int, error) {
	split := n / 2 &^ 4095 // whole pages for both sides' pinning
	if a.size != 2 || split == 0 || a.segs[root].recs[a.phase&1].addr == 0 {
		return n, nil
	}
	peer := 1 - root
	if a.rank == root {
		if err := a.meet(ctx, a.segs[peer], a.phase, a.cur.id); err != nil {
			return 0, err
		}
	}
	if a.segs[peer].recs[a.phase&1].addr == 0 {
		return n, nil
	}
	return split, nil
}

// ReduceScatter sets recv to block Rank of the reduction of every rank's
// send: len(send) == Size*len(recv). recv may be send's own block
// (send[Rank*len(recv):]) but not overlap send otherwise.
func (a *Arena) ReduceScatter(ctx context.Context, c Call, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	r := len(recv)
	if err := checkTypes("reducescatter", r, dt, op); err != nil {
		return err
	}
	if len(send) != a.size*r {
		return fmt.Errorf("%w: reducescatter: send %d bytes, want %d ranks × %d", ErrInvalid, len(send), a.size, r)
	}
	ownBlock := send[a.rank*r : (a.rank+1)*r]
	if overlaps(send, recv) && !same(recv, ownBlock) {
		return fmt.Errorf("%w: reducescatter: recv overlaps send other than at this rank's block", ErrInvalid)
	}
	if err := a.begin(c, r, desc(kindReduceScatter, dt, op, -1)); err != nil {
		return err
	}
	defer a.end()
	if a.size == 1 {
		copyIfNot(recv, send)
		return nil
	}
	bs := a.blockPiece()
	reg, regOff := a.lookupReg(send)
	if r < smallBytes {
		reg = nil // not worth the closing barrier
	}
	anyReg := false
	for off := 0; off == 0 || off < r; off += bs {
		m := min(bs, r-off)
		set, err := a.nextSet(ctx)
		if err != nil {
			return err
		}
		mine := a.me.slots[set]
		a.stage(mine, send, r, off, m, bs, reg, regOff, false)
		if err := a.barrier(ctx); err != nil {
			return err
		}
		at := a.rank * bs
		// This rank's part of every send, bytes [lo, hi) = Rank*r+off+[0, m):
		// in a peer's slot at [at, at+m) (slot offset at-lo), or in place
		// in its registered buffer.
		if err := a.gather(set, send, at-off-a.rank*r, a.rank*r+off, a.rank*r+off+m, uint64(len(send))); err != nil {
			return err
		}
		if off == 0 {
			for _, s := range a.segs {
				anyReg = anyReg || s.recs[a.phase&1].reg != 0
			}
		}
		// The own block of the own slot is free: scratch for the partial
		// results when recv is the own block of send.
		fold(recv[off:off+m], nil, mine[at:at+m], a.terms, dt, op, a.avg(op))
	}
	if anyReg {
		// Peers read registered send buffers in place: they must be done
		// before their owners return. Every rank saw the same records, so
		// all agree on this extra barrier.
		if err := a.barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

// AllToAll sends block j of send to rank j, which stores it as its block
// Rank of recv: len(send) == len(recv), a multiple of Size. send may equal
// recv but not overlap it otherwise.
func (a *Arena) AllToAll(ctx context.Context, c Call, send, recv []byte) error {
	if len(send) != len(recv) || len(send)%a.size != 0 {
		return fmt.Errorf("%w: alltoall: send %d bytes, recv %d bytes, %d ranks", ErrInvalid, len(send), len(recv), a.size)
	}
	if overlaps(send, recv) && !same(send, recv) {
		return fmt.Errorf("%w: alltoall: send and recv overlap partially", ErrInvalid)
	}
	b := len(send) / a.size
	if err := a.begin(c, len(send), desc(kindAllToAll, 0, 0, -1)); err != nil {
		return err
	}
	defer a.end()
	own := a.rank * b
	ownCopy := func() { copyIfNot(recv[own:own+b], send[own:own+b]) }
	if a.size == 1 {
		ownCopy()
		return nil
	}
	k, timed := a.choosePath(chooseAllToAll, b, 0)
	if same(send, recv) {
		// In place, this rank's blocks are never read out of its
		// process; it still counted the call (choosePath), as every
		// rank must, but its time says nothing about the path.
		timed = false
	}
	start := a.pathStart(timed)
	err := a.allToAll(ctx, send, recv, ownCopy)
	a.pathEnd(chooseAllToAll, k, timed, start, err)
	return err
}

// allToAll is AllToAll's data movement; own copies this rank's block
// within its buffers while the first barrier waits for the peers.
func (a *Arena) allToAll(ctx context.Context, send, recv []byte, own func()) error {
	b := len(send) / a.size
	bs := a.blockPiece()
	var reg *regAlloc
	regOff := 0
	if b >= smallBytes && !same(send, recv) {
		// (In place, this rank overwrites the blocks the peers would read.)
		reg, regOff = a.lookupReg(send)
	}
	anyReg := false
	for off := 0; off == 0 || off < b; off += bs {
		m := min(bs, b-off)
		set, err := a.nextSet(ctx)
		if err != nil {
			return err
		}
		mine := a.me.slots[set]
		a.stage(mine, send, b, off, m, bs, reg, regOff, !same(send, recv))
		if err := a.barrierDoing(ctx, own); err != nil {
			return err
		}
		own = nil
		whole := off == 0 && a.allDirect()
		if whole {
			m = b
		}
		if off == 0 {
			anyReg = a.anyReg()
			a.noteRegistered()
		}
		// This rank's block of a peer's send, bytes [lo, lo+m): in its slot
		// at [at, at+m), in place in its registered buffer, or in its
		// process.
		at, lo := a.rank*bs, a.rank*b+off
		if err := a.fetchBlocks(recv, b, off, m, set, at-lo, lo, uint64(len(send))); err != nil {
			return err
		}
		if whole {
			break
		}
	}
	if anyReg {
		return a.closeReg(ctx, reg)
	}
	return nil
}

// fetchBlocks copies, from every peer j, bytes [lo, lo+m) of its data for
// the piece into recv's block j (blocks of b bytes) at off (slotOff and
// need as for fetch).
func (a *Arena) fetchBlocks(recv []byte, b, off, m, set, slotOff, lo int, need uint64) error {
	for k := 1; k < a.size; k++ {
		j := (a.rank + k) % a.size
		if err := a.fetch(recv[j*b+off:j*b+off+m], j, set, slotOff, lo, lo+m, need); err != nil {
			return err
		}
	}
	return nil
}

// anyReg says whether any rank published a registered buffer or an
// address at the current phase, so that peers read its buffer in place and
// the call needs a closing barrier (all ranks see the same records, so all
// agree).
func (a *Arena) anyReg() bool {
	for _, s := range a.segs {
		if rec := s.recs[a.phase&1]; rec.reg != 0 || rec.addr != 0 {
			return true
		}
	}
	return false
}

// noteRegistered notes, after a call's first barrier, whether some rank
// published registered memory, which its peers read in place whatever
// the chosen path: the call's time then says nothing about the choice.
func (a *Arena) noteRegistered() {
	for _, s := range a.segs {
		a.regRead = a.regRead || s.recs[a.phase&1].reg != 0
	}
}

// allDirect says whether every rank published its whole buffer at the
// current phase (registered memory or an address), so that the call needs
// no further pieces: the rest is read in place in one go, with no barrier
// per slot-sized piece (all ranks see the same records, so all agree).
func (a *Arena) allDirect() bool {
	for _, s := range a.segs {
		if rec := s.recs[a.phase&1]; rec.reg == 0 && rec.addr == 0 {
			return false
		}
	}
	return true
}

// source returns bytes [lo, hi) of peer j's data for the piece that just
// passed its barrier: from its registered buffer (at its published offset
// plus lo) when its record names one (need: the bytes of it the call may
// touch past that offset), else from its slot of set at slotOff+lo.
func (a *Arena) source(j, set, slotOff, lo, hi int, need uint64) ([]byte, error) {
	rec := a.segs[j].recs[a.phase&1]
	if rec.reg == 0 {
		return a.segs[j].slots[set][slotOff+lo : slotOff+hi], nil
	}
	m, err := a.peerReg(j, rec.reg, rec.regOff+need)
	if err != nil {
		return nil, a.fail(fmt.Errorf("shmcoll: rank %d: %w", a.rank, err))
	}
	return m[rec.regOff+uint64(lo) : rec.regOff+uint64(hi)], nil
}

// closeReg ends a call in which peers read registered buffers in place:
// a closing barrier, so that no rank returns (and may change its buffer)
// before every peer is done reading.
func (a *Arena) closeReg(ctx context.Context, reg *regAlloc) error {
	if err := a.barrier(ctx); err != nil {
		return err
	}
	return nil
}

// Barrier returns once every rank called it.
func (a *Arena) Barrier(ctx context.Context, c Call) error {
	if err := a.begin(c, 0, desc(kindBarrier, 0, 0, -1)); err != nil {
		return err
	}
	defer a.end()
	if a.size == 1 {
		return nil
	}
	return a.barrier(ctx)
}

// small says whether a reduction of nbytes per rank takes the one-barrier
// path.
func (a *Arena) small(nbytes int) bool {
	lim := smallBytes
	if a.size == 2 {
		lim = smallBytes2
	}
	return nbytes*a.size <= lim && nbytes <= a.slot
}

// avg is the divisor Avg needs at the end (1: none).
func (a *Arena) avg(op kernel.RedOp) int {
	if op == kernel.Avg {
		return a.size
	}
	return 1
}

// chunk is the byte range of the part of an n-byte piece that rank j
// reduces: equal parts of whole elements, cache-line aligned, the last ones
// possibly shorter or empty.
func (a *Arena) chunk(n, j, es int) (lo, hi int) {
	per := roundUp((n/es+a.size-1)/a.size*es, lineBytes)
	lo = min(j*per, n)
	return lo, min(lo+per, n)
}

// blockPiece is the most bytes of each rank's block one piece of
// ReduceScatter or AllToAll moves: a slot holds one such part per rank.
func (a *Arena) blockPiece() int {
	return a.slot / a.size &^ (lineBytes - 1)
}

// fold sets dst to terms[0] op terms[1] op … (left to right, n >= 2), then
// divides by div (> 1 for Avg), working in blocks of foldBlock bytes, and
// copies the result to out as well when out is not nil. dst must not
// overlap any term, or be exactly one of them if acc (scratch of len(dst)
// overlapping nothing) is given for the partial results.
func fold(dst, out, acc []byte, terms [][]byte, dt kernel.DataType, op kernel.RedOp, div int) {
	n := len(terms)
	for off := 0; off < len(dst); off += foldBlock {
		e := min(off+foldBlock, len(dst))
		d := dst[off:e]
		if n == 2 {
			kernel.Reduce3(d, terms[0][off:e], terms[1][off:e], dt, op)
		} else {
			x := d
			if acc != nil {
				x = acc[off:e]
			}
			kernel.Reduce3(x, terms[0][off:e], terms[1][off:e], dt, op)
			for k := 2; k < n-1; k++ {
				kernel.Reduce(x, terms[k][off:e], dt, op)
			}
			kernel.Reduce3(d, x, terms[n-1][off:e], dt, op)
		}
		if div > 1 {
			kernel.DivideBy(d, dt, div)
		}
		// Per block, while the block is in L1, rather than one copy of
		// the whole chunk at the end, which Go's memmove does with
		// non-temporal stores from 1 MiB on, to memory (measured:
		// docs/tuning.md, cachedBlock).
		if out != nil {
			copy(out[off:e], d)
		}
	}
}

func checkTypes(name string, n int, dt kernel.DataType, op kernel.RedOp) error {
	if err := kernel.CheckOp(dt, op); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, name, err)
	}
	if n%dt.Size() != 0 {
		return fmt.Errorf("%w: %s: %d bytes is not a whole number of %v", ErrInvalid, name, n, dt)
	}
	return nil
}

func checkReduce(name string, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	if err := checkTypes(name, len(send), dt, op); err != nil {
		return err
	}
	if len(send) != len(recv) {
		return fmt.Errorf("%w: %s: send %d bytes, recv %d bytes", ErrInvalid, name, len(send), len(recv))
	}
	if overlaps(send, recv) && !same(send, recv) {
		return fmt.Errorf("%w: %s: send and recv overlap partially", ErrInvalid, name)
	}
	return nil
}

func overlaps(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 {
		return false
	}
	px, py := uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&y[0]))
	return px < py+uintptr(len(y)) && py < px+uintptr(len(x))
}

func same(x, y []byte) bool {
	return len(x) == len(y) && (len(x) == 0 || &x[0] == &y[0])
}

func copyIfNot(dst, src []byte) {
	if !same(dst, src) {
		copy(dst, src)
	}
}

// stage makes bytes [off, off+m) of every peer's block of send (blocks of
// blk bytes) readable by that peer: copied into this rank's slot at the
// peer's bs-sized place, or, for a registered send buffer, published so the
// peers read it in place, or, when direct (this rank will not overwrite
// send during the call) and cross-memory reads are on, its address
// published so the peers read it out of this process.
func (a *Arena) stage(mine, send []byte, blk, off, m, bs int, reg *regAlloc, regOff int, direct bool) {
	if reg != nil {
		a.cur.reg, a.cur.regOff = reg.id, uint64(regOff)
		return
	}
	if direct && a.publishAddr(send, m) {
		return
	}
	for j := range a.size {
		if j != a.rank {
			a.copyIn(mine[j*bs:j*bs+m], send[j*blk+off:j*blk+off+m])
		}
	}
}

// copyIn copies src into this rank's slot, in pieces of at most
// a.copyBlock bytes. Go's memmove copies 1 MiB or more with
// non-temporal stores, which send the slot's lines to memory, out of every
// cache, just before the peers read them: with a core per rank, they read
// them within microseconds, from the cache the stores would have filled.
// Copies into user buffers keep the non-temporal stores (nobody reads
// those soon; cached copies out of the slots measured no faster).
//
// At 2 ranks and 16 MiB the pieces made every collective faster. With more ranks than cores a reader may run a
// time slice later, when the data has left the cache anyway: there the
// two measured alike and the single copy stays, except for Broadcast's
// root (copyShared).
func (a *Arena) copyIn(dst, src []byte) { copyPieces(dst, src, a.copyBlock) }

// copyShared is copyIn for a slot that every peer reads (Broadcast's
// root): with more ranks than cores, one of the readers shares the root's
// core and finds the lines in its cache, and the others in the shared
// one (measured faster from 1 MiB with 4 ranks on 2 cores).
func (a *Arena) copyShared(dst, src []byte) {
	copyPieces(dst, src, min(a.copyBlock, cachedBlock))
}

func copyPieces(dst, src []byte, block int) {
	for off := 0; off < len(src); off += block {
		e := min(off+block, len(src))
		copy(dst[off:e], src[off:e])
	}
}
