package choose

import (
	"testing"

	"github.com/gocoll/gocoll/engine/internal/schedtest"
	"github.com/gocoll/gocoll/engine/sched"
)

// A shape's plan is built once and kept; a schedule built from one call's
// layouts (alltoallv's pairwise exchange) is built per call; the cache
// stays bounded.
func TestPlans(t *testing.T) {
	var ps Plans
	ring := Lookup(sched.AllReduce, "ring")
	p := sched.Params{Coll: sched.AllReduce, N: 4, ElemSize: 4, Count: 100}
	a, err := ps.Get(ring, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Ops) == 0 || a.S.N != 4 {
		t.Fatalf("rank 1's plan: %d ops of %d ranks", len(a.Ops), a.S.N)
	}
	if b, _ := ps.Get(ring, p, 1); b.S != a.S {
		t.Error("the same shape was built again")
	}
	p.Count = 101
	if b, _ := ps.Get(ring, p, 1); b.S == a.S {
		t.Error("another count got the first count's schedule")
	}

	pairwise := Lookup(sched.AllToAllv, "pairwise")
	c := randomLayouts(nil, 3)
	v1, err := ps.Get(pairwise, c.layouts[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	if v2, _ := ps.Get(pairwise, c.layouts[0], 0); v2.S == v1.S {
		t.Error("a schedule of one call's layouts was kept")
	}
	agg := Lookup(sched.AllToAllv, "aggregate")
	b1, err := ps.Get(agg, c.layouts[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	if b2, _ := ps.Get(agg, c.layouts[0], 0); !b1.S.Blocks || b2.S != b1.S {
		t.Error("a block-mode schedule was not kept")
	}

	for count := range 3 * maxPlans {
		if _, err := ps.Get(ring, sched.Params{Coll: sched.AllReduce, N: 4, ElemSize: 4, Count: count}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if len(ps.m) > maxPlans {
		t.Errorf("%d plans kept, at most %d", len(ps.m), maxPlans)
	}
	if _, err := ps.Get(Lookup(sched.AllReduce, "hier"), p, 0); err == nil {
		t.Error("a hierarchical schedule without hosts was built")
	}
}

// Across hosts the cost model picks among the schedules that can run the
// call, the same wherever it is asked; all-to-alls keep the measured
// thresholds; one host and very many ranks leave it to the size rules.
func TestModel(t *testing.T) {
	hosts := [][]int{{0, 1}, {2, 3}}
	base := sched.Params{N: 4, Hosts: hosts}
	if m := NewModel(sched.Params{N: 4, Hosts: [][]int{{0, 1, 2, 3}}}, 0); m != nil {
		t.Error("a model on one host")
	}
	if m := NewModel(sched.Params{N: 2 * (directMaxRanks/2 + 1), Hosts: schedtest.HostsOf(2, directMaxRanks/2+1, true)}, 0); m != nil {
		t.Error("a model of a placement walked whole above directMaxRanks")
	}
	ch := &Chooser{Model: NewModel(base, 0)}
	if ch.Model == nil {
		t.Fatal("no model across two hosts")
	}
	for _, tc := range []struct {
		coll  sched.Coll
		bytes int
		want  string
	}{
		{sched.AllReduce, 16 << 20, "hier"},
		{sched.AllReduce, 256, "rd"},
		{sched.AllGather, 16 << 20, "hier"},
		{sched.Barrier, 0, "rd"},
		{sched.AllToAll, 4 * 64, "bruck"},
		{sched.AllToAll, 4 * (64 << 10), "pairwise"},
	} {
		s := Shape{Coll: tc.coll, Bytes: tc.bytes, N: 4, Hosts: 2, Even: true}
		got := ch.Choose(s)
		if got.Name != tc.want {
			t.Errorf("%s of %d bytes on %v: %s, want %s", tc.coll, tc.bytes, hosts, got.Name, tc.want)
		}
		if again := (&Chooser{Model: NewModel(base, 0)}).Choose(s); again != got {
			t.Errorf("%s of %d bytes: another model of the same placement picks %s, not %s", tc.coll, tc.bytes, again.Name, got.Name)
		}
	}
	forced, err := ParseOverrides("allreduce=ring")
	if err != nil {
		t.Fatal(err)
	}
	if got := (&Chooser{Overrides: forced, Model: ch.Model}).Choose(Shape{Coll: sched.AllReduce, Bytes: 16 << 20, N: 4, Hosts: 2, Even: true}); got.Name != "ring" {
		t.Errorf("GOCOLL_ALGO=allreduce=ring gives %s", got.Name)
	}
}
