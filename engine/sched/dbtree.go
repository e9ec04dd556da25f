package sched

import (
	"fmt"
	"slices"
)

// Double binary tree allreduce (NCCL's): the vector is cut in two halves,
// half t runs on tree t, and the trees are chosen so that a rank that is
// interior in one is a leaf in the other — every rank sends and receives
// about the vector once each way, with a latency of O(log n) instead of a
// ring's O(n). On each tree the half is cut into segments of
// Params.SegBytes and pipelined: segment k goes up (each rank folds its
// children's partials into its own, then passes it to its parent) while
// segment k-1 is still rising and earlier ones come down again (the root
// divides for Avg, then every rank copies what its parent sends and
// forwards it to its children). Every element is reduced by one fixed
// tree in a fixed order and the way down only copies, so all ranks end
// bitwise identical.
//
// Rounds: a rank of height h (leaves 0) sends segment k up in round k+h
// and receives its children's in their rounds; the root, of height H,
// sends segment k down in round k+H, and a rank at depth d forwards it in
// round k+H+d. Each rank's program lists its operations round by round —
// in a round, per tree: receive-reduces from its children (lowest child
// first), the send up, the receive from its parent, the sends down — which
// keeps rounds non-decreasing and gives both ends of every pair the same
// message order (one message per tree, direction and round on an edge).
// A rank's children are reduced in order of height, then rank, so that
// the receive-reduces of one segment come in round order.
//
// Params.Trees gives the trees as parent arrays (parent[r] = -1 for the
// root); the topology package builds them to follow the machine. Without
// them: tree 0 is the heap-ordered binary tree (parent (i-1)/2), tree 1
// the same over the ranks numbered backwards, whose interior ranks are
// tree 0's leaves.

// tree is one parent array with what the schedule needs of it.
type tree struct {
	parent        []int
	root, h       int   // h: the root's height
	height, depth []int // per rank
	kids          []int // children of every rank, by (height, rank)
	first         []int // kids[first[r]:first[r+1]] are r's
}

func newTree(parent []int, n int) (*tree, error) {
	if len(parent) != n {
		return nil, fmt.Errorf("%d parents for %d ranks", len(parent), n)
	}
	t := &tree{parent: parent, root: -1, height: make([]int, n), depth: make([]int, n), first: make([]int, n+1)}
	for r, p := range parent {
		switch {
		case p == -1 && t.root >= 0:
			return nil, fmt.Errorf("two roots, %d and %d", t.root, r)
		case p == -1:
			t.root = r
		case p < 0 || p >= n || p == r:
			return nil, fmt.Errorf("rank %d's parent %d", r, p)
		default:
			t.first[p+1]++
		}
	}
	if t.root < 0 {
		return nil, fmt.Errorf("no root")
	}
	// Depths by walking up, remembering what is known; a walk longer than
	// n is a cycle.
	const unknown = -1
	for r := range t.depth {
		t.depth[r] = unknown
	}
	t.depth[t.root] = 0
	var path []int
	for r := range parent {
		path = path[:0]
		for q := r; t.depth[q] == unknown; q = parent[q] {
			path = append(path, q)
			if len(path) > n {
				return nil, fmt.Errorf("a cycle through rank %d", r)
			}
		}
		base := t.depth[parentOrSelf(parent, path, r)]
		for i := len(path) - 1; i >= 0; i-- {
			base++
			t.depth[path[i]] = base
		}
	}
	// Heights, deepest ranks first.
	byDepth := make([]int, n)
	for i := range byDepth {
		byDepth[i] = i
	}
	slices.SortFunc(byDepth, func(a, b int) int { return t.depth[b] - t.depth[a] })
	for _, r := range byDepth {
		if p := parent[r]; p >= 0 {
			t.height[p] = max(t.height[p], t.height[r]+1)
		}
	}
	t.h = t.height[t.root]
	for r := 0; r < n; r++ {
		t.first[r+1] += t.first[r]
	}
	t.kids = make([]int, n-1)
	next := slices.Clone(t.first[:n])
	for r, p := range parent {
		if p >= 0 {
			t.kids[next[p]] = r
			next[p]++
		}
	}
	for r := 0; r < n; r++ {
		slices.SortFunc(t.kids[t.first[r]:t.first[r+1]], func(a, b int) int {
			if t.height[a] != t.height[b] {
				return t.height[a] - t.height[b]
			}
			return a - b
		})
	}
	return t, nil
}

