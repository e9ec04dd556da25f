package sched

import (
	"fmt"
	"slices"
)

// AggregateAllToAll is the aggregation of docs/design/aggregated-alltoall.md: the all-to-all as the
// transpose of a distributed N×N block matrix (row s holds rank s's
// blocks, column d what rank d receives), cut into sub-matrices by a
// partition of the ranks into source sub-groups (rows, dh ranks each) and
// one into destination sub-groups (columns, dv ranks each). Each
// sub-matrix (a, b) belongs to a repacking rank: the ranks of source
// group a send it their blocks for group b (one message each, figure 5's
// first stage), it transposes the sub-matrix so the blocks are ordered by
// destination, and sends every rank of group b one contiguous message
// holding the blocks of all of group a (the second stage). A rank thus
// sends one message per destination group and receives one per source
// group, about 2√N messages for dh = dv = √N, against N-1 for the pairwise
// exchange, while every byte travels twice.
//
// Sub-groups need not be contiguous ranks (Params.SrcGroups, DstGroups:
// partitions of 0..N-1, e.g. the hosts); where one is, its blocks are sent
// from the user's buffer and land in it directly, otherwise they are packed
// and unpacked at the edges. The default cuts the ranks into runs of
// ⌈√N⌉ (Params.Group sets the run length; edge groups are smaller).
//
// The repacking rank of sub-matrix (a, b) is in source group a (its ranks
// take the columns in turn). The document's control tree, which pairs
// sub-groups as their ranks arrive, is replaced by this static assignment:
// every rank computes it alike, and the executor already lets each
// repacker start a sub-matrix as soon as its sources' messages are in.
//
// Relay (Params.Relay, set across hosts with the hosts as groups) adds a
// third stage: the repacker sends the whole transposed sub-matrix to one
// rank of the destination group, which hands every member its row, so one
// message per pair of groups crosses the network.
//
// Message order between two ranks is the same on both sides: all
// first-stage messages by increasing sub-matrix, then all second-stage
// ones, then the relays; first-stage sends depend on nothing, and each
// later stage only on earlier ones, so no wait can close a cycle.
func AggregateAllToAll(p Params) (*Schedule, error) {
	g, err := newAggPlan(p)
	if err != nil {
		return nil, err
	}
	l := newAggLayout(g, p.Relay)
	return g.schedule("aggregate", l.tmpBlocks, l.program), nil
}

// aggLayout is the static assignment of an aggregated all-to-all: who
// repacks (and with Relay relays) each sub-matrix, and where its areas lie
// in that rank's Tmp.
type aggLayout struct {
	*aggPlan
	relay bool
	// Tmp: the packed first-stage messages (n blocks, by destination
	// group), the unpacking area of the second stage (n blocks, by source
	// group), then per sub-matrix this rank repacks an "in" area (by
	// source, then destination) and an "out" area (by destination, then
	// source), then with Relay the areas of the sub-matrices it relays.
	repackOff []map[int]int // per rank: sub-matrix → first block of its in area
	relayOff  []map[int]int // per rank: sub-matrix → its relay area
	tmpBlocks int
}

func newAggLayout(g *aggPlan, relay bool) *aggLayout {
	n, src, dst := g.n, g.src, g.dst
	l := &aggLayout{aggPlan: g, relay: relay, repackOff: make([]map[int]int, n), relayOff: make([]map[int]int, n),
		tmpBlocks: 2 * n}
	B := len(dst)
	for k := range g.subs() {
		a, b := k/B, k%B
		r := l.rep(a, b)
		if l.repackOff[r] == nil {
			l.repackOff[r] = map[int]int{}
		}
		end := 2 * n
		for _, o := range l.repackOff[r] {
			end = max(end, o)
		}
		for k2, o := range l.repackOff[r] {
			end = max(end, o+2*len(src[k2/B])*len(dst[k2%B]))
		}
		l.repackOff[r][k] = end
		l.tmpBlocks = max(l.tmpBlocks, end+2*len(src[a])*len(dst[b]))
	}
	if relay {
		next := make([]int, n)
		for r := range n {
			next[r] = l.tmpBlocks
		}
		for k := range g.subs() {
			a, b := k/B, k%B
			r := l.relayer(a, b)
			if l.relayOff[r] == nil {
				l.relayOff[r] = map[int]int{}
			}
			l.relayOff[r][k] = next[r]
			next[r] += len(src[a]) * len(dst[b])
		}
		l.tmpBlocks = max(l.tmpBlocks, slices.Max(next))
	}
	return l
}

