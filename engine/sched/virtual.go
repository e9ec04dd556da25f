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
	bcast := p.N
	if p.Coll == Reduce {
		if root := VirtualRoot(p.Devices); p.Root != root {
			return nil, fmt.Errorf("sched: virtual reduce to rank %d, but the chain ends on rank %d", p.Root, root)
		}
		bcast = 1
	}
	n, total := p.N, p.Count*p.ElemSize
	hops := VirtualChain(p.Devices)
	slot := make([]int, m) // device → its place among its rank's devices
	most := 0
	for r := 0; r < n; r++ {
		local := LocalDevices(p.Devices, r)
		for k, v := range local {
			slot[v] = k
		}
		most = max(most, len(local))
	}
	seg := p.SegBytes
	if seg <= 0 {
		seg = virtualChunk
	}
	seg = max(seg/p.ElemSize, 1) * p.ElemSize
	chunks := 0
	if total > 0 {
		chunks = (total + seg - 1) / seg
	}
	last := hops[len(hops)-1].Rank
	// The broadcast's order: the last hop's rank, then the ranks below
	// it, wrapping around.
	down := make([]int, n)
	for i := range down {
		down[i] = mod(last-i, n)
	}
	j := len(hops)
	steps := j + n - 1 // tags per chunk: j hops, then n-1 broadcast receives
	s := New(p.Coll, "virtual-chain", n, p.ElemSize, func(r int, yield func(Op) bool) {
		var ops []Op
		for c := 0; c < chunks; c++ {
			lo, hi := Segment(c, total, p.ElemSize, chunks)
			part := work(lo, hi-lo)
			contrib := func(v int) Range {
				return Range{Buf: In, Off: slot[v]*total + lo, Len: hi - lo}
			}
			tag := func(step int) uint32 { return uint32(c*steps + step) }
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
					if p.Avg && m > 1 {
						ops = append(ops, Op{Kind: Scale, Dst: part, Div: m, Round: round})
					}
					if bcast > 1 {
						ops = append(ops, Op{Kind: Send, Peer: down[1], Tag: tag(j), Src: part, Round: round})
					}
				}
			}
			for i := 1; i < bcast; i++ {
				if down[i] != r {
					continue
				}
				round := c + j - 1 + i
				ops = append(ops, Op{Kind: Recv, Peer: down[i-1], Tag: tag(j + i - 1), Dst: part, Round: round - 1})
				if i+1 < n {
					ops = append(ops, Op{Kind: Send, Peer: down[i+1], Tag: tag(j + i), Src: part, Round: round})
				}
			}
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
	s.WorkLen, s.InLen = total, most*total
	if chunks > 0 {
		s.Rounds = chunks + j + bcast - 2
	}
	return s, nil
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
