package sched

import "fmt"

// Hierarchical collectives for jobs across hosts (Params.Hosts): the data
// crosses each host's network link once, not once per rank. Inside a host
// the ranks talk through shared memory, which is an order of magnitude
// faster than the network, so the shape that counts is what crosses hosts:
//
//	allreduce      intra-host reduce-scatter into R chunks (local rank l
//	               owns chunk l, reduced over its host) → for every l, a
//	               ring allreduce of chunk l across hosts among the ranks of
//	               local index l (R rings side by side, so every rank drives
//	               its share of the NIC) → intra-host allgather of the chunks.
//	               Each host sends 2·(H-1)/H of the vector, the ring optimum
//	               over H hosts, where a flat ring over all N ranks sends
//	               2·(N-1)/N of it through the busiest host link.
//	allgather      ring allgather across hosts among same-local-index ranks,
//	               then intra-host allgather of what each gathered.
//	reducescatter  intra-host reduce-scatter (local rank l gets the host's
//	               partials of the blocks of every host's local rank l),
//	               then ring reduce-scatter across hosts.
//	broadcast      pipelined chain across hosts among the ranks with the
//	               root's local index, each forwarding every segment along
//	               a chain inside its host.
//
// Every reduction has a fixed order (the ring's) and the last phases only
// copy, so all ranks end bitwise identical.

// Tag bases of the phases; steps within a phase stay below 1<<20.
const (
	hierTag1 = 0
	hierTag2 = 1 << 21
	hierTag3 = 2 << 21
)

// hosts is a placement: H hosts of R ranks, where[rank] = (host, local).
type hosts struct {
	groups [][]int
	h, r   int
	es     int
	host   []int
	local  []int
	// across[l] is the ring across hosts of the ranks of local index l,
	// in host order: built once, not per rank (every rank's program
	// would otherwise allocate H entries, N·H in all: 4 GiB at 65,536
	// ranks of 8 per host).
	across [][]int
}

func newHosts(p Params) (*hosts, error) {
	if len(p.Hosts) == 0 {
		return nil, fmt.Errorf("sched: hierarchical %s needs the ranks of each host", p.Coll)
	}
	hs := &hosts{groups: p.Hosts, h: len(p.Hosts), r: len(p.Hosts[0]), es: p.ElemSize, host: make([]int, p.N), local: make([]int, p.N)}
	seen := make([]bool, p.N)
	for h, g := range p.Hosts {
		if len(g) != hs.r {
			return nil, fmt.Errorf("sched: hierarchical %s needs as many ranks on every host: host 0 has %d, host %d has %d", p.Coll, hs.r, h, len(g))
		}
		for l, rank := range g {
			if rank < 0 || rank >= p.N || seen[rank] {
				return nil, fmt.Errorf("sched: hosts %v are not a partition of 0..%d", p.Hosts, p.N-1)
			}
			seen[rank] = true
			hs.host[rank], hs.local[rank] = h, l
		}
	}
	if hs.h*hs.r != p.N {
		return nil, fmt.Errorf("sched: hosts %v hold %d ranks, not %d", p.Hosts, hs.h*hs.r, p.N)
	}
	hs.across = make([][]int, hs.r)
	for l := range hs.across {
		hs.across[l] = make([]int, hs.h)
		for h := range hs.across[l] {
			hs.across[l][h] = hs.groups[h][l]
		}
	}
	return hs, nil
}

// intra is rank's ring inside its host (local order); cross is its ring
// across hosts among the ranks of its local index (host order).
func (hs *hosts) intra(rank int) ring {
	return newRing(hs.groups[hs.host[rank]], hs.local[rank], hs.es)
}

func (hs *hosts) cross(rank int) ring {
	return newRing(hs.across[hs.local[rank]], hs.host[rank], hs.es)
}

// HierAllReduce: see the file comment.
func HierAllReduce(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	hs, err := newHosts(p)
	if err != nil {
		return nil, err
	}
	es, total := p.ElemSize, p.Count*p.ElemSize
	chunks := ChunkBlocks(p.Count, hs.r, es)
	// sub[l][h]: block h of chunk l for the ring across hosts.
	sub := make([][]Block, hs.r)
	for l, c := range chunks {
		sub[l] = ChunkBlocks(c.Len/es, hs.h, es)
		for h := range sub[l] {
			sub[l][h].Off += c.Off
		}
	}
	r1, r2 := hs.r-1, 2*(hs.h-1)
	s := New(AllReduce, "hier", p.N, es, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		in, l := hs.intra(rank), hs.local[rank]
		chunk := one(func(i int) Range { return work(chunks[i].Off, chunks[i].Len) })
		for s := 0; s < r1; s++ {
			in.rsStep(e, s, chunk, -1, uint32(hierTag1+s), s)
		}
		// Across hosts: a ring allreduce of chunk l.
		x := hs.cross(rank)
		blk := one(func(i int) Range { return work(sub[l][i].Off, sub[l][i].Len) })
		for s := 0; s < hs.h-1; s++ {
			x.rsStep(e, s, blk, 0, uint32(hierTag2+s), r1+s)
		}
		if p.Avg {
			own := sub[l][mod(x.me+1, hs.h)]
			e.scale(r1+max(hs.h-2, 0), work(own.Off, own.Len), p.N)
		}
		for s := 0; s < hs.h-1; s++ {
			x.agStep(e, s, blk, 0, uint32(hierTag2+hs.h+s), r1+hs.h-1+s)
		}
		for s := 0; s < r1; s++ {
			in.agStep(e, s, chunk, -1, uint32(hierTag3+s), r1+r2+s)
		}
	})
	s.WorkLen = total
	s.Rounds = max(2*r1+r2, 1)
	return s, nil
}

