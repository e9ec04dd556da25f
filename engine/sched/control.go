package sched

import (
	"fmt"
	"slices"
)

// The control tree of docs/design/aggregated-alltoall.md (the source's steps 7.1–7.6): a reduction tree over
// the ranks takes each rank's arrival registration, marks a sub-group
// ready once all its members registered, pairs a ready source sub-group
// with a ready destination sub-group, gives the pair's sub-matrix to a
// repacking rank and notifies the sources, the destinations and the
// repacker. Ranks that arrived early move the sub-matrices that are ready
// while the others are still on their way.
//
// Here the tree is binomial and rooted at rank 0: rank r's parent is r
// with its lowest set bit cleared, so its subtree is the ranks
// r … r+lowbit(r)-1. A rank sends its parent its own registration when it
// arrives and forwards each registration message of its children as it
// comes (up). The root pairs groups as registrations reach it and sends
// the decisions it made to its children, who forward them to theirs
// before acting on them (down): every rank learns every decision, in the
// root's order, and a rank that waits for a decision's data has always
// been told of that decision before the data can arrive from its parent.
//
// The tree's inner nodes are ranks, not switches as in the document: a
// registration reaches the root only through ancestors that have arrived
// themselves. In a binomial tree a rank's ancestors are lower ranks, so
// a sub-group of consecutive ranks (a host's) waits for nobody outside
// it but lower-ranked ancestors.
//
// The repacking rank of a pair is the member of the source group that has
// been given the fewest sub-matrices so far, the earliest to arrive among
// equals: the first stage stays inside the group (inside a host when the
// hosts are the groups), and the work spreads over the group as in the
// static assignment of AggregateAllToAll, except that it follows the
// order of arrival. Completion needs no message of its own (step 7.5): a
// source is done when its sends are, a destination when the repacked
// messages it was told to expect are in, and each rank finishes once both
// hold (7.6).
//
// The relay stage of AggregateAllToAll (Params.Relay) has no part here:
// a repacking rank sends each destination its row.
//
// Node is one rank's part of the protocol as a deterministic state
// machine: the engine moves its messages and runs the data movement of
// each decision (RankOps); tests drive nodes directly in any order of
// arrival and delivery. Decided turns a finished log into the schedule of
// the data movement, for the simulator.

// Decision gives sub-matrix Sub (source group Sub/B, destination group
// Sub%B, B destination groups) to repacking rank Rep.
type Decision struct{ Sub, Rep int }

// Tree is the control tree of one call shape.
type Tree struct {
	g        *aggPlan
	parent   []int // -1 at the root
	children [][]int
}

// NewTree makes the control tree for p's ranks and sub-groups (as
// AggregateAllToAll takes them).
func NewTree(p Params) (*Tree, error) {
	g, err := newAggPlan(p)
	if err != nil {
		return nil, err
	}
	t := &Tree{g: g, parent: make([]int, g.n), children: make([][]int, g.n)}
	for r := range g.n {
		t.parent[r] = r & (r - 1) // clears the lowest set bit
		if r == 0 {
			t.parent[r] = -1
		}
		for bit := 1; bit < lowbit(r, g.n) && r+bit < g.n; bit <<= 1 {
			t.children[r] = append(t.children[r], r+bit)
		}
	}
	return t, nil
}

// lowbit is r's lowest set bit (n, beyond every rank, for the root).
func lowbit(r, n int) int {
	if r == 0 {
		return max(n, 1) << 1
	}
	return r & -r
}

// Subs is the number of sub-matrices, each decided once.
func (t *Tree) Subs() int { return t.g.subs() }

// Parent is rank r's parent (-1 for the root), Children its children.
func (t *Tree) Parent(r int) int        { return t.parent[r] }
func (t *Tree) Children(r int) []int    { return t.children[r] }
func (t *Tree) inSubtree(c, r int) bool { return r >= c && r < c+lowbit(c, t.g.n) }

// subtreeSize is the number of ranks in c's subtree.
func (t *Tree) subtreeSize(c int) int { return min(c+lowbit(c, t.g.n), t.g.n) - c }

// Msg is a control message: registrations on their way up or decisions
// on their way down.
type Msg struct {
	To int
	Up bool
	// Up: ranks of the sender's subtree that registered since its last
	// message. Down: the next decisions of the root's log.
	Ranks     []int
	Decisions []Decision
}

// Node is rank r's part of the control tree.
type Node struct {
	t      *Tree
	rank   int
	heard  map[int]int // registrations heard from each child
	got    []bool      // ranks whose registration came through here
	log    []Decision  // the decisions this rank knows, in the root's order
	seen   []bool      // sub-matrices in log
	ctl    *controller // the root's
	joined bool
}

// Node returns rank r's part of the tree, before its arrival.
func (t *Tree) Node(r int) *Node {
	n := &Node{t: t, rank: r, heard: map[int]int{}, got: make([]bool, t.g.n), seen: make([]bool, t.Subs())}
	if t.parent[r] < 0 {
		n.ctl = newController(t.g)
	}
	return n
}

