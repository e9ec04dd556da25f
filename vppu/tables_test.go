package vppu

import (
	"slices"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/topology"
)

func TestNeighbours(t *testing.T) {
	for spec, want := range map[string][][]int{
		"ring:4":    {{1, 3}, {0, 2}, {1, 3}, {0, 2}},
		"mesh:2x3":  {{1, 3}, {0, 2, 4}, {1, 5}, {0, 4}, {1, 3, 5}, {2, 4}},
		"torus:2x3": {{1, 2, 3}, {0, 2, 4}, {0, 1, 5}, {0, 4, 5}, {1, 3, 5}, {2, 3, 4}},
		"tree:5":    {{1, 2}, {0, 3, 4}, {0}, {1}, {1}},
		"full:3":    {{1, 2}, {0, 2}, {0, 1}},
	} {
		l, err := ParseLogical(spec, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := l.Neighbours()
		for v := range want {
			if !slices.Equal(got[v], want[v]) {
				t.Errorf("%s: device %d neighbours %v, want %v", spec, v, got[v], want[v])
			}
		}
	}
	for _, bad := range []string{"ring:0", "mesh:2", "hypercube", "torus:2x3x4"} {
		if _, err := ParseLogical(bad, 0); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := ParseLogical("mesh:2x3", 8); err == nil {
		t.Error("mesh:2x3 accepted for 8 devices")
	}
}

// Every virtual edge is local or carried by links that exist and join its
// two ranks' devices (in order along the route); in use and free links
// partition the topology's links.
func checkTables(t *testing.T, l Logical, p Place, g *topology.Graph) Tables {
	t.Helper()
	tb, err := RoutingTables(l, p, g)
	if err != nil {
		t.Fatal(err)
	}
	edges := 0
	for _, ns := range tb.Virtual {
		edges += len(ns)
	}
	if len(tb.Physical) != edges {
		t.Fatalf("%d physical entries for %d virtual edges", len(tb.Physical), edges)
	}
	for _, e := range tb.Physical {
		if e.Ranks != [2]int{p[e.From], p[e.To]} {
			t.Fatalf("edge %+v: ranks, want %d→%d", e, p[e.From], p[e.To])
		}
		if (e.Link == nil) != (e.Ranks[0] == e.Ranks[1]) {
			t.Fatalf("edge %+v: a link exactly when the ranks differ", e)
		}
		if e.Link == nil {
			continue
		}
		at := e.Ranks[0]
		for _, id := range strings.Split(*e.Link, ">") {
			i, ok := g.LinkIndex(id)
			if !ok {
				t.Fatalf("edge %+v: no link %q", e, id)
			}
			lk := g.Links[i]
			switch at {
			case lk.A:
				at = lk.B
			case lk.B:
				at = lk.A
			default:
				t.Fatalf("edge %+v: link %s does not start at node %d", e, id, at)
			}
		}
		if at != e.Ranks[1] {
			t.Fatalf("edge %+v: the route ends at %d", e, at)
		}
	}
	all := append(slices.Clone(tb.InUse), tb.Free...)
	slices.Sort(all)
	var ids []string
	for _, lk := range g.Links {
		ids = append(ids, lk.ID)
	}
	slices.Sort(ids)
	if !slices.Equal(all, ids) {
		t.Fatalf("in use ∪ free = %v, links %v", all, ids)
	}
	return tb
}

func TestRoutingTables(t *testing.T) {
	cube, _ := topology.Builtin("hybrid-cube-mesh")
	ring8, _ := ParseLogical("ring:8", 0)
	// The virtual ring laid along the cube-mesh's first Hamiltonian ring
	// uses one link per edge pair direction and leaves the other ring free.
	tb := checkTables(t, ring8, Place{0, 1, 2, 3, 7, 6, 5, 4}, cube)
	if len(tb.InUse) != 14 || len(tb.Free) != 14 {
		t.Fatalf("ring on the cube-mesh: %d links in use, %d free", len(tb.InUse), len(tb.Free))
	}
	// Two virtual devices per unit: edges inside a unit stay local.
	tb = checkTables(t, ring8, Block(8, 4), cube)
	local := 0
	for _, e := range tb.Physical {
		if e.Link == nil {
			local++
		}
	}
	if local != 8 {
		t.Fatalf("4 units hosting 2 ring neighbours each: %d local edges, want 8", local)
	}
	cl, _ := topology.Builtin("cluster:2x2")
	torus, _ := ParseLogical("torus:2x2", 0)
	checkTables(t, torus, Place{0, 1, 2, 3}, cl)
	full, _ := ParseLogical("full:6", 0)
	checkTables(t, full, CyclicPlace(6, 4), cl)
	if _, err := RoutingTables(ring8, Place{0, 1, 2}, cube); err == nil {
		t.Fatal("a placement of the wrong length was accepted")
	}
	if _, err := RoutingTables(ring8, Place{0, 1, 2, 3, 4, 5, 6, 9}, cube); err == nil {
		t.Fatal("a placement on a missing device was accepted")
	}
}

func TestParsePlace(t *testing.T) {
	p, err := ParsePlace("block:3", 8)
	if err != nil || !slices.Equal(p, Place{0, 0, 0, 1, 1, 1, 2, 2}) {
		t.Fatalf("block:3 → %v, %v", p, err)
	}
	p, err = ParsePlace("cyclic:3", 5)
	if err != nil || !slices.Equal(p, Place{0, 1, 2, 0, 1}) {
		t.Fatalf("cyclic:3 → %v, %v", p, err)
	}
	if _, err := ParsePlace("0,1", 3); err == nil {
		t.Fatal("two ranks for three devices accepted")
	}
}
