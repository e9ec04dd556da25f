package sched

// chainSeg is the chain broadcast's default segment size.
const chainSeg = 256 << 10

// ChainBroadcast passes segments down the chain root → root+1 → …, so
// every link carries the message once and all links are busy at the same
// time: the rank at distance v forwards segment k in round k+v while it
// receives segment k+1.
func ChainBroadcast(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, total := p.N, p.Count*p.ElemSize
	seg := p.segBytes()
	nseg := (total + seg - 1) / seg
	s := New(Broadcast, "pipeline", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		v := mod(r-p.Root, n)
		prev, next := mod(r-1, n), mod(r+1, n)
		for k := 0; k < nseg; k++ {
			part := work(k*seg, min(seg, total-k*seg))
			if v != 0 {
				e.recv(prev, uint32(k), k+v-1, part)
			}
			if v != n-1 {
				e.send(next, uint32(k), k+v, part, 1)
			}
		}
	})
	s.WorkLen = total
	s.Rounds = max(nseg+n-2, 0)
	return s, nil
}

// segBytes is the chain's segment size: Params.SegBytes, else 256 KiB,
// rounded down to whole elements.
func (p Params) segBytes() int {
	seg := p.SegBytes
	if seg <= 0 {
		seg = chainSeg
	}
	return max(seg/p.ElemSize, 1) * p.ElemSize
}
