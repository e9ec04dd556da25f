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
	n, bs := g.n, g.bs
	src, dst := g.src, g.dst
	A, B := len(src), len(dst)
	// The repacker of sub-matrix (a, b) is a rank of source group a, the
	// group's ranks taking its columns in turn: with hosts as groups the
	// first stage stays inside a host and only the second crosses the
	// network.
	rep := func(a, b int) int { return src[a][b%len(src[a])] }
	// Tmp: the packed first-stage messages (n blocks, by destination
	// group), the unpacking area of the second stage (n blocks, by source
	// group), then per sub-matrix this rank repacks an "in" area (by
	// source, then destination) and an "out" area (by destination, then
	// source).
	repackOff := make([]map[int]int, n) // per rank: sub-matrix → first block of its in area
	tmpBlocks := 2 * n
	for k := range A * B {
		a, b := k/B, k%B
		r := rep(a, b)
		if repackOff[r] == nil {
			repackOff[r] = map[int]int{}
		}
		end := 2 * n
		for _, o := range repackOff[r] {
			end = max(end, o)
		}
		for k2, o := range repackOff[r] {
			end = max(end, o+2*len(src[k2/B])*len(dst[k2%B]))
		}
		repackOff[r][k] = end
		tmpBlocks = max(tmpBlocks, end+2*len(src[a])*len(dst[b]))
	}
	// With Relay, the repacker sends the whole transposed sub-matrix to one
	// rank of the destination group (the groups' ranks take the source
	// groups in turn), which hands each member its row: one message per
	// pair of groups crosses the network instead of one per destination.
	relay := p.Relay
	relayer := func(a, b int) int { return dst[b][a%len(dst[b])] }
	relayOff := make([]map[int]int, n) // per rank: sub-matrix → its relay area
	if relay {
		next := make([]int, n)
		for r := range n {
			next[r] = tmpBlocks
		}
		for k := range A * B {
			a, b := k/B, k%B
			r := relayer(a, b)
			if relayOff[r] == nil {
				relayOff[r] = map[int]int{}
			}
			relayOff[r][k] = next[r]
			next[r] += len(src[a]) * len(dst[b])
		}
		tmpBlocks = max(tmpBlocks, slices.Max(next))
	}
	blk := g.blk
	s := New(AllToAll, "aggregate", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		a0 := g.srcOf[r]
		offs := repackOff[r]
		inArea := func(k int) int { return offs[k] }
		outArea := func(k int) int { return offs[k] + len(src[k/B])*len(dst[k%B]) }
		g.pack(e)
		// Stage 1 in sub-matrix order: sends of this rank's rows, receives
		// of the sub-matrices it repacks.
		for k := range A * B {
			a, b := k/B, k%B
			if a == a0 {
				g.stage1Send(e, r, k, rep(a, b), 0, inArea(k))
			}
			if rep(a, b) == r {
				g.stage1Recv(e, r, k, 0, inArea(k))
			}
		}
		// Repack: transpose each sub-matrix to destination-major order.
		for k := range A * B {
			if rep(k/B, k%B) == r {
				g.repack(e, k, 1, inArea(k), outArea(k))
			}
		}
		// Stage 2 in sub-matrix order: sends of the rows of destination
		// blocks this rank repacked, receives of this rank's column.
		b0 := g.dstOf[r]
		for k := range A * B {
			a, b := k/B, k%B
			h := len(src[a])
			if rep(a, b) == r {
				if relay {
					whole := blk(Tmp, outArea(k), h*len(dst[b]))
					if via := relayer(a, b); via == r {
						e.copy(1, whole, blk(Tmp, relayOff[r][k], h*len(dst[b])))
					} else {
						e.send(via, aggTag(k, 1), 1, whole, 1)
					}
				} else {
					g.stage2Send(e, r, k, 1, outArea(k))
				}
			}
			if relay {
				if relayer(a, b) == r && rep(a, b) != r {
					e.recv(rep(a, b), aggTag(k, 1), 1, blk(Tmp, relayOff[r][k], h*len(dst[b])))
				}
			} else if b == b0 && rep(a, b) != r {
				e.recv(rep(a, b), aggTag(k, 1), 1, g.incoming(a))
			}
		}
		// Relay stage: hand each member of the destination group its row.
		if relay {
			for k := range A * B {
				a, b := k/B, k%B
				h := len(src[a])
				via := relayer(a, b)
				if via == r {
					for j, d := range dst[b] {
						row := blk(Tmp, relayOff[r][k]+j*h, h)
						if d == r {
							e.copy(2, row, g.incoming(a))
						} else {
							e.send(d, aggTag(k, 2), 2, row, 1)
						}
					}
				} else if b == b0 {
					e.recv(via, aggTag(k, 2), 2, g.incoming(a))
				}
			}
		}
		g.unpack(e, 3)
	})
	s.WorkLen, s.InLen, s.TmpLen = n*bs, n*bs, tmpBlocks*bs
	s.Rounds = 4
	return s, nil
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
