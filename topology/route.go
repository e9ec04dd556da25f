package topology

import (
	"container/heap"
	"fmt"
	"strings"
	"sync"
)

// Path returns the links a message from node a to node b crosses, in
// order. Built-ins with a regular shape route by formula (the cluster
// through its hosts' memory and NICs, the fat tree up and down with the
// core switch chosen by destination so flows spread); any other graph takes
// the path of least latency, then fewest hops, ties going to the lower
// link index, so every rank computes the same path.
func (g *Graph) Path(a, b int) ([]Hop, error) {
	if a == b {
		return nil, nil
	}
	if g.router != nil {
		return g.router(a, b)
	}
	ia, okA := g.index[a]
	ib, okB := g.index[b]
	if !okA || !okB {
		return nil, fmt.Errorf("topology: path %d→%d: no such node", a, b)
	}
	pred := g.paths.tree(g, ia)
	if pred[ib].link < 0 {
		return nil, fmt.Errorf("topology: no path from node %d to node %d", a, b)
	}
	var rev []Hop
	for at := ib; at != ia; {
		h := pred[at]
		rev = append(rev, Hop{Link: h.link, Forward: h.fwd})
		at = h.to
	}
	out := make([]Hop, len(rev))
	for i, h := range rev {
		out[len(rev)-1-i] = h
	}
	return out, nil
}

// Route is Path as link identifiers.
func (g *Graph) Route(a, b int) ([]string, error) {
	p, err := g.Path(a, b)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(p))
	for i, h := range p {
		ids[i] = g.Links[h.Link].ID
	}
	return ids, nil
}

// PathString shows a path's link ids joined by ">".
func (g *Graph) PathString(p []Hop) string {
	ids := make([]string, len(p))
	for i, h := range p {
		ids[i] = g.Links[h.Link].ID
	}
	return strings.Join(ids, ">")
}

// pathCache keeps one shortest-path tree per source: a cost model asks for
// many paths from each rank.
type pathCache struct {
	mu    sync.Mutex
	trees map[int][]half
}

func newPathCache() *pathCache { return &pathCache{trees: map[int][]half{}} }

// tree returns, for every node position, the half-link by which the
// shortest path from src reaches it (to = the node before it; link -1:
// unreachable).
func (c *pathCache) tree(g *Graph, src int) []half {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.trees[src]; ok {
		return t
	}
	type cost struct {
		lat  float64
		hops int
	}
	less := func(x, y cost) bool { return x.lat < y.lat || x.lat == y.lat && x.hops < y.hops }
	n := len(g.Nodes)
	best := make([]cost, n)
	pred := make([]half, n)
	done := make([]bool, n)
	for i := range pred {
		pred[i] = half{link: -1}
	}
	reached := make([]bool, n)
	reached[src] = true
	q := &pq{}
	heap.Push(q, item{src, 0, 0})
	for q.Len() > 0 {
		it := heap.Pop(q).(item)
		if done[it.node] {
			continue
		}
		done[it.node] = true
		for _, h := range g.adj[it.node] {
			l := g.Links[h.link]
			nc := cost{best[it.node].lat + l.Latency, best[it.node].hops + 1}
			if !reached[h.to] || less(nc, best[h.to]) || (nc == best[h.to] && h.link < pred[h.to].link) {
				if done[h.to] {
					continue
				}
				reached[h.to] = true
				best[h.to] = nc
				pred[h.to] = half{link: h.link, to: it.node, fwd: h.fwd}
				heap.Push(q, item{h.to, nc.lat, nc.hops})
			}
		}
	}
	c.trees[src] = pred
	return pred
}

type item struct {
	node int
	lat  float64
	hops int
}

type pq []item

func (q pq) Len() int { return len(q) }
func (q pq) Less(i, j int) bool {
	return q[i].lat < q[j].lat || q[i].lat == q[j].lat && (q[i].hops < q[j].hops || q[i].hops == q[j].hops && q[i].node < q[j].node)
}
func (q pq) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *pq) Push(x any)   { *q = append(*q, x.(item)) }
func (q *pq) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}
