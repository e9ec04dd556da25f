//go:build linux

package shmcoll

import (
	"context"
	"fmt"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
)

// ChainAllReduce is the virtual allreduce of two ranks (docs/virtual.md)
// whose virtual devices form two runs in device order: rank first hosts
// devices 0…k-1, the other rank devices k…M-1. in holds this rank's
// devices' vectors of len(recv) bytes back to back, in device order; every
// rank gets ((x0 op x1) op x2) … op x(M-1) in recv, divided by div once
// when div > 1 (Avg over M devices), bit for bit what the chain schedule
// (sched.VirtualAllReduce) computes on the same placement.
//
// The partial sums go through the slots instead of messages: the first
// rank folds its devices into its slot, the other folds that slot and its
// own devices into its slot and recv in one pass per cache block, and the
// first copies the result out of it. Against the schedule over the
// shared-memory transport, that saves the copies into and out of the
// transport's rings in both directions and the separate passes of each
// device's fold. The vector goes in pieces so both ranks fold at once.
func (a *Arena) ChainAllReduce(ctx context.Context, c Call, in []byte, local int, recv []byte, first int, dt kernel.DataType, op kernel.RedOp, div int) error {
	n := len(recv)
	switch {
	case a.size != 2:
		return fmt.Errorf("%w: chain allreduce: %d ranks (two only)", ErrInvalid, a.size)
	case first < 0 || first > 1:
		return fmt.Errorf("%w: chain allreduce: first rank %d of 2", ErrInvalid, first)
	case local < 1 || len(in) != local*n:
		return fmt.Errorf("%w: chain allreduce: %d bytes of input for %d devices of %d bytes", ErrInvalid, len(in), local, n)
	case div < 1:
		return fmt.Errorf("%w: chain allreduce: divisor %d", ErrInvalid, div)
	case overlaps(in, recv):
		return fmt.Errorf("%w: chain allreduce: input and recv overlap", ErrInvalid)
	}
	if err := checkTypes("chain allreduce", n, dt, op); err != nil {
		return err
	}
	if err := a.begin(c, n, desc(kindChain, dt, op, first)); err != nil {
		return err
	}
	defer a.end()
	if n == 0 {
		return nil
	}
	es := dt.Size()
	pieces := max(min(chainPieces, n/chainMinPiece, n/es), 1)
	for (n+pieces-1)/pieces > a.slot {
		pieces++
	}
	if cap(a.chainTerms) < local+1 {
		a.chainTerms = make([][]byte, local+1)
	}
	// Step t: the first rank folds piece t into its slot, the second
	// folds piece t-1 out of the first's slot (the other set), and the
	// first copies piece t-2's result out of the second's slot (this
	// step's set, written in step t-1); a barrier ends each step but
	// the last. Each slot is written two steps after its last reader
	// passed a barrier, as the pieces of the other collectives are.
	isFirst := a.rank == first
	other := a.segs[1-a.rank]
	for t := 0; t <= pieces+1; t++ {
		set, err := a.nextSet(ctx)
		if err != nil {
			return err
		}
		if isFirst && t < pieces {
			lo, hi := sched.Segment(t, n, es, pieces)
			terms := a.chainTerms[:0]
			for k := range local {
				terms = append(terms, in[k*n+lo:k*n+hi])
			}
			dst := a.me.slots[set][:hi-lo]
			if local == 1 {
				copy(dst, terms[0])
			} else {
				fold(dst, nil, nil, terms, dt, op, 1)
			}
		}
		if isFirst && t >= 2 {
			lo, hi := sched.Segment(t-2, n, es, pieces)
			copy(recv[lo:hi], other.slots[set][:hi-lo])
		}
		if !isFirst && t >= 1 && t <= pieces {
			lo, hi := sched.Segment(t-1, n, es, pieces)
			terms := append(a.chainTerms[:0], other.slots[1-set][:hi-lo])
			for k := range local {
				terms = append(terms, in[k*n+lo:k*n+hi])
			}
			fold(a.me.slots[1-set][:hi-lo], recv[lo:hi], nil, terms, dt, op, div)
		}
		if t == pieces+1 {
			break
		}
		if err := a.barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}
