package sched

import (
	"fmt"
	"slices"
)

// virtualChunk is the virtual allreduce's default chunk: small enough that
// the chain's ranks work on different chunks at once, large enough that a
// chunk's hand-offs (a message, and a wake-up when ranks share cores) cost
// little against its folds; docs/virtual.md has the comparison of sizes.
const virtualChunk = 512 << 10

// Hop is one stop of the virtual allreduce's chain: rank folds the
// contributions of Devices (consecutive, increasing) into the running
// partial sum, in that order.
type Hop struct {
	Rank    int
	Devices []int
}

// VirtualChain is the route of every chunk of the virtual allreduce:
// devices 0, 1, …, M-1 in order, one hop per maximal run of consecutive
// devices on one rank. A block placement visits each rank once; a cyclic
// one hops at every device.
func VirtualChain(devices []int) []Hop {
	var hops []Hop
	for v, r := range devices {
		if n := len(hops); n > 0 && hops[n-1].Rank == r {
			hops[n-1].Devices = append(hops[n-1].Devices, v)
			continue
		}
		hops = append(hops, Hop{Rank: r, Devices: []int{v}})
	}
	return hops
}

// LocalDevices lists the devices placed on rank, increasing: slot k of
// the rank's contributions (In) belongs to device LocalDevices(…)[k].
func LocalDevices(devices []int, rank int) []int {
	var out []int
	for v, r := range devices {
		if r == rank {
			out = append(out, v)
		}
	}
	return out
}

// VirtualAllReduce folds the vectors of M virtual devices placed on N
// ranks (Params.Devices[v] is device v's rank) in device order, ((x0 op
// x1) op x2) … op x(M-1) for every element (divided by M once for Avg),
// and leaves the result in every rank's Work. A rank's In holds its
// devices' vectors of Count elements back to back, in device order.
//
// The vector is cut into chunks, and every chunk travels the chain of
// VirtualChain: the first hop copies its first device's chunk and folds
// in its others; every later hop receives the partial sum, folds in its
// devices one by one and passes it on. The last hop finishes the average
// and the result goes back down a chain broadcast through the other ranks
// (from the last hop's rank to the ranks before it, the links the
// reduction does not use on a block placement). Chunk k's hop j runs in
// round k+j, so with enough chunks every hop is busy: each rank sends its
// partial sum once per visit, and on a block placement a rank's vector
// crosses one link once, whatever its number of devices.
//
// With Params.Coll Reduce the schedule stops at the last hop: only the
// last hop's rank (VirtualRoot) holds the result, for a caller that
// broadcasts it by other means (the engine's shared-memory broadcast).
func VirtualAllReduce(p Params) (*Schedule, error) {
	x, err := newVChain(p)
	if err != nil {
		return nil, err
	}
	s := New(p.Coll, "virtual-chain", p.N, p.ElemSize, func(r int, yield func(Op) bool) {
		var ops []Op
		for c := 0; c < x.chunks; c++ {
			ops = x.chunk(ops, r, c)
		}
		// Program order is round order (stable: a chunk's operations keep
		// theirs), so a rank works on the chunks in the order they reach
		// it and no operation waits for one issued after it.
		slices.SortStableFunc(ops, func(a, b Op) int { return a.Round - b.Round })
		for _, o := range ops {
			if !yield(o) {
				return
			}
		}
	})
	s.WorkLen, s.InLen = x.total, x.most*x.total
	if x.chunks > 0 {
		s.Rounds = x.chunks + len(x.hops) + x.bcast - 2
	}
	return s, nil
}

// vChain is the plan of a virtual allreduce (or reduce): the chain, the
// chunks and the broadcast's order.
type vChain struct {
	p        Params
	m, total int   // devices, vector bytes
	hops     []Hop // VirtualChain
	slot     []int // device → its place among its rank's devices
	most     int   // devices on the fullest rank
	chunks   int
	down     []int // the broadcast's order: the last hop's rank, then the ranks below it, wrapping around
	bcast    int   // ranks the result reaches: N, or 1 for Reduce
	steps    int   // tags per chunk: the hops, then N-1 broadcast receives
}

