package sched

// Pipelined halving–doubling (docs/design/halving-doubling.md).
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
// Mapping of figure 8A/8B's per-rank loop onto the schedule below:
//
//   - pv = pu XOR (1<<i)                  → w := v ^ mask in halve
//   - l = length/2^(i+1), ls = l/slice[i] → the kept/sent halves, cut into
//     nseg(elems) segments by element (Segment: sizes differ by at most one
//     element)
//   - adjust = ±1 (which side of the pair this rank is on) → TheirsFirst:
//     whether the partner's partial is the left operand of the reduction
//   - send 810/838 at b_send, advancing   → one Send op with Segs segments:
//     the executor streams them in order on one goroutine (two sends to one
//     peer must not overlap, and the per-peer stream is FIFO)
//   - receive 812 before the loop         → the executor's synchronous
//     receive of segment 0 of a RecvReduce
//   - loop: receive 840 of slice j+1 concurrently with reduce 842 of slice j
//     → the executor posts the receive of segment k+1 into the other of two
//     scratch buffers, then reduces segment k
//   - the final reduce after the last exchange (824 → 842) → the last
//     segment, after which no receive is posted.
//
// Two details differ from the figures. The figures interleave the sent and
// kept slices (b_send/b_recv step by 2·ls); here the halves are contiguous,
// as in the description of figure 3 (the lower rank keeps the first half),
// so that the collection phase moves contiguous ranges. And the halving runs
// its masks from p/2 down to 1 (claim 4 only asks for a mask not used before)
// so that vrank v ends owning segment v: then the collection phase of figures
// 6/7, with k ascending, merges contiguous neighbours, and reduce-scatter can
// give rank r block r. The next round's send waits for the reduction that
// produces its data (a read-after-write hazard on the kept half), as the
// document allows.
//
// Ranks beyond p first fold their vector into a partner (among the first
// 2·(n-p) ranks, each even one hands its data to the odd one above) and
// receive their result at the end. Every element is reduced along a fixed
// tree, always as (lower side's partial) op (higher side's partial), by
// exactly one rank; the collection phase only copies. So results repeat
// bitwise run to run and are identical on every rank.

const (
	hdMaxSeg    = 64        // most segments per round; also the stride of tags
	hdAutoMaxQ  = 8         // most segments per round when q is chosen by size
	hdSegTarget = 128 << 10 // segment size aimed at when q is chosen by size

	// Tags: each message of one collective gets its own, computed the same
	// way on both sides. Rounds are fewer than 64, so ranges don't meet.
	hdStepFold   = 0       // + segment
	hdStepHalve  = 1 << 12 // + round*hdMaxSeg + segment
	hdStepGather = 2 << 12 // + round
	hdStepUnfold = 3 << 12
)

// foldLayout maps ranks onto the largest power of two p ≤ n (MPICH's
// scheme): among the first 2·(n-p) ranks, each even rank hands its data to
// the odd rank above it and sits out; the rest renumber densely.
type foldLayout struct{ n, p, rem int }

func newFold(n int) foldLayout {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	return foldLayout{n, p, n - p}
}

// vrank is r's number among the p active ranks, or -1 if r sits out.
func (f foldLayout) vrank(r int) int {
	if r < 2*f.rem {
		if r%2 == 0 {
			return -1
		}
		return r / 2
	}
	return r - f.rem
}

// real is the rank behind active number v.
func (f foldLayout) real(v int) int {
	if v < f.rem {
		return 2*v + 1
	}
	return v + f.rem
}

func log2(p int) int {
	k := 0
	for 1<<k < p {
		k++
	}
	return k
}

// hd is a halving–doubling run's shape, shared by all ranks.
type hd struct {
	p     Params
	es    int
	f     foldLayout
	shift int // rank = mod(rel + shift, n): relative numbering (reduce puts its root at p-1)

	// Final segment layout: vrank s ends owning bytes [off(s), off(s+1)).
	rs    bool // reduce-scatter: segment s is the blocks of the ranks folded into vrank s
	count int  // otherwise count elements are cut into p near-equal segments
	block int  // reduce-scatter block size in bytes

	// Rounds of each phase (the cost model's clock): a segmented op takes
	// as many rounds as it has segments.
	foldRounds int
	halveBase  []int // first round of each halving round; len log2(p)+1
}

