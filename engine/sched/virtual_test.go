package sched

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// placements of the virtual allreduce's tests: block, cyclic and explicit
// ones, the chain each must take (the fold order as data: every device in
// order, one hop per run of consecutive devices on a rank), and ranks
// that host no device.
var virtualPlacements = []struct {
	name    string
	n       int
	devices []int
	chain   string
}{
	{"block 8 on 1", 1, []int{0, 0, 0, 0, 0, 0, 0, 0}, "0:[0 1 2 3 4 5 6 7]"},
	{"block 8 on 2", 2, []int{0, 0, 0, 0, 1, 1, 1, 1}, "0:[0 1 2 3] 1:[4 5 6 7]"},
	{"block 8 on 4", 4, []int{0, 0, 1, 1, 2, 2, 3, 3}, "0:[0 1] 1:[2 3] 2:[4 5] 3:[6 7]"},
	{"block 8 on 8", 8, []int{0, 1, 2, 3, 4, 5, 6, 7}, "0:[0] 1:[1] 2:[2] 3:[3] 4:[4] 5:[5] 6:[6] 7:[7]"},
	{"cyclic 8 on 2", 2, []int{0, 1, 0, 1, 0, 1, 0, 1}, "0:[0] 1:[1] 0:[2] 1:[3] 0:[4] 1:[5] 0:[6] 1:[7]"},
	{"cyclic 6 on 4", 4, []int{0, 1, 2, 3, 0, 1}, "0:[0] 1:[1] 2:[2] 3:[3] 0:[4] 1:[5]"},
	{"explicit, unordered ranks", 3, []int{2, 2, 0, 1, 1, 2, 0}, "2:[0 1] 0:[2] 1:[3 4] 2:[5] 0:[6]"},
	{"explicit, idle rank", 4, []int{3, 1, 1, 3}, "3:[0] 1:[1 2] 3:[3]"},
	{"one device", 3, []int{1}, "1:[0]"},
}

func chainString(hops []Hop) string {
	var parts []string
	for _, h := range hops {
		parts = append(parts, fmt.Sprintf("%d:%v", h.Rank, h.Devices))
	}
	return strings.Join(parts, " ")
}

func TestVirtualChainOrder(t *testing.T) {
	for _, pl := range virtualPlacements {
		if got := chainString(VirtualChain(pl.devices)); got != pl.chain {
			t.Errorf("%s: chain %s, want %s", pl.name, got, pl.chain)
		}
	}
}

// TestVirtualAllReduceFoldOrder simulates the schedule on every placement
// and size: every rank must end with, for every element, the expression
// ((x0 op x1) op x2) … op x(M-1) node by node (divided by M once for Avg).
func TestVirtualAllReduceFoldOrder(t *testing.T) {
	for _, pl := range virtualPlacements {
		for _, count := range []int{0, 1, 5, 64} {
			for _, seg := range []int{8, 24, 0} {
				for _, avg := range []bool{false, true} {
					for _, coll := range []Coll{AllReduce, Reduce} {
						p := Params{Coll: coll, N: pl.n, ElemSize: 8, Count: count, Avg: avg, SegBytes: seg, Devices: pl.devices, Root: VirtualRoot(pl.devices)}
						s, err := VirtualAllReduce(p)
						if err != nil {
							t.Fatalf("%s: %v", pl.name, err)
						}
						if _, err := Simulate(s, p); err != nil {
							t.Fatalf("%s %s count %d seg %d avg %v: %v", pl.name, coll, count, seg, avg, err)
						}
					}
				}
			}
		}
	}
}