func newVChain(p Params) (*vChain, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	m := len(p.Devices)
	if m < 1 {
		return nil, fmt.Errorf("sched: virtual allreduce of no devices")
	}
	for v, r := range p.Devices {
		if r < 0 || r >= p.N {
			return nil, fmt.Errorf("sched: virtual device %d on rank %d of %d", v, r, p.N)
		}
	}
	if p.Coll != AllReduce && p.Coll != Reduce {
		return nil, fmt.Errorf("sched: a virtual %s", p.Coll)
	}
	n := p.N
	x := &vChain{p: p, m: m, total: p.Count * p.ElemSize, hops: VirtualChain(p.Devices), slot: make([]int, m), bcast: n}
	if p.Coll == Reduce {
		if root := VirtualRoot(p.Devices); p.Root != root {
			return nil, fmt.Errorf("sched: virtual reduce to rank %d, but the chain ends on rank %d", p.Root, root)
		}
		x.bcast = 1
	}
	for r := 0; r < n; r++ {
		local := LocalDevices(p.Devices, r)
		for k, v := range local {
			x.slot[v] = k
		}
		x.most = max(x.most, len(local))
	}
	seg := p.SegBytes
	if seg <= 0 {
		seg = virtualChunk
	}
	seg = max(seg/p.ElemSize, 1) * p.ElemSize
	if x.total > 0 {
		x.chunks = (x.total + seg - 1) / seg
	}
	last := x.hops[len(x.hops)-1].Rank
	x.down = make([]int, n)
	for i := range x.down {
		x.down[i] = mod(last-i, n)
	}
	x.steps = len(x.hops) + n - 1
	return x, nil
}

// chunk appends rank r's operations on chunk c: its hops of the chain
// (the last finishing the average and starting the broadcast), then its
// part of the broadcast.
func (x *vChain) chunk(ops []Op, r, c int) []Op {
	p, hops, down, n := x.p, x.hops, x.down, x.p.N
	j := len(hops)
	lo, hi := Segment(c, x.total, p.ElemSize, x.chunks)
	part := work(lo, hi-lo)
	contrib := func(v int) Range {
		return Range{Buf: In, Off: x.slot[v]*x.total + lo, Len: hi - lo}
	}
	tag := func(step int) uint32 { return uint32(c*x.steps + step) }
	for h, hop := range hops {
		if hop.Rank != r {
			continue
		}
		round := c + h
		ops = foldHop(ops, hops, h, part, contrib, tag, round)
		switch {
		case h+1 < j:
			ops = append(ops, Op{Kind: Send, Peer: hops[h+1].Rank, Tag: tag(h), Src: part, Round: round})
		default:
			if p.Avg && x.m > 1 {
				ops = append(ops, Op{Kind: Scale, Dst: part, Div: x.m, Round: round})
			}
			if x.bcast > 1 {
				ops = append(ops, Op{Kind: Send, Peer: down[1], Tag: tag(j), Src: part, Round: round})
			}
		}
	}
	for i := 1; i < x.bcast; i++ {
		if down[i] != r {
			continue
		}
		round := c + j - 1 + i
		ops = append(ops, Op{Kind: Recv, Peer: down[i-1], Tag: tag(j + i - 1), Dst: part, Round: round - 1})
		if i+1 < n {
			ops = append(ops, Op{Kind: Send, Peer: down[i+1], Tag: tag(j + i), Src: part, Round: round})
		}
	}
	return ops
}

// VirtualRoot is the rank the virtual chain ends on: the rank of the last
// device.
func VirtualRoot(devices []int) int { return devices[len(devices)-1] }

// inputDevices fills every rank's In with its devices' vectors: device v's
// element i is the leaf (v, i).
func (m *sim) inputDevices() {
	total := m.p.Count
	for r := 0; r < m.s.N; r++ {
		for k, v := range LocalDevices(m.p.Devices, r) {
			for i := 0; i < total; i++ {
				m.bufs[r][In][k*total+i] = m.leaf(v, i)
			}
		}
	}
}

// verifyDevices checks that every rank's Work holds, for every element,
// exactly the fold of the devices in device order (divided by M once for
// Avg): the same expression, node by node, not merely the same leaves.
func (m *sim) verifyDevices(fail func(r int, format string, args ...any) error) error {
	nd := len(m.p.Devices)
	for i := 0; i < m.p.Count; i++ {
		want := m.leaf(0, i)
		for v := 1; v < nd; v++ {
			want = m.id(node{1, want, m.leaf(v, i)})
		}
		if m.p.Avg && nd > 1 {
			want = m.id(node{2, want, int32(nd)})
		}
		for r := 0; r < m.s.N; r++ {
			if m.p.Coll == Reduce && r != m.p.Root {
				continue
			}
			if got := m.bufs[r][Work][i]; got != want {
				return fail(r, "element %d is %s, want %s (the fold in device order)", i, m.show(got), m.show(want))
			}
		}
	}
	return nil
}
