package topology

import (
	"fmt"
	"strconv"
	"strings"
)

// Params are the link figures the built-ins and ForPlacement use. The
// defaults for shared memory and TCP were measured on the 2-core VM gocoll
// is developed on (see the cost model's calibration in topology/cost); the
// device links of the cube-mesh are a plausible accelerator interconnect.
type Params struct {
	ShmBandwidth float64 // bytes/s, one rank's copy into or out of shared memory
	ShmLatency   float64 // seconds, one shared-memory message
	NICBandwidth float64 // bytes/s, each direction of a host's network link
	NICLatency   float64 // seconds, one TCP message between hosts (half of it on each host's link)
	DevBandwidth float64 // bytes/s, a direct device link
	DevLatency   float64
}

// DefaultParams are the figures Builtin uses unless a spec overrides them.
// Shared memory and the per-message latency of TCP were fitted by
// build/calibrate to gocoll's own runs on the 2-core development VM (one
// host at 2 and 4 ranks; 2 and 4 namespaced hosts): the latency of a
// shared-memory message includes waking a peer that yielded its core, and
// what a TCP message costs beyond its bytes is in the cost model's
// per-message figure, so the NIC's own latency fitted to zero. The NIC's
// bandwidth is a default for a real network; measure yours.
func DefaultParams() Params {
	return Params{
		ShmBandwidth: 3.8e9, ShmLatency: 20e-6,
		NICBandwidth: 10e9 / 8, NICLatency: 0,
		DevBandwidth: 50e9, DevLatency: 1e-6,
	}
}

// Builtin builds a named topology with DefaultParams:
//
//	hybrid-cube-mesh   the 8 units of docs/design/virtual-devices.md: two groups of 4, two links
//	                   between every pair inside a group, one link from
//	                   each unit to its counterpart in the other group
//	ring:N             N devices in a ring (two parallel links when N = 2)
//	torus:AxB          A×B devices, each linked to its four neighbours with
//	                   wraparound
//	fattree:K          a k-ary fat tree: K pods of K/2 edge and K/2
//	                   aggregation switches, (K/2)² core switches, K³/4
//	                   hosts of one device each (K even)
//	cluster:HxR[:BW]   H hosts of R ranks: inside a host through shared
//	                   memory, between hosts through one NIC per host of
//	                   BW (e.g. 250mbit, 10gbit; default 10gbit) to one
//	                   switch
func Builtin(spec string) (*Graph, error) { return BuiltinWith(spec, DefaultParams()) }

// BuiltinWith is Builtin with other link figures.
func BuiltinWith(spec string, p Params) (*Graph, error) {
	name, arg, _ := strings.Cut(spec, ":")
	var g *Graph
	var err error
	switch name {
	case "hybrid-cube-mesh":
		if arg != "" {
			return nil, fmt.Errorf("topology: hybrid-cube-mesh takes no size (it has 8 units)")
		}
		g = cubeMesh(p)
	case "ring":
		var n int
		if n, err = positive(spec, arg); err == nil {
			g = ringOf(n, p)
		}
	case "torus":
		var a, b int
		if a, b, err = dims(spec, arg); err == nil {
			g = torus(a, b, p)
		}
	case "fattree":
		var k int
		if k, err = positive(spec, arg); err == nil {
			if k%2 != 0 || k > 64 {
				return nil, fmt.Errorf("topology: %s: K must be even and at most 64", spec)
			}
			g = fatTree(k, p)
		}
	case "cluster":
		shape, bw, hasBW := strings.Cut(arg, ":")
		var h, r int
		if h, r, err = dims(spec, shape); err == nil && hasBW {
			p.NICBandwidth, err = ParseRate(bw)
		}
		if err == nil {
			hosts := make([][]int, h)
			for i := range hosts {
				for j := 0; j < r; j++ {
					hosts[i] = append(hosts[i], i*r+j)
				}
			}
			g, err = ForPlacement(hosts, p)
		}
	default:
		return nil, fmt.Errorf("topology: unknown built-in %q (hybrid-cube-mesh, ring:N, torus:AxB, fattree:K, cluster:HxR[:BW])", spec)
	}
	if err != nil {
		return nil, err
	}
	g.Name, g.Source = spec, "builtin:"+spec
	return g, g.Validate()
}

func positive(spec, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1<<16 {
		return 0, fmt.Errorf("topology: %s: want a size between 1 and 65536", spec)
	}
	return n, nil
}

func dims(spec, s string) (int, int, error) {
	as, bs, ok := strings.Cut(s, "x")
	a, err1 := strconv.Atoi(as)
	b, err2 := strconv.Atoi(bs)
	if !ok || err1 != nil || err2 != nil || a < 1 || b < 1 || a*b > 1<<16 {
		return 0, 0, fmt.Errorf("topology: %s: want AxB with A, B ≥ 1 and at most 65536 devices", spec)
	}
	return a, b, nil
}