// rep is the repacker of sub-matrix (a, b): a rank of source group a, the
// group's ranks taking its columns in turn, so that with hosts as groups
// the first stage stays inside a host and only the second crosses the
// network.
func (l *aggLayout) rep(a, b int) int { return l.src[a][b%len(l.src[a])] }

// relayer is, with Relay, the rank of destination group b that receives
// sub-matrix (a, b) whole and hands each member its row (the group's
// ranks take the source groups in turn): one message per pair of groups
// crosses the network instead of one per destination.
func (l *aggLayout) relayer(a, b int) int { return l.dst[b][a%len(l.dst[b])] }

// in and out are the first blocks of sub-matrix k's areas on its
// repacker r.
func (l *aggLayout) in(r, k int) int  { return l.repackOff[r][k] }
func (l *aggLayout) out(r, k int) int { return l.repackOff[r][k] + l.area(k) }

// program is rank r's operations: pack, stage 1, repack, stage 2, the
// relays, unpack.
func (l *aggLayout) program(r int, e *emitter) {
	B := len(l.dst)
	l.pack(e)
	// Stage 1 in sub-matrix order: sends of this rank's rows, receives
	// of the sub-matrices it repacks.
	for k := range l.subs() {
		a, b := k/B, k%B
		if a == l.srcOf[r] {
			l.stage1Send(e, r, k, l.rep(a, b), 0, l.in(r, k))
		}
		if l.rep(a, b) == r {
			l.stage1Recv(e, r, k, 0, l.in(r, k))
		}
	}
	// Repack: transpose each sub-matrix to destination-major order.
	for k := range l.subs() {
		if l.rep(k/B, k%B) == r {
			l.repack(e, k, 1, l.in(r, k), l.out(r, k))
		}
	}
	l.stage2(r, e)
	if l.relay {
		l.relayStage(r, e)
	}
	l.unpack(e, 3)
}

// stage2 is rank r's second stage, in sub-matrix order: sends of the rows
// of destination blocks it repacked (with Relay, the whole sub-matrix to
// its relayer), receives of its column (with Relay, of the sub-matrices
// it relays).
func (l *aggLayout) stage2(r int, e *emitter) {
	B := len(l.dst)
	for k := range l.subs() {
		a, b := k/B, k%B
		h := len(l.src[a])
		if l.rep(a, b) == r {
			if l.relay {
				whole := l.blk(Tmp, l.out(r, k), h*len(l.dst[b]))
				if via := l.relayer(a, b); via == r {
					e.copy(1, whole, l.blk(Tmp, l.relayOff[r][k], h*len(l.dst[b])))
				} else {
					e.send(via, aggTag(k, 1), 1, whole, 1)
				}
			} else {
				l.stage2Send(e, r, k, 1, l.out(r, k))
			}
		}
		if l.relay {
			if l.relayer(a, b) == r && l.rep(a, b) != r {
				e.recv(l.rep(a, b), aggTag(k, 1), 1, l.blk(Tmp, l.relayOff[r][k], h*len(l.dst[b])))
			}
		} else if b == l.dstOf[r] && l.rep(a, b) != r {
			e.recv(l.rep(a, b), aggTag(k, 1), 1, l.incoming(a))
		}
	}
}

// relayStage hands, on every relayer, each member of the destination
// group its row; the members receive it.
func (l *aggLayout) relayStage(r int, e *emitter) {
	B := len(l.dst)
	for k := range l.subs() {
		a, b := k/B, k%B
		h := len(l.src[a])
		via := l.relayer(a, b)
		if via == r {
			for j, d := range l.dst[b] {
				row := l.blk(Tmp, l.relayOff[r][k]+j*h, h)
				if d == r {
					e.copy(2, row, l.incoming(a))
				} else {
					e.send(d, aggTag(k, 2), 2, row, 1)
				}
			}
		} else if b == l.dstOf[r] {
			e.recv(via, aggTag(k, 2), 2, l.incoming(a))
		}
	}
}

