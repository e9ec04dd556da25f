package choose

import (
	"sync"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/topology/cost"
)

// modelMaxRanks bounds the communicators whose algorithm the cost model
// picks (and the calibration across hosts times): a prediction walks every
// rank's program, O(N²) operations for the ring, and every rank predicts
// at the first call of each size, so above this the first calls of a job
// whose ranks share cores would take longer than its calls; the size
// rules choose there (docs/scale.md has the cost per rank count).
const modelMaxRanks = 64

// Model caches the cost model's pick per collective and size: every rank
// computes the same prediction from the same placement, so they agree.
// Where the network's bandwidth is not known (Options.NetBandwidth), it
// predicts at several and picks the algorithm whose worst ratio to the
// fastest is smallest: a choice that is never far from the best, whether
// the hosts are joined by 1 or 100 Gbit/s.
type Model struct {
	models []*cost.Model
	base   sched.Params // the communicator's: ranks, tuning, placement
	mu     sync.Mutex
	picks  map[modelKey]*Entry
}

type modelKey struct {
	coll  sched.Coll
	bytes int
}

// NewModel is the cost model's choice for the placement of base
// (base.Hosts: the ranks of each host) at netBandwidth bytes/s (0: not
// known), or nil where the size rules choose: on one host, or above
// modelMaxRanks ranks. base is the communicator's part of every call's
// parameters (ranks, tuning, rings, trees, hosts).
func NewModel(base sched.Params, netBandwidth float64) *Model {
	if len(base.Hosts) <= 1 || base.N > modelMaxRanks {
		return nil
	}
	rates := []float64{1e9 / 8, 10e9 / 8, 100e9 / 8}
	if netBandwidth > 0 {
		rates = []float64{netBandwidth}
	}
	mc := &Model{base: base, picks: map[modelKey]*Entry{}}
	for _, bw := range rates {
		p := topology.DefaultParams()
		p.NICBandwidth = bw
		if g, err := topology.ForPlacement(base.Hosts, p); err == nil {
			mc.models = append(mc.models, cost.New(g))
		}
	}
	if len(mc.models) == 0 {
		return nil
	}
	return mc
}

// pick returns the candidate the model predicts fastest for a call of
// coll over bytes, or nil if none could be predicted.
func (mc *Model) pick(s Shape, candidates []*Entry) *Entry {
	key := modelKey{s.Coll, s.Bytes}
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if a, ok := mc.picks[key]; ok {
		return a
	}
	times := mc.predictLocked(s, candidates)
	var ok []*Entry
	for _, a := range candidates {
		if times[a] != nil {
			ok = append(ok, a)
		}
	}
	var best *Entry
	bestRegret := 0.0
	for _, a := range ok {
		regret := 0.0
		for m := range mc.models {
			fastest := times[a][m]
			for _, b := range ok {
				fastest = min(fastest, times[b][m])
			}
			regret = max(regret, times[a][m]/fastest)
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

// predict returns each candidate's predicted seconds under each of the
// model's rates (nil where it could not be predicted).
func (mc *Model) predict(s Shape, candidates []*Entry) map[*Entry][]float64 {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	return mc.predictLocked(s, candidates)
}

func (mc *Model) predictLocked(s Shape, candidates []*Entry) map[*Entry][]float64 {
	count := s.Bytes / 4
	switch s.Coll {
	case sched.AllGather, sched.ReduceScatter, sched.AllToAll:
		count /= mc.base.N
	}
	times := map[*Entry][]float64{}
	for _, a := range candidates {
		p := mc.base
		p.Coll, p.ElemSize, p.Count = s.Coll, 4, max(count, 0)
		sch, err := a.Build(p)
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
			times[a] = ts
		}
	}
	return times
}
