package topology

import "slices"

// Ring is a cycle through every device: hop i goes from device From to
// device To over link Link (an index into Graph.Links); the last hop
// returns to the first device.
type Ring []RingHop

// RingHop is one hop of a ring.
type RingHop struct {
	From, To int
	Link     int
}

// Order is the ring's devices in order.
func (r Ring) Order() []int {
	out := make([]int, len(r))
	for i, h := range r {
		out[i] = h.From
	}
	return out
}

// RingSet is the answer of MaxDisjointRings.
type RingSet struct {
	Rings []Ring
	// Bound is an upper bound found independently of the search: half the
	// smallest degree, and half the links crossing any cut that was
	// checked (a Hamiltonian ring crosses every cut an even number of
	// times, at least twice).
	Bound int
	// Proved says that no larger set exists: the search found Bound rings,
	// or it tried every way to place one more ring and failed.
	Proved bool
}

// HostRing is a ring order of all devices that keeps each host's devices
// together, hosts in order: on a switched network it crosses each host
// boundary once each way, where an order that ignores placement may cross
// it at every hop.
func (g *Graph) HostRing() []int {
	var order []int
	for _, devs := range g.HostDevices() {
		order = append(order, devs...)
	}
	if len(g.Hosts) == 0 {
		order = g.Devices()
	}
	return order
}

// exhaustiveMax is the largest number of devices the ring search explores
// completely; above it, it settles for a greedy answer.
const exhaustiveMax = 16

// searchBudget bounds the backtracking steps of one search, so that an
// unlucky graph cannot stall a caller; running out leaves Proved false.
const searchBudget = 20_000_000

// mesh is the device graph the ring search works on: direct device–device
// links only, as a capacity matrix.
type mesh struct {
	n     int
	dev   []int   // position → device id
	links [][]int // links[i*n+j]: indices of the links joining i and j
	cap   []int   // n×n remaining parallel links
}

func (g *Graph) mesh() *mesh {
	devs := g.Devices()
	n := len(devs)
	pos := make(map[int]int, n)
	for i, d := range devs {
		pos[d] = i
	}
	m := &mesh{n: n, dev: devs, links: make([][]int, n*n), cap: make([]int, n*n)}
	for li, l := range g.Links {
		a, okA := pos[l.A]
		b, okB := pos[l.B]
		if !okA || !okB {
			continue
		}
		m.links[a*n+b] = append(m.links[a*n+b], li)
		m.links[b*n+a] = append(m.links[b*n+a], li)
		m.cap[a*n+b]++
		m.cap[b*n+a]++
	}
	return m
}

func (m *mesh) degree(i int) int {
	d := 0
	for j := 0; j < m.n; j++ {
		d += m.cap[i*m.n+j]
	}
	return d
}

// RingBound is the independent upper bound of MaxDisjointRings.
func (g *Graph) RingBound() int { return g.mesh().bound(g) }

func (m *mesh) bound(g *Graph) int {
	n := m.n
	if n < 2 {
		return 0
	}
	b := 1 << 30
	for i := 0; i < n; i++ {
		b = min(b, m.degree(i)/2)
	}
	cut := func(in func(i int) bool) {
		size := 0
		for i := 0; i < n; i++ {
			if in(i) {
				size++
			}
		}
		if size == 0 || size == n {
			return // not a cut
		}
		c := 0
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				if in(i) && !in(j) {
					c += m.cap[i*n+j]
				}
			}
		}
		b = min(b, c/2)
	}
	if n <= exhaustiveMax {
		// Every cut: subsets holding device 0, neither empty nor all.
		for s := uint32(0); s < 1<<(n-1)-1; s++ {
			set := s<<1 | 1
			cut(func(i int) bool { return set&(1<<i) != 0 })
		}
	}
	// Host cuts, and halves of the device order (the cube-mesh's groups).
	host := make([]int, n)
	for i, d := range m.dev {
		nd, _ := g.Node(d)
		host[i] = nd.Host
	}
	for h := range g.Hosts {
		cut(func(i int) bool { return host[i] == h })
	}
	for k := 1; k < n; k++ {
		cut(func(i int) bool { return i < k })
	}
	return b
}

// MaxDisjointRings finds the largest set of pairwise link-disjoint
// Hamiltonian rings over the devices' direct links (two rings may use
// different parallel links between the same two devices). Up to 16 devices
// the search is exhaustive and proves its answer; above, it is greedy. A
// graph whose devices meet only through switches has no such ring (use
// HostRing there).
func (g *Graph) MaxDisjointRings() RingSet {
	m := g.mesh()
	rs := RingSet{Bound: m.bound(g)}
	if m.n < 2 || rs.Bound == 0 {
		rs.Proved = true
		return rs
	}
	if m.n == 2 {
		// A ring of two is two parallel links.
		ls := m.links[1]
		for k := 0; k+1 < len(ls); k += 2 {
			rs.Rings = append(rs.Rings, Ring{{m.dev[0], m.dev[1], ls[k]}, {m.dev[1], m.dev[0], ls[k+1]}})
		}
		rs.Proved = true
		return rs
	}
	s := &ringSearch{m: m, budget: searchBudget}
	if m.n > exhaustiveMax {
		for {
			c := s.greedyCycle()
			if c == nil {
				break
			}
			s.take(c, -1)
			s.found = append(s.found, c)
		}
		rs.Rings = m.rings(s.found)
		rs.Proved = len(rs.Rings) == rs.Bound
		return rs
	}
	// Try the bound first, then fewer: the first k that works is the answer;
	// the failures above it prove it maximal unless the budget ran out.
	exhausted := false
	for k := rs.Bound; k >= 1; k-- {
		s.found = nil
		if s.place(k, nil) {
			rs.Rings = m.rings(s.found)
			rs.Proved = !exhausted
			return rs
		}
		if s.budget <= 0 {
			exhausted = true
			s.budget = searchBudget // still look for a smaller set
		}
	}
	rs.Proved = !exhausted
	return rs
}

