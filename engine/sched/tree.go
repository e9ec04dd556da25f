package sched

// Binomial trees, for latency-bound reduce and broadcast: ranks are
// numbered relative to the root, v = rank - root mod N; in round k, a rank
// whose v has bit k set exchanges with v - 2^k.

// TreeReduce is a binomial tree toward the root: in round k, ranks whose v
// has bit k set send their partial result to v - 2^k and stop. A parent
// folds its children in increasing distance, always as (its partial) op
// (the child's), so the order is fixed.
func TreeReduce(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, total := p.N, p.Count*p.ElemSize
	rounds := log2(n)
	s := New(Reduce, "tree", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		acc := work(0, total)
		v := mod(r-p.Root, n)
		for mask, k := 1, 0; mask < n; mask, k = mask<<1, k+1 {
			if v&mask != 0 {
				e.send(mod(v-mask+p.Root, n), uint32(k), k, acc, 1)
				return
			}
			if v+mask < n {
				e.recvReduce(mod(v+mask+p.Root, n), uint32(k), k, acc, 1, false)
			}
		}
		if p.Avg {
			e.scale(max(rounds-1, 0), acc, n)
		}
	})
	s.WorkLen = total
	s.Rounds = max(rounds, 1)
	return s, nil
}

// TreeBroadcast is a binomial tree from the root: each rank receives once
// from its parent (v with its lowest set bit cleared) and forwards to its
// children, farthest first.
func TreeBroadcast(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, total := p.N, p.Count*p.ElemSize
	rounds := log2(n)
	s := New(Broadcast, "tree", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		buf := work(0, total)
		v := mod(r-p.Root, n)
		// Round of a message to v+mask: the tree's depth so far.
		mask, k := 1, 0
		for mask < n {
			if v&mask != 0 {
				e.recv(mod(v-mask+p.Root, n), 0, rounds-1-k, buf)
				break
			}
			mask, k = mask<<1, k+1
		}
		for mask, k = mask>>1, k-1; mask > 0; mask, k = mask>>1, k-1 {
			if v+mask < n {
				e.send(mod(v+mask+p.Root, n), 0, rounds-1-k, buf, 1)
			}
		}
	})
	s.WorkLen = total
	s.Rounds = rounds
	return s, nil
}