// ParseRate reads a bandwidth such as 250mbit, 10gbit or 1.5GB (bytes) into
// bytes per second.
func ParseRate(s string) (float64, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	units := []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(l, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil || !(v > 0) {
				break
			}
			return v * u.mult, nil
		}
	}
	return 0, fmt.Errorf("topology: bandwidth %q: want e.g. 250mbit, 10gbit or 2GB (bytes/s)", s)
}

func devices(g *Graph, n, host int) {
	for i := 0; i < n; i++ {
		g.Nodes = append(g.Nodes, Node{ID: i, Kind: Device, Name: fmt.Sprintf("d%d", i), Host: host, NUMA: -1})
	}
}

func (g *Graph) link(id string, kind LinkKind, a, b int, bw, lat float64) int {
	g.Links = append(g.Links, Link{ID: id, Kind: kind, A: a, B: b, Bandwidth: bw, Latency: lat})
	return len(g.Links) - 1
}

// cubeMesh is the hybrid cube-mesh of docs/design/virtual-devices.md.
func cubeMesh(p Params) *Graph {
	g := &Graph{Hosts: []Host{{Name: "cube-mesh"}}}
	devices(g, 8, 0)
	for grp := 0; grp < 2; grp++ {
		for i := 0; i < 4; i++ {
			for j := i + 1; j < 4; j++ {
				a, b := 4*grp+i, 4*grp+j
				for k := 0; k < 2; k++ {
					g.link(fmt.Sprintf("d%d-d%d.%d", a, b, k), Dev, a, b, p.DevBandwidth, p.DevLatency)
				}
			}
		}
	}
	for i := 0; i < 4; i++ {
		g.link(fmt.Sprintf("d%d-d%d", i, i+4), Dev, i, i+4, p.DevBandwidth, p.DevLatency)
	}
	return g
}

func ringOf(n int, p Params) *Graph {
	g := &Graph{Hosts: []Host{{Name: "ring"}}}
	devices(g, n, 0)
	switch {
	case n == 2:
		g.link("d0-d1.0", Dev, 0, 1, p.DevBandwidth, p.DevLatency)
		g.link("d0-d1.1", Dev, 0, 1, p.DevBandwidth, p.DevLatency)
	case n > 2:
		for i := 0; i < n; i++ {
			g.link(fmt.Sprintf("d%d-d%d", i, (i+1)%n), Dev, i, (i+1)%n, p.DevBandwidth, p.DevLatency)
		}
	}
	return g
}

// torus: device i·B+j links to (i+1, j) and (i, j+1), wrapping around; a
// dimension of 2 gets two parallel links (the neighbour both ways), a
// dimension of 1 none.
func torus(a, b int, p Params) *Graph {
	g := &Graph{Hosts: []Host{{Name: "torus"}}}
	devices(g, a*b, 0)
	for i := 0; i < a; i++ {
		for j := 0; j < b; j++ {
			d := i*b + j
			if a > 1 {
				e := ((i+1)%a)*b + j
				g.link(fmt.Sprintf("d%d-d%d.v", d, e), Dev, d, e, p.DevBandwidth, p.DevLatency)
			}
			if b > 1 {
				e := i*b + (j+1)%b
				g.link(fmt.Sprintf("d%d-d%d.h", d, e), Dev, d, e, p.DevBandwidth, p.DevLatency)
			}
		}
	}
	return g
}

