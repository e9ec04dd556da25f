package sched

// DisseminationBarrier: in round k every rank signals rank+2^k and waits
// for rank-2^k; after ceil(log2 n) rounds everyone has heard, directly or
// through others, from everyone. Messages are empty, so no byte range
// orders the rounds: a Sync closes each one.
func DisseminationBarrier(p Params) (*Schedule, error) {
	if p.N < 1 {
		return nil, p.check()
	}
	n := p.N
	s := New(Barrier, "dissemination", n, max(p.ElemSize, 1), func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		for d, k := 1, 0; d < n; d, k = d*2, k+1 {
			e.send(mod(r+d, n), uint32(k), k, Range{}, 1)
			e.recv(mod(r-d, n), uint32(k), k, Range{})
			e.sync(k)
		}
	})
	s.Rounds = log2(n)
	return s, nil
}
