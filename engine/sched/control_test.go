package sched

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// ctlRun drives the control tree's nodes as a network would: ranks arrive
// in a random order at random times, and each directed pair's messages
// are delivered in order but at random times, to ranks that arrived.
type ctlRun struct {
	t       *testing.T
	tree    *Tree
	nodes   []*Node
	queues  map[[2]int][]Msg
	arrived []bool
	rng     *rand.Rand
	log     []Decision // the root's, as it decides
}

func newCtlRun(t *testing.T, p Params, seed int64) *ctlRun {
	tree, err := NewTree(p)
	if err != nil {
		t.Fatal(err)
	}
	c := &ctlRun{t: t, tree: tree, queues: map[[2]int][]Msg{}, arrived: make([]bool, p.N), rng: rand.New(rand.NewSource(seed))}
	for r := range p.N {
		c.nodes = append(c.nodes, tree.Node(r))
	}
	return c
}

// handle queues what rank r sent and checks what the root decided: both
// groups of a pair had arrived, and its repacker belongs to the source
// group and had arrived.
func (c *ctlRun) handle(r int, out []Msg, decided []Decision) {
	c.t.Helper()
	g := c.tree.g
	for _, m := range out {
		if m.Up != (m.To == c.tree.Parent(r)) {
			c.t.Fatalf("rank %d sends %+v to rank %d, parent %d", r, m, m.To, c.tree.Parent(r))
		}
		k := [2]int{r, m.To}
		c.queues[k] = append(c.queues[k], m)
	}
	if c.tree.Parent(r) >= 0 {
		return
	}
	for _, d := range decided {
		a, b := d.Sub/len(g.dst), d.Sub%len(g.dst)
		for _, q := range append(slices.Clone(g.src[a]), g.dst[b]...) {
			if !c.arrived[q] {
				c.t.Fatalf("sub-matrix %d (groups %v → %v) decided before rank %d arrived", d.Sub, g.src[a], g.dst[b], q)
			}
		}
		if !slices.Contains(g.src[a], d.Rep) {
			c.t.Fatalf("sub-matrix %d given to rank %d, outside source group %v", d.Sub, d.Rep, g.src[a])
		}
		c.log = append(c.log, d)
	}
}

func (c *ctlRun) arrive(r int) {
	c.arrived[r] = true
	out, decided := c.nodes[r].Arrive()
	c.handle(r, out, decided)
}