// fatTree: hosts are numbered pod by pod, edge switch by edge switch.
// Every link has the NIC's bandwidth (a non-blocking fat tree).
func fatTree(k int, p Params) *Graph {
	half := k / 2
	hosts := k * half * half
	g := &Graph{Hosts: make([]Host, hosts)}
	for h := range g.Hosts {
		g.Hosts[h].Name = fmt.Sprintf("h%d", h)
		g.Nodes = append(g.Nodes, Node{ID: h, Kind: Device, Name: fmt.Sprintf("d%d", h), Host: h, NUMA: -1})
	}
	next := hosts
	sw := func(name string) int {
		g.Nodes = append(g.Nodes, Node{ID: next, Kind: Switch, Name: name, Host: -1, NUMA: -1})
		next++
		return next - 1
	}
	edge := make([][]int, k)
	agg := make([][]int, k)
	core := make([][]int, half)
	for i := range core {
		for j := 0; j < half; j++ {
			core[i] = append(core[i], sw(fmt.Sprintf("c%d.%d", i, j)))
		}
	}
	lat := p.NICLatency / 2
	up := make([]int, hosts) // host → its edge link
	ea := make([][][]int, k) // pod, edge, agg → link
	ac := make([][][]int, k) // pod, agg, core j → link
	for pod := 0; pod < k; pod++ {
		ea[pod] = make([][]int, half)
		ac[pod] = make([][]int, half)
		for i := 0; i < half; i++ {
			edge[pod] = append(edge[pod], sw(fmt.Sprintf("p%d.e%d", pod, i)))
			agg[pod] = append(agg[pod], sw(fmt.Sprintf("p%d.a%d", pod, i)))
		}
		for i := 0; i < half; i++ {
			for j := 0; j < half; j++ {
				h := (pod*half+i)*half + j
				up[h] = g.link(fmt.Sprintf("p%d.e%d.h%d", pod, i, h), Net, h, edge[pod][i], p.NICBandwidth, lat)
			}
			for m := 0; m < half; m++ {
				ea[pod][i] = append(ea[pod][i], g.link(fmt.Sprintf("p%d.e%d-a%d", pod, i, m), Net, edge[pod][i], agg[pod][m], p.NICBandwidth, lat))
			}
		}
		for m := 0; m < half; m++ {
			for j := 0; j < half; j++ {
				ac[pod][m] = append(ac[pod][m], g.link(fmt.Sprintf("p%d.a%d-c%d.%d", pod, m, m, j), Net, agg[pod][m], core[m][j], p.NICBandwidth, lat))
			}
		}
	}
	// Up-down routing; the aggregation and core switches are picked by the
	// destination, so the flows toward different hosts spread over them.
	g.router = func(a, b int) ([]Hop, error) {
		if a < 0 || b < 0 || a >= hosts || b >= hosts {
			return nil, fmt.Errorf("topology: fat tree routes between devices 0..%d, not %d→%d", hosts-1, a, b)
		}
		pa, ia := a/(half*half), a/half%half
		pb, ib := b/(half*half), b/half%half
		m, j := b%half, b/half%half
		path := []Hop{{up[a], true}}
		switch {
		case pa == pb && ia == ib:
		case pa == pb:
			path = append(path, Hop{ea[pa][ia][m], true}, Hop{ea[pb][ib][m], false})
		default:
			path = append(path, Hop{ea[pa][ia][m], true}, Hop{ac[pa][m][j], true}, Hop{ac[pb][m][j], false}, Hop{ea[pb][ib][m], false})
		}
		return append(path, Hop{up[b], false}), nil
	}
	return g
}

// ForPlacement is the graph of a communicator: hosts lists the ranks of each
// host (ranks are the device ids). Inside a host every rank reaches the
// others through the host's memory (a hub node; each rank's link to it is
// its copy bandwidth into or out of shared memory); between hosts through
// the hosts' NICs and one switch. It is cheap and deterministic, so every
// rank builds the same graph from the same placement.
func ForPlacement(hosts [][]int, p Params) (*Graph, error) {
	n := 0
	for _, h := range hosts {
		n += len(h)
	}
	g := &Graph{Name: "placement", Source: "placement", Hosts: make([]Host, len(hosts))}
	hostOf := make([]int, n)
	for i := range hostOf {
		hostOf[i] = -1
	}
	for h, ranks := range hosts {
		g.Hosts[h].Name = fmt.Sprintf("host%d", h)
		for _, r := range ranks {
			if r < 0 || r >= n || hostOf[r] >= 0 {
				return nil, fmt.Errorf("topology: placement %v is not a partition of ranks 0..%d", hosts, n-1)
			}
			hostOf[r] = h
		}
	}
	for r := 0; r < n; r++ {
		g.Nodes = append(g.Nodes, Node{ID: r, Kind: Device, Name: fmt.Sprintf("r%d", r), Host: hostOf[r], NUMA: -1})
	}
	for h := range hosts {
		g.Nodes = append(g.Nodes, Node{ID: n + h, Kind: Memory, Name: fmt.Sprintf("host%d.mem", h), Host: h, NUMA: -1})
	}
	multi := len(hosts) > 1
	swID := n + len(hosts)
	if multi {
		g.Nodes = append(g.Nodes, Node{ID: swID, Kind: Switch, Name: "switch", Host: -1, NUMA: -1})
	}
	shm := make([]int, n)
	for r := 0; r < n; r++ {
		shm[r] = g.link(fmt.Sprintf("host%d.r%d", hostOf[r], r), Shm, r, n+hostOf[r], p.ShmBandwidth, p.ShmLatency/2)
	}
	nic := make([]int, len(hosts))
	if multi {
		for h := range hosts {
			nic[h] = g.link(fmt.Sprintf("host%d.nic", h), Net, n+h, swID, p.NICBandwidth, p.NICLatency/2)
		}
	}
	g.router = func(a, b int) ([]Hop, error) {
		if a < 0 || b < 0 || a >= n || b >= n {
			return nil, fmt.Errorf("topology: placement routes between ranks 0..%d, not %d→%d", n-1, a, b)
		}
		if hostOf[a] == hostOf[b] {
			return []Hop{{shm[a], true}, {shm[b], false}}, nil
		}
		return []Hop{{shm[a], true}, {nic[hostOf[a]], true}, {nic[hostOf[b]], false}, {shm[b], false}}, nil
	}
	return g, g.Validate()
}
