package sched

// BruckAllToAll aggregates small blocks (the baseline of docs/design/aggregated-alltoall.md): after a
// local rotation, block i is bound for rank r+i; in the round for digit
// position w = radix^p and digit d, every block whose p-th base-radix digit
// of i is d travels d·w ranks forward in one message. That is
// (radix-1)·ceil(log_radix n) messages per rank instead of n-1, each
// carrying about n/radix blocks.
//
// Tmp holds three areas of n blocks: the rotated blocks, the packed
// outgoing message and the incoming one. Packing copies runs of
// consecutive blocks (digit d of i is constant over runs of w).
func BruckAllToAll(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, bs := p.N, p.Count*p.ElemSize
	radix := p.Radix
	if radix < 2 {
		radix = 2
	}
	rounds := 0
	for w := 1; w < n; w *= radix {
		for d := 1; d < radix && d*w < n; d++ {
			rounds++
		}
	}
	tmp := func(i, k int) Range { return Range{Buf: Tmp, Off: i * bs, Len: k * bs} }
	out := func(i, k int) Range { return Range{Buf: Tmp, Off: (n + i) * bs, Len: k * bs} }
	in := func(i, k int) Range { return Range{Buf: Tmp, Off: (2*n + i) * bs, Len: k * bs} }
	s := New(AllToAll, "bruck", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		// Rotation: tmp block i = In block r+i (two contiguous runs).
		e.copy(0, Range{Buf: In, Off: r * bs, Len: (n - r) * bs}, tmp(0, n-r))
		e.copy(0, Range{Buf: In, Off: 0, Len: r * bs}, tmp(n-r, r))
		step := 0
		for w := 1; w < n; w *= radix {
			for d := 1; d < radix && d*w < n; d++ {
				// Blocks with digit d: runs [j, j+w) for j ≡ d·w mod radix·w.
				k := 0
				for j := d * w; j < n; j += radix * w {
					run := min(w, n-j)
					e.copy(step, tmp(j, run), out(k, run))
					k += run
				}
				to, from := mod(r+d*w, n), mod(r-d*w, n)
				e.send(to, uint32(step), step, out(0, k), 1)
				e.recv(from, uint32(step), step, in(0, k))
				k = 0
				for j := d * w; j < n; j += radix * w {
					run := min(w, n-j)
					e.copy(step, in(k, run), tmp(j, run))
					k += run
				}
				step++
			}
		}
		// Block i now came from rank r-i.
		for i := 0; i < n; i++ {
			e.copy(max(rounds-1, 0), tmp(i, 1), work(mod(r-i, n)*bs, bs))
		}
	})
	s.WorkLen, s.InLen, s.TmpLen = n*bs, n*bs, 3*n*bs
	s.Rounds = max(rounds, 1)
	return s, nil
}
