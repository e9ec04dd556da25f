package sched

// RDAllReduce is recursive doubling: log2(p) exchanges of the whole vector,
// for messages where latency, not bandwidth, decides. Ranks beyond the
// largest power of two p fold into a partner first and get the result back
// at the end (foldLayout). In each exchange both partners compute
// (lower rank's partial) op (higher rank's partial), so every rank ends
// with the same bytes.
func RDAllReduce(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, total := p.N, p.Count*p.ElemSize
	f := newFold(n)
	rounds := log2(f.p)
	s := New(AllReduce, "rd", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		buf := work(0, total)
		v := f.vrank(r)
		if r < 2*f.rem {
			if v < 0 {
				e.send(r+1, 0, 0, buf, 1)
			} else {
				e.recvReduce(r-1, 0, 0, buf, 1, true)
			}
		}
		step := 1
		if v >= 0 {
			for mask := 1; mask < f.p; mask <<= 1 {
				peer := f.real(v ^ mask)
				e.send(peer, uint32(step), step, buf, 1)
				e.recvReduce(peer, uint32(step), step, buf, 1, peer < r)
				step++
			}
			if p.Avg {
				e.scale(step-1, buf, n)
			}
		} else {
			step += rounds
		}
		if r < 2*f.rem {
			if v < 0 {
				e.recv(r+1, uint32(step), step, buf)
			} else {
				e.send(r-1, uint32(step), step, buf, 1)
			}
		}
	})
	s.WorkLen = total
	s.Rounds = rounds + 2
	return s, nil
}
