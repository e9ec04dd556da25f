package sched

import "slices"

// LeaderAllToAll is the aggregation of docs/design/aggregated-alltoall.md, with every sub-matrix of a
// source sub-group given to one repacking rank, the group's first rank
// (its leader), which also relays what its own destination group
// receives. The document allows it ("a single aggregator can process
// blocks of several sub-matrices"); it trades the spread of repacking work
// for the fewest messages:
//
//  1. each rank sends its whole row to its source group's leader (one
//     message; the leader copies its own);
//  2. the leader transposes the rows of its group into one sub-matrix per
//     destination group, ordered by destination, and sends each to that
//     group's leader (one message per pair of groups);
//  3. each destination leader lays out, per member, the rows of every
//     source group that are for that member and sends each member one
//     message.
//
// With the hosts as sub-groups, H hosts of R ranks exchange H·(H-1)
// messages across the network and 2·H·(R-1) inside the hosts, against
// N·(N-1) for the pairwise exchange and N·⌈log₂N⌉ for Bruck: on 4 hosts ×
// 4 ranks 36 messages (12 across hosts), where Bruck sends 64 (44),
// AggregateAllToAll's spread assignment 108 (48) and pairwise 240 (192).
// Where every message costs a process wake-up (many ranks sharing cores)
// the count decides; every byte travels three times, so it is for small
// blocks.
//
// Groups are Params.SrcGroups and DstGroups (default: runs of ⌈√N⌉, as
// AggregateAllToAll); blocks of groups that are not runs of ranks are
// packed and unpacked at the edges.
func LeaderAllToAll(p Params) (*Schedule, error) {
	g, err := newAggPlan(p)
	if err != nil {
		return nil, err
	}
	n, bs := g.n, g.bs
	src, dst := g.src, g.dst
	// Rows travel in destination-group order, deliveries in source-group
	// order: straight from In and into Work when those orders are the
	// ranks' own.
	rowOrder, inOrder := slices.Concat(dst...), slices.Concat(src...)
	rowIsIn, inIsWork := identity(rowOrder), identity(inOrder)
	hmax, wmax := 0, 0
	for _, s := range src {
		hmax = max(hmax, len(s))
	}
	for _, d := range dst {
		wmax = max(wmax, len(d))
	}
	// Tmp, in blocks: the packed row [0, n), the deliveries before
	// unpacking [n, 2n); on leaders the group's rows (rows, by source then
	// destination), its sub-matrices (subs, per destination group by
	// destination then source), the relayed sub-matrices (relayed, per
	// source group by member then source) and the deliveries being laid
	// out (out, per member n blocks by source).
	rows := 2 * n
	subs := rows + hmax*n
	relayed := subs + hmax*n
	out := relayed + wmax*n
	blk := g.blk
	row := func() Range {
		if rowIsIn {
			return blk(In, 0, n)
		}
		return blk(Tmp, 0, n)
	}
	delivery := func() Range {
		if inIsWork {
			return blk(Work, 0, n)
		}
		return blk(Tmp, n, n)
	}
	s := New(AllToAll, "aggregate-leader", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		a0, b0 := g.srcOf[r], g.dstOf[r]
		srcLead, dstLead := src[a0][0], dst[b0][0]
		h := len(src[a0])
		if !rowIsIn {
			for k, d := range rowOrder {
				e.copy(0, blk(In, d, 1), blk(Tmp, k, 1))
			}
		}
		// Stage 1: rows to the source leader.
		if r != srcLead {
			e.send(srcLead, 0, 0, row(), 1)
		} else {
			e.copy(0, row(), blk(Tmp, rows, n))
			for i := 1; i < h; i++ {
				e.recv(src[a0][i], 0, 0, blk(Tmp, rows+i*n, n))
			}
			// Transpose: sub-matrix b holds, per destination j of
			// group b, the blocks of every source i of this group.
			for b := range dst {
				w := len(dst[b])
				for i := range h {
					for j := range w {
						e.copy(1, blk(Tmp, rows+i*n+g.packOff[b]+j, 1), blk(Tmp, subs+h*g.packOff[b]+j*h+i, 1))
					}
				}
			}
		}
		// Stage 2: sub-matrices between leaders, in destination-group
		// order on the sender and source-group order on the receiver, so
		// two leaders that exchange both ways agree on the order.
		if r == srcLead {
			for b := range dst {
				sub := blk(Tmp, subs+h*g.packOff[b], h*len(dst[b]))
				if lead := dst[b][0]; lead == r {
					e.copy(1, sub, blk(Tmp, relayed+len(dst[b])*g.unpackOff[a0], h*len(dst[b])))
				} else {
					e.send(lead, 1, 1, sub, 1)
				}
			}
		}
		if r != dstLead {
			e.recv(dstLead, 2, 2, delivery())
		} else {
			w := len(dst[b0])
			for a := range src {
				if lead := src[a][0]; lead != r {
					e.recv(lead, 1, 1, blk(Tmp, relayed+w*g.unpackOff[a], len(src[a])*w))
				}
			}
			// Stage 3: each member's blocks from every source group,
			// laid out in source order, one message each.
			for j, d := range dst[b0] {
				for a := range src {
					ha := len(src[a])
					e.copy(2, blk(Tmp, relayed+w*g.unpackOff[a]+j*ha, ha), blk(Tmp, out+j*n+g.unpackOff[a], ha))
				}
				if d == r {
					e.copy(2, blk(Tmp, out+j*n, n), delivery())
				} else {
					e.send(d, 2, 2, blk(Tmp, out+j*n, n), 1)
				}
			}
		}
		if !inIsWork {
			for k, s := range inOrder {
				e.copy(3, blk(Tmp, n+k, 1), blk(Work, s, 1))
			}
		}
	})
	s.WorkLen, s.InLen, s.TmpLen = n*bs, n*bs, (out+wmax*n)*bs
	s.Rounds = 4
	return s, nil
}

// identity says whether order lists 0, 1, 2, … in turn.
func identity(order []int) bool {
	for i, r := range order {
		if r != i {
			return false
		}
	}
	return true
}