// Arrive registers this rank (step 7.1): the messages to send, and on the
// root the decisions that made.
func (n *Node) Arrive() (out []Msg, decided []Decision) {
	if n.joined {
		return nil, nil
	}
	n.joined = true
	return n.registered([]int{n.rank})
}

// registered moves registrations up, or decides on the root.
func (n *Node) registered(ranks []int) (out []Msg, decided []Decision) {
	if n.ctl == nil {
		return []Msg{{To: n.t.parent[n.rank], Up: true, Ranks: ranks}}, nil
	}
	for _, r := range ranks {
		decided = append(decided, n.ctl.register(r)...)
	}
	return n.learn(decided), decided
}

// Up takes a registration message from child from.
func (n *Node) Up(from int, ranks []int) (out []Msg, decided []Decision, err error) {
	if !slices.Contains(n.t.children[n.rank], from) {
		return nil, nil, fmt.Errorf("sched: control tree: rank %d got registrations from rank %d, not a child", n.rank, from)
	}
	for i, r := range ranks {
		if !n.t.inSubtree(from, r) || n.got[r] || slices.Contains(ranks[:i], r) {
			return nil, nil, fmt.Errorf("sched: control tree: rank %d got a registration of rank %d from rank %d, outside its subtree or twice", n.rank, r, from)
		}
	}
	for _, r := range ranks {
		n.got[r] = true
	}
	n.heard[from] += len(ranks)
	out, decided = n.registered(ranks)
	return out, decided, nil
}

// Down takes decisions from the parent: they go on to the children first,
// then this rank acts on them.
func (n *Node) Down(ds []Decision) (out []Msg, decided []Decision, err error) {
	if n.ctl != nil {
		return nil, nil, fmt.Errorf("sched: control tree: the root got decisions")
	}
	for _, d := range ds {
		if d.Sub < 0 || d.Sub >= len(n.seen) || n.seen[d.Sub] {
			return nil, nil, fmt.Errorf("sched: control tree: rank %d got a decision for sub-matrix %d twice or out of range", n.rank, d.Sub)
		}
		if !slices.Contains(n.t.g.src[d.Sub/len(n.t.g.dst)], d.Rep) {
			return nil, nil, fmt.Errorf("sched: control tree: rank %d told that rank %d repacks sub-matrix %d, outside its source group", n.rank, d.Rep, d.Sub)
		}
	}
	return n.learn(ds), ds, nil
}

// learn appends ds to the log and addresses them to the children.
func (n *Node) learn(ds []Decision) []Msg {
	if len(ds) == 0 {
		return nil
	}
	for _, d := range ds {
		n.seen[d.Sub] = true
	}
	n.log = append(n.log, ds...)
	var out []Msg
	for _, c := range n.t.children[n.rank] {
		out = append(out, Msg{To: c, Decisions: ds})
	}
	return out
}

// ExpectsUp says whether child c has registrations still to send.
func (n *Node) ExpectsUp(c int) bool { return n.heard[c] < n.t.subtreeSize(c) }

// Complete says whether this rank knows every decision: nothing more will
// come from its parent.
func (n *Node) Complete() bool { return len(n.log) == len(n.seen) }

// Log is the decisions this rank knows, in the root's order.
func (n *Node) Log() []Decision { return slices.Clone(n.log) }

// controller is the root's bookkeeping (steps 7.2 and 7.3).
type controller struct {
	g                  *aggPlan
	srcLeft, dstLeft   []int // members of each group yet to register
	readySrc, readyDst []int // ready groups, in the order they became so
	load               []int // sub-matrices given to each rank
	arrival            []int // order of arrival (-1: not yet)
	arrived            int
}

func newController(g *aggPlan) *controller {
	c := &controller{g: g, srcLeft: make([]int, len(g.src)), dstLeft: make([]int, len(g.dst)),
		load: make([]int, g.n), arrival: make([]int, g.n)}
	for a, m := range g.src {
		c.srcLeft[a] = len(m)
	}
	for b, m := range g.dst {
		c.dstLeft[b] = len(m)
	}
	for r := range c.arrival {
		c.arrival[r] = -1
	}
	return c
}

// register takes rank r's arrival and returns the pairs it made ready.
func (c *controller) register(r int) []Decision {
	if c.arrival[r] >= 0 {
		return nil
	}
	c.arrival[r] = c.arrived
	c.arrived++
	var out []Decision
	a, b := c.g.srcOf[r], c.g.dstOf[r]
	c.srcLeft[a]--
	c.dstLeft[b]--
	if c.srcLeft[a] == 0 {
		c.readySrc = append(c.readySrc, a)
		for _, ready := range c.readyDst {
			out = append(out, c.assign(a, ready))
		}
	}
	if c.dstLeft[b] == 0 {
		c.readyDst = append(c.readyDst, b)
		for _, ready := range c.readySrc {
			out = append(out, c.assign(ready, b))
		}
	}
	return out
}

