package topology

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func mustBuiltin(t *testing.T, spec string) *Graph {
	t.Helper()
	g, err := Builtin(spec)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestBuiltinsGolden(t *testing.T) {
	want := map[string]string{
		"hybrid-cube-mesh":    "hybrid-cube-mesh: 8 devices on 1 hosts, 0 switches, 28 links, 28 dev",
		"ring:5":              "ring:5: 5 devices on 1 hosts, 0 switches, 5 links, 5 dev",
		"ring:2":              "ring:2: 2 devices on 1 hosts, 0 switches, 2 links, 2 dev",
		"torus:3x4":           "torus:3x4: 12 devices on 1 hosts, 0 switches, 24 links, 24 dev",
		"fattree:4":           "fattree:4: 16 devices on 16 hosts, 20 switches, 48 links, 48 net",
		"cluster:2x3":         "cluster:2x3: 6 devices on 2 hosts, 1 switches, 8 links, 6 shm, 2 net",
		"cluster:4x1:250mbit": "cluster:4x1:250mbit: 4 devices on 4 hosts, 1 switches, 8 links, 4 shm, 4 net",
	}
	for spec, w := range want {
		if got := mustBuiltin(t, spec).Summary(); got != w {
			t.Errorf("%s:\n got %s\nwant %s", spec, got, w)
		}
	}
	g := mustBuiltin(t, "cluster:4x1:250mbit")
	if i, _ := g.LinkIndex("host0.nic"); g.Links[i].Bandwidth != 250e6/8 {
		t.Errorf("cluster NIC: %v bytes/s, want 250 Mbit/s", g.Links[i].Bandwidth)
	}
	for _, bad := range []string{"ring:0", "torus:3", "fattree:3", "cluster:2x2:fast", "hybrid-cube-mesh:9", "mesh:4"} {
		if _, err := Builtin(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// checkRings verifies rings independently of the search: Hamiltonian, every
// hop an existing link between the hop's devices, no link used twice.
func checkRings(t *testing.T, g *Graph, rings []Ring) {
	t.Helper()
	devs := g.Devices()
	used := map[int]bool{}
	for k, r := range rings {
		if len(r) != len(devs) {
			t.Fatalf("ring %d has %d hops for %d devices", k, len(r), len(devs))
		}
		order := r.Order()
		if s := slices.Sorted(slices.Values(order)); !slices.Equal(s, devs) {
			t.Fatalf("ring %d visits %v, not every device once", k, order)
		}
		for i, h := range r {
			if next := r[(i+1)%len(r)]; next.From != h.To {
				t.Fatalf("ring %d: hop %d ends at %d, the next starts at %d", k, i, h.To, next.From)
			}
			l := g.Links[h.Link]
			if !(l.A == h.From && l.B == h.To || l.A == h.To && l.B == h.From) {
				t.Fatalf("ring %d: hop %d→%d over link %s (%d–%d)", k, h.From, h.To, l.ID, l.A, l.B)
			}
			if used[h.Link] {
				t.Fatalf("ring %d reuses link %s", k, l.ID)
			}
			used[h.Link] = true
		}
	}
}

// The cube-mesh of docs/design/virtual-devices.md: every unit has 3·2 + 1 = 7 links, so at
// most 3 rings could pass through it, but only the 4 counterpart links
// cross between the groups and a ring crosses that cut at least twice: at
// most 2. The search must find 2 and know it is the maximum.
func TestCubeMeshRings(t *testing.T) {
	g := mustBuiltin(t, "hybrid-cube-mesh")
	for _, d := range g.Devices() {
		deg := 0
		for _, l := range g.Links {
			if l.A == d || l.B == d {
				deg++
			}
		}
		if deg != 7 {
			t.Fatalf("unit %d has %d links, want 7", d, deg)
		}
	}
	cross := 0
	for _, l := range g.Links {
		if (l.A < 4) != (l.B < 4) {
			cross++
		}
	}
	countBound := min(7/2, cross/2)
	rs := g.MaxDisjointRings()
	checkRings(t, g, rs.Rings)
	if len(rs.Rings) != countBound || rs.Bound != countBound || !rs.Proved {
		t.Fatalf("found %d rings (bound %d, proved %v), the count argument says %d", len(rs.Rings), rs.Bound, rs.Proved, countBound)
	}
}

func TestRingsOnBuiltins(t *testing.T) {
	for spec, want := range map[string]int{"ring:7": 1, "ring:2": 1, "ring:1": 0, "torus:4x4": 2, "torus:3x3": 2, "torus:3x5": 2, "torus:2x4": 2, "torus:1x6": 1} {
		g := mustBuiltin(t, spec)
		rs := g.MaxDisjointRings()
		checkRings(t, g, rs.Rings)
		if len(rs.Rings) != want || !rs.Proved || len(rs.Rings) > rs.Bound {
			t.Errorf("%s: %d rings (bound %d, proved %v), want %d", spec, len(rs.Rings), rs.Bound, rs.Proved, want)
		}
	}
	// Switched graphs have no direct rings; HostRing keeps hosts together.
	g := mustBuiltin(t, "cluster:3x2")
	if rs := g.MaxDisjointRings(); len(rs.Rings) != 0 {
		t.Errorf("cluster: %d direct rings", len(rs.Rings))
	}
	if got := g.HostRing(); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Errorf("HostRing %v", got)
	}
	p, _ := ForPlacement([][]int{{0, 2}, {1, 3}}, DefaultParams())
	if got := p.HostRing(); !slices.Equal(got, []int{0, 2, 1, 3}) {
		t.Errorf("HostRing of a strided placement: %v", got)
	}
}

// bruteRings is an independent answer for small graphs: enumerate every
// Hamiltonian cycle (as a multiset of device pairs) and the largest set of
// them whose pair counts fit the parallel links.
func bruteRings(g *Graph) int {
	devs := g.Devices()
	n := len(devs)
	capOf := map[[2]int]int{}
	for _, l := range g.Links {
		a, b := min(l.A, l.B), max(l.A, l.B)
		capOf[[2]int{a, b}]++
	}
	var cycles [][][2]int
	perm := make([]int, 0, n)
	var rec func(used uint32)
	rec = func(used uint32) {
		if len(perm) == n {
			if perm[1] > perm[n-1] {
				return
			}
			var edges [][2]int
			for i := range perm {
				a, b := devs[perm[i]], devs[perm[(i+1)%n]]
				e := [2]int{min(a, b), max(a, b)}
				if capOf[e] == 0 {
					return
				}
				edges = append(edges, e)
			}
			cycles = append(cycles, edges)
			return
		}
		for j := 1; j < n; j++ {
			if used&(1<<j) == 0 {
				perm = append(perm, j)
				rec(used | 1<<j)
				perm = perm[:len(perm)-1]
			}
		}
	}
	perm = append(perm, 0)
	rec(1)
	best := 0
	left := map[[2]int]int{}
	for k, v := range capOf {
		left[k] = v
	}
	var pick func(from, k int)
	pick = func(from, k int) {
		best = max(best, k)
		for i := from; i < len(cycles); i++ {
			ok := true
			for _, e := range cycles[i] {
				left[e]--
				ok = ok && left[e] >= 0
			}
			if ok {
				pick(i, k+1)
			}
			for _, e := range cycles[i] {
				left[e]++
			}
		}
	}
	pick(0, 0)
	return best
}

func TestRingSearchAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for trial := 0; trial < 60; trial++ {
		n := 3 + rng.Intn(4)
		g := &Graph{Name: "random"}
		for i := 0; i < n; i++ {
			g.Nodes = append(g.Nodes, Node{ID: i, Kind: Device, Host: -1, NUMA: -1})
		}
		for a := 0; a < n; a++ {
			for b := a + 1; b < n; b++ {
				for k := rng.Intn(4) - 1; k > 0; k-- {
					g.link(fmt.Sprintf("%d-%d.%d", a, b, k), Dev, a, b, 1, 0)
				}
			}
		}
		if err := g.Validate(); err != nil {
			t.Fatal(err)
		}
		rs := g.MaxDisjointRings()
		checkRings(t, g, rs.Rings)
		want := bruteRings(g)
		if len(rs.Rings) != want || !rs.Proved || len(rs.Rings) > rs.Bound {
			t.Fatalf("trial %d (%d devices, %d links): search %d (bound %d, proved %v), brute force %d", trial, n, len(g.Links), len(rs.Rings), rs.Bound, rs.Proved, want)
		}
	}
}

func TestJSONRoundTrip(t *testing.T) {
	for _, spec := range []string{"hybrid-cube-mesh", "torus:3x3", "fattree:4", "cluster:2x2:1gbit"} {
		g := mustBuiltin(t, spec)
		data, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(data)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		if !g.equal(back) {
			t.Fatalf("%s: the round trip changed the graph", spec)
		}
		// Routing of a parsed graph is generic; it still finds paths.
		devs := back.Devices()
		if p, err := back.Path(devs[0], devs[len(devs)-1]); err != nil || len(p) == 0 {
			t.Fatalf("%s after the round trip: path %v, %v", spec, p, err)
		}
	}
}

func TestJSONErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"nodes":[{"id":0,"kind":"device"}],"links":[],"extra":1}`, "unknown field"},
		{`{"nodes":[{"id":0,"kind":"gpu"}],"links":[]}`, `unknown kind "gpu"`},
		{`{"nodes":[{"id":0,"kind":"device"},{"id":0,"kind":"device"}],"links":[]}`, "node id 0 appears twice"},
		{`{"nodes":[{"id":0,"kind":"device"}],"links":[{"id":"x","kind":"net","a":0,"b":5,"bandwidth":1,"latency":0}]}`, "node 5, which does not exist"},
		{`{"nodes":[{"id":0,"kind":"device"},{"id":1,"kind":"device"}],"links":[{"id":"x","kind":"net","a":0,"b":1,"bandwidth":0,"latency":0}]}`, `link "x": bandwidth 0`},
		{`{"nodes":[{"id":0,"kind":"device"}],"links":[{"id":"x","kind":"net","a":0,"b":0,"bandwidth":1,"latency":0}]}`, "joins node 0 to itself"},
		{`{"nodes":[{"id":0,"kind":"device"},{"id":1,"kind":"device"}],"links":[{"id":"x","kind":"net","a":0,"b":1,"bandwidth":1,"latency":0},{"id":"x","kind":"net","a":0,"b":1,"bandwidth":1,"latency":0}]}`, `link id "x" appears twice`},
		{`{"hosts":[{"name":"h"}],"nodes":[{"id":0,"kind":"device"}],"links":[]}`, "device 0 belongs to no host"},
		{`{"nodes":[{"id":0,"kind":"device","host":3}],"links":[]}`, "host 3, but there are 0 hosts"},
		{`{"nodes":[{"id":0,"kind":"device"}],"links":[{"id":"x","kind":"net","b":0,"bandwidth":1}]}`, `needs both ends`},
		{`{"nodes":[{"id":0,"kind":"device"},{"id":1,"kind":"device"}],"links":[{"id":"x","kind":"wifi","a":0,"b":1,"bandwidth":1,"latency":0}]}`, `unknown kind "wifi"`},
	} {
		_, err := Parse([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestDetectionSourcesAgree(t *testing.T) {
	sys, err := DetectSys("/sys")
	if err != nil {
		t.Skipf("no /sys here: %v", err)
	}
	hw, err := DetectHwloc()
	if err != nil {
		if _, lerr := exec.LookPath("ldconfig"); lerr == nil {
			if out, _ := exec.Command("ldconfig", "-p").Output(); !strings.Contains(string(out), "libhwloc.so") {
				t.Skipf("libhwloc is not installed: %v", err)
			}
		}
		t.Fatalf("hwloc is installed but detection failed: %v", err)
	}
	if hw.Cores != sys.Cores || hw.PUs != sys.PUs || hw.NUMANodes != sys.NUMANodes || !slices.Equal(hw.Caches, sys.Caches) {
		t.Fatalf("hwloc and /sys disagree:\nhwloc %+v\n/sys  %+v", hw, sys)
	}
	if sys.Cores < 1 || len(sys.Caches) == 0 {
		t.Fatalf("implausible machine: %+v", sys)
	}
	g, err := Detect()
	if err != nil || len(g.Devices()) != sys.Cores {
		t.Fatalf("Detect: %v, %v", g, err)
	}
	// With the library there, detection goes through it (purego), not /sys.
	if g.Source != "hwloc" {
		t.Fatalf("Detect used %q, want hwloc", g.Source)
	}
}

func TestPaths(t *testing.T) {
	g := mustBuiltin(t, "cluster:2x2")
	same, _ := g.Route(0, 1)
	other, _ := g.Route(0, 3)
	if strings.Join(same, ">") != "host0.r0>host0.r1" || strings.Join(other, ">") != "host0.r0>host0.nic>host1.nic>host1.r3" {
		t.Fatalf("cluster routes: %v, %v", same, other)
	}
	ft := mustBuiltin(t, "fattree:4")
	cores := map[string]bool{}
	for dst := 1; dst < 16; dst++ {
		p, err := ft.Path(0, dst)
		if err != nil {
			t.Fatal(err)
		}
		// Same edge switch: 2 hops; same pod: 4; another pod: 6.
		want := map[bool]int{true: 2, false: 4}[dst < 2]
		if dst >= 4 {
			want = 6
		}
		if len(p) != want {
			t.Fatalf("fat tree 0→%d: %d hops, want %d", dst, len(p), want)
		}
		// Consecutive hops meet at a node.
		at := 0
		for _, h := range p {
			l := ft.Links[h.Link]
			from, to := l.A, l.B
			if !h.Forward {
				from, to = to, from
			}
			if from != at {
				t.Fatalf("fat tree 0→%d: hop over %s starts at %d, not %d", dst, l.ID, from, at)
			}
			at = to
		}
		if at != dst {
			t.Fatalf("fat tree 0→%d ends at %d", dst, at)
		}
		if len(p) == 6 {
			cores[ft.Links[p[2].Link].ID] = true
		}
	}
	if len(cores) < 4 {
		t.Fatalf("flows from host 0 to other pods use %d core links, want them spread over 4", len(cores))
	}
	// Generic routing on the cube-mesh: counterparts are one hop apart.
	cm := mustBuiltin(t, "hybrid-cube-mesh")
	if p, _ := cm.Path(1, 5); len(p) != 1 {
		t.Fatalf("cube-mesh 1→5: %v", p)
	}
	if p, _ := cm.Path(1, 6); len(p) != 2 {
		t.Fatalf("cube-mesh 1→6: %v", p)
	}
}

func TestDoubleBinaryTree(t *testing.T) {
	for n := 1; n <= 64; n++ {
		trees := DoubleBinaryTree(n)
		inner := make([]int, n)
		for k, tr := range trees {
			if err := CheckTree(tr); err != nil {
				t.Fatalf("n=%d tree %d %v: %v", n, k, tr, err)
			}
			kids := make([]int, n)
			for _, p := range tr {
				if p >= 0 {
					kids[p]++
				}
			}
			for r, c := range kids {
				if c > 0 && !(tr[r] == -1 && c == 1) {
					inner[r]++
				}
			}
		}
		for r, c := range inner {
			if c > 1 {
				t.Fatalf("n=%d: rank %d is an inner node of both trees %v", n, r, trees)
			}
		}
	}
}
