package engine

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
)

// place records where the ranks are: hosts lists the ranks of each host
// (nil: all on one host), names their host names when known. The ring
// algorithms follow the hosts in order, each host's ranks adjacent, so that
// a ring crosses each host boundary once; the hierarchical algorithms need
// every host to hold as many ranks; across hosts the cost model chooses.
func (c *Comm) place(hosts [][]int, names []string) {
	// Every line names the communicator once it has an id (equal on every
	// rank), so the lines of one job's communicators can be told apart.
	if id := c.commID(); id != "" {
		c.log = c.opts.Logger.With("rank", c.rank, "nranks", c.size, "comm", id)
	}
	if len(hosts) == 0 {
		all := make([]int, c.size)
		for i := range all {
			all[i] = i
		}
		hosts = [][]int{all}
	}
	c.layout.hosts, c.layout.hostNames = hosts, names
	c.layout.evenHosts = true
	var ring []int
	identity := true
	for _, h := range hosts {
		c.layout.evenHosts = c.layout.evenHosts && len(h) == len(hosts[0])
		for _, r := range h {
			identity = identity && r == len(ring)
			ring = append(ring, r)
		}
	}
	t := topology.DoubleBinaryTree(c.size)
	c.layout.trees = [][]int{t[0], t[1]}
	c.layout.rings = nil
	if !identity {
		c.layout.rings = [][]int{ring}
	}
	c.choice.Model = choose.NewModel(sched.Params{N: c.size, Segments: c.opts.Segments, Radix: c.opts.BruckRadix,
		Rings: c.layout.rings, Hosts: c.layout.hosts, Trees: c.layout.trees}, c.opts.NetBandwidth)
}

// Topology describes the communicator as JSON: its ranks and hosts, the
// graph the cost model uses (topology.ForPlacement's schema), the ring
// order, and what this rank's host is made of (detected with hwloc or
// /sys; "detect_error" if that failed).
func (c *Comm) Topology() ([]byte, error) {
	g, err := topology.ForPlacement(c.layout.hosts, topology.DefaultParams())
	if err != nil {
		return nil, err
	}
	type hostJSON struct {
		Name  string `json:"name,omitempty"`
		Ranks []int  `json:"ranks"`
	}
	out := struct {
		Rank        int             `json:"rank"`
		Ranks       int             `json:"ranks"`
		Hosts       []hostJSON      `json:"hosts"`
		Ring        []int           `json:"ring"`
		Graph       *topology.Graph `json:"graph"`
		Local       *topology.Host  `json:"local_host,omitempty"`
		Source      string          `json:"local_source,omitempty"`
		DetectError string          `json:"detect_error,omitempty"`
	}{Rank: c.rank, Ranks: c.size, Graph: g}
	for h, ranks := range c.layout.hosts {
		hj := hostJSON{Ranks: ranks}
		if h < len(c.layout.hostNames) {
			hj.Name = c.layout.hostNames[h]
		}
		out.Hosts = append(out.Hosts, hj)
		out.Ring = append(out.Ring, ranks...)
	}
	if h, src, err := topology.DetectHost(); err == nil {
		out.Local, out.Source = &h, src
	} else {
		out.DetectError = err.Error()
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("gocoll: topology of rank %d: %w", c.rank, err)
	}
	return b, nil
}

// Hosts lists the ranks of each host of the communicator (ranks sharing
// memory), hosts in order of their lowest rank: what
// topology.ForPlacement needs to describe the communicator.
func (c *Comm) Hosts() [][]int {
	out := make([][]int, len(c.layout.hosts))
	for h, ranks := range c.layout.hosts {
		out[h] = slices.Clone(ranks)
	}
	return out
}

// hostLayout is where a communicator's ranks are, equal on every rank: the
// ranks of each host (in local order), whether every host holds as many,
// and the orders the ring and tree algorithms follow.
type hostLayout struct {
	hosts     [][]int
	hostNames []string
	evenHosts bool
	rings     [][]int // nil: 0, 1, …, size-1
	trees     [][]int // the double binary trees (dbtree)
}
