package engine

import "github.com/gocoll/gocoll/engine/kernel"

// Pipelined halving–doubling (document 000).
//
// Distribution phase: recursive halving over the p active ranks (p the
// largest power of two ≤ n). In each of log2(p) rounds a rank pairs with
// vrank XOR mask, keeps one half of the range it is responsible for and
// sends the other half. The half it sends is cut into q segments; while
// segment k+1 is in flight, the rank reduces the segment k it has already
// received into its kept half, so reduction overlaps transfer (figures 3, 4
// and 8A/8B of the document). After the last round vrank v holds segment v
// of the result, fully reduced.
//
// Collection phase: recursive doubling back (figures 6 and 7): in round k,
// vrank i pairs with i XOR 2^k; for allreduce both sides swap everything they
// hold, for reduce only the side with bit k set sends (toward the root) and
// then stops, so the root ends with the whole vector.
//
// Mapping of figure 8A/8B's per-rank loop onto the code below:
//
//   - pv = pu XOR (1<<i)                  → w := v ^ mask in halve
//   - l = length/2^(i+1), ls = l/slice[i] → the kept/sent halves, cut into
//     nseg(elems) segments by element (sizes differ by at most one element)
//   - adjust = ±1 (which side of the pair this rank is on) → theirsLower:
//     whether the partner's partial is the left operand of the reduction
//   - send 810/838 at b_send, advancing   → sendSegs: one goroutine streams
//     the segments of the sent half in order (two sends to one peer must not
//     overlap, and the per-peer stream is FIFO)
//   - receive 812 before the loop         → the synchronous receive of segment
//     0 in hdRecvReduce
//   - loop: receive 840 of slice j+1 concurrently with reduce 842 of slice j
//     → post the receive of segment k+1 on a goroutine into the other of two
//     scratch buffers, then reduce segment k
//   - the final reduce after the last exchange (824 → 842) → the last
//     iteration, which posts no further receive.
//
// Two details differ from the figures. The figures interleave the sent and
// kept slices (b_send/b_recv step by 2·ls); here the halves are contiguous,
// as in the description of figure 3 (the lower rank keeps the first half),
// so that the collection phase moves contiguous ranges. And the halving runs
// its masks from p/2 down to 1 (claim 4 only asks for a mask not used before)
// so that vrank v ends owning segment v: then the collection phase of figures
// 6/7, with k ascending, merges contiguous neighbours, and reduce-scatter can
// give rank r block r. The last reduction of a round is not overlapped with
// the first exchange of the next round (an option the document mentions):
// the next round sends data that reduction produces.
//
// Ranks beyond p first fold their vector into a partner (newFold: among the
// first 2·(n-p) ranks, each even one hands its data to the odd one above) and
// receive their result at the end. Every element is reduced along a fixed
// tree, always as (lower side's partial) op (higher side's partial), by
// exactly one rank; the collection phase only copies. So results repeat
// bitwise run to run and are identical on every rank.

const (
	hdMaxSeg    = 64        // most segments per round; also the stride of step numbers
	hdAutoMaxQ  = 8         // most segments per round when q is chosen by size
	hdSegTarget = 128 << 10 // segment size aimed at when q is chosen by size

	// Step numbers: each message of one collective gets its own, computed the
	// same way on both sides. Rounds are fewer than 64, so ranges don't meet.
	hdStepFold   = 0       // + segment
	hdStepHalve  = 1 << 12 // + round*hdMaxSeg + segment
	hdStepGather = 2 << 12 // + round
	hdStepUnfold = 3 << 12
)

// hd is one rank's view of a halving–doubling run.
type hd struct {
	x     *execCtx
	dt    DataType
	op    RedOp
	es    int
	f     foldLayout
	shift int // rank = mod(rel + shift, n): relative numbering (reduce puts its root at p-1)
	rel   int // this rank's relative number
	v     int // this rank's active number, -1 if it sits out

	// Final segment layout: vrank s ends owning bytes [off(s), off(s+1)).
	rs    bool // reduce-scatter: segment s is the blocks of the ranks folded into vrank s
	count int  // otherwise count elements are cut into p near-equal segments
	block int  // reduce-scatter block size in bytes
}

func newHD(x *execCtx, dt DataType, op RedOp, shift int) *hd {
	n := x.size()
	f := newFold(n)
	h := &hd{x: x, dt: dt, op: op, es: dt.Size(), f: f, shift: mod(shift, n)}
	h.rel = mod(x.rank()-h.shift, n)
	h.v = f.vrank(h.rel)
	return h
}

// rank is the real rank behind relative number rel.
func (h *hd) rank(rel int) int { return mod(rel+h.shift, h.f.n) }

