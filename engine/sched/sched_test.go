package sched

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/schedtest"
)

type builderCase struct {
	name  string
	coll  Coll
	build Builder
}

func simulate(t *testing.T, b Builder, p Params) *Report {
	t.Helper()
	s, err := b(p)
	if err != nil {
		t.Fatalf("%s n=%d count=%d: build: %v", p.Coll, p.N, p.Count, err)
	}
	rep, err := Simulate(s, p)
	if err != nil {
		t.Fatalf("n=%d count=%d root=%d avg=%v: %v", p.N, p.Count, p.Root, p.Avg, err)
	}
	return rep
}

// Every builder of the registry is simulated over rank counts, sizes and
// roots by TestRegistrySchedules (engine/internal/choose); here, what the
// registry does not name: AggregateAllToAll's relay option.
func TestRelayAggregation(t *testing.T) {
	relay := func(p Params) (*Schedule, error) { p.Relay = true; return AggregateAllToAll(p) }
	for _, n := range schedtest.RankCounts() {
		for _, count := range []int{0, 1, n - 1, 7, 37} {
			simulate(t, relay, Params{Coll: AllToAll, N: n, ElemSize: 4, Count: max(count, 0)})
		}
	}
}

// Segment counts chosen by size, and Bruck's other radixes.
func TestBuilderTuning(t *testing.T) {
	for _, n := range []int{3, 4, 6, 8} {
		for _, q := range []int{0, 1, 5} {
			for _, bc := range []builderCase{{"", AllReduce, HDAllReduce}, {"", Reduce, HDReduce}, {"", ReduceScatter, HDReduceScatter}} {
				simulate(t, bc.build, Params{Coll: bc.coll, N: n, ElemSize: 2, Count: 301, Segments: q, Root: n - 1, Avg: q == 5})
			}
		}
		for _, radix := range []int{2, 3, 4, 7} {
			simulate(t, BruckAllToAll, Params{Coll: AllToAll, N: n, ElemSize: 1, Count: 3, Radix: radix})
		}
	}
}

func fixColl(b Builder, c Coll) Builder {
	return func(p Params) (*Schedule, error) { p.Coll = c; return b(p) }
}

func TestMultiRing(t *testing.T) {
	rings := [][]int{{0, 1, 2, 3, 4, 5}, {0, 2, 4, 1, 5, 3}}
	for _, bc := range []builderCase{{"ring", AllReduce, RingAllReduce}, {"ring", AllGather, RingAllGather}, {"ring", ReduceScatter, RingReduceScatter}} {
		for _, count := range []int{0, 1, 5, 61} {
			simulate(t, bc.build, Params{Coll: bc.coll, N: 6, ElemSize: 4, Count: count, Rings: rings, Avg: true})
		}
	}
	// A permuted single ring still leaves rank r with block r.
	simulate(t, RingReduceScatter, Params{Coll: ReduceScatter, N: 5, ElemSize: 1, Count: 3, Rings: [][]int{{3, 1, 4, 0, 2}}})
	if _, err := RingAllReduce(Params{Coll: AllReduce, N: 3, ElemSize: 1, Count: 3, Rings: [][]int{{0, 1, 1}}}); err == nil {
		t.Fatal("a ring that is not a permutation was accepted")
	}
}

// The hierarchical forms need every host to hold as many ranks (the
// registry's rules keep them from uneven hosts).
func TestHierarchicalUneven(t *testing.T) {
	if _, err := HierAllReduce(Params{Coll: AllReduce, N: 3, ElemSize: 1, Count: 3, Hosts: [][]int{{0, 1}, {2}}}); err == nil {
		t.Fatal("uneven hosts were accepted")
	}
}

