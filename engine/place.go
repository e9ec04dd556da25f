package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/topology/cost"
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
	c.hosts, c.hostNames = hosts, names
	c.evenHosts = true
	var ring []int
	identity := true
	for _, h := range hosts {
		c.evenHosts = c.evenHosts && len(h) == len(hosts[0])
		for _, r := range h {
			identity = identity && r == len(ring)
			ring = append(ring, r)
		}
	}
	t := topology.DoubleBinaryTree(c.size)
	c.trees = [][]int{t[0], t[1]}
	c.rings = nil
	if !identity {
		c.rings = [][]int{ring}
	}
	c.model = nil
	if len(hosts) > 1 && c.size <= modelMaxRanks {
		rates := []float64{1e9 / 8, 10e9 / 8, 100e9 / 8}
		if c.opts.NetBandwidth > 0 {
			rates = []float64{c.opts.NetBandwidth}
		}
		mc := &modelChoice{picks: map[modelKey]*algorithm{}}
		for _, bw := range rates {
			p := topology.DefaultParams()
			p.NICBandwidth = bw
			if g, err := topology.ForPlacement(hosts, p); err == nil {
				mc.models = append(mc.models, cost.New(g))
			}
		}
		if len(mc.models) > 0 {
			c.model = mc
		}
	}
}

// modelMaxRanks bounds the communicators whose algorithm the cost model
// picks: a prediction walks every rank's program, which is cheap below a
// few hundred ranks; above, the size rules choose.
const modelMaxRanks = 256

// modelChoice caches the model's pick per collective and size: every rank
// computes the same prediction from the same placement, so they agree.
// Where the network's bandwidth is not known (Options.NetBandwidth), it
// predicts at several and picks the algorithm whose worst ratio to the
// fastest is smallest: a choice that is never far from the best, whether
// the hosts are joined by 1 or 100 Gbit/s.
type modelChoice struct {
	models []*cost.Model
	mu     sync.Mutex
	picks  map[modelKey]*algorithm
}

type modelKey struct {
	coll  sched.Coll
	bytes int
}

// pick returns the candidate the model predicts fastest for a call of
// coll over bytes, or nil if none could be predicted.
func (mc *modelChoice) pick(c *Comm, s shape, candidates []*algorithm) *algorithm {
	key := modelKey{s.coll, s.bytes}
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if a, ok := mc.picks[key]; ok {
		return a
	}
	count := s.bytes / 4
	switch s.coll {
	case sched.AllGather, sched.ReduceScatter, sched.AllToAll:
		count /= c.size
	}
	// times[k][m]: candidate k's prediction under model m.
	var ok []*algorithm
	var times [][]float64
	for _, a := range candidates {
		sch, err := a.build(sched.Params{Coll: s.coll, N: c.size, ElemSize: 4, Count: max(count, 0),
			Segments: c.opts.Segments, Radix: c.opts.BruckRadix, Rings: c.rings, Hosts: c.hosts, Trees: c.trees})
		// The control tree's time depends on when ranks arrive, which the
		// model cannot see.
		if err != nil || sch.Tree != nil {
			continue
		}
		var ts []float64
		for _, m := range mc.models {
			p, err := m.Predict(sch)
			if err != nil {
				break
			}
			ts = append(ts, p.Seconds)
		}
		if len(ts) == len(mc.models) {
			ok, times = append(ok, a), append(times, ts)
		}
	}
	var best *algorithm
	bestRegret := 0.0
	for k, a := range ok {
		regret := 0.0
		for m := range mc.models {
			fastest := times[k][m]
			for j := range ok {
				fastest = min(fastest, times[j][m])
			}
			regret = max(regret, times[k][m]/fastest)
		}
		if best == nil || regret < bestRegret {
			best, bestRegret = a, regret
		}
	}
	if len(mc.picks) > 256 {
		clear(mc.picks)
	}
	mc.picks[key] = best
	return best
}

// Topology describes the communicator as JSON: its ranks and hosts, the
// graph the cost model uses (topology.ForPlacement's schema), the ring
// order, and what this rank's host is made of (detected with hwloc or
// /sys; "detect_error" if that failed).
func (c *Comm) Topology() ([]byte, error) {
	g, err := topology.ForPlacement(c.hosts, topology.DefaultParams())
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
	for h, ranks := range c.hosts {
		hj := hostJSON{Ranks: ranks}
		if h < len(c.hostNames) {
			hj.Name = c.hostNames[h]
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
	out := make([][]int, len(c.hosts))
	for h, ranks := range c.hosts {
		out[h] = slices.Clone(ranks)
	}
	return out
}
