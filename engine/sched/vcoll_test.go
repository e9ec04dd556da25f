package sched

import (
	"math/rand"
	"reflect"
	"slices"
	"testing"
)

// virtualBuilders are the virtual collectives besides the allreduce, each
// with the roots it takes (reduce: the rank of every device; the others
// none).
var virtualBuilders = []struct {
	coll  Coll
	build Builder
}{
	{Reduce, VirtualReduce},
	{ReduceScatter, VirtualReduceScatter},
	{AllGather, VirtualAllGather},
	{AllToAll, VirtualAllToAll},
}

func virtualRoots(coll Coll, devices []int) []int {
	if coll != Reduce {
		return []int{0}
	}
	roots := slices.Clone(devices)
	slices.Sort(roots)
	return slices.Compact(roots)
}

// TestVirtualCollectivesSimulate proves every builder on block, cyclic and
// explicit placements: the reductions leave, node by node, the fold of
// the devices in device order (divided by M once for Avg) where the result
// belongs; the gathers and the all-to-all move every device's block where
// it belongs.
func TestVirtualCollectivesSimulate(t *testing.T) {
	for _, b := range virtualBuilders {
		for _, pl := range virtualPlacements {
			for _, root := range virtualRoots(b.coll, pl.devices) {
				for _, count := range []int{0, 1, 5, 17} {
					for _, seg := range []int{8, 24, 0} {
						for _, avg := range []bool{false, true} {
							p := Params{Coll: b.coll, N: pl.n, ElemSize: 8, Count: count, Root: root, Avg: avg, SegBytes: seg, Devices: pl.devices}
							s, err := b.build(p)
							if err != nil {
								t.Fatalf("%s %s: %v", b.coll, pl.name, err)
							}
							if _, err := Simulate(s, p); err != nil {
								t.Fatalf("%s %s root %d count %d seg %d avg %v: %v", b.coll, pl.name, root, count, seg, avg, err)
							}
						}
					}
				}
			}
		}
	}
}

