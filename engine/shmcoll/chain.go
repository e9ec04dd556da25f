//go:build linux

package shmcoll

import (
	"context"
	"fmt"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
)

// ChainAllReduce is the virtual allreduce (docs/virtual.md) of ranks whose
// virtual devices form one run each, in device order: rank order[0] hosts
// devices 0…k-1, order[1] the next run, and so on, every rank once. in
// holds this rank's devices' vectors of len(recv) bytes back to back, in
// device order; every rank gets ((x0 op x1) op x2) … op x(M-1) in recv,
// divided by div once when div > 1 (Avg over M devices), bit for bit what
// the chain schedule (sched.VirtualAllReduce) computes on the same
// placement.
//
// The partial sums go through the slots instead of messages: the first
// rank folds its devices into its slot; each next one folds that slot and
// its own devices into its slot (the last into recv too) in one pass per
// cache block; the others copy the result out of the last one's slot.
// Against the schedule over the shared-memory transport, that saves the
// copies into and out of the transport's rings at every hop and the
// separate passes of each device's fold. The vector goes in pieces, so
// the ranks fold different pieces at once.
func (a *Arena) ChainAllReduce(ctx context.Context, c Call, in []byte, local int, recv []byte, order []int, dt kernel.DataType, op kernel.RedOp, div int) error {
	n := len(recv)
	hop, err := a.chainHop(in, local, recv, order, div)
	if err != nil {
		return err
	}
	if err := checkTypes("chain allreduce", n, dt, op); err != nil {
		return err
	}
	if err := a.begin(c, n, desc(kindChain, dt, op, orderKey(order))); err != nil {
		return err
	}
	defer a.end()
	if n == 0 {
		return nil
	}
	es := dt.Size()
	ne := n / es
	pieces := max(min(chainPieces, n/chainMinPiece, ne), 1)
	for (ne+pieces-1)/pieces*es > a.slot { // (sched.Segment's largest piece)
		pieces++
	}
	if cap(a.chainTerms) < local+1 {
		a.chainTerms = make([][]byte, local+1)
	}
	// Step t: hop h folds piece t-h, the hops before the last into their
	// slot of this step's set, the last into the other set's (and recv);
	// the others copy piece t-N out of the last one's slot of this step's
	// set (written in step t-1). A barrier ends each step but the last.
	// So each slot is read in the step after it was written and written
	// again two steps later, after its readers passed a barrier, and the
	// last rank's next call writes the set no rank still reads.
	last := len(order) - 1
	var prev *segment
	if hop > 0 {
		prev = a.segs[order[hop-1]]
	}
	end := a.segs[order[last]]
	for t := 0; t <= pieces+last; t++ {
		set, err := a.nextSet(ctx)
		if err != nil {
			return err
		}
		if q := t - hop; q >= 0 && q < pieces {
			lo, hi := sched.Segment(q, n, es, pieces)
			terms := a.chainTerms[:0]
			if hop > 0 {
				terms = append(terms, prev.slots[1-set][:hi-lo])
			}
			for k := range local {
				terms = append(terms, in[k*n+lo:k*n+hi])
			}
			var dst, out []byte
			switch {
			case hop == last:
				dst, out = a.me.slots[1-set][:hi-lo], recv[lo:hi]
			default:
				dst = a.me.slots[set][:hi-lo]
			}
			if len(terms) == 1 { // the first hop, with one device
				copy(dst, terms[0])
			} else {
				fold(dst, out, nil, terms, dt, op, divAt(hop == last, div))
			}
		}
		if q := t - last - 1; hop != last && q >= 0 && q < pieces {
			lo, hi := sched.Segment(q, n, es, pieces)
			copy(recv[lo:hi], end.slots[set][:hi-lo])
		}
		if t == pieces+last {
			break
		}
		if err := a.barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

// chainHop checks ChainAllReduce's arguments and returns this rank's hop
// (its place in order).
func (a *Arena) chainHop(in []byte, local int, recv []byte, order []int, div int) (int, error) {
	n, hop := len(recv), -1
	if cap(a.chainSeen) < a.size {
		a.chainSeen = make([]bool, a.size)
	}
	seen := a.chainSeen[:a.size]
	clear(seen)
	for h, r := range order {
		if r < 0 || r >= a.size || seen[r] {
			return 0, fmt.Errorf("%w: chain allreduce: order %v is not a permutation of %d ranks", ErrInvalid, order, a.size)
		}
		seen[r] = true
		if r == a.rank {
			hop = h
		}
	}
	switch {
	case a.size < 2:
		return 0, fmt.Errorf("%w: chain allreduce: one rank (no slots to chain through)", ErrInvalid)
	case len(order) != a.size:
		return 0, fmt.Errorf("%w: chain allreduce: order %v is not a permutation of %d ranks", ErrInvalid, order, a.size)
	case local < 1 || len(in) != local*n:
		return 0, fmt.Errorf("%w: chain allreduce: %d bytes of input for %d devices of %d bytes", ErrInvalid, len(in), local, n)
	case div < 1:
		return 0, fmt.Errorf("%w: chain allreduce: divisor %d", ErrInvalid, div)
	case overlaps(in, recv):
		return 0, fmt.Errorf("%w: chain allreduce: input and recv overlap", ErrInvalid)
	}
	return hop, nil
}

// divAt is the divisor of a hop's fold: the average's, at the last hop.
func divAt(last bool, div int) int {
	if last {
		return div
	}
	return 1
}

// orderKey is a chain order as a record's root field (FNV-1a of the
// ranks), so that ranks passing different orders fail instead of folding
// different chains.
func orderKey(order []int) int {
	h := uint32(2166136261)
	for _, r := range order {
		for _, b := range [2]byte{byte(r), byte(r >> 8)} {
			h = (h ^ uint32(b)) * 16777619
		}
	}
	return int(h & 0x7fffffff)
}