// rings turns cycles of positions into rings of link indices, giving each
// hop a parallel link not used by an earlier ring.
func (m *mesh) rings(cycles [][]int) []Ring {
	used := map[int]bool{}
	var out []Ring
	for _, c := range cycles {
		var r Ring
		for i, a := range c {
			b := c[(i+1)%len(c)]
			for _, l := range m.links[a*m.n+b] {
				if !used[l] {
					used[l] = true
					r = append(r, RingHop{m.dev[a], m.dev[b], l})
					break
				}
			}
		}
		out = append(out, r)
	}
	return out
}

type ringSearch struct {
	m      *mesh
	budget int
	found  [][]int
}

func (s *ringSearch) take(c []int, d int) {
	n := s.m.n
	for i, a := range c {
		b := c[(i+1)%len(c)]
		s.m.cap[a*n+b] += d
		s.m.cap[b*n+a] += d
	}
}

// place looks for k more disjoint Hamiltonian cycles. Cycles are found in
// a canonical form (starting at position 0, second position below the
// last), and each cycle after the first must come later than the one
// before in lexicographic order, so no set is tried twice.
func (s *ringSearch) place(k int, after []int) bool {
	if k == 0 {
		return true
	}
	n := s.m.n
	for i := 0; i < n; i++ {
		if s.m.degree(i) < 2*k {
			return false
		}
	}
	path := make([]int, 1, n)
	var visited uint64 = 1
	var dfs func() bool
	dfs = func() bool {
		s.budget--
		if s.budget <= 0 {
			return false
		}
		last := path[len(path)-1]
		if len(path) == n {
			if s.m.cap[last*n+0] == 0 || path[1] > last {
				return false
			}
			// The same cycle twice is allowed (parallel links), a smaller one
			// was tried before.
			if after != nil && slices.Compare(path, after) < 0 {
				return false
			}
			// The path's links are already taken; close the cycle.
			c := slices.Clone(path)
			s.m.cap[last*n]--
			s.m.cap[last]--
			s.found = append(s.found, c)
			ok := s.place(k-1, c)
			if !ok {
				s.found = s.found[:len(s.found)-1]
			}
			s.m.cap[last*n]++
			s.m.cap[last]++
			return ok
		}
		// While the prefix still equals after's, the next position may not
		// go below after's (a lexicographically smaller cycle).
		lo := 0
		if after != nil && slices.Equal(path, after[:len(path)]) {
			lo = after[len(path)]
		}
		for next := lo; next < n; next++ {
			if visited&(1<<next) != 0 || s.m.cap[last*n+next] == 0 {
				continue
			}
			s.m.cap[last*n+next]--
			s.m.cap[next*n+last]--
			path = append(path, next)
			visited |= 1 << next
			ok := dfs()
			visited &^= 1 << next
			path = path[:len(path)-1]
			s.m.cap[last*n+next]++
			s.m.cap[next*n+last]++
			if ok {
				return true
			}
			if s.budget <= 0 {
				return false
			}
		}
		return false
	}
	return dfs()
}

// greedyCycle finds one Hamiltonian cycle in what is left, visiting the
// neighbour with the fewest onward links first (Warnsdorff), within the
// budget; nil if none was found.
func (s *ringSearch) greedyCycle() []int {
	n := s.m.n
	visited := make([]bool, n)
	path := []int{0}
	visited[0] = true
	steps := 0
	var dfs func() bool
	dfs = func() bool {
		steps++
		if steps > 200_000 {
			return false
		}
		last := path[len(path)-1]
		if len(path) == n {
			return s.m.cap[last*n] > 0
		}
		var cand []int
		for j := 0; j < n; j++ {
			if !visited[j] && s.m.cap[last*n+j] > 0 {
				cand = append(cand, j)
			}
		}
		onward := func(j int) int {
			c := 0
			for k := 0; k < n; k++ {
				if !visited[k] && k != j && s.m.cap[j*n+k] > 0 {
					c++
				}
			}
			return c
		}
		slices.SortStableFunc(cand, func(a, b int) int { return onward(a) - onward(b) })
		for _, j := range cand {
			s.m.cap[last*n+j]--
			s.m.cap[j*n+last]--
			visited[j] = true
			path = append(path, j)
			if dfs() {
				s.m.cap[last*n+j]++
				s.m.cap[j*n+last]++
				return true
			}
			path = path[:len(path)-1]
			visited[j] = false
			s.m.cap[last*n+j]++
			s.m.cap[j*n+last]++
		}
		return false
	}
	if !dfs() {
		return nil
	}
	return path
}