// assign gives sub-matrix (a, b) to the least loaded rank of source group
// a, the earliest to arrive among equals.
func (c *controller) assign(a, b int) Decision {
	best := -1
	for _, r := range c.g.src[a] {
		if best < 0 || c.load[r] < c.load[best] || c.load[r] == c.load[best] && c.arrival[r] < c.arrival[best] {
			best = r
		}
	}
	c.load[best]++
	return Decision{Sub: a*len(c.g.dst) + b, Rep: best}
}

// RankOps turns the decisions rank r learns into its operations, giving
// each sub-matrix it repacks its Tmp areas as it comes.
type RankOps struct {
	g    *aggPlan
	r    int
	next int // first free block of Tmp
}

// RankOps returns rank r's operation maker.
func (t *Tree) RankOps(r int) *RankOps { return &RankOps{g: t.g, r: r, next: 2 * t.g.n} }

// TmpBlocks is how many blocks of Tmp the operations so far use.
func (o *RankOps) TmpBlocks() int { return o.next }

// Prologue packs this rank's blocks for the destination groups that are
// not runs of ranks.
func (o *RankOps) Prologue(yield func(Op) bool) { o.g.pack(&emitter{yield: yield}) }

// Epilogue unpacks the blocks from source groups that are not runs of
// ranks, once every decision's data is in.
func (o *RankOps) Epilogue(round int, yield func(Op) bool) {
	o.g.unpack(&emitter{yield: yield}, round)
}

// Batch is this rank's operations for decisions it learnt together: first
// every send and receive that waits for nothing but data, then the
// repacking of the sub-matrices it was given and their second stage, so
// that a repacking that waits for a late source holds up nothing else of
// the batch.
func (o *RankOps) Batch(ds []Decision, round int, yield func(Op) bool) {
	g, r := o.g, o.r
	e := &emitter{yield: yield}
	in := make([]int, len(ds))
	for i, d := range ds {
		if d.Rep == r {
			in[i] = o.next
			o.next += 2 * g.area(d.Sub)
		}
	}
	for i, d := range ds {
		a, b := d.Sub/len(g.dst), d.Sub%len(g.dst)
		if g.srcOf[r] == a {
			g.stage1Send(e, r, d.Sub, d.Rep, round, in[i])
		}
		if d.Rep == r {
			g.stage1Recv(e, r, d.Sub, round, in[i])
		} else if g.dstOf[r] == b {
			e.recv(d.Rep, aggTag(d.Sub, 1), round, g.incoming(a))
		}
	}
	for i, d := range ds {
		if d.Rep == r {
			g.repack(e, d.Sub, round, in[i], in[i]+g.area(d.Sub))
			g.stage2Send(e, r, d.Sub, round, in[i]+g.area(d.Sub))
		}
	}
}

// Decided is the data movement the control tree runs once the decisions
// of log are known: rank r learns them in batches of the lengths cut(r)
// gives (nil: one at a time) and runs each batch as RankOps does. Ranks
// batch differently, so receives take their messages by tag (Matched).
func (t *Tree) Decided(log []Decision, cut func(r int) []int) (*Schedule, error) {
	if len(log) != t.Subs() {
		return nil, fmt.Errorf("sched: %d decisions for %d sub-matrices", len(log), t.Subs())
	}
	batches := func(r int) [][]Decision {
		var lens []int
		if cut != nil {
			lens = cut(r)
		}
		var out [][]Decision
		rest := log
		for i := 0; len(rest) > 0; i++ {
			k := 1
			if i < len(lens) {
				k = min(max(lens[i], 1), len(rest))
			}
			out = append(out, rest[:k])
			rest = rest[k:]
		}
		return out
	}
	g := t.g
	s := New(AllToAll, "aggregate-tree", g.n, g.es, func(r int, yield func(Op) bool) {
		o := t.RankOps(r)
		o.Prologue(yield)
		bs := batches(r)
		for i, b := range bs {
			o.Batch(b, i, yield)
		}
		o.Epilogue(len(bs), yield)
	})
	tmp := 2 * g.n
	rounds := 1
	for r := range g.n {
		o := t.RankOps(r)
		bs := batches(r)
		for i, b := range bs {
			o.Batch(b, i, func(Op) bool { return true })
		}
		tmp = max(tmp, o.TmpBlocks())
		rounds = max(rounds, len(bs)+1)
	}
	s.WorkLen, s.InLen, s.TmpLen = g.n*g.bs, g.n*g.bs, tmp*g.bs
	s.Rounds, s.Matched = rounds, true
	return s, nil
}

// AggregateTreeAllToAll is the schedule the control tree arrives at when
// the ranks register in rank order and every message is delivered at
// once: what the catalogue, gocoll-topo and the simulator see of
// aggregate-tree. The engine decides while it runs (RankOps, Node).
func AggregateTreeAllToAll(p Params) (*Schedule, error) {
	t, err := NewTree(p)
	if err != nil {
		return nil, err
	}
	ctl := newController(t.g)
	var log []Decision
	for r := range t.g.n {
		log = append(log, ctl.register(r)...)
	}
	s, err := t.Decided(log, nil)
	if err != nil {
		return nil, err
	}
	s.Tree = t
	return s, nil
}
