package sched

import (
	"fmt"
	"slices"
)

// The virtual collectives besides the allreduce (virtual.go): M virtual
// devices placed on N ranks (Params.Devices[v] is device v's rank), a
// rank's In holding its devices' send vectors back to back in device
// order. Where they reduce they fold in device order, ((x0 op x1) op x2)
// … op x(M-1), by the chain of VirtualChain, so the result does not depend
// on the placement; the simulator checks that expression node by node.

// checkVirtual checks the placement of a virtual collective of coll.
func checkVirtual(p Params, coll Coll) error {
	if err := p.check(); err != nil {
		return err
	}
	if p.Coll != coll {
		return fmt.Errorf("sched: a virtual %s built as a %s", p.Coll, coll)
	}
	if len(p.Devices) < 1 {
		return fmt.Errorf("sched: virtual %s of no devices", coll)
	}
	for v, r := range p.Devices {
		if r < 0 || r >= p.N {
			return fmt.Errorf("sched: virtual device %d on rank %d of %d", v, r, p.N)
		}
	}
	return nil
}

// devSlots maps every device to its place among its rank's devices (its
// slot in that rank's In) and returns the most devices any rank hosts.
func devSlots(devices []int, n int) (slot []int, most int) {
	slot = make([]int, len(devices))
	for r := 0; r < n; r++ {
		local := LocalDevices(devices, r)
		for k, v := range local {
			slot[v] = k
		}
		most = max(most, len(local))
	}
	return slot, most
}

// foldBlock is a byte range of every device's vector, folded over the
// devices in order and delivered to rank dest's Work at the same offset.
type foldBlock struct{ off, len, dest int }

// chainFold is the reduction of VirtualReduce and VirtualReduceScatter:
// each block is cut into chunks of at most SegBytes, and every chunk
// travels VirtualChain as in the virtual allreduce (the first hop copies
// its first device's chunk into Work and folds in its others, each later
// hop receives the partial sum and folds in its own). The last hop
// finishes the average and sends the result to the block's destination
// when that is another rank. stride is a device's vector in bytes: device
// v's chunk [lo,hi) is In[slot(v)·stride+lo : slot(v)·stride+hi] on its
// rank.
func chainFold(p Params, name string, stride, workLen int, blocks []foldBlock) *Schedule {
	m := len(p.Devices)
	hops := VirtualChain(p.Devices)
	slot, most := devSlots(p.Devices, p.N)
	seg := p.SegBytes
	if seg <= 0 {
		seg = virtualChunk
	}
	seg = max(seg/p.ElemSize, 1) * p.ElemSize
	type chunk struct{ lo, hi, dest int }
	var chunks []chunk
	for _, b := range blocks {
		if b.len == 0 {
			continue
		}
		k := (b.len + seg - 1) / seg
		for c := 0; c < k; c++ {
			lo, hi := Segment(c, b.len, p.ElemSize, k)
			chunks = append(chunks, chunk{b.off + lo, b.off + hi, b.dest})
		}
	}
	j := len(hops)
	last := hops[j-1].Rank
	steps := j + 1 // tags per chunk: the hops' sends (0…j-2), the delivery (j)
	s := New(p.Coll, name, p.N, p.ElemSize, func(r int, yield func(Op) bool) {
		var ops []Op
		for c, ch := range chunks {
			part := work(ch.lo, ch.hi-ch.lo)
			contrib := func(v int) Range {
				return Range{Buf: In, Off: slot[v]*stride + ch.lo, Len: ch.hi - ch.lo}
			}
			tag := func(step int) uint32 { return uint32(c*steps + step) }
			for h, hop := range hops {
				if hop.Rank != r {
					continue
				}
				round := c + h
				ops = foldHop(ops, hops, h, part, contrib, tag, round)
				if h+1 < j {
					ops = append(ops, Op{Kind: Send, Peer: hops[h+1].Rank, Tag: tag(h), Src: part, Round: round})
					continue
				}
				if p.Avg && m > 1 {
					ops = append(ops, Op{Kind: Scale, Dst: part, Div: m, Round: round})
				}
				if ch.dest != last {
					ops = append(ops, Op{Kind: Send, Peer: ch.dest, Tag: tag(j), Src: part, Round: round})
				}
			}
			if ch.dest != last && ch.dest == r {
				ops = append(ops, Op{Kind: Recv, Peer: last, Tag: tag(j), Dst: part, Round: c + j - 1})
			}
		}
		// Program order is round order, as in the virtual allreduce: a
		// rank takes the chunks in the order they reach it.
		slices.SortStableFunc(ops, func(a, b Op) int { return a.Round - b.Round })
		for _, o := range ops {
			if !yield(o) {
				return
			}
		}
	})
	s.WorkLen, s.InLen = workLen, most*stride
	if len(chunks) > 0 {
		s.Rounds = len(chunks) + j - 1
	}
	return s
}

