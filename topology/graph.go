// Package topology describes the machine a job runs on as a graph, and
// builds what collectives need from it: paths between ranks, ring orders,
// the largest set of link-disjoint rings, double binary trees.
//
// Nodes are devices (the ranks or processing units collectives run on,
// grouped into hosts and NUMA nodes) and the things between them that are
// not devices: network switches, a host's memory hub. Links join two nodes,
// carry an identifier, a kind (shm, net, dev), a bandwidth in bytes per
// second in each direction (they are full duplex) and a latency in
// seconds; two nodes may be joined by several parallel links, each with its
// own identifier (the hybrid cube-mesh of docs/design/virtual-devices.md has two between every
// pair of units of a group).
//
// A graph comes from a built-in (Builtin: hybrid-cube-mesh, ring:N,
// torus:AxB, fattree:K, cluster:HxR), from a JSON file (Parse, Load; the
// schema is in the README of this folder), from the placement of a
// communicator's ranks on hosts (ForPlacement), or from this machine
// (Detect: hwloc when libhwloc is there, /sys otherwise).
//
// The package imports nothing of gocoll's: the engine, the cost model and
// the virtual-device layer build on it.
package topology

import (
	"fmt"
	"slices"
	"sort"
)

// NodeKind says what a node is.
type NodeKind string

const (
	Device NodeKind = "device" // a rank / processing unit
	Switch NodeKind = "switch" // a network switch
	Memory NodeKind = "memory" // a host's shared memory, through which its devices talk
)

// LinkKind says what carries a link's bytes.
type LinkKind string

const (
	Shm LinkKind = "shm" // shared memory inside a host
	Net LinkKind = "net" // a network link (NIC, cable, switch port)
	Dev LinkKind = "dev" // a direct device-to-device link
)

// Node is a vertex of the graph.
type Node struct {
	ID   int
	Kind NodeKind
	Name string
	Host int // index into Graph.Hosts, -1 if none
	NUMA int // NUMA node inside the host, -1 if unknown
}

// Link is an edge: full duplex, Bandwidth bytes/s in each direction.
type Link struct {
	ID        string
	Kind      LinkKind
	A, B      int // node ids
	Bandwidth float64
	Latency   float64
}

// Cache is one level of a host's caches.
type Cache struct {
	Level int    `json:"level"` // 1, 2, 3…
	Type  string `json:"type"`  // "data", "instruction", "unified"
	Size  int64  `json:"size"`  // bytes, each instance
	Count int    `json:"count"` // instances on the host
}

// Host is a machine: what its devices share.
type Host struct {
	Name      string  `json:"name"`
	Cores     int     `json:"cores,omitempty"`
	PUs       int     `json:"pus,omitempty"` // hardware threads
	NUMANodes int     `json:"numa_nodes,omitempty"`
	Caches    []Cache `json:"caches,omitempty"`
}

// Graph is a machine description. Build it with the constructors of this
// package or fill it and call Validate; after Validate it must not change.
type Graph struct {
	Name   string
	Source string // "builtin:…", "file:…", "placement", "hwloc", "sys"
	Hosts  []Host
	Nodes  []Node
	Links  []Link

	index  map[int]int // node id → position in Nodes
	adj    [][]half    // per node position: the links at it
	router func(a, b int) ([]Hop, error)
	paths  *pathCache
}

// half is a link seen from one of its ends.
type half struct {
	link int // index into Links
	to   int // node position at the other end
	fwd  bool
}

// Hop is one link of a path, in the direction it is crossed.
type Hop struct {
	Link    int  // index into Graph.Links
	Forward bool // crossed from A to B
}