// real is the real rank behind active number v.
func (h *hd) real(v int) int { return h.rank(h.f.real(v)) }

// off is the byte offset of final segment s, for s in [0, p].
func (h *hd) off(s int) int {
	if h.rs {
		// Relative numbers are ranks here (shift 0); vranks below rem stand for
		// ranks 2s and 2s+1, the others for rank s+rem.
		first := s + h.f.rem
		if s < h.f.rem {
			first = 2 * s
		}
		return first * h.block
	}
	return s * h.count / h.f.p * h.es
}

// nseg is the number of segments a message of elems elements is cut into:
// Options.Segments if set, else about hdSegTarget bytes each, at most
// hdAutoMaxQ; never more than elems (but at least one message, possibly
// empty, so both sides always agree on what is sent).
func (h *hd) nseg(elems int) int {
	q := h.x.c.opts.Segments
	if q <= 0 {
		q = min(max((elems*h.es+hdSegTarget-1)/hdSegTarget, 1), hdAutoMaxQ)
	}
	return max(min(q, hdMaxSeg, elems), 1)
}

// seg is the byte range of segment k when elems elements are cut into ns.
func (h *hd) seg(k, elems, ns int) (lo, hi int) {
	return k * elems / ns * h.es, (k + 1) * elems / ns * h.es
}

// sendSegs streams data to peer as nseg segments, steps step0, step0+1, …,
// in order, on one goroutine.
func (h *hd) sendSegs(peer, step0 int, data []byte) pending {
	ne := len(data) / h.es
	ns := h.nseg(ne)
	p := make(pending, 1)
	go func() {
		for k := 0; k < ns; k++ {
			lo, hi := h.seg(k, ne, ns)
			if err := h.x.send(peer, step0+k, data[lo:hi]); err != nil {
				p <- err
				return
			}
		}
		p <- nil
	}()
	return p
}

// recvReduce receives len(acc) bytes from peer in the segments sendSegs cuts
// them into and folds each into acc (theirs op mine if theirsLower, else mine
// op theirs). Segment k+1 is being received while segment k is reduced; two
// scratch buffers alternate. At most one receive is in flight, so the
// stream's order is kept, and none is left running when it returns.
func (h *hd) recvReduce(peer, step0 int, acc []byte, theirsLower bool) error {
	ne := len(acc) / h.es
	ns := h.nseg(ne)
	most := (ne + ns - 1) / ns * h.es
	bufs := [2][]byte{h.x.scratchBuf(2, most)}
	if ns > 1 {
		bufs[1] = h.x.scratchBuf(3, most)
	}
	lo, hi := h.seg(0, ne, ns)
	in := bufs[0][:hi-lo]
	if err := h.x.recv(peer, step0, in); err != nil {
		return err
	}
	for k := 0; ; k++ {
		var next pending
		var nlo, nhi int
		if k+1 < ns {
			nlo, nhi = h.seg(k+1, ne, ns)
			next = h.x.goRecv(peer, step0+k+1, bufs[(k+1)%2][:nhi-nlo])
		}
		combine(acc[lo:hi], in, theirsLower, h.dt, h.op)
		if next == nil {
			return nil
		}
		if err := next.wait(); err != nil {
			return err
		}
		lo, hi, in = nlo, nhi, bufs[(k+1)%2][:nhi-nlo]
	}
}

// fold: ranks that sit out hand their vector to their partner, which reduces
// it into its own (the sitting-out rank is the lower side).
func (h *hd) fold(buf []byte) error {
	if h.rel >= 2*h.f.rem {
		return nil
	}
	if h.v < 0 {
		return h.sendSegs(h.rank(h.rel+1), hdStepFold, buf).wait()
	}
	return h.recvReduce(h.rank(h.rel-1), hdStepFold, buf, true)
}