// foldHop appends hop h's share of one chunk's fold (Work range part):
// the first hop copies its first device's contribution and folds in its
// others; a later hop receives the partial sum (tag h-1) and folds in its
// devices, in order. The running value stays the left operand.
func foldHop(ops []Op, hops []Hop, h int, part Range, contrib func(v int) Range, tag func(step int) uint32, round int) []Op {
	devs := hops[h].Devices
	if h == 0 {
		ops = append(ops, Op{Kind: Copy, Src: contrib(devs[0]), Dst: part, Round: round})
		devs = devs[1:]
	} else {
		ops = append(ops, Op{Kind: Recv, Peer: hops[h-1].Rank, Tag: tag(h - 1), Dst: part, Round: round - 1})
	}
	for _, v := range devs {
		ops = append(ops, Op{Kind: Accumulate, Src: contrib(v), Dst: part, Round: round})
	}
	return ops
}

// VirtualReduce folds the devices' vectors of Count elements in device
// order (divided by M once for Avg) into Work of rank Params.Root, the
// rank of the root device; the other ranks' Work is scratch for the
// partial sums. The chain of VirtualChain ends on the last device's rank,
// which sends the result on when the root is elsewhere.
func VirtualReduce(p Params) (*Schedule, error) {
	if err := checkVirtual(p, Reduce); err != nil {
		return nil, err
	}
	if p.Root < 0 || p.Root >= p.N {
		return nil, fmt.Errorf("sched: virtual reduce to rank %d of %d", p.Root, p.N)
	}
	total := p.Count * p.ElemSize
	return chainFold(p, "virtual-reduce", total, total, []foldBlock{{0, total, p.Root}}), nil
}

// VirtualReduceScatter folds the devices' vectors of M·Count elements in
// device order (divided by M once for Avg) and leaves block v (Count
// elements) of the result in Work[v·Count…] on device v's rank. Work holds
// M·Count elements on every rank: the partial sums travel in it.
func VirtualReduceScatter(p Params) (*Schedule, error) {
	if err := checkVirtual(p, ReduceScatter); err != nil {
		return nil, err
	}
	m, n := len(p.Devices), p.Count*p.ElemSize
	blocks := make([]foldBlock, m)
	for v, r := range p.Devices {
		blocks[v] = foldBlock{v * n, n, r}
	}
	return chainFold(p, "virtual-reducescatter", m*n, m*n, blocks), nil
}

// runs cuts devices (increasing) into runs of consecutive numbers.
func runs(devices []int) [][]int {
	var out [][]int
	for _, v := range devices {
		if k := len(out); k > 0 && out[k-1][len(out[k-1])-1] == v-1 {
			out[k-1] = append(out[k-1], v)
			continue
		}
		out = append(out, []int{v})
	}
	return out
}

// VirtualAllGather leaves every device's vector of Count elements at
// Work[v·Count…] on every rank (M·Count elements): a ring over the ranks
// in which step s forwards the devices of rank r−s, one message per run
// of consecutive devices.
func VirtualAllGather(p Params) (*Schedule, error) {
	if err := checkVirtual(p, AllGather); err != nil {
		return nil, err
	}
	n, np := p.Count*p.ElemSize, p.N
	m := len(p.Devices)
	local := make([][][]int, np) // rank → runs of its devices
	for r := range np {
		local[r] = runs(LocalDevices(p.Devices, r))
	}
	s := New(AllGather, "virtual-allgather", np, p.ElemSize, func(r int, yield func(Op) bool) {
		if n == 0 {
			return
		}
		for k, v := range LocalDevices(p.Devices, r) {
			if !yield(Op{Kind: Copy, Src: Range{Buf: In, Off: k * n, Len: n}, Dst: work(v*n, n)}) {
				return
			}
		}
		next, prev := mod(r+1, np), mod(r-1, np)
		for st := 0; st < np-1; st++ {
			for _, run := range local[mod(r-st, np)] {
				if !yield(Op{Kind: Send, Peer: next, Tag: uint32(run[0]), Src: work(run[0]*n, len(run)*n), Round: st}) {
					return
				}
			}
			for _, run := range local[mod(r-st-1, np)] {
				if !yield(Op{Kind: Recv, Peer: prev, Tag: uint32(run[0]), Dst: work(run[0]*n, len(run)*n), Round: st}) {
					return
				}
			}
		}
	})
	_, most := devSlots(p.Devices, np)
	s.WorkLen, s.InLen = m*n, most*n
	if n > 0 {
		s.Rounds = max(np-1, 1)
	}
	return s, nil
}

