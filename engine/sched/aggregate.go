package sched

import (
	"fmt"
	"slices"
)

// AggregateAllToAll is document 001's aggregation: the all-to-all as the
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
	if err := p.check(); err != nil {
		return nil, err
	}
	n, bs := p.N, p.Count*p.ElemSize
	src, err := groupsOf(p.SrcGroups, p.Group, n, "source")
	if err != nil {
		return nil, err
	}
	dst, err := groupsOf(p.DstGroups, p.Group, n, "destination")
	if err != nil {
		return nil, err
	}
	A, B := len(src), len(dst)
	groupOf := func(gs [][]int) []int {
		g := make([]int, n)
		for i, members := range gs {
			for _, r := range members {
				g[r] = i
			}
		}
		return g
	}
	srcOf, dstOf := groupOf(src), groupOf(dst)
	// The repacker of sub-matrix (a, b) is a rank of source group a, the
	// group's ranks taking its columns in turn: with hosts as groups the
	// first stage stays inside a host and only the second crosses the
	// network.
	rep := func(a, b int) int { return src[a][b%len(src[a])] }
	packOff := make([]int, B) // in blocks
	for b := 1; b < B; b++ {
		packOff[b] = packOff[b-1] + len(dst[b-1])
	}
	unpackOff := make([]int, A)
	for a := 1; a < A; a++ {
		unpackOff[a] = unpackOff[a-1] + len(src[a-1])
	}
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
	blk := func(buf Buf, i, k int) Range { return Range{Buf: buf, Off: i * bs, Len: k * bs} }
	tag := func(k, stage int) uint32 { return uint32(3*k + stage) }
	s := New(AllToAll, "aggregate", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		a0 := srcOf[r]
		offs := repackOff[r]
		// Stage 1, sending: this rank's blocks for each destination group,
		// straight from In when the group is a run of ranks.
		outgoing := func(b int) Range {
			if lo, ok := run(dst[b]); ok {
				return blk(In, lo, len(dst[b]))
			}
			return blk(Tmp, packOff[b], len(dst[b]))
		}
		inArea := func(k int) int { return offs[k] }
		outArea := func(k int) int { return offs[k] + len(src[k/B])*len(dst[k%B]) }
		for b := range B {
			if _, ok := run(dst[b]); !ok {
				for j, d := range dst[b] {
					e.copy(0, blk(In, d, 1), blk(Tmp, packOff[b]+j, 1))
				}
			}
		}
		// Stage 1 in sub-matrix order: sends of this rank's rows, receives
		// of the sub-matrices it repacks.
		for k := range A * B {
			a, b := k/B, k%B
			width := len(dst[b])
			if a == a0 {
				i := slices.Index(src[a], r)
				if rep(a, b) == r {
					e.copy(0, outgoing(b), blk(Tmp, inArea(k)+i*width, width))
				} else {
					e.send(rep(a, b), tag(k, 0), 0, outgoing(b), 1)
				}
			}
			if rep(a, b) == r {
				for i, s := range src[a] {
					if s != r {
						e.recv(s, tag(k, 0), 0, blk(Tmp, inArea(k)+i*width, width))
					}
				}
			}
		}
		// Repack: transpose each sub-matrix to destination-major order.
		for k := range A * B {
			a, b := k/B, k%B
			if rep(a, b) != r {
				continue
			}
			h, w := len(src[a]), len(dst[b])
			for i := range h {
				for j := range w {
					e.copy(1, blk(Tmp, inArea(k)+i*w+j, 1), blk(Tmp, outArea(k)+j*h+i, 1))
				}
			}
		}
		// Stage 2 in sub-matrix order: sends of the rows of destination
		// blocks this rank repacked, receives of this rank's column.
		incoming := func(a int) Range {
			if lo, ok := run(src[a]); ok {
				return blk(Work, lo, len(src[a]))
			}
			return blk(Tmp, n+unpackOff[a], len(src[a]))
		}
		b0 := dstOf[r]
		for k := range A * B {
			a, b := k/B, k%B
			h := len(src[a])
			if rep(a, b) == r {
				if relay {
					whole := blk(Tmp, outArea(k), h*len(dst[b]))
					if via := relayer(a, b); via == r {
						e.copy(1, whole, blk(Tmp, relayOff[r][k], h*len(dst[b])))
					} else {
						e.send(via, tag(k, 1), 1, whole, 1)
					}
				} else {
					for j, d := range dst[b] {
						row := blk(Tmp, outArea(k)+j*h, h)
						if d == r {
							e.copy(1, row, incoming(a))
						} else {
							e.send(d, tag(k, 1), 1, row, 1)
						}
					}
				}
			}
			if relay {
				if relayer(a, b) == r && rep(a, b) != r {
					e.recv(rep(a, b), tag(k, 1), 1, blk(Tmp, relayOff[r][k], h*len(dst[b])))
				}
			} else if b == b0 && rep(a, b) != r {
				e.recv(rep(a, b), tag(k, 1), 1, incoming(a))
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
							e.copy(2, row, incoming(a))
						} else {
							e.send(d, tag(k, 2), 2, row, 1)
						}
					}
				} else if b == b0 {
					e.recv(via, tag(k, 2), 2, incoming(a))
				}
			}
		}
		for a := range A {
			if _, ok := run(src[a]); !ok {
				for i, s := range src[a] {
					e.copy(3, blk(Tmp, n+unpackOff[a]+i, 1), blk(Work, s, 1))
				}
			}
		}
	})
	s.WorkLen, s.InLen, s.TmpLen = n*bs, n*bs, tmpBlocks*bs
	s.Rounds = 4
	return s, nil
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
