package sched

// Ring collectives (docs/design/virtual-devices.md). Ranks form a ring: the position after
// rank r's is its successor. A reduce-scatter takes N-1 steps in which
// every rank passes one block to its successor and folds the block it
// receives into its own copy (the source's first N-1 iterations, "the
// received values are added"); an allgather takes N-1 more steps that pass
// the finished blocks on unchanged (the second N-1 iterations, "the
// received values replace"). Each block is reduced in the same order on
// every run, so results are reproducible, and the allgather only copies,
// so every rank ends bitwise identical.
//
// Params.Rings may give several ring orders (the link-disjoint rings of a
// topology): the vector is split into one part per ring and the rings run
// side by side. Their operations are interleaved step by step, ring by
// ring, the same way on every rank, so two rings that share a directed
// pair keep its messages in the same order on both sides.

// ringTag keeps the rings' tags apart (for readers of a trace; FIFO order
// already matches them).
const ringTag = 1 << 20

// blockFn gives the byte ranges of block i of a ring (in position space):
// parts(i) ranges, range(i, j) the j-th. Most blocks are one range;
// hierarchical forms gather several. Not a callback per range: builders
// run for every rank of 4,096-rank schedules, and closures per operation
// would allocate.
type blockFn struct {
	parts func(i int) int
	at    func(i, j int) Range
}

// one is a blockFn of single ranges.
func one(f func(i int) Range) blockFn {
	return blockFn{parts: func(int) int { return 1 }, at: func(i, _ int) Range { return f(i) }}
}

// ring is one rank's view of a ring group: the ranks in ring order and its
// own position, and how blocks are cut into messages.
type ring struct {
	order      []int
	me         int
	next, prev int
	es         int // element size: messages are cut at element boundaries
}

func newRing(order []int, me, es int) ring {
	n := len(order)
	return ring{order: order, me: me, next: order[mod(me+1, n)], prev: order[mod(me-1, n)], es: es}
}

func (g ring) n() int { return len(g.order) }

// Ring messages are cut into segments of about ringSegTarget bytes (at most
// ringMaxSeg), each its own operation: then step s+1 may forward segment j
// as soon as segment j of step s is reduced, instead of waiting for the
// whole block, which keeps a slow link busy across the steps instead of
// idle between them. A block too small for two such segments is still cut
// into up to ringMinSegs of at least ringSegFloor bytes: without that,
// every step of a 64 KiB-block ring waits for the whole block to cross
// (measured across emulated hosts: docs/performance.md).
// The reductions and their order are the same.
const (
	ringSegTarget = 64 << 10
	ringMaxSeg    = 16
	ringMinSegs   = 4
	ringSegFloor  = 8 << 10
)

// cut returns how many segments a range of n bytes becomes.
func (g ring) cut(n int) int {
	elems := n / g.es
	ns := max((n+ringSegTarget-1)/ringSegTarget, min(ringMinSegs, n/ringSegFloor))
	return max(min(ns, ringMaxSeg, elems), 1)
}

func (g ring) send(e *emitter, r Range, tag uint32, round int) {
	ns := g.cut(r.Len)
	for k := 0; k < ns; k++ {
		lo, hi := Segment(k, r.Len, g.es, ns)
		e.send(g.next, tag, round, Range{r.Buf, r.Off + lo, hi - lo}, 1)
	}
}

func (g ring) recv(e *emitter, r Range, tag uint32, round int, reduce bool) {
	ns := g.cut(r.Len)
	for k := 0; k < ns; k++ {
		lo, hi := Segment(k, r.Len, g.es, ns)
		seg := Range{r.Buf, r.Off + lo, hi - lo}
		if reduce {
			e.recvReduce(g.prev, tag, round, seg, 1, false)
		} else {
			e.recv(g.prev, tag, round, seg)
		}
	}
}

// rsStep is step s of a ring reduce-scatter. With shift 0 position p ends
// owning block p+1 (where an allreduce's allgather starts); with shift -1
// it ends owning block p.
func (g ring) rsStep(e *emitter, s int, blk blockFn, shift int, tag uint32, round int) {
	n := g.n()
	sb, rb := mod(g.me-s+shift, n), mod(g.me-s-1+shift, n)
	for j := 0; j < blk.parts(sb); j++ {
		g.send(e, blk.at(sb, j), tag, round)
	}
	for j := 0; j < blk.parts(rb); j++ {
		g.recv(e, blk.at(rb, j), tag, round, true)
	}
}

