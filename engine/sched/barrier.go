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

// agreeTag is the tag base of Agreed's closing round, above any data tag.
const agreeTag = 1 << 30

// Agreed appends a dissemination barrier to what b builds. Its messages
// are empty, but every message's header carries the call's signature (in
// the engine: collective, type, count, op, root, algorithm), and no rank
// finishes the barrier without a chain of matching messages from every
// rank. So where ranks disagree about the call — a broadcast whose ranks
// pass different roots exchanges data only along the tree each of them
// believes in, and could leave some with another rank's data and no error
// — some rank sees the difference and fails, and every other rank fails
// with it instead of returning.
func Agreed(b Builder) Builder {
	return func(p Params) (*Schedule, error) {
		s, err := b(p)
		if err != nil || p.N == 1 {
			return s, err
		}
		data, n, base := s.prog, p.N, s.Rounds
		s.prog = func(r int, yield func(Op) bool) {
			stopped := false
			data(r, func(o Op) bool {
				stopped = stopped || !yield(o)
				return !stopped
			})
			e := &emitter{yield: yield, done: stopped}
			e.sync(base)
			for d, k := 1, 0; d < n; d, k = d*2, k+1 {
				e.send(mod(r+d, n), uint32(agreeTag+k), base+k, Range{}, 1)
				e.recv(mod(r-d, n), uint32(agreeTag+k), base+k, Range{})
				e.sync(base + k)
			}
		}
		s.Rounds = base + log2(n)
		return s, nil
	}
}