// HierAllGather: see the file comment.
func HierAllGather(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	hs, err := newHosts(p)
	if err != nil {
		return nil, err
	}
	bs := p.Count * p.ElemSize
	s := New(AllGather, "hier", p.N, p.ElemSize, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		x := hs.cross(rank)
		blk := one(func(i int) Range { return work(x.order[i]*bs, bs) })
		for s := 0; s < hs.h-1; s++ {
			x.agStep(e, s, blk, -1, uint32(hierTag2+s), s)
		}
		// Inside the host, local position l carries the blocks of every
		// host's local rank l.
		in := hs.intra(rank)
		gathered := blockFn{parts: func(int) int { return hs.h }, at: func(l, h int) Range { return work(hs.groups[h][l]*bs, bs) }}
		for s := 0; s < hs.r-1; s++ {
			in.agStep(e, s, gathered, -1, uint32(hierTag3+s), hs.h-1+s)
		}
	})
	s.WorkLen = p.N * bs
	s.Rounds = max(hs.h+hs.r-2, 1)
	return s, nil
}

// HierReduceScatter: see the file comment.
func HierReduceScatter(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	hs, err := newHosts(p)
	if err != nil {
		return nil, err
	}
	bs := p.Count * p.ElemSize
	s := New(ReduceScatter, "hier", p.N, p.ElemSize, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		in := hs.intra(rank)
		partials := blockFn{parts: func(int) int { return hs.h }, at: func(l, h int) Range { return work(hs.groups[h][l]*bs, bs) }}
		for s := 0; s < hs.r-1; s++ {
			in.rsStep(e, s, partials, -1, uint32(hierTag1+s), s)
		}
		x := hs.cross(rank)
		blk := one(func(i int) Range { return work(x.order[i]*bs, bs) })
		for s := 0; s < hs.h-1; s++ {
			x.rsStep(e, s, blk, -1, uint32(hierTag2+s), hs.r-1+s)
		}
		if p.Avg {
			e.scale(max(hs.r+hs.h-3, 0), work(rank*bs, bs), p.N)
		}
	})
	s.WorkLen = p.N * bs
	s.Rounds = max(hs.h+hs.r-2, 1)
	return s, nil
}

// HierBroadcast: see the file comment. The host chain starts at the root's
// host and each host's chain at the root's local index, so the root sends
// every segment once across hosts and once inside its host.
func HierBroadcast(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	hs, err := newHosts(p)
	if err != nil {
		return nil, err
	}
	total := p.Count * p.ElemSize
	seg := p.segBytes()
	nseg := (total + seg - 1) / seg
	rh, rl := hs.host[p.Root], hs.local[p.Root]
	s := New(Broadcast, "hier", p.N, p.ElemSize, func(rank int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		h, l := hs.host[rank], hs.local[rank]
		v, u := mod(h-rh, hs.h), mod(l-rl, hs.r) // distances along the two chains
		prevHost, nextHost := hs.groups[mod(h-1, hs.h)][l], hs.groups[mod(h+1, hs.h)][l]
		prevLocal, nextLocal := hs.groups[h][mod(l-1, hs.r)], hs.groups[h][mod(l+1, hs.r)]
		for k := 0; k < nseg; k++ {
			part := work(k*seg, min(seg, total-k*seg))
			at := k + v + u
			switch {
			case u == 0 && v != 0:
				e.recv(prevHost, uint32(hierTag2+k), at-1, part)
			case u != 0:
				e.recv(prevLocal, uint32(hierTag3+k), at-1, part)
			}
			if u == 0 && v != hs.h-1 {
				e.send(nextHost, uint32(hierTag2+k), at, part, 1)
			}
			if u != hs.r-1 {
				e.send(nextLocal, uint32(hierTag3+k), at, part, 1)
			}
		}
	})
	s.WorkLen = total
	s.Rounds = max(nseg+hs.h+hs.r-3, 1)
	return s, nil
}