// Bytes per rank against the theory.
func TestBytesMatchTheory(t *testing.T) {
	for _, n := range []int{2, 4, 8, 16} {
		count := 64 * n // divides evenly
		l := count * 4
		for _, b := range []Builder{RingAllReduce, HDAllReduce} {
			rep := simulate(t, b, Params{Coll: AllReduce, N: n, ElemSize: 4, Count: count})
			for r, got := range rep.BytesSent {
				if want := 2 * l * (n - 1) / n; got != want {
					t.Fatalf("n=%d rank %d sends %d bytes, want 2·L·(N-1)/N = %d", n, r, got, want)
				}
			}
		}
		for _, b := range []builderCase{{"", AllGather, RingAllGather}, {"", ReduceScatter, RingReduceScatter}} {
			rep := simulate(t, b.build, Params{Coll: b.coll, N: n, ElemSize: 4, Count: 64})
			for r, got := range rep.BytesSent {
				if want := 64 * 4 * (n - 1); got != want {
					t.Fatalf("%s n=%d rank %d sends %d bytes, want (N-1)·L/N = %d", b.coll, n, r, got, want)
				}
			}
		}
	}
}

// What crosses hosts is the optimum: for allreduce each host sends
// 2·(H-1)/H of the vector, where a flat ring sends 2·(N-1)/N of it through
// the host boundary it crosses.
func TestHierarchicalCrossHostBytes(t *testing.T) {
	for _, sh := range [][2]int{{2, 2}, {4, 2}, {3, 4}} {
		h, r := sh[0], sh[1]
		n := h * r
		count := 12 * n * h // everything divides
		l := count * 4
		hosts := schedtest.HostsOf(h, r, false)
		rep := simulate(t, HierAllReduce, Params{Coll: AllReduce, N: n, ElemSize: 4, Count: count, Hosts: hosts})
		for host, got := range rep.CrossHostBytes {
			if want := 2 * l * (h - 1) / h; got != want {
				t.Errorf("allreduce %dx%d: host %d sends %d bytes across, want %d", h, r, host, got, want)
			}
		}
		flatRep := simulate(t, RingAllReduce, Params{Coll: AllReduce, N: n, ElemSize: 4, Count: count, Hosts: hosts})
		if flatRep.CrossHostBytes[0] <= rep.CrossHostBytes[0] {
			t.Errorf("allreduce %dx%d: the flat ring sends %d bytes across, no more than the hierarchy's %d", h, r, flatRep.CrossHostBytes[0], rep.CrossHostBytes[0])
		}
		block := 8 * 4
		for _, bc := range []builderCase{{"", AllGather, HierAllGather}, {"", ReduceScatter, HierReduceScatter}} {
			rep := simulate(t, bc.build, Params{Coll: bc.coll, N: n, ElemSize: 4, Count: 8, Hosts: hosts})
			for host, got := range rep.CrossHostBytes {
				if want := (h - 1) * r * block; got != want {
					t.Errorf("%s %dx%d: host %d sends %d bytes across, want (H-1)·R blocks = %d", bc.coll, h, r, host, got, want)
				}
			}
		}
		rep = simulate(t, HierBroadcast, Params{Coll: Broadcast, N: n, ElemSize: 4, Count: count, Hosts: hosts, Root: 1})
		for host, got := range rep.CrossHostBytes {
			if want := l; host != h-1 && got != want {
				t.Errorf("broadcast %dx%d: host %d sends %d bytes across, want the vector once (%d)", h, r, host, got, want)
			}
		}
	}
}

func randomLayout(rng *rand.Rand, n int) ([]Block, int) {
	blocks := make([]Block, n)
	off := 0
	order := rng.Perm(n) // displacements in any order
	for _, i := range order {
		ln := rng.Intn(4)
		if rng.Intn(3) == 0 {
			ln = 0
		}
		off += rng.Intn(3)
		blocks[i] = Block{off, ln}
		off += ln
	}
	return blocks, off
}

func TestAllToAllv(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for trial := 0; trial < 40; trial++ {
		n := 1 + rng.Intn(9)
		// counts[i][j]: elements i sends j.
		counts := make([][]int, n)
		for i := range counts {
			counts[i] = make([]int, n)
			for j := range counts[i] {
				if rng.Intn(3) > 0 {
					counts[i][j] = rng.Intn(5)
				}
			}
		}
		ps := make([]Params, n)
		parts := make([]*Schedule, n)
		for r := 0; r < n; r++ {
			send, recv := make([]Block, n), make([]Block, n)
			so, ro := 0, 0
			for _, j := range rng.Perm(n) {
				so += rng.Intn(2)
				send[j] = Block{so * 2, counts[r][j] * 2}
				so += counts[r][j]
			}
			for _, i := range rng.Perm(n) {
				recv[i] = Block{ro * 2, counts[i][r] * 2}
				ro += counts[i][r] + rng.Intn(2)
			}
			ps[r] = Params{Coll: AllToAllv, N: n, ElemSize: 2, SendBlocks: send, RecvBlocks: recv, Mine: r}
			s, err := PairwiseAllToAllv(ps[r])
			if err != nil {
				t.Fatal(err)
			}
			parts[r] = s
		}
		if _, err := Simulate(PerRank(parts), ps[0], ps...); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
	}
}

