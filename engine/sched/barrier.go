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

// RDBarrier: the ranks of recursive doubling exchange empty messages —
// ranks past the largest power of two p first signal their neighbour,
// then log2(p) rounds of rank XOR 2^k among p, then the neighbours hear
// back — so every rank hears, directly or through others, from every
// rank. Its peers are DoublingPeers, which every communicator connects
// when it is made: a barrier opens no connection, where dissemination's
// rank±2^k would open up to 2·log2(n) more.
func RDBarrier(p Params) (*Schedule, error) {
	if p.N < 1 {
		return nil, p.check()
	}
	n := p.N
	s := New(Barrier, "rd", n, max(p.ElemSize, 1), func(r int, yield func(Op) bool) {
		doublingBarrier(&emitter{yield: yield}, r, n, 0, 0)
	})
	s.Rounds = doublingRounds(n)
	return s, nil
}

// DoublingPeers are the ranks rank r of n exchanges with in recursive
// doubling and halving–doubling (RDAllReduce, HDAllReduce, RDBarrier):
// its neighbour when r folds (r < 2·(n-p), p the largest power of two
// not above n), then the active rank v XOR 2^k for each k, v being r's
// number among the p active ones. The relation is symmetric.
func DoublingPeers(r, n int) []int {
	f := newFold(n)
	v := f.vrank(r)
	if v < 0 {
		return []int{r + 1}
	}
	var out []int
	if r < 2*f.rem {
		out = append(out, r-1)
	}
	for mask := 1; mask < f.p; mask <<= 1 {
		out = append(out, f.real(v^mask))
	}
	return out
}

// doublingRounds is the rounds doublingBarrier takes among n ranks.
func doublingRounds(n int) int { return log2(newFold(n).p) + 2 }

// doublingBarrier emits RDBarrier's rounds for rank r of n, numbered from
// round base, with tags from tag.
func doublingBarrier(e *emitter, r, n, base int, tag uint32) {
	f := newFold(n)
	v := f.vrank(r)
	folds := r < 2*f.rem
	if folds && v < 0 {
		e.send(r+1, tag, base, Range{}, 1)
	} else if folds {
		e.recv(r-1, tag, base, Range{})
	}
	e.sync(base)
	k := 1
	for mask := 1; mask < f.p; mask, k = mask<<1, k+1 {
		if v >= 0 {
			peer := f.real(v ^ mask)
			e.send(peer, tag+uint32(k), base+k, Range{}, 1)
			e.recv(peer, tag+uint32(k), base+k, Range{})
		}
		e.sync(base + k)
	}
	if folds && v < 0 {
		e.recv(r+1, tag+uint32(k), base+k, Range{})
	} else if folds {
		e.send(r-1, tag+uint32(k), base+k, Range{}, 1)
	}
	e.sync(base + k)
}

// agreeTag is the tag base of Agreed's closing round, above any data tag.
const agreeTag = 1 << 30

// Agreed appends a barrier (RDBarrier's) to what b builds. Its messages
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
			doublingBarrier(e, r, n, base+1, agreeTag)
		}
		s.Rounds = base + 1 + doublingRounds(n)
		return s, nil
	}
}