// piece is one block of an all-to-all message: n bytes from Src on the
// sender to Dst on the receiver.
type piece struct{ src, dst int }

// VirtualAllToAll sends block w (Count elements) of device v's vector (M
// blocks) to device w, which keeps it as block v of its own: on device
// w's rank at Work[(slot(w)·M + v)·Count…], Work holding the rank's
// devices' results back to back. Every pair of ranks exchanges one
// message, packed in Tmp where its blocks are not one range (devices x of
// the sender in order, then devices w of the receiver in order); blocks
// between devices of one rank are copies.
func VirtualAllToAll(p Params) (*Schedule, error) {
	if err := checkVirtual(p, AllToAll); err != nil {
		return nil, err
	}
	np, m, n := p.N, len(p.Devices), p.Count*p.ElemSize
	x := &vAllToAll{np: np, m: m, n: n, devs: make([][]int, np)}
	var most int
	x.slot, most = devSlots(p.Devices, np)
	for r := range np {
		x.devs[r] = LocalDevices(p.Devices, r)
	}
	tmp := 0
	for r := range np {
		_, _, t := x.tmpAt(r)
		tmp = max(tmp, t)
	}
	s := New(AllToAll, "virtual-alltoall", np, p.ElemSize, func(r int, yield func(Op) bool) {
		if n == 0 {
			return
		}
		for _, o := range x.program(r) {
			if !yield(o) {
				return
			}
		}
	})
	s.WorkLen, s.InLen, s.TmpLen = most*m*n, most*m*n, tmp
	if n > 0 {
		s.Rounds = 1
	}
	return s, nil
}

// vAllToAll is the shape of a virtual all-to-all: np ranks, m devices,
// blocks of n bytes.
type vAllToAll struct {
	np, m, n int
	slot     []int   // device → its place among its rank's devices
	devs     [][]int // rank → its devices
}

// pieces are the blocks rank a sends rank b, in message order.
func (x *vAllToAll) pieces(a, b int) []piece {
	var out []piece
	for _, v := range x.devs[a] {
		for _, w := range x.devs[b] {
			out = append(out, piece{(x.slot[v]*x.m + w) * x.n, (x.slot[w]*x.m + v) * x.n})
		}
	}
	return out
}

// contiguous says whether the pieces' sources (or destinations) are one
// range, and where it starts.
func (x *vAllToAll) contiguous(ps []piece, dst bool) (int, bool) {
	at := func(q piece) int {
		if dst {
			return q.dst
		}
		return q.src
	}
	for i := 1; i < len(ps); i++ {
		if at(ps[i]) != at(ps[i-1])+x.n {
			return 0, false
		}
	}
	return at(ps[0]), true
}

// tmpAt lays out rank r's Tmp: its packed sends to each peer, then its
// packed receives.
func (x *vAllToAll) tmpAt(r int) (sendAt, recvAt []int, total int) {
	np, n := x.np, x.n
	sendAt, recvAt = make([]int, np), make([]int, np)
	for q := range np {
		if q == r {
			continue
		}
		if ps := x.pieces(r, q); len(ps) > 0 {
			if _, ok := x.contiguous(ps, false); !ok {
				sendAt[q], total = total, total+len(ps)*n
			}
		}
	}
	for q := range np {
		if q == r {
			continue
		}
		if ps := x.pieces(q, r); len(ps) > 0 {
			if _, ok := x.contiguous(ps, true); !ok {
				recvAt[q], total = total, total+len(ps)*n
			}
		}
	}
	return sendAt, recvAt, total
}