// aggPlan is the shape of an aggregated all-to-all that does not depend on
// who repacks what: the sub-groups, and where blocks are packed and
// unpacked at the edges. The static builder and the control tree's
// decisions (control.go) both turn it into operations.
type aggPlan struct {
	n, es, bs    int
	src, dst     [][]int
	srcOf, dstOf []int
	// In blocks: where each destination group's blocks are packed in Tmp
	// (packOff) and where each source group's blocks are unpacked from
	// (n + unpackOff).
	packOff, unpackOff []int
}

func newAggPlan(p Params) (*aggPlan, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n := p.N
	src, err := groupsOf(p.SrcGroups, p.Group, n, "source")
	if err != nil {
		return nil, err
	}
	dst, err := groupsOf(p.DstGroups, p.Group, n, "destination")
	if err != nil {
		return nil, err
	}
	groupOf := func(gs [][]int) []int {
		g := make([]int, n)
		for i, members := range gs {
			for _, r := range members {
				g[r] = i
			}
		}
		return g
	}
	g := &aggPlan{n: n, es: p.ElemSize, bs: p.Count * p.ElemSize, src: src, dst: dst, srcOf: groupOf(src), dstOf: groupOf(dst)}
	g.packOff = make([]int, len(dst))
	for b := 1; b < len(dst); b++ {
		g.packOff[b] = g.packOff[b-1] + len(dst[b-1])
	}
	g.unpackOff = make([]int, len(src))
	for a := 1; a < len(src); a++ {
		g.unpackOff[a] = g.unpackOff[a-1] + len(src[a-1])
	}
	return g, nil
}

// schedule is the all-to-all whose ranks run program, in four rounds
// (pack, the stages, unpack), with tmpBlocks blocks of Tmp.
func (g *aggPlan) schedule(algo string, tmpBlocks int, program func(r int, e *emitter)) *Schedule {
	s := New(AllToAll, algo, g.n, g.es, func(r int, yield func(Op) bool) {
		program(r, &emitter{yield: yield})
	})
	s.WorkLen, s.InLen, s.TmpLen = g.n*g.bs, g.n*g.bs, tmpBlocks*g.bs
	s.Rounds = 4
	return s
}

// subs is the number of sub-matrices; sub-matrix k is (k/B, k%B).
func (g *aggPlan) subs() int { return len(g.src) * len(g.dst) }

// area is the size in blocks of sub-matrix k's in (or out) area.
func (g *aggPlan) area(k int) int { return len(g.src[k/len(g.dst)]) * len(g.dst[k%len(g.dst)]) }

func (g *aggPlan) blk(buf Buf, i, k int) Range { return Range{Buf: buf, Off: i * g.bs, Len: k * g.bs} }

// aggTag is the tag of sub-matrix k's messages in stage 0 (to the
// repacker), 1 (from it) and 2 (relayed).
func aggTag(k, stage int) uint32 { return uint32(3*k + stage) }

// outgoing is this rank's blocks for destination group b: straight from In
// when the group is a run of ranks, else packed.
func (g *aggPlan) outgoing(b int) Range {
	if lo, ok := run(g.dst[b]); ok {
		return g.blk(In, lo, len(g.dst[b]))
	}
	return g.blk(Tmp, g.packOff[b], len(g.dst[b]))
}

// incoming is where the blocks from source group a land: straight in Work
// when the group is a run of ranks, else in the unpacking area.
func (g *aggPlan) incoming(a int) Range {
	if lo, ok := run(g.src[a]); ok {
		return g.blk(Work, lo, len(g.src[a]))
	}
	return g.blk(Tmp, g.n+g.unpackOff[a], len(g.src[a]))
}