// The validator and the simulator catch broken schedules.
func TestBrokenSchedules(t *testing.T) {
	mk := func(prog func(r int, e *emitter)) *Schedule {
		s := New(AllReduce, "broken", 2, 1, func(r int, yield func(Op) bool) { prog(r, &emitter{yield: yield}) })
		s.WorkLen, s.Rounds = 4, 4
		return s
	}
	whole := work(0, 4)
	cases := []struct {
		name string
		s    *Schedule
		want string
	}{
		{"missing receive", mk(func(r int, e *emitter) {
			if r == 0 {
				e.send(1, 0, 0, whole, 1)
			}
		}), "receives only 0"},
		{"wrong tag", mk(func(r int, e *emitter) {
			e.send(1-r, uint32(r), 0, whole, 1)
			e.recvReduce(1-r, 0, 0, whole, 1, r == 1)
		}), "received as tag"},
		{"out of range", mk(func(r int, e *emitter) { e.scale(0, work(2, 4), 2) }), "outside the buffer"},
		{"rounds go back", mk(func(r int, e *emitter) { e.sync(2); e.sync(1) }), "round 1 after round 2"},
		{"needs buffering", mk(func(r int, e *emitter) {
			e.recv(1-r, 0, 0, work(0, 2))
			e.sync(0)
			e.send(1-r, 0, 1, work(2, 2), 1)
		}), "deadlocks"},
		{"order differs between ranks", mk(func(r int, e *emitter) {
			e.send(1-r, 0, 0, whole, 1)
			e.recvReduce(1-r, 0, 0, whole, 1, false) // each rank puts its own partial first
		}), "not bitwise identical"},
		{"a contribution missing", mk(func(r int, e *emitter) {
			if r == 0 {
				e.send(1, 0, 0, whole, 1)
				e.recv(1, 1, 0, whole)
			} else {
				e.recv(0, 0, 0, whole) // overwrites instead of reducing
				e.send(0, 1, 0, whole, 1)
			}
		}), "not one contribution of every rank"},
	}
	for _, tc := range cases {
		_, err := Simulate(tc.s, Params{Coll: AllReduce, N: 2, ElemSize: 1, Count: 4})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	deaf := New(Barrier, "deaf", 3, 1, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		if r < 2 { // ranks 0 and 1 signal each other; rank 2 is left out
			e.send(1-r, 0, 0, Range{}, 1)
			e.recv(1-r, 0, 0, Range{})
		}
	})
	deaf.Rounds = 1
	if _, err := Simulate(deaf, Params{Coll: Barrier, N: 3}); err == nil || !strings.Contains(err.Error(), "without hearing") {
		t.Errorf("a barrier in which nobody hears from rank 2: %v", err)
	}
}

// A 3-rank ring allreduce, as a person reads it.
func TestRingProgramGolden(t *testing.T) {
	s, err := RingAllReduce(Params{Coll: AllReduce, N: 3, ElemSize: 4, Count: 6, Avg: true})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for o := range s.Program(1) {
		fmt.Fprintln(&b, o)
	}
	want := `r0 send work[8:16] -> 2 tag 0 segs 1
r0 recvreduce work[0:8] <- 0 tag 0 segs 1 (mine op theirs)
r1 send work[0:8] -> 2 tag 1 segs 1
r1 recvreduce work[16:24] <- 0 tag 1 segs 1 (mine op theirs)
r1 scale work[16:24] / 3
r2 send work[16:24] -> 2 tag 3 segs 1
r2 recv work[8:16] <- 0 tag 3
r3 send work[8:16] -> 2 tag 4 segs 1
r3 recv work[0:8] <- 0 tag 4
`
	if got := b.String(); got != want {
		t.Fatalf("rank 1's program:\n%s\nwant:\n%s", got, want)
	}
}