// parentOrSelf is the rank whose depth is known above a walked path.
func parentOrSelf(parent, path []int, r int) int {
	if len(path) == 0 {
		return r
	}
	return parent[path[len(path)-1]]
}

func (t *tree) children(r int) []int { return t.kids[t.first[r]:t.first[r+1]] }

// defaultTrees is tree 0 heap-ordered, tree 1 the same backwards.
func defaultTrees(n int) [][]int {
	a, b := make([]int, n), make([]int, n)
	a[0], b[n-1] = -1, -1
	for i := 1; i < n; i++ {
		a[i] = (i - 1) / 2
		b[n-1-i] = n - 1 - (i-1)/2 // rank n-1-i sits where i sits in tree 0
	}
	return [][]int{a, b}
}

func dbTag(tree int, down bool, k int) uint32 {
	t := uint32(tree)<<29 | uint32(k)
	if down {
		t |= 1 << 28
	}
	return t
}

// DBTreeAllReduce is the double binary tree allreduce (see above).
func DBTreeAllReduce(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, es := p.N, p.ElemSize
	parents := p.Trees
	if parents == nil {
		parents = defaultTrees(n)
	}
	if len(parents) == 0 || len(parents) > 7 {
		return nil, fmt.Errorf("sched: dbtree needs 1 to 7 trees, got %d", len(parents))
	}
	trees := make([]*tree, len(parents))
	for i, par := range parents {
		t, err := newTree(par, n)
		if err != nil {
			return nil, fmt.Errorf("sched: tree %d: %w", i, err)
		}
		trees[i] = t
	}
	seg := p.segBytes()
	parts := ChunkBlocks(p.Count, len(trees), es)
	nseg := make([]int, len(trees))
	rounds := 0
	for i, part := range parts {
		nseg[i] = (part.Len + seg - 1) / seg
		if nseg[i] > 0 && n > 1 {
			rounds = max(rounds, nseg[i]+2*trees[i].h-1)
		}
	}
	s := New(AllReduce, "dbtree", n, es, func(r int, yield func(Op) bool) {
		if n == 1 {
			return
		}
		e := &emitter{yield: yield}
		for at := 0; at < rounds && !e.done; at++ {
			for i, t := range trees {
				part, ns := parts[i], nseg[i]
				piece := func(k int) (Range, bool) {
					if k < 0 || k >= ns {
						return Range{}, false
					}
					return work(part.Off+k*seg, min(seg, part.Len-k*seg)), true
				}
				kids, up, d := t.children(r), t.parent[r], t.depth[r]
				for _, c := range kids {
					if g, ok := piece(at - t.height[c]); ok {
						e.recvReduce(c, dbTag(i, false, at-t.height[c]), at, g, 1, false)
					}
				}
				if up >= 0 {
					if g, ok := piece(at - t.height[r]); ok {
						e.send(up, dbTag(i, false, at-t.height[r]), at, g, 1)
					}
					if g, ok := piece(at - (t.h + d - 1)); ok {
						e.recv(up, dbTag(i, true, at-(t.h+d-1)), at, g)
					}
				}
				if g, ok := piece(at - (t.h + d)); ok {
					if up < 0 && p.Avg {
						e.scale(at, g, n)
					}
					for _, c := range kids {
						e.send(c, dbTag(i, true, at-(t.h+d)), at, g, 1)
					}
				}
			}
		}
	})
	s.WorkLen = p.Count * es
	s.Rounds = rounds
	return s, nil
}
