package sched

import (
	"fmt"
	"slices"
)

// Validate checks a schedule as data: every range inside its buffer, sane
// segment counts and divisors, rounds that never decrease and stay below
// Rounds, and, for every directed pair, the sender's messages (segment by
// segment, in program order) equal the receiver's in tag and length.
func Validate(s *Schedule) error {
	v := &validator{s: s, sent: make(map[[2]int][]msg), got: make(map[[2]int][]msg)}
	for r := 0; r < s.N; r++ {
		last, i := 0, 0
		for o := range s.Program(r) {
			where := func(format string, args ...any) error {
				return fmt.Errorf("sched: %s %s rank %d op %d (%v): %s", s.Coll, s.Algo, r, i, o, fmt.Sprintf(format, args...))
			}
			if o.Round < last {
				return where("round %d after round %d", o.Round, last)
			}
			last = o.Round
			if err := v.op(r, o, where); err != nil {
				return err
			}
			v.record(r, o)
			i++
		}
	}
	for _, k := range v.pairs() {
		if err := v.match(k); err != nil {
			return err
		}
	}
	return nil
}

// validator holds the messages of every directed pair (sender, receiver),
// as the sender's program sends them and as the receiver's receives them.
type validator struct {
	s         *Schedule
	sent, got map[[2]int][]msg
}

// msg is one message (one segment of a send or receive).
type msg struct {
	tag uint32
	n   int
}

// op checks one operation of rank r on its own; where wraps an error with
// the operation.
func (v *validator) op(r int, o Op, where func(string, ...any) error) error {
	s := v.s
	if o.Round < 0 || o.Round+o.NSegs() > max(s.Rounds, 1) {
		return where("round %d (+%d segments) outside [0,%d)", o.Round, o.NSegs(), s.Rounds)
	}
	if o.Segs < 0 {
		return where("negative segment count")
	}
	if s.Blocks {
		switch {
		case o.Kind == RecvReduce || o.Kind == Scale || o.Kind == Accumulate:
			return where("no %s in block mode", o.Kind)
		case o.NSegs() > 1:
			return where("no segments in block mode")
		}
	}
	switch o.Kind {
	case Send, Recv, RecvReduce:
		if o.Peer < 0 || o.Peer >= s.N || o.Peer == r {
			return where("peer %d", o.Peer)
		}
	}
	return v.ranges(o, where)
}

// ranges checks the ranges an operation reads and writes, by its kind.
func (v *validator) ranges(o Op, where func(string, ...any) error) error {
	s := v.s
	inside := func(name string, g Range) error {
		if g.Buf >= NumBufs || g.Off < 0 || g.Len < 0 || g.End() > s.Len(g.Buf) {
			return where("%s %s[%d:%d] outside the buffer (%d bytes)", name, g.Buf, g.Off, g.End(), s.Len(g.Buf))
		}
		return nil
	}
	// The source, then the destination, of the kinds that have them.
	switch o.Kind {
	case Send, Copy, Accumulate:
		if err := inside("source", o.Src); err != nil {
			return err
		}
	}
	switch o.Kind {
	case Recv, RecvReduce, Copy, Scale, Accumulate:
		if err := inside("destination", o.Dst); err != nil {
			return err
		}
	}
	var err error
	switch o.Kind {
	case Send:
		err = segsOK(o, o.Src, s.ElemSize)
	case Recv, RecvReduce:
		if o.Kind == Recv && o.Segs > 1 {
			return where("a plain receive is never segmented")
		}
		err = segsOK(o, o.Dst, s.ElemSize)
	case Copy:
		if o.Src.Len != o.Dst.Len || o.Src.Overlaps(o.Dst) {
			return where("copy between unequal or overlapping ranges")
		}
	case Scale:
		if o.Div < 1 || o.Dst.Len%s.ElemSize != 0 {
			return where("divisor %d on %d bytes", o.Div, o.Dst.Len)
		}
	case Accumulate:
		if o.Src.Len != o.Dst.Len || o.Src.Overlaps(o.Dst) || o.Dst.Len%s.ElemSize != 0 {
			return where("accumulate between unequal, overlapping or partial-element ranges")
		}
	case Sync:
	default:
		return where("unknown kind")
	}
	if err != nil {
		return where("%v", err)
	}
	return nil
}

// record notes the messages a (checked) send or receive of rank r makes,
// one per segment.
func (v *validator) record(r int, o Op) {
	var l map[[2]int][]msg
	var k [2]int
	var g Range
	switch o.Kind {
	case Send:
		l, k, g = v.sent, [2]int{r, o.Peer}, o.Src
	case Recv, RecvReduce:
		l, k, g = v.got, [2]int{o.Peer, r}, o.Dst
	default:
		return
	}
	for seg := 0; seg < o.NSegs(); seg++ {
		lo, hi := Segment(seg, g.Len, v.s.ElemSize, o.NSegs())
		l[k] = append(l[k], msg{o.Tag + uint32(seg), hi - lo})
	}
}

// pairs lists the directed pairs that exchange anything, in order.
func (v *validator) pairs() [][2]int {
	pairs := make([][2]int, 0, len(v.sent)+len(v.got))
	for k := range v.sent {
		pairs = append(pairs, k)
	}
	for k := range v.got {
		if _, ok := v.sent[k]; !ok {
			pairs = append(pairs, k)
		}
	}
	slices.SortFunc(pairs, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return a[1] - b[1]
	})
	return pairs
}

// match checks that what pair k's sender sends is what its receiver
// receives: message by message in program order, or by tag for a
// Matched schedule.
func (v *validator) match(k [2]int) error {
	s := v.s
	a, b := v.sent[k], v.got[k]
	if s.Matched {
		// Order does not matter, but every tag must name one message.
		byTag := func(l []msg) []msg {
			l = slices.Clone(l)
			slices.SortFunc(l, func(x, y msg) int { return int(x.tag) - int(y.tag) })
			return l
		}
		a, b = byTag(a), byTag(b)
		for i := 1; i < len(a); i++ {
			if a[i].tag == a[i-1].tag {
				return fmt.Errorf("sched: %s %s: rank %d sends two messages with tag %d to rank %d", s.Coll, s.Algo, k[0], a[i].tag, k[1])
			}
		}
	}
	for i := 0; i < max(len(a), len(b)); i++ {
		switch {
		case i >= len(a):
			return fmt.Errorf("sched: %s %s: rank %d receives message %d (tag %d, %d bytes) from rank %d, which sends only %d", s.Coll, s.Algo, k[1], i, b[i].tag, b[i].n, k[0], len(a))
		case i >= len(b):
			return fmt.Errorf("sched: %s %s: rank %d sends message %d (tag %d, %d bytes) to rank %d, which receives only %d", s.Coll, s.Algo, k[0], i, a[i].tag, a[i].n, k[1], len(b))
		case a[i] != b[i]:
			return fmt.Errorf("sched: %s %s: message %d from rank %d to rank %d: sent tag %d with %d bytes, received as tag %d with %d bytes", s.Coll, s.Algo, i, k[0], k[1], a[i].tag, a[i].n, b[i].tag, b[i].n)
		}
	}
	return nil
}

func segsOK(o Op, g Range, es int) error {
	if g.Len%es != 0 {
		return fmt.Errorf("%d bytes are not whole %d-byte elements", g.Len, es)
	}
	if g.Len > 0 && o.NSegs() > g.Len/es {
		return fmt.Errorf("%d segments of %d elements", o.NSegs(), g.Len/es)
	}
	return nil
}
