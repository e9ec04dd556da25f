package cost

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
)

// pinnedCases are schedules of every kind of operation the model prices
// (segmented pipelines, reductions, copies, Scale, parallel links, ranks
// placed off their device order) on several graphs.
func pinnedCases(t *testing.T) []struct {
	name  string
	m     *Model
	build sched.Builder
	p     sched.Params
} {
	cm := func() *topology.Graph {
		params := topology.DefaultParams()
		params.DevBandwidth = 2e9
		g, err := topology.BuiltinWith("hybrid-cube-mesh", params)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}()
	var rings [][]int
	for _, r := range cm.MaxDisjointRings().Rings {
		rings = append(rings, r.Order())
	}
	model := func(spec string) *Model { return New(builtin(t, spec)) }
	placed := model("ring:8")
	placed.Ranks = []int{0, 2, 4, 6, 1, 3, 5, 7}
	rated := model("cluster:3x2")
	rated.Call, rated.ReduceRate, rated.CopyRate = 5e-6, 7e9, 11e9
	h22, h42, h33 := [][]int{{0, 1}, {2, 3}}, [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}
	return []struct {
		name  string
		m     *Model
		build sched.Builder
		p     sched.Params
	}{
		{"ring4/ring", model("ring:4"), sched.RingAllReduce, sched.Params{Coll: sched.AllReduce, N: 4, ElemSize: 4, Count: 1 << 20}},
		{"2x2/hier-avg", model("cluster:2x2:250mbit"), sched.HierAllReduce, sched.Params{Coll: sched.AllReduce, N: 4, ElemSize: 4, Count: 4 << 20, Hosts: h22, Avg: true}},
		{"4x4/rd", model("cluster:4x4"), sched.RDAllReduce, sched.Params{Coll: sched.AllReduce, N: 16, ElemSize: 4, Count: 256}},
		{"cubemesh/two-rings", New(cm), sched.RingAllReduce, sched.Params{Coll: sched.AllReduce, N: 8, ElemSize: 4, Count: 16 << 20, Rings: rings}},
		{"4x2/bruck", model("cluster:4x2"), sched.BruckAllToAll, sched.Params{Coll: sched.AllToAll, N: 8, ElemSize: 4, Count: 1000}},
		{"4x2/pairwise", model("cluster:4x2"), sched.PairwiseAllToAll, sched.Params{Coll: sched.AllToAll, N: 8, ElemSize: 2, Count: 3001}},
		{"3x2/hd-segments", rated, sched.HDAllReduce, sched.Params{Coll: sched.AllReduce, N: 6, ElemSize: 8, Count: 12345, Segments: 4, Avg: true}},
		{"torus/tree-bcast", model("torus:3x3"), sched.TreeBroadcast, sched.Params{Coll: sched.Broadcast, N: 9, ElemSize: 1, Count: 1 << 16, Root: 2}},
		{"torus/chain-bcast", model("torus:3x3"), sched.ChainBroadcast, sched.Params{Coll: sched.Broadcast, N: 9, ElemSize: 1, Count: 1 << 20, Root: 4, SegBytes: 64 << 10}},
		{"ring8-placed/allgather", placed, sched.RingAllGather, sched.Params{Coll: sched.AllGather, N: 8, ElemSize: 4, Count: 5000}},
		{"3x3/aggregate", model("cluster:3x3"), sched.AggregateAllToAll, sched.Params{Coll: sched.AllToAll, N: 9, ElemSize: 4, Count: 100}},
		{"4x2/dbtree", model("cluster:4x2"), sched.DBTreeAllReduce, sched.Params{Coll: sched.AllReduce, N: 8, ElemSize: 4, Count: 1 << 18}},
		{"4x2/hier-allgather", model("cluster:4x2"), sched.HierAllGather, sched.Params{Coll: sched.AllGather, N: 8, ElemSize: 4, Count: 777, Hosts: h42}},
		{"3x3/leader", model("cluster:3x3"), sched.LeaderAllToAll, sched.Params{Coll: sched.AllToAll, N: 9, ElemSize: 4, Count: 64, Hosts: h33}},
		// 300² paths: more than the path cache keeps
		{"50x6/pairwise", model("cluster:50x6"), sched.PairwiseAllToAll, sched.Params{Coll: sched.AllToAll, N: 300, ElemSize: 4, Count: 16}},
		{"fattree/hd-rs", model("fattree:4"), sched.HDReduceScatter, sched.Params{Coll: sched.ReduceScatter, N: 16, ElemSize: 4, Count: 4096}},
	}
}

func pinnedText(pr Prediction) string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return fmt.Sprintf("%s %d %d %d %s %s", f(pr.Seconds), pr.Rounds, pr.Messages, pr.Bytes, pr.Busiest, f(pr.BusiestTime))
}

// TestPredictPinned pins Predict's answers, to the last bit, on schedules
// of every kind: a change to the model's code that is meant to keep its
// numbers must keep these. A change to the model itself updates them
// (go test -run TestPredictPinned -v prints the new ones).
func TestPredictPinned(t *testing.T) {
	want := map[string]string{
		"ring4/ring":             "0.001527034692307692 6 384 25165824 d0-d1 0.00012582912",
		"2x2/hier-avg":           "0.5417926538677463 4 256 100663296 host0.nic 1.073741824",
		"4x4/rd":                 "0.00015119757300944672 6 64 65536 host0.nic 1.31072e-05",
		"cubemesh/two-rings":     "0.030880650589743597 14 3584 939524096 d0-d1.0+d0-d1.1 0.02936012800000001",
		"4x2/bruck":              "0.00017733333333333333 3 24 384000 host0.nic 0.000128",
		"4x2/pairwise":           "0.00030981926666666674 7 56 336112 host0.nic 0.00011523839999999997",
		"3x2/hd-segments":        "0.0008227279759398495 15 50 987600 host2.nic 0.00031603199999999994",
		"torus/tree-bcast":       "7.75536e-05 4 8 524288 d2-d0.h 3.93216e-06",
		"torus/chain-bcast":      "0.0004601859199999999 23 128 8388608 d2-d0.h 4.1943040000000004e-05",
		"ring8-placed/allgather": "0.0001785 7 112 1120000 d0-d1 5.6e-06",
		"3x3/aggregate":          "7.859157894736842e-05 4 42 50400 host0.nic 1.152e-05",
		"4x2/dbtree":             "0.0040739250871794875 7 56 14680064 host1.nic 0.0058720256000000005",
		"4x2/hier-allgather":     "0.0001621899789473684 4 56 174048 host0.nic 2.9836800000000002e-05",
		"3x3/leader":             "0.00011480286315789474 4 18 41472 host0.nic 7.3728e-06",
		"50x6/pairwise":          "0.01085431893333337 299 89700 5740800 host0.nic 0.0001806335999999987",
		"fattree/hd-rs":          "0.0002669095384615385 5 64 3932160 p0.e0.h0 0.00039321600000000005",
	}
	for _, c := range pinnedCases(t) {
		s, err := c.build(c.p)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		pr, err := c.m.Predict(s)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := pinnedText(pr)
		t.Logf("%q: %q,", c.name, got)
		if w, ok := want[c.name]; !ok || got != w {
			t.Errorf("%s: %s, pinned %s", c.name, got, w)
		}
	}
}