func newHD(p Params, shift int) *hd {
	f := newFold(p.N)
	return &hd{p: p, es: p.ElemSize, f: f, shift: mod(shift, p.N)}
}

// layoutRounds fixes the rounds each phase takes, from the largest message
// of the phase (segment counts only grow with size).
func (h *hd) layoutRounds(total int) {
	if h.f.rem > 0 {
		h.foldRounds = h.nseg(total / h.es)
	}
	r := h.foldRounds
	h.halveBase = append(h.halveBase[:0], r)
	for mask := h.f.p / 2; mask > 0; mask >>= 1 {
		most := 0
		for base := 0; base < h.f.p; base += 2 * mask {
			most = max(most, h.off(base+mask)-h.off(base), h.off(base+2*mask)-h.off(base+mask))
		}
		r += h.nseg(most / h.es)
		h.halveBase = append(h.halveBase, r)
	}
}

func (h *hd) rank(rel int) int { return mod(rel+h.shift, h.f.n) }
func (h *hd) real(v int) int   { return h.rank(h.f.real(v)) }

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
// Params.Segments if set, else about hdSegTarget bytes each, at most
// hdAutoMaxQ; never more than elems (but at least one message, possibly
// empty, so both sides always agree on what is sent).
func (h *hd) nseg(elems int) int {
	q := h.p.Segments
	if q <= 0 {
		q = min(max((elems*h.es+hdSegTarget-1)/hdSegTarget, 1), hdAutoMaxQ)
	}
	return max(min(q, hdMaxSeg, elems), 1)
}

// segsOf is nseg for a range of bytes.
func (h *hd) segsOf(r Range) int { return h.nseg(r.Len / h.es) }

// fold: ranks that sit out hand their vector to their partner, which reduces
// it into its own (the sitting-out rank is the lower side).
func (h *hd) fold(e *emitter, rel, v int, buf Range) {
	if rel >= 2*h.f.rem {
		return
	}
	if v < 0 {
		e.send(h.rank(rel+1), hdStepFold, 0, buf, h.segsOf(buf))
		return
	}
	e.recvReduce(h.rank(rel-1), hdStepFold, 0, buf, h.segsOf(buf), true)
}

// halve is the distribution phase: afterwards vrank v holds final segment v
// reduced over all ranks.
func (h *hd) halve(e *emitter, v int) {
	for mask, round := h.f.p/2, 0; mask > 0; mask, round = mask>>1, round+1 {
		base := v &^ (2*mask - 1)
		lo, mid, hi := h.off(base), h.off(base+mask), h.off(base+2*mask)
		keep, out := work(lo, mid-lo), work(mid, hi-mid)
		if v&mask != 0 {
			keep, out = out, keep
		}
		w := v ^ mask
		peer, tag := h.real(w), uint32(hdStepHalve+round*hdMaxSeg)
		at := h.halveBase[round]
		e.send(peer, tag, at, out, h.segsOf(out))
		e.recvReduce(peer, tag, at, keep, h.segsOf(keep), w < v)
	}
}

// gatherAll is figure 7's collection: in round k vrank v and v^2^k swap the
// 2^k segments each holds.
func (h *hd) gatherAll(e *emitter, v, round0 int) {
	for mask, round := 1, 0; mask < h.f.p; mask, round = mask<<1, round+1 {
		w := v ^ mask
		mine, theirs := v&^(mask-1), w&^(mask-1)
		peer, tag := h.real(w), uint32(hdStepGather+round)
		e.send(peer, tag, round0+round, work(h.off(mine), h.off(mine+mask)-h.off(mine)), 1)
		e.recv(peer, tag, round0+round, work(h.off(theirs), h.off(theirs+mask)-h.off(theirs)))
	}
}

// gatherTop is figure 6's collection toward vrank p-1. Figure 6 gathers at
// number 0: with u = p-1-v, in round k u receives from u+2^k when u mod
// 2^(k+1) == 0, and the sender stops. u holds u-range [u, u+2^k), which is
// v-range (v-2^k, v].
func (h *hd) gatherTop(e *emitter, v, round0 int) {
	u := h.f.p - 1 - v
	for mask, round := 1, 0; mask < h.f.p; mask, round = mask<<1, round+1 {
		tag := uint32(hdStepGather + round)
		if u&mask != 0 {
			e.send(h.real(v+mask), tag, round0+round, work(h.off(v-mask+1), h.off(v+1)-h.off(v-mask+1)), 1)
			return
		}
		e.recv(h.real(v-mask), tag, round0+round, work(h.off(v-2*mask+1), h.off(v-mask+1)-h.off(v-2*mask+1)))
	}
}