// deliver hands over the oldest message of pair k.
func (c *ctlRun) deliver(k [2]int) {
	c.t.Helper()
	m := c.queues[k][0]
	c.queues[k] = c.queues[k][1:]
	if len(c.queues[k]) == 0 {
		delete(c.queues, k)
	}
	var out []Msg
	var decided []Decision
	var err error
	if m.Up {
		out, decided, err = c.nodes[k[1]].Up(k[0], m.Ranks)
	} else {
		out, decided, err = c.nodes[k[1]].Down(m.Decisions)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	c.handle(k[1], out, decided)
}

// deliverable lists the pairs whose next message can be taken.
func (c *ctlRun) deliverable() [][2]int {
	var ks [][2]int
	for k := range c.queues {
		if c.arrived[k[1]] {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, func(a, b [2]int) int { return (a[0]-b[0])*1<<20 + a[1] - b[1] })
	return ks
}

// run lets the ranks in order arrive, interleaving deliveries at random,
// and delivers everything at the end.
func (c *ctlRun) run(order []int) {
	for len(order) > 0 || len(c.queues) > 0 {
		ks := c.deliverable()
		if len(order) > 0 && (len(ks) == 0 || c.rng.Intn(3) == 0) {
			c.arrive(order[0])
			order = order[1:]
			continue
		}
		if len(ks) == 0 {
			c.t.Fatalf("messages stuck at ranks that never arrive: %v", c.queues)
		}
		c.deliver(ks[c.rng.Intn(len(ks))])
	}
}

// check: every sub-matrix decided once, every rank knows the root's log
// in its order, and nothing more is expected anywhere.
func (c *ctlRun) check() {
	c.t.Helper()
	seen := make([]bool, c.tree.Subs())
	for _, d := range c.log {
		if seen[d.Sub] {
			c.t.Fatalf("sub-matrix %d decided twice", d.Sub)
		}
		seen[d.Sub] = true
	}
	if len(c.log) != c.tree.Subs() {
		c.t.Fatalf("%d of %d sub-matrices decided", len(c.log), c.tree.Subs())
	}
	for r, n := range c.nodes {
		if !n.Complete() || !slices.Equal(n.Log(), c.log) {
			c.t.Fatalf("rank %d knows %v, the root decided %v", r, n.Log(), c.log)
		}
		for _, ch := range c.tree.Children(r) {
			if n.ExpectsUp(ch) {
				c.t.Fatalf("rank %d still expects registrations from rank %d", r, ch)
			}
		}
	}
}

var treeCases = []Params{
	{N: 1}, {N: 2}, {N: 3}, {N: 5, Group: 2}, {N: 8}, {N: 11, Group: 3}, {N: 16}, {N: 16, Group: 8},
	// Figure 8's sub-groups {1,2}, {0,3}, {4,5}.
	{N: 6, SrcGroups: [][]int{{1, 2}, {0, 3}, {4, 5}}, DstGroups: [][]int{{1, 2}, {0, 3}, {4, 5}}},
	{N: 12, SrcGroups: [][]int{{0, 3, 6, 9}, {1, 4, 7, 10}, {2, 5, 8, 11}}, DstGroups: [][]int{{0, 1}, {2, 3, 4, 5, 6}, {7, 8, 9, 10, 11}}},
}

// The control protocol under random arrivals and deliveries: pairs are
// decided only once both groups arrived, once each, every rank learns the
// same log; the data movement that log amounts to, with every rank
// batching the decisions its own way, is the all-to-all without a
// deadlock.
func TestControlTree(t *testing.T) {
	for _, p := range treeCases {
		for seed := range int64(20) {
			t.Run(fmt.Sprintf("n=%d/g=%d/src=%v/dst=%v/seed=%d", p.N, p.Group, p.SrcGroups, p.DstGroups, seed), func(t *testing.T) {
				p.Coll, p.ElemSize, p.Count = AllToAll, 2, 3
				c := newCtlRun(t, p, seed)
				c.run(c.rng.Perm(p.N))
				c.check()
				cuts := make([][]int, p.N)
				for r := range cuts {
					for range c.tree.Subs() {
						cuts[r] = append(cuts[r], 1+c.rng.Intn(4))
					}
				}
				s, err := c.tree.Decided(c.log, func(r int) []int { return cuts[r] })
				if err != nil {
					t.Fatal(err)
				}
				if _, err := Simulate(s, p); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// Ranks that arrive early work on the sub-matrices that are ready: once
// group 0 is in, the root has paired it with itself and every rank of the
// group knows it, while the other ranks have not arrived; then group 1.
func TestControlTreeEarlyGroups(t *testing.T) {
	p := Params{Coll: AllToAll, N: 16, ElemSize: 1, Count: 1}
	c := newCtlRun(t, p, 1)
	arrive := func(order ...int) {
		for _, r := range order {
			c.arrive(r)
			for ks := c.deliverable(); len(ks) > 0; ks = c.deliverable() {
				c.deliver(ks[0])
			}
		}
	}
	arrive(3, 0, 2, 1)
	if len(c.log) != 1 || c.log[0].Sub != 0 {
		t.Fatalf("group 0 in: the root decided %v, want sub-matrix 0 alone", c.log)
	}
	for r := range 4 {
		if got := c.nodes[r].Log(); !slices.Equal(got, c.log) {
			t.Fatalf("rank %d knows %v before the others arrive, want %v", r, got, c.log)
		}
	}
	// Group 1 next (its registrations travel through ranks 4 and 0, both
	// in): it pairs with group 0 both ways and with itself.
	arrive(7, 6, 5, 4)
	if subs := []int{c.log[1].Sub, c.log[2].Sub, c.log[3].Sub}; !slices.Equal(subs, []int{4, 1, 5}) || len(c.log) != 4 {
		t.Fatalf("log %v: want (1,0), (0,1), (1,1) after (0,0)", c.log)
	}
	arrive(15, 14, 13, 12, 11, 10, 9, 8)
	c.check()
}

// Corrupt or misrouted control messages are errors, not panics.
func TestControlTreeBadMessages(t *testing.T) {
	tree, err := NewTree(Params{Coll: AllToAll, N: 8, ElemSize: 1, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	root, four := tree.Node(0), tree.Node(4)
	for _, bad := range []struct {
		name string
		err  func() error
	}{
		{"not a child", func() error { _, _, err := root.Up(3, []int{3}); return err }},
		{"outside the subtree", func() error { _, _, err := root.Up(4, []int{2}); return err }},
		{"twice", func() error { _, _, err := four.Up(6, []int{6, 6}); return err }},
		{"decisions at the root", func() error { _, _, err := root.Down([]Decision{{0, 0}}); return err }},
		{"sub-matrix out of range", func() error { _, _, err := four.Down([]Decision{{99, 0}}); return err }},
		{"repacker outside the source group", func() error { _, _, err := four.Down([]Decision{{0, 7}}); return err }},
	} {
		if bad.err() == nil {
			t.Errorf("%s: accepted", bad.name)
		}
	}
	if _, _, err := four.Down([]Decision{{1, 1}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := four.Down([]Decision{{1, 1}}); err == nil {
		t.Error("a decision taken twice")
	}
}