// program is rank r's operations: the copies between its own devices,
// then per step a message to one peer (packed where its blocks are not
// one range) and from another, then the unpacking copies.
func (x *vAllToAll) program(r int) []Op {
	np, n := x.np, x.n
	sendAt, recvAt, _ := x.tmpAt(r)
	var ops, unpack []Op
	for _, q := range x.pieces(r, r) {
		ops = append(ops, Op{Kind: Copy, Src: Range{Buf: In, Off: q.src, Len: n}, Dst: work(q.dst, n)})
	}
	for st := 1; st < np; st++ {
		to := mod(r+st, np)
		if ps := x.pieces(r, to); len(ps) > 0 {
			src, ok := x.contiguous(ps, false)
			at := Range{Buf: In, Off: src, Len: len(ps) * n}
			if !ok {
				at = Range{Buf: Tmp, Off: sendAt[to], Len: len(ps) * n}
				for i, q := range ps {
					ops = append(ops, Op{Kind: Copy, Src: Range{Buf: In, Off: q.src, Len: n}, Dst: Range{Buf: Tmp, Off: at.Off + i*n, Len: n}})
				}
			}
			ops = append(ops, Op{Kind: Send, Peer: to, Src: at})
		}
		from := mod(r-st, np)
		if ps := x.pieces(from, r); len(ps) > 0 {
			dst, ok := x.contiguous(ps, true)
			at := work(dst, len(ps)*n)
			if !ok {
				at = Range{Buf: Tmp, Off: recvAt[from], Len: len(ps) * n}
				for i, q := range ps {
					unpack = append(unpack, Op{Kind: Copy, Src: Range{Buf: Tmp, Off: at.Off + i*n, Len: n}, Dst: work(q.dst, n)})
				}
			}
			ops = append(ops, Op{Kind: Recv, Peer: from, Dst: at})
		}
	}
	// The unpacking copies come after every receive is posted: a copy
	// waits for its receive, a receive for nothing issued later.
	return append(ops, unpack...)
}

// inputVirtual fills every rank's In with its devices' vectors (device
// v's element i is the leaf (v, i)): Count elements each, M·Count for the
// reduce-scatter and the all-to-all.
func (m *sim) inputVirtual() {
	if m.p.Coll != ReduceScatter && m.p.Coll != AllToAll {
		m.inputDevices()
		return
	}
	total := len(m.p.Devices) * m.p.Count
	for r := 0; r < m.s.N; r++ {
		for k, v := range LocalDevices(m.p.Devices, r) {
			for i := 0; i < total; i++ {
				m.bufs[r][In][k*total+i] = m.leaf(v, i)
			}
		}
	}
}

// foldOf is the fold of element i of every device in device order
// (divided by M once for Avg): the one expression a virtual reduction may
// leave.
func (m *sim) foldOf(i int) int32 {
	nd := len(m.p.Devices)
	want := m.leaf(0, i)
	for v := 1; v < nd; v++ {
		want = m.id(node{1, want, m.leaf(v, i)})
	}
	if m.p.Avg && nd > 1 {
		want = m.id(node{2, want, int32(nd)})
	}
	return want
}

// verifyVirtual checks a virtual collective's result on every rank that
// must hold it.
func (m *sim) verifyVirtual(fail func(r int, format string, args ...any) error) error {
	p, count, nd := m.p, m.p.Count, len(m.p.Devices)
	switch p.Coll {
	case AllReduce, Reduce:
		return m.verifyDevices(fail)
	case ReduceScatter:
		for v, r := range p.Devices {
			for i := v * count; i < (v+1)*count; i++ {
				if got, want := m.bufs[r][Work][i], m.foldOf(i); got != want {
					return fail(r, "element %d of device %d's block is %s, want %s (the fold in device order)", i, v, m.show(got), m.show(want))
				}
			}
		}
	case AllGather:
		for r := 0; r < m.s.N; r++ {
			for i := 0; i < nd*count; i++ {
				if got, want := m.bufs[r][Work][i], m.leaf(i/count, i%count); got != want {
					return fail(r, "element %d is %s, want %s", i, m.show(got), m.show(want))
				}
			}
		}
	case AllToAll:
		for r := 0; r < m.s.N; r++ {
			for k, w := range LocalDevices(p.Devices, r) {
				for v := range nd {
					for e := range count {
						got := m.bufs[r][Work][(k*nd+v)*count+e]
						if want := m.leaf(v, w*count+e); got != want {
							return fail(r, "device %d's block %d element %d is %s, want %s", w, v, e, m.show(got), m.show(want))
						}
					}
				}
			}
		}
	default:
		return fmt.Errorf("sched: no virtual %s to verify", p.Coll)
	}
	return nil
}