func (h *hd) collectRounds() int { return log2(h.f.p) }

// HDAllReduce: Work (Count elements, in place) ends holding the reduction
// over all ranks on every rank, bitwise identical on all ranks.
func HDAllReduce(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	h := newHD(p, 0)
	h.count = p.Count
	total := p.Count * p.ElemSize
	h.layoutRounds(total)
	gather := h.halveBase[len(h.halveBase)-1]
	unfold := gather + h.collectRounds()
	s := New(AllReduce, "hd", p.N, p.ElemSize, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		rel := mod(rank-h.shift, p.N)
		v := h.f.vrank(rel)
		buf := work(0, total)
		h.fold(e, rel, v, buf)
		if v >= 0 {
			h.halve(e, v)
			if p.Avg {
				e.scale(gather, work(h.off(v), h.off(v+1)-h.off(v)), p.N)
			}
			h.gatherAll(e, v, gather)
		}
		// Unfold: the partners hand the finished vector to the ranks that sat out.
		if rel < 2*h.f.rem {
			if v < 0 {
				e.recv(h.rank(rel+1), hdStepUnfold, unfold, buf)
			} else {
				e.send(h.rank(rel-1), hdStepUnfold, unfold, buf, 1)
			}
		}
	})
	s.WorkLen = total
	s.Rounds = unfold
	if h.f.rem > 0 {
		s.Rounds++
	}
	return s, nil
}

// HDReduce: Work holds this rank's contribution; on return root's Work holds
// the full reduction (divided by N for Avg); other ranks' Work is
// unspecified. Ranks are renumbered relative to root+1, so that the root is
// relative rank n-1: it never sits out (n-1 ≥ 2·(n-p)) and is vrank p-1,
// where the collection ends.
func HDReduce(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	h := newHD(p, p.Root+1)
	h.count = p.Count
	total := p.Count * p.ElemSize
	h.layoutRounds(total)
	gather := h.halveBase[len(h.halveBase)-1]
	s := New(Reduce, "hd", p.N, p.ElemSize, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		rel := mod(rank-h.shift, p.N)
		v := h.f.vrank(rel)
		h.fold(e, rel, v, work(0, total))
		if v < 0 {
			return
		}
		h.halve(e, v)
		h.gatherTop(e, v, gather)
		if p.Avg && rank == p.Root {
			e.scale(gather+max(h.collectRounds()-1, 0), work(0, total), p.N)
		}
	})
	s.WorkLen = total
	s.Rounds = gather + h.collectRounds()
	return s, nil
}

// HDReduceScatter: Work holds N·Count elements (a private copy of the
// input); on return Work's block rank (Count elements at rank·Count·es)
// holds the reduced block for this rank (divided by N for Avg). Other
// blocks are unspecified.
//
// The sitting-out ranks fold their whole vector into their partner. The
// halving then runs over the p active ranks on segments made of whole blocks:
// vrank s's segment is the blocks of the ranks folded into it (ranks 2s and
// 2s+1 for s < rem, rank s+rem otherwise). These are contiguous and in rank
// order, so the halving leaves every active rank with its own block, and
// vranks below rem with their partner's block too, which they then send to it.
func HDReduceScatter(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	h := newHD(p, 0)
	h.rs, h.block = true, p.Count*p.ElemSize
	total := p.N * h.block
	h.layoutRounds(total)
	unfold := h.halveBase[len(h.halveBase)-1]
	s := New(ReduceScatter, "hd", p.N, p.ElemSize, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		v := h.f.vrank(rank)
		h.fold(e, rank, v, work(0, total))
		if v >= 0 {
			h.halve(e, v)
		}
		if rank < 2*h.f.rem {
			if v < 0 {
				e.recv(rank+1, hdStepUnfold, unfold, work(rank*h.block, h.block))
			} else {
				e.send(rank-1, hdStepUnfold, unfold, work((rank-1)*h.block, h.block), 1)
			}
		}
		if p.Avg {
			e.scale(unfold, work(rank*h.block, h.block), p.N)
		}
	})
	s.WorkLen = total
	s.Rounds = unfold + 1
	return s, nil
}
