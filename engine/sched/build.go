package sched

import "fmt"

// emitter hands a program's operations to the consumer and remembers
// whether it asked to stop (range-over-func semantics), so builders can be
// written as plain loops.
type emitter struct {
	yield func(Op) bool
	done  bool
}

func (e *emitter) add(o Op) {
	if !e.done {
		e.done = !e.yield(o)
	}
}

func (e *emitter) send(peer int, tag uint32, round int, src Range, segs int) {
	e.add(Op{Kind: Send, Peer: peer, Tag: tag, Segs: segs, Src: src, Round: round})
}

func (e *emitter) recv(peer int, tag uint32, round int, dst Range) {
	e.add(Op{Kind: Recv, Peer: peer, Tag: tag, Dst: dst, Round: round})
}

func (e *emitter) recvReduce(peer int, tag uint32, round int, dst Range, segs int, theirsFirst bool) {
	e.add(Op{Kind: RecvReduce, Peer: peer, Tag: tag, Segs: segs, Dst: dst, TheirsFirst: theirsFirst, Round: round})
}

func (e *emitter) copy(round int, src, dst Range) {
	if src.Len > 0 {
		e.add(Op{Kind: Copy, Src: src, Dst: dst, Round: round})
	}
}

func (e *emitter) scale(round int, dst Range, div int) {
	if dst.Len > 0 && div > 1 {
		e.add(Op{Kind: Scale, Dst: dst, Div: div, Round: round})
	}
}

func (e *emitter) sync(round int) { e.add(Op{Kind: Sync, Round: round}) }

func mod(a, n int) int { return ((a % n) + n) % n }

func work(off, n int) Range { return Range{Buf: Work, Off: off, Len: n} }

// check validates what every builder needs from Params.
func (p Params) check() error {
	switch {
	case p.N < 1:
		return fmt.Errorf("sched: %d ranks", p.N)
	case p.ElemSize < 1 && p.Coll != Barrier:
		return fmt.Errorf("sched: element size %d", p.ElemSize)
	case p.Count < 0:
		return fmt.Errorf("sched: negative count %d", p.Count)
	case (p.Coll == Reduce || p.Coll == Broadcast) && (p.Root < 0 || p.Root >= p.N):
		return fmt.Errorf("sched: root %d out of range [0,%d)", p.Root, p.N)
	}
	for i, ring := range p.Rings {
		if err := checkPerm(ring, p.N); err != nil {
			return fmt.Errorf("sched: ring %d: %w", i, err)
		}
	}
	return nil
}

func checkPerm(order []int, n int) error {
	if len(order) != n {
		return fmt.Errorf("%d entries for %d ranks", len(order), n)
	}
	seen := make([]bool, n)
	for _, r := range order {
		if r < 0 || r >= n || seen[r] {
			return fmt.Errorf("not a permutation of 0..%d: %v", n-1, order)
		}
		seen[r] = true
	}
	return nil
}

// rings returns the ring orders to use: Params.Rings, or the single ring
// 0, 1, …, N-1.
func (p Params) rings() [][]int {
	if len(p.Rings) > 0 {
		return p.Rings
	}
	id := make([]int, p.N)
	for i := range id {
		id[i] = i
	}
	return [][]int{id}
}

// positions inverts ring orders: pos[k][rank] is rank's place on ring k.
func positions(rings [][]int) [][]int {
	pos := make([][]int, len(rings))
	for k, ring := range rings {
		pos[k] = make([]int, len(ring))
		for i, r := range ring {
			pos[k][r] = i
		}
	}
	return pos
}
