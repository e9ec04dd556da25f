package sched

import (
	"strings"
	"testing"
)

// Block mode has no reductions, divisions or segments; a matched schedule
// takes messages by tag, whose tags must then name one message each.
func TestBlockAndMatchedValidation(t *testing.T) {
	two := func(prog func(r int, e *emitter)) *Schedule {
		s := New(AllToAll, "test", 2, 1, func(r int, yield func(Op) bool) { prog(r, &emitter{yield: yield}) })
		s.WorkLen, s.InLen, s.TmpLen, s.Rounds = 2, 2, 2, 1
		return s
	}
	reduce := two(func(r int, e *emitter) {
		e.send(1-r, 0, 0, Range{Buf: In, Off: 1 - r, Len: 1}, 1)
		e.recvReduce(1-r, 0, 0, Range{Buf: Work, Off: 1 - r, Len: 1}, 1, false)
	})
	if err := Validate(reduce); err != nil {
		t.Fatalf("byte mode: %v", err)
	}
	reduce.Blocks = true
	if err := Validate(reduce); err == nil || !strings.Contains(err.Error(), "block mode") {
		t.Errorf("a reduction in block mode: %v", err)
	}
	// Rank 0 sends tags 1 then 2; rank 1 takes 2 first.
	swapped := two(func(r int, e *emitter) {
		if r == 0 {
			e.copy(0, Range{Buf: In, Off: 0, Len: 1}, Range{Buf: Work, Off: 0, Len: 1})
			e.send(1, 1, 0, Range{Buf: In, Off: 1, Len: 1}, 1)
			e.send(1, 2, 0, Range{Buf: In, Off: 1, Len: 1}, 1)
			e.recv(1, 3, 0, Range{Buf: Work, Off: 1, Len: 1})
			return
		}
		e.recv(0, 2, 0, Range{Buf: Tmp, Off: 0, Len: 1})
		e.recv(0, 1, 0, Range{Buf: Work, Off: 0, Len: 1})
		e.copy(0, Range{Buf: In, Off: 1, Len: 1}, Range{Buf: Work, Off: 1, Len: 1})
		e.send(0, 3, 0, Range{Buf: In, Off: 0, Len: 1}, 1)
	})
	p := Params{Coll: AllToAll, N: 2, ElemSize: 1, Count: 1}
	if _, err := Simulate(swapped, p); err == nil {
		t.Error("messages taken out of order in a FIFO schedule")
	}
	swapped.Matched = true
	if _, err := Simulate(swapped, p); err != nil {
		t.Errorf("matched by tag: %v", err)
	}
	dup := two(func(r int, e *emitter) {
		e.send(1-r, 7, 0, Range{Buf: In, Off: 1 - r, Len: 1}, 1)
		e.send(1-r, 7, 0, Range{Buf: In, Off: 1 - r, Len: 1}, 1)
		e.recv(1-r, 7, 0, Range{Buf: Work, Off: 1 - r, Len: 1})
		e.recv(1-r, 7, 0, Range{Buf: Tmp, Off: 1 - r, Len: 1})
	})
	dup.Matched = true
	if err := Validate(dup); err == nil || !strings.Contains(err.Error(), "two messages with tag 7") {
		t.Errorf("a tag used twice: %v", err)
	}
}