func TestVirtualCollectivesRandomPlacements(t *testing.T) {
	rng := rand.New(rand.NewSource(29))
	for trial := 0; trial < 100; trial++ {
		n := 1 + rng.Intn(5)
		m := 1 + rng.Intn(9)
		devices := make([]int, m)
		for v := range devices {
			devices[v] = rng.Intn(n)
		}
		for _, b := range virtualBuilders {
			p := Params{Coll: b.coll, N: n, ElemSize: 4, Count: rng.Intn(12), Avg: rng.Intn(2) == 0, SegBytes: 4 * (1 + rng.Intn(4)), Devices: devices, Root: devices[rng.Intn(m)]}
			s, err := b.build(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Simulate(s, p); err != nil {
				t.Fatalf("%s placement %v count %d: %v", b.coll, devices, p.Count, err)
			}
		}
	}
}

// TestVirtualFoldsRejectReorderedFolds: a reduce or reduce-scatter that
// folds the same contributions in another order must fail the simulator,
// on block, cyclic and explicit placements alike.
func TestVirtualFoldsRejectReorderedFolds(t *testing.T) {
	swapFirst := func(r int, ops []Op) []Op {
		for i, o := range ops {
			if o.Kind != Copy || o.Src.Buf != In {
				continue
			}
			for k := i + 1; k < len(ops); k++ {
				if ops[k].Kind == Accumulate && ops[k].Dst == o.Dst {
					ops[i].Src, ops[k].Src = ops[k].Src, o.Src
					break
				}
			}
		}
		return ops
	}
	for _, b := range virtualBuilders[:2] {
		tried := 0
		for _, pl := range virtualPlacements {
			if len(pl.devices) < 3 {
				continue
			}
			p := Params{Coll: b.coll, N: pl.n, ElemSize: 8, Count: 6, SegBytes: 16, Devices: pl.devices, Root: pl.devices[0]}
			s, err := b.build(p)
			if err != nil {
				t.Fatal(err)
			}
			for name, edit := range map[string]func(r int, ops []Op) []Op{
				"first copy from another device": swapFirst,
				"received partial on the right":  func(r int, ops []Op) []Op { return partialOnRight(ops, false) },
			} {
				e := reorder(s, edit)
				changed := false
				for r := 0; r < pl.n; r++ {
					changed = changed || !reflect.DeepEqual(e.Ops(r), s.Ops(r))
				}
				if !changed {
					continue
				}
				tried++
				if _, err := Simulate(e, p); err == nil {
					t.Errorf("%s %s: %s: the simulator accepted it", b.coll, pl.name, name)
				}
			}
		}
		if tried == 0 {
			t.Errorf("%s: no placement had a fold to reorder", b.coll)
		}
	}
}

// TestVirtualFoldOrderAsData pins the route of a reduction's chunk on
// block, cyclic and explicit placements: the ranks that fold it and the
// devices each folds, in order, read from the programs.
func TestVirtualFoldOrderAsData(t *testing.T) {
	for _, pl := range virtualPlacements {
		p := Params{Coll: ReduceScatter, N: pl.n, ElemSize: 8, Count: 1, Devices: pl.devices}
		s, err := VirtualReduceScatter(p)
		if err != nil {
			t.Fatal(err)
		}
		// Block 0's chunk: the ranks' Copy and Accumulate from In into
		// Work[0:8], followed along the chain's messages.
		var hops []Hop
		slot := map[[2]int]int{} // (rank, In offset) → device
		for r := 0; r < pl.n; r++ {
			for k, v := range LocalDevices(pl.devices, r) {
				slot[[2]int{r, k * len(pl.devices) * 8}] = v
			}
		}
		progs := make([][]Op, pl.n)
		for r := range progs {
			progs[r] = s.Ops(r)
		}
		r, used := pl.devices[0], make([]int, pl.n)
		for {
			var devs []int
			next := -1
			for i := used[r]; i < len(progs[r]); i++ {
				o := progs[r][i]
				if o.Src.Buf == In && o.Dst.Off == 0 && (o.Kind == Copy || o.Kind == Accumulate) {
					devs = append(devs, slot[[2]int{r, o.Src.Off}])
				}
				if o.Kind == Send && o.Src.Off == 0 && len(devs) > 0 {
					next, used[r] = o.Peer, i+1
					break
				}
			}
			if len(devs) == 0 {
				break // the delivery to device 0's rank: no fold there
			}
			hops = append(hops, Hop{Rank: r, Devices: devs})
			if next < 0 || len(hops) >= len(pl.devices) {
				break
			}
			r = next
		}
		if got := chainString(hops); got != pl.chain {
			t.Errorf("%s: block 0 folds along %s, want %s", pl.name, got, pl.chain)
		}
	}
}

func TestVirtualAllToAllTraffic(t *testing.T) {
	// Block placement of 8 devices on 2 ranks: each rank sends its 4
	// devices' 4 blocks for the other rank, once.
	p := Params{Coll: AllToAll, N: 2, ElemSize: 8, Count: 10, Devices: []int{0, 0, 0, 0, 1, 1, 1, 1}}
	s, err := VirtualAllToAll(p)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Simulate(s, p)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{16 * 80, 16 * 80}; !reflect.DeepEqual(rep.BytesSent, want) {
		t.Errorf("bytes sent %v, want %v", rep.BytesSent, want)
	}
	if want := []int{1, 1}; !reflect.DeepEqual(rep.Messages, want) {
		t.Errorf("messages %v, want %v", rep.Messages, want)
	}
}

func TestVirtualCollectivesBadParams(t *testing.T) {
	for _, b := range virtualBuilders {
		for _, p := range []Params{
			{Coll: b.coll, N: 2, ElemSize: 8, Count: 4},
			{Coll: b.coll, N: 2, ElemSize: 8, Count: 4, Devices: []int{0, 2}},
			{Coll: b.coll, N: 2, ElemSize: 8, Count: 4, Devices: []int{-1}},
			{Coll: b.coll, N: 0, ElemSize: 8, Count: 4, Devices: []int{0}},
			{Coll: Broadcast, N: 2, ElemSize: 8, Count: 4, Devices: []int{0, 1}},
		} {
			if _, err := b.build(p); err == nil {
				t.Errorf("%s %+v: no error", b.coll, p)
			}
		}
	}
	if _, err := VirtualReduce(Params{Coll: Reduce, N: 2, ElemSize: 8, Count: 4, Devices: []int{0, 1}, Root: 2}); err == nil {
		t.Error("reduce to rank 2 of 2: no error")
	}
}