func TestVirtualAllReduceRandomPlacements(t *testing.T) {
	rng := rand.New(rand.NewSource(30))
	for trial := 0; trial < 200; trial++ {
		n := 1 + rng.Intn(6)
		m := 1 + rng.Intn(10)
		devices := make([]int, m)
		for v := range devices {
			devices[v] = rng.Intn(n)
		}
		p := Params{Coll: AllReduce, N: n, ElemSize: 4, Count: rng.Intn(40), Avg: rng.Intn(2) == 0, SegBytes: 4 * (1 + rng.Intn(8)), Devices: devices}
		s, err := VirtualAllReduce(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Simulate(s, p); err != nil {
			t.Fatalf("placement %v count %d: %v", devices, p.Count, err)
		}
	}
}

// reorder wraps s, letting edit rewrite each rank's program.
func reorder(s *Schedule, edit func(r int, ops []Op) []Op) *Schedule {
	w := New(s.Coll, s.Algo+"-edited", s.N, s.ElemSize, func(r int, yield func(Op) bool) {
		for _, o := range edit(r, s.Ops(r)) {
			if !yield(o) {
				return
			}
		}
	})
	w.WorkLen, w.InLen, w.TmpLen, w.Rounds = s.WorkLen, s.InLen, s.TmpLen, s.Rounds
	return w
}

// TestVirtualAllReduceRejectsReorderedFolds: a schedule that folds the
// same contributions in another order (which a sum of leaves would not
// notice) must fail the simulator, on block, cyclic and explicit
// placements alike.
func TestVirtualAllReduceRejectsReorderedFolds(t *testing.T) {
	for _, pl := range virtualPlacements {
		if len(pl.devices) < 3 {
			continue
		}
		p := Params{Coll: AllReduce, N: pl.n, ElemSize: 8, Count: 6, SegBytes: 16, Devices: pl.devices}
		s, err := VirtualAllReduce(p)
		if err != nil {
			t.Fatal(err)
		}
		edits := map[string]func(r int, ops []Op) []Op{
			// The first hop starts from its second device instead.
			"first copy from another device": func(r int, ops []Op) []Op {
				for i, o := range ops {
					if o.Kind == Copy {
						for k := i + 1; k < len(ops); k++ {
							if ops[k].Kind == Accumulate && ops[k].Dst == o.Dst {
								ops[i].Src, ops[k].Src = ops[k].Src, o.Src
								break
							}
						}
					}
				}
				return ops
			},
			// The partial sum becomes the right operand: x op partial.
			"received partial on the right": func(r int, ops []Op) []Op { return partialOnRight(ops, false) },
		}
		// The same edit with the partial on the left is a correct schedule.
		if _, err := Simulate(reorder(s, func(r int, ops []Op) []Op { return partialOnRight(ops, true) }), p); err != nil {
			t.Errorf("%s: receive-reduce with the partial first: %v", pl.name, err)
		}
		for name, edit := range edits {
			e := reorder(s, func(r int, ops []Op) []Op { return edit(r, ops) })
			changed := false
			for r := 0; r < pl.n; r++ {
				changed = changed || !reflect.DeepEqual(e.Ops(r), s.Ops(r))
			}
			if !changed {
				continue // nothing to reorder on this placement
			}
			if _, err := Simulate(e, p); err == nil {
				t.Errorf("%s: %s: the simulator accepted it", pl.name, name)
			} else if !strings.Contains(err.Error(), "fold in device order") && !strings.Contains(err.Error(), "deadlock") {
				t.Logf("%s: %s: %v", pl.name, name, err)
			}
		}
	}
}

// partialOnRight replaces each receive of a partial sum and the first fold
// into it by a copy of that device's contribution and a receive-reduce:
// partial op x when theirsFirst (the same fold), x op partial otherwise.
func partialOnRight(ops []Op, theirsFirst bool) []Op {
	ops = append([]Op(nil), ops...)
	for i := 0; i < len(ops); i++ {
		o := ops[i]
		if o.Kind != Recv {
			continue
		}
		for k := i + 1; k < len(ops); k++ {
			if ops[k].Kind == Send && ops[k].Src == o.Dst {
				break // a broadcast receive, or a hop of one device folded already
			}
			if ops[k].Kind == Accumulate && ops[k].Dst == o.Dst {
				// The receive keeps its place among the receives from
				// its peer.
				acc := ops[k]
				ops = append(ops[:k], ops[k+1:]...)
				ops[i] = Op{Kind: RecvReduce, Peer: o.Peer, Tag: o.Tag, Dst: o.Dst, TheirsFirst: theirsFirst, Round: o.Round}
				ops = append(ops[:i], append([]Op{{Kind: Copy, Src: acc.Src, Dst: o.Dst, Round: o.Round}}, ops[i:]...)...)
				break
			}
		}
	}
	return ops
}

func TestVirtualAllReduceTraffic(t *testing.T) {
	// On a block placement every rank sends each chunk once in the
	// reduction or once in the broadcast: n bytes per rank at most on two
	// ranks, whatever the number of devices per rank.
	for _, m := range []int{2, 8, 32} {
		devices := make([]int, m)
		for v := range devices {
			devices[v] = v * 2 / m
		}
		p := Params{Coll: AllReduce, N: 2, ElemSize: 8, Count: 1000, Devices: devices, SegBytes: 800}
		s, err := VirtualAllReduce(p)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Simulate(s, p)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int{8000, 8000}; !reflect.DeepEqual(rep.BytesSent, want) {
			t.Errorf("%d devices: bytes sent %v, want %v", m, rep.BytesSent, want)
		}
	}
}

func TestVirtualAllReduceBadParams(t *testing.T) {
	for _, p := range []Params{
		{Coll: AllReduce, N: 2, ElemSize: 8, Count: 4},
		{Coll: AllReduce, N: 2, ElemSize: 8, Count: 4, Devices: []int{0, 2}},
		{Coll: AllReduce, N: 2, ElemSize: 8, Count: 4, Devices: []int{-1}},
		{Coll: AllReduce, N: 0, ElemSize: 8, Count: 4, Devices: []int{0}},
		{Coll: Reduce, N: 2, ElemSize: 8, Count: 4, Devices: []int{0, 1}, Root: 0},
		{Coll: AllGather, N: 2, ElemSize: 8, Count: 4, Devices: []int{0, 1}},
	} {
		if _, err := VirtualAllReduce(p); err == nil {
			t.Errorf("%+v: no error", p)
		}
	}
}