// agStep is step s of a ring allgather in which position p starts owning
// block p+1+shift.
func (g ring) agStep(e *emitter, s int, blk blockFn, shift int, tag uint32, round int) {
	n := g.n()
	sb, rb := mod(g.me+1+shift-s, n), mod(g.me+shift-s, n)
	for j := 0; j < blk.parts(sb); j++ {
		g.send(e, blk.at(sb, j), tag, round)
	}
	for j := 0; j < blk.parts(rb); j++ {
		g.recv(e, blk.at(rb, j), tag, round, false)
	}
}

// ringSetup is what the flat ring builders share: ring orders and this
// rank's place on each.
type ringSetup struct {
	p     Params
	rings [][]int
	pos   [][]int
}

func newRingSetup(p Params) ringSetup {
	rings := p.rings()
	return ringSetup{p: p, rings: rings, pos: positions(rings)}
}

func (rs ringSetup) ring(k, rank int) ring {
	return newRing(rs.rings[k], rs.pos[k][rank], rs.p.ElemSize)
}

// RingAllReduce is the ring allreduce: reduce-scatter then allgather, 2(N-1)
// steps, each rank sending 2·L·(N-1)/N bytes.
func RingAllReduce(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, es := p.N, p.ElemSize
	rs := newRingSetup(p)
	parts := ChunkBlocks(p.Count, len(rs.rings), es)
	// chunks[k][i]: block i of ring k's part, in position space.
	chunks := make([][]Block, len(parts))
	for k, part := range parts {
		chunks[k] = ChunkBlocks(part.Len/es, n, es)
		for i := range chunks[k] {
			chunks[k][i].Off += part.Off
		}
	}
	s := New(AllReduce, "ring", n, es, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		if n == 1 {
			e.scale(0, work(0, p.Count*es), 1)
			return
		}
		blks := make([]blockFn, len(rs.rings))
		rings := make([]ring, len(rs.rings))
		for k := range rs.rings {
			blks[k] = one(func(i int) Range { return work(chunks[k][i].Off, chunks[k][i].Len) })
			rings[k] = rs.ring(k, rank)
		}
		for s := 0; s < n-1; s++ {
			for k := range rings {
				rings[k].rsStep(e, s, blks[k], 0, uint32(s+k*ringTag), s)
			}
		}
		if p.Avg {
			for k := range rs.rings {
				own := chunks[k][mod(rs.pos[k][rank]+1, n)]
				e.scale(n-2, work(own.Off, own.Len), n)
			}
		}
		for s := 0; s < n-1; s++ {
			for k := range rings {
				rings[k].agStep(e, s, blks[k], 0, uint32(n+s+k*ringTag), n-1+s)
			}
		}
	})
	s.WorkLen = p.Count * es
	s.Rounds = 2 * (n - 1)
	return s, nil
}

// subBlocks cuts every rank's block of bytes into one sub-block per ring:
// ring k moves sub-block k of every block.
func subBlocks(count, es, rings int) []Block { return ChunkBlocks(count, rings, es) }

// RingReduceScatter leaves block r (Count elements) of the reduction on
// rank r, in N-1 steps.
func RingReduceScatter(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, es, bs := p.N, p.ElemSize, p.Count*p.ElemSize
	rs := newRingSetup(p)
	sub := subBlocks(p.Count, es, len(rs.rings))
	s := New(ReduceScatter, "ring", n, es, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		for s := 0; s < n-1; s++ {
			for k := range rs.rings {
				order := rs.rings[k]
				blk := one(func(i int) Range { return work(order[i]*bs+sub[k].Off, sub[k].Len) })
				rs.ring(k, rank).rsStep(e, s, blk, -1, uint32(s+k*ringTag), s)
			}
		}
		if p.Avg {
			e.scale(max(n-2, 0), work(rank*bs, bs), n)
		}
	})
	s.WorkLen = n * bs
	s.Rounds = max(n-1, 1)
	return s, nil
}

// RingAllGather passes every rank's block (Count elements, already in
// place at rank·block) around the ring in N-1 steps.
func RingAllGather(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, es, bs := p.N, p.ElemSize, p.Count*p.ElemSize
	rs := newRingSetup(p)
	sub := subBlocks(p.Count, es, len(rs.rings))
	s := New(AllGather, "ring", n, es, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		for s := 0; s < n-1; s++ {
			for k := range rs.rings {
				order := rs.rings[k]
				blk := one(func(i int) Range { return work(order[i]*bs+sub[k].Off, sub[k].Len) })
				rs.ring(k, rank).agStep(e, s, blk, -1, uint32(s+k*ringTag), s)
			}
		}
	})
	s.WorkLen = n * bs
	s.Rounds = n - 1
	return s, nil
}
