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
	l := newLeaderLayout(g)
	return g.schedule("aggregate-leader", l.tmpBlocks, l.program), nil
}

// leaderLayout is where LeaderAllToAll keeps what in each rank's buffers.
type leaderLayout struct {
	*aggPlan
	// Rows travel in destination-group order, deliveries in source-group
	// order: straight from In and into Work when those orders are the
	// ranks' own.
	rowOrder, inOrder []int
	rowIsIn, inIsWork bool
	// Tmp, in blocks: the packed row [0, n), the deliveries before
	// unpacking [n, 2n); on leaders the group's rows (rows, by source then
	// destination), its sub-matrices (subs, per destination group by
	// destination then source), the relayed sub-matrices (relayed, per
	// source group by member then source) and the deliveries being laid
	// out (out, per member n blocks by source).
	rows, subs, relayed, out, tmpBlocks int
}

func newLeaderLayout(g *aggPlan) *leaderLayout {
	n := g.n
	l := &leaderLayout{aggPlan: g, rowOrder: slices.Concat(g.dst...), inOrder: slices.Concat(g.src...)}
	l.rowIsIn, l.inIsWork = identity(l.rowOrder), identity(l.inOrder)
	hmax, wmax := 0, 0
	for _, s := range g.src {
		hmax = max(hmax, len(s))
	}
	for _, d := range g.dst {
		wmax = max(wmax, len(d))
	}
	l.rows = 2 * n
	l.subs = l.rows + hmax*n
	l.relayed = l.subs + hmax*n
	l.out = l.relayed + wmax*n
	l.tmpBlocks = l.out + wmax*n
	return l
}

// row is where this rank's row leaves from, delivery where the blocks
// for it land.
func (l *leaderLayout) row() Range {
	if l.rowIsIn {
		return l.blk(In, 0, l.n)
	}
	return l.blk(Tmp, 0, l.n)
}

func (l *leaderLayout) delivery() Range {
	if l.inIsWork {
		return l.blk(Work, 0, l.n)
	}
	return l.blk(Tmp, l.n, l.n)
}

// program is rank r's operations: pack its row, the three stages (the
// leaders' parts in gather, exchange and deliver), unpack.
func (l *leaderLayout) program(r int, e *emitter) {
	n := l.n
	srcLead, dstLead := l.src[l.srcOf[r]][0], l.dst[l.dstOf[r]][0]
	if !l.rowIsIn {
		for k, d := range l.rowOrder {
			e.copy(0, l.blk(In, d, 1), l.blk(Tmp, k, 1))
		}
	}
	// Stage 1: rows to the source leader.
	if r != srcLead {
		e.send(srcLead, 0, 0, l.row(), 1)
	} else {
		l.gather(r, e)
	}
	// Stage 2: sub-matrices between leaders, in destination-group order
	// on the sender and source-group order on the receiver, so two
	// leaders that exchange both ways agree on the order.
	if r == srcLead {
		l.exchange(r, e)
	}
	if r != dstLead {
		e.recv(dstLead, 2, 2, l.delivery())
	} else {
		l.deliver(r, e)
	}
	if !l.inIsWork {
		for k, s := range l.inOrder {
			e.copy(3, l.blk(Tmp, n+k, 1), l.blk(Work, s, 1))
		}
	}
}

// gather is the source leader r's stage 1: its group's rows, transposed
// into one sub-matrix per destination group holding, per destination j
// of the group, the blocks of every source i of this group.
func (l *leaderLayout) gather(r int, e *emitter) {
	n, a0 := l.n, l.srcOf[r]
	h := len(l.src[a0])
	e.copy(0, l.row(), l.blk(Tmp, l.rows, n))
	for i := 1; i < h; i++ {
		e.recv(l.src[a0][i], 0, 0, l.blk(Tmp, l.rows+i*n, n))
	}
	for b := range l.dst {
		w := len(l.dst[b])
		for i := range h {
			for j := range w {
				e.copy(1, l.blk(Tmp, l.rows+i*n+l.packOff[b]+j, 1), l.blk(Tmp, l.subs+h*l.packOff[b]+j*h+i, 1))
			}
		}
	}
}

// exchange sends the source leader r's sub-matrices to the destination
// leaders (a copy to itself as one).
func (l *leaderLayout) exchange(r int, e *emitter) {
	a0 := l.srcOf[r]
	h := len(l.src[a0])
	for b := range l.dst {
		sub := l.blk(Tmp, l.subs+h*l.packOff[b], h*len(l.dst[b]))
		if lead := l.dst[b][0]; lead == r {
			e.copy(1, sub, l.blk(Tmp, l.relayed+len(l.dst[b])*l.unpackOff[a0], h*len(l.dst[b])))
		} else {
			e.send(lead, 1, 1, sub, 1)
		}
	}
}

// deliver is the destination leader r's part: receive the other leaders'
// sub-matrices, then (stage 3) lay out each member's blocks from every
// source group in source order and send them, one message each.
func (l *leaderLayout) deliver(r int, e *emitter) {
	n, b0 := l.n, l.dstOf[r]
	w := len(l.dst[b0])
	for a := range l.src {
		if lead := l.src[a][0]; lead != r {
			e.recv(lead, 1, 1, l.blk(Tmp, l.relayed+w*l.unpackOff[a], len(l.src[a])*w))
		}
	}
	for j, d := range l.dst[b0] {
		for a := range l.src {
			ha := len(l.src[a])
			e.copy(2, l.blk(Tmp, l.relayed+w*l.unpackOff[a]+j*ha, ha), l.blk(Tmp, l.out+j*n+l.unpackOff[a], ha))
		}
		if d == r {
			e.copy(2, l.blk(Tmp, l.out+j*n, n), l.delivery())
		} else {
			e.send(d, 2, 2, l.blk(Tmp, l.out+j*n, n), 1)
		}
	}
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
