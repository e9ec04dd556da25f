package sched

import (
	"fmt"
	"testing"
)

// The aggregation (docs/design/aggregated-alltoall.md) with sub-groups that do and do not divide N
// (11 ranks in groups of 3), rows and columns of different sizes, and
// non-contiguous groups (every other rank; hosts as placement gives them):
// the simulated result is the all-to-all, without a deadlock.
func TestAggregateGroups(t *testing.T) {
	interleaved := func(n, parts int) [][]int {
		gs := make([][]int, parts)
		for r := range n {
			gs[r%parts] = append(gs[r%parts], r)
		}
		return gs
	}
	cases := []Params{
		{N: 11, Group: 3},
		{N: 16, Group: 4},
		{N: 16, SrcGroups: [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}, DstGroups: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}},
		{N: 12, SrcGroups: interleaved(12, 3), DstGroups: interleaved(12, 4)},
		{N: 7, SrcGroups: [][]int{{6, 0}, {3, 1, 5}, {2, 4}}, Group: 2},
		{N: 5, Group: 5},
		{N: 5, Group: 1},
	}
	for _, p := range cases {
		for _, count := range []int{0, 1, 5} {
			relay := p
			relay.Relay, relay.Coll, relay.ElemSize, relay.Count = true, AllToAll, 4, count
			t.Run(fmt.Sprintf("relay/n=%d/g=%d/src=%v/dst=%v/count=%d", p.N, p.Group, p.SrcGroups, p.DstGroups, count), func(t *testing.T) {
				simulate(t, AggregateAllToAll, relay)
			})
			p.Coll, p.ElemSize, p.Count = AllToAll, 4, count
			t.Run(fmt.Sprintf("n=%d/g=%d/src=%v/dst=%v/count=%d", p.N, p.Group, p.SrcGroups, p.DstGroups, count), func(t *testing.T) {
				simulate(t, AggregateAllToAll, p)
			})
			t.Run(fmt.Sprintf("leader/n=%d/g=%d/src=%v/dst=%v/count=%d", p.N, p.Group, p.SrcGroups, p.DstGroups, count), func(t *testing.T) {
				simulate(t, LeaderAllToAll, p)
			})
		}
	}
}

// Messages per rank: one first-stage message per destination group it
// does not repack itself and one second-stage message per rank of the
// columns it repacks — about 2√N, where pairwise sends N-1.
func TestAggregateMessageCount(t *testing.T) {
	for _, n := range []int{16, 64} {
		s, err := AggregateAllToAll(Params{Coll: AllToAll, N: n, ElemSize: 1, Count: 8})
		if err != nil {
			t.Fatal(err)
		}
		most := 0
		for r := range n {
			most = max(most, sends(s, r))
		}
		g := 1
		for g*g < n {
			g++
		}
		if most > 2*g || most >= n-1 {
			t.Errorf("n=%d: a rank sends %d messages; want at most 2√N = %d (pairwise: %d)", n, most, 2*g, n-1)
		}
	}
}

func TestAggregateBadGroups(t *testing.T) {
	for _, gs := range [][][]int{{{0, 1}, {1, 2}}, {{0, 1}}, {{0, 1, 2}, {}}, {{0, 1, 5}}} {
		if _, err := AggregateAllToAll(Params{Coll: AllToAll, N: 3, ElemSize: 1, Count: 1, SrcGroups: gs}); err == nil {
			t.Errorf("groups %v accepted", gs)
		}
	}
}

// The leader form's message count: with H groups of R ranks, H·(R-1)
// rows to the leaders, H·(H-1) sub-matrices between them and H·(R-1)
// deliveries; a rank that leads nothing sends one message.
func TestLeaderMessageCount(t *testing.T) {
	for _, c := range []struct{ h, r int }{{4, 4}, {2, 8}, {8, 2}, {4, 1}, {1, 4}, {3, 5}} {
		n := c.h * c.r
		var groups [][]int
		for h := range c.h {
			var g []int
			for i := range c.r {
				g = append(g, h*c.r+i)
			}
			groups = append(groups, g)
		}
		s, err := LeaderAllToAll(Params{Coll: AllToAll, N: n, ElemSize: 1, Count: 8, SrcGroups: groups, DstGroups: groups})
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for r := range n {
			k := sends(s, r)
			if r%c.r != 0 && k != 1 {
				t.Errorf("%dx%d: rank %d (no leader) sends %d messages, want 1", c.h, c.r, r, k)
			}
			total += k
		}
		if want := 2*c.h*(c.r-1) + c.h*(c.h-1); total != want {
			t.Errorf("%dx%d: %d messages in all, want %d", c.h, c.r, total, want)
		}
	}
}

// sends counts the messages rank r sends in s.
func sends(s *Schedule, r int) int {
	k := 0
	for _, op := range s.Ops(r) {
		if op.Kind == Send {
			k++
		}
	}
	return k
}