// pack copies this rank's blocks for every destination group that is not
// a run of ranks into the group's packing area (round 0).
func (g *aggPlan) pack(e *emitter) {
	for b := range g.dst {
		if _, ok := run(g.dst[b]); !ok {
			for j, d := range g.dst[b] {
				e.copy(0, g.blk(In, d, 1), g.blk(Tmp, g.packOff[b]+j, 1))
			}
		}
	}
}

// unpack copies the blocks of every source group that is not a run of
// ranks from the unpacking area into Work.
func (g *aggPlan) unpack(e *emitter, round int) {
	for a := range g.src {
		if _, ok := run(g.src[a]); !ok {
			for i, s := range g.src[a] {
				e.copy(round, g.blk(Tmp, g.n+g.unpackOff[a]+i, 1), g.blk(Work, s, 1))
			}
		}
	}
}

// stage1Send hands rank r's row of sub-matrix k to its repacker rep (a
// copy into the in area at block in when r repacks it itself).
func (g *aggPlan) stage1Send(e *emitter, r, k, rep, round, in int) {
	b := k % len(g.dst)
	width := len(g.dst[b])
	if rep == r {
		i := slices.Index(g.src[k/len(g.dst)], r)
		e.copy(round, g.outgoing(b), g.blk(Tmp, in+i*width, width))
	} else {
		e.send(rep, aggTag(k, 0), round, g.outgoing(b), 1)
	}
}

// stage1Recv receives, on sub-matrix k's repacker r, the rows of its other
// sources into the in area at block in.
func (g *aggPlan) stage1Recv(e *emitter, r, k, round, in int) {
	width := len(g.dst[k%len(g.dst)])
	for i, s := range g.src[k/len(g.dst)] {
		if s != r {
			e.recv(s, aggTag(k, 0), round, g.blk(Tmp, in+i*width, width))
		}
	}
}

// repack transposes sub-matrix k from its in area (by source, then
// destination) to its out area (by destination, then source).
func (g *aggPlan) repack(e *emitter, k, round, in, out int) {
	h, w := len(g.src[k/len(g.dst)]), len(g.dst[k%len(g.dst)])
	for i := range h {
		for j := range w {
			e.copy(round, g.blk(Tmp, in+i*w+j, 1), g.blk(Tmp, out+j*h+i, 1))
		}
	}
}

// stage2Send sends every destination of sub-matrix k its row of the out
// area at block out (r's own row is copied where it lands).
func (g *aggPlan) stage2Send(e *emitter, r, k, round, out int) {
	a, b := k/len(g.dst), k%len(g.dst)
	h := len(g.src[a])
	for j, d := range g.dst[b] {
		row := g.blk(Tmp, out+j*h, h)
		if d == r {
			e.copy(round, row, g.incoming(a))
		} else {
			e.send(d, aggTag(k, 1), round, row, 1)
		}
	}
}

// groupsOf checks a partition of 0..n-1 into groups, or cuts the ranks
// into runs of size (0: ⌈√n⌉).
func groupsOf(gs [][]int, size, n int, what string) ([][]int, error) {
	if gs == nil {
		if size <= 0 {
			size = 1
			for size*size < n {
				size++
			}
		}
		for lo := 0; lo < n; lo += size {
			g := make([]int, 0, size)
			for r := lo; r < min(lo+size, n); r++ {
				g = append(g, r)
			}
			gs = append(gs, g)
		}
		return gs, nil
	}
	seen := make([]bool, n)
	count := 0
	for i, g := range gs {
		if len(g) == 0 {
			return nil, fmt.Errorf("sched: %s group %d is empty", what, i)
		}
		for _, r := range g {
			if r < 0 || r >= n || seen[r] {
				return nil, fmt.Errorf("sched: %s groups %v are not a partition of the %d ranks", what, gs, n)
			}
			seen[r] = true
			count++
		}
	}
	if count != n {
		return nil, fmt.Errorf("sched: %s groups %v are not a partition of the %d ranks", what, gs, n)
	}
	return gs, nil
}

// run reports whether g is the consecutive ranks lo, lo+1, ….
func run(g []int) (int, bool) {
	for i, r := range g {
		if r != g[0]+i {
			return 0, false
		}
	}
	return g[0], true
}
