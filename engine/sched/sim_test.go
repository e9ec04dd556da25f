package sched

import (
	"strings"
	"testing"
)

// The simulator finds the operations an operation waits for by element
// (sim.go, hazards): a rank that forwards what it receives must send
// after the receive wrote it (read after write), a receive into a range
// must wait for the sends of the range issued before it (write after
// read, two of them), and two receives into one range land in program
// order (write after write). Each schedule below is right only if the
// simulator keeps that order; a simulator that did not would deliver
// garbage or another rank's data.
func TestSimulatorHazards(t *testing.T) {
	whole := work(0, 4)
	bcast := func(n int, prog func(r int, e *emitter)) *Schedule {
		s := New(Broadcast, "hazard", n, 1, func(r int, yield func(Op) bool) { prog(r, &emitter{yield: yield}) })
		s.WorkLen, s.Rounds = 4, 4
		return s
	}
	cases := []struct {
		name string
		s    *Schedule
	}{
		{"forward after receive", bcast(3, func(r int, e *emitter) {
			switch r {
			case 0:
				e.send(1, 0, 0, whole, 1)
			case 1:
				e.recv(0, 0, 0, whole)
				e.send(2, 0, 1, whole, 1) // waits for the receive above
			case 2:
				e.recv(1, 0, 1, whole)
			}
		})},
		{"receive after two sends", bcast(5, func(r int, e *emitter) {
			// Rank 1 hands the root's data to 2 and 3, then receives
			// rank 4's garbage into the same range (which must wait for
			// both sends), then the root's data back from 2 (which must
			// land after the garbage).
			switch r {
			case 0:
				e.send(1, 0, 0, whole, 1)
			case 1:
				e.recv(0, 0, 0, whole)
				e.send(2, 0, 1, whole, 1)
				e.send(3, 0, 1, whole, 1)
				e.recv(4, 0, 2, whole)
				e.recv(2, 0, 3, whole)
			case 2:
				e.recv(1, 0, 1, whole)
				e.send(1, 0, 2, whole, 1)
				e.send(4, 0, 2, whole, 1)
			case 3:
				e.recv(1, 0, 1, whole)
			case 4:
				e.send(1, 0, 0, whole, 1) // its garbage
				e.recv(2, 0, 2, whole)
			}
		})},
	}
	for _, tc := range cases {
		if _, err := Simulate(tc.s, Params{Coll: Broadcast, N: tc.s.N, ElemSize: 1, Count: 4}); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// The same forward without its receive: the simulator sees garbage.
	s := bcast(3, func(r int, e *emitter) {
		switch r {
		case 0:
			e.send(2, 0, 0, whole, 1)
		case 1:
			e.send(2, 0, 1, whole, 1)
		case 2:
			e.recv(0, 0, 0, whole)
			e.recv(1, 0, 1, whole) // rank 1 never had the data
		}
	})
	if _, err := Simulate(s, Params{Coll: Broadcast, N: 3, ElemSize: 1, Count: 4}); err == nil || !strings.Contains(err.Error(), "want the root's") {
		t.Errorf("a rank forwarding what it never received: %v", err)
	}
}

// The simulator's cost grows with the operations, not their square: the
// log-depth allreduces are proved correct at 8,192 ranks (a few seconds;
// 65,536 ranks fit in memory too), with a small vector, as every rank's
// symbolic data is held.
func TestSimulateLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of ranks")
	}
	for _, b := range []struct {
		name  string
		build Builder
	}{{"hd", HDAllReduce}, {"dbtree", DBTreeAllReduce}, {"ring", RingAllReduce}} {
		n := 8192
		if b.name == "ring" {
			n = 256 // 4(N-1) operations per rank: N² in all
		}
		simulate(t, b.build, Params{Coll: AllReduce, N: n, ElemSize: 4, Count: 16})
	}
}