// The cost model walks 4,096-rank schedules rank by rank: building one and
// generating a program must not be quadratic.
func TestLargeScheduleIsCheap(t *testing.T) {
	s, err := RingAllReduce(Params{Coll: AllReduce, N: 4096, ElemSize: 4, Count: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ops := 0
	for range s.Program(4095) {
		ops++
	}
	if ops != 4*4095 {
		t.Fatalf("%d ops, want %d", ops, 4*4095)
	}
}

// The double binary tree allreduce, with its own trees and with NCCL's
// (as topology.DoubleBinaryTree makes them; written out here for 6 ranks
// so that this package imports nothing).
func TestDBTree(t *testing.T) {
	for _, n := range schedtest.RankCounts() {
		for _, count := range []int{0, 1, 7, 300} {
			simulate(t, DBTreeAllReduce, Params{Coll: AllReduce, N: n, ElemSize: 4, Count: count, Avg: count%2 == 1, SegBytes: 64})
		}
	}
	nccl6 := [][]int{{-1, 2, 4, 2, 0, 4}, {1, 5, 3, 1, 3, -1}}
	simulate(t, DBTreeAllReduce, Params{Coll: AllReduce, N: 6, ElemSize: 4, Count: 97, Trees: nccl6, SegBytes: 32})
}

// Ring steps are cut into segments so that the next step can forward the
// first while the rest still cross: about 64 KiB each (at most 16), and
// blocks too small for two of those into up to 4 of at least 8 KiB.
func TestRingSegments(t *testing.T) {
	const n = 4
	for _, tc := range []struct{ bytes, perStep int }{
		{4 << 10, 1},   // 1 KiB blocks: one message each
		{64 << 10, 2},  // 16 KiB blocks: two of 8 KiB
		{256 << 10, 4}, // 64 KiB blocks: four of 16 KiB
		{1 << 20, 4},   // 256 KiB blocks: four of 64 KiB
		{4 << 20, 16},  // 1 MiB blocks: sixteen of 64 KiB
		{64 << 20, 16}, // 16 MiB blocks: at most sixteen
		{32 + 4*3, 1},  // fewer bytes than a floor segment
	} {
		s, err := RingAllReduce(Params{Coll: AllReduce, N: n, ElemSize: 4, Count: tc.bytes / 4})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sends(s, 0), 2*(n-1)*tc.perStep; got != want {
			t.Errorf("%d bytes: rank 0 sends %d messages, want %d (%d per step)", tc.bytes, got, want, tc.perStep)
		}
		if tc.bytes <= 256<<10 { // the simulator checks every element
			simulate(t, RingAllReduce, Params{Coll: AllReduce, N: n, ElemSize: 4, Count: tc.bytes / 4})
		}
	}
}

// TestDoublingPeers: the peers the connection setup connects eagerly for
// recursive doubling are exactly those RDAllReduce, HDAllReduce and
// RDBarrier talk to, and the relation is symmetric.
func TestDoublingPeers(t *testing.T) {
	for n := 1; n <= 40; n++ {
		for _, b := range []Builder{RDAllReduce, HDAllReduce, RDBarrier} {
			s, err := b(Params{Coll: AllReduce, N: n, ElemSize: 4, Count: 3 * n})
			if err != nil {
				t.Fatal(err)
			}
			for r := range n {
				talks := map[int]bool{}
				for o := range s.Program(r) {
					if o.Kind == Send || o.Kind == Recv || o.Kind == RecvReduce {
						talks[o.Peer] = true
					}
				}
				want := map[int]bool{}
				for _, q := range DoublingPeers(r, n) {
					want[q] = true
					if !slices.Contains(DoublingPeers(q, n), r) {
						t.Fatalf("n=%d: %d is a peer of %d, not the other way", n, q, r)
					}
				}
				for q := range talks {
					if !want[q] {
						t.Errorf("n=%d %s: rank %d talks to %d, not among DoublingPeers %v", n, s.Algo, r, q, DoublingPeers(r, n))
					}
				}
			}
		}
	}
}