// halve is the distribution phase: on return vrank v holds final segment v
// reduced over all ranks.
func (h *hd) halve(buf []byte) error {
	v := h.v
	for mask, round := h.f.p/2, 0; mask > 0; mask, round = mask>>1, round+1 {
		base := v &^ (2*mask - 1)
		lo, mid, hi := h.off(base), h.off(base+mask), h.off(base+2*mask)
		keep, out := buf[lo:mid], buf[mid:hi]
		if v&mask != 0 {
			keep, out = out, keep
		}
		w := v ^ mask
		peer, step := h.real(w), hdStepHalve+round*hdMaxSeg
		sp := h.sendSegs(peer, step, out)
		err := h.recvReduce(peer, step, keep, w < v)
		if serr := sp.wait(); err == nil {
			err = serr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// allgather is figure 7's collection: in round k vrank v and v^2^k swap the
// 2^k segments each holds.
func (h *hd) allgather(buf []byte) error {
	v := h.v
	for mask, round := 1, 0; mask < h.f.p; mask, round = mask<<1, round+1 {
		w := v ^ mask
		mine, theirs := v&^(mask-1), w&^(mask-1)
		peer, step := h.real(w), hdStepGather+round
		if err := h.x.sendRecv(peer, step, buf[h.off(mine):h.off(mine+mask)],
			peer, step, buf[h.off(theirs):h.off(theirs+mask)]); err != nil {
			return err
		}
	}
	return nil
}

// gatherTop is figure 6's collection toward vrank p-1. Figure 6 gathers at
// number 0: with u = p-1-v, in round k u receives from u+2^k when u mod
// 2^(k+1) == 0, and the sender stops. u holds u-range [u, u+2^k), which is
// v-range (v-2^k, v].
func (h *hd) gatherTop(buf []byte) error {
	v := h.v
	u := h.f.p - 1 - v
	for mask, round := 1, 0; mask < h.f.p; mask, round = mask<<1, round+1 {
		step := hdStepGather + round
		if u&mask != 0 {
			return h.x.send(h.real(v+mask), step, buf[h.off(v-mask+1):h.off(v+1)])
		}
		if err := h.x.recv(h.real(v-mask), step, buf[h.off(v-2*mask+1):h.off(v-mask+1)]); err != nil {
			return err
		}
	}
	return nil
}

// allreduceHD: buf (count elements of dt, in place) ends holding the
// reduction over all ranks on every rank, bitwise identical on all ranks.
func allreduceHD(x *execCtx, buf []byte, count int, dt DataType, op RedOp) error {
	h := newHD(x, dt, op, 0)
	h.count = count
	if err := h.fold(buf); err != nil {
		return err
	}
	if h.v >= 0 {
		if err := h.halve(buf); err != nil {
			return err
		}
		if op == Avg {
			kernel.DivideBy(buf[h.off(h.v):h.off(h.v+1)], dt, h.f.n)
		}
		if err := h.allgather(buf); err != nil {
			return err
		}
	}
	// Unfold: the partners hand the finished vector to the ranks that sat out.
	if h.rel < 2*h.f.rem {
		if h.v < 0 {
			return x.recv(h.rank(h.rel+1), hdStepUnfold, buf)
		}
		return x.send(h.rank(h.rel-1), hdStepUnfold, buf)
	}
	return nil
}

// reduceHD: acc holds this rank's contribution; on return root's acc holds
// the full reduction (divided by n for Avg); other ranks' acc contents are
// unspecified. Ranks are renumbered relative to root+1, so that the root is
// relative rank n-1: it never sits out (n-1 ≥ 2·(n-p)) and is vrank p-1,
// where the collection ends.
func reduceHD(x *execCtx, acc []byte, count int, dt DataType, op RedOp, root int) error {
	h := newHD(x, dt, op, root+1)
	h.count = count
	if err := h.fold(acc); err != nil || h.v < 0 {
		return err
	}
	if err := h.halve(acc); err != nil {
		return err
	}
	if err := h.gatherTop(acc); err != nil {
		return err
	}
	if op == Avg && x.rank() == root {
		kernel.DivideBy(acc, dt, h.f.n)
	}
	return nil
}

// reduceScatterHD: work holds size*recvcount elements (a private copy of the
// send buffer); on return work's block rank (recvcount elements at offset
// rank*recvcount*es) holds the reduced block for this rank, not divided for
// Avg. Other blocks are unspecified.
//
// The sitting-out ranks fold their whole vector into their partner. The
// halving then runs over the p active ranks on segments made of whole blocks:
// vrank s's segment is the blocks of the ranks folded into it (ranks 2s and
// 2s+1 for s < rem, rank s+rem otherwise). These are contiguous and in rank
// order, so the halving leaves every active rank with its own block, and
// vranks below rem with their partner's block too, which they then send to it.
func reduceScatterHD(x *execCtx, work []byte, recvcount int, dt DataType, op RedOp) error {
	h := newHD(x, dt, op, 0)
	h.rs, h.block = true, recvcount*dt.Size()
	if err := h.fold(work); err != nil {
		return err
	}
	if h.v >= 0 {
		if err := h.halve(work); err != nil {
			return err
		}
	}
	if h.rel < 2*h.f.rem {
		r := h.rel
		if h.v < 0 {
			return x.recv(r+1, hdStepUnfold, work[r*h.block:(r+1)*h.block])
		}
		return x.send(r-1, hdStepUnfold, work[(r-1)*h.block:r*h.block])
	}
	return nil
}