// Validate checks the graph and builds its indexes; every constructor calls
// it. Errors name the offending element.
func (g *Graph) Validate() error {
	g.index = make(map[int]int, len(g.Nodes))
	for i, n := range g.Nodes {
		if n.ID < 0 {
			return fmt.Errorf("topology: node %d: negative id", n.ID)
		}
		if _, dup := g.index[n.ID]; dup {
			return fmt.Errorf("topology: node id %d appears twice", n.ID)
		}
		switch n.Kind {
		case Device, Switch, Memory:
		default:
			return fmt.Errorf("topology: node %d: unknown kind %q (device, switch or memory)", n.ID, n.Kind)
		}
		if n.Host < -1 || n.Host >= len(g.Hosts) {
			return fmt.Errorf("topology: node %d: host %d, but there are %d hosts", n.ID, n.Host, len(g.Hosts))
		}
		if n.Kind == Device && len(g.Hosts) > 0 && n.Host < 0 {
			return fmt.Errorf("topology: device %d belongs to no host (hosts are declared, so every device needs one)", n.ID)
		}
		g.index[n.ID] = i
	}
	ids := make(map[string]bool, len(g.Links))
	g.adj = make([][]half, len(g.Nodes))
	for i, l := range g.Links {
		switch {
		case l.ID == "":
			return fmt.Errorf("topology: link %d (%d–%d) has no id", i, l.A, l.B)
		case ids[l.ID]:
			return fmt.Errorf("topology: link id %q appears twice", l.ID)
		case l.A == l.B:
			return fmt.Errorf("topology: link %q joins node %d to itself", l.ID, l.A)
		case !(l.Bandwidth > 0):
			return fmt.Errorf("topology: link %q: bandwidth %v bytes/s, want > 0", l.ID, l.Bandwidth)
		case !(l.Latency >= 0):
			return fmt.Errorf("topology: link %q: latency %v s, want ≥ 0", l.ID, l.Latency)
		}
		switch l.Kind {
		case Shm, Net, Dev:
		default:
			return fmt.Errorf("topology: link %q: unknown kind %q (shm, net or dev)", l.ID, l.Kind)
		}
		a, okA := g.index[l.A]
		b, okB := g.index[l.B]
		if !okA || !okB {
			missing := l.A
			if okA {
				missing = l.B
			}
			return fmt.Errorf("topology: link %q ends at node %d, which does not exist", l.ID, missing)
		}
		ids[l.ID] = true
		g.adj[a] = append(g.adj[a], half{i, b, true})
		g.adj[b] = append(g.adj[b], half{i, a, false})
	}
	g.paths = newPathCache()
	return nil
}

// Devices lists the device ids in increasing order.
func (g *Graph) Devices() []int {
	var out []int
	for _, n := range g.Nodes {
		if n.Kind == Device {
			out = append(out, n.ID)
		}
	}
	sort.Ints(out)
	return out
}

// Node returns the node with id, if any.
func (g *Graph) Node(id int) (Node, bool) {
	i, ok := g.index[id]
	if !ok {
		return Node{}, false
	}
	return g.Nodes[i], true
}

// HostDevices lists each host's devices (ids, increasing).
func (g *Graph) HostDevices() [][]int {
	out := make([][]int, len(g.Hosts))
	for _, id := range g.Devices() {
		if h := g.Nodes[g.index[id]].Host; h >= 0 {
			out[h] = append(out[h], id)
		}
	}
	return out
}

// LinkIndex returns the index of the link with id, if any.
func (g *Graph) LinkIndex(id string) (int, bool) {
	for i, l := range g.Links {
		if l.ID == id {
			return i, true
		}
	}
	return 0, false
}

// equal reports whether two validated graphs describe the same machine
// (tests of the JSON round trip).
func (g *Graph) equal(o *Graph) bool {
	return g.Name == o.Name && slices.EqualFunc(g.Hosts, o.Hosts, func(a, b Host) bool {
		return a.Name == b.Name && a.Cores == b.Cores && a.PUs == b.PUs && a.NUMANodes == b.NUMANodes && slices.Equal(a.Caches, b.Caches)
	}) && slices.Equal(g.Nodes, o.Nodes) && slices.Equal(g.Links, o.Links)
}

// Summary is a one-paragraph description: devices, hosts, links by kind.
func (g *Graph) Summary() string {
	kinds := map[LinkKind]int{}
	for _, l := range g.Links {
		kinds[l.Kind]++
	}
	switches := 0
	for _, n := range g.Nodes {
		if n.Kind == Switch {
			switches++
		}
	}
	s := fmt.Sprintf("%s: %d devices on %d hosts, %d switches, %d links", g.Name, len(g.Devices()), len(g.Hosts), switches, len(g.Links))
	for _, k := range []LinkKind{Dev, Shm, Net} {
		if kinds[k] > 0 {
			s += fmt.Sprintf(", %d %s", kinds[k], k)
		}
	}
	return s
}
