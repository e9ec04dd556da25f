package choose

import (
	"errors"
	"math/bits"
	"slices"
	"sync"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/topology/cost"
)

// The cost model's choice across hosts at any rank count. Every rank
// predicts at the first call of each collective and size class, and a
// walk of a schedule over every rank is Θ(N²) operations for a ring (Θ(N
// log N) for the trees): at 1,024 ranks that is seconds, where a first call
// may spend milliseconds. So on a placement of identical hosts numbered
// host by host (cost.Cluster, what a job launched host by host gets) the
// model projects each schedule from walks of a few small clusters by the
// way it grows (cost.GrowthOf, cost.Projector): the work depends on the
// ranks per host, not on the hosts. Another placement is walked whole.
// Either way a class's prediction is bounded by modelBudget; a class
// that would pass it is left to the size rules (registry.go's bySize).

// modelBudget bounds the work of one class's prediction, all candidates
// and rates together: operations pulled from the ranks' programs plus
// ranks visited round by round (cost.Prediction's Ops + Visits). A
// projection on hosts of 8 ranks takes an eighth of it at most, of 32
// ranks three quarters; from 64 ranks a host the largest classes pass it.
// A placement walked whole fits it up to about 64 ranks at every size.
const modelBudget = 1 << 19

// directMaxRanks: beyond this many ranks, a placement walked whole would
// pass the budget at every size (the flat ring alone is 2(N-1) rounds of
// N ranks), so the size rules choose without trying.
const directMaxRanks = 1 << 10

// Model caches the cost model's predictions and pick per collective and
// size class: every rank computes the same prediction from the same
// placement, so they agree. Where the network's bandwidth is not known
// (Options.NetBandwidth), it predicts at several and picks the algorithm
// whose worst ratio to the fastest is smallest: a choice that is never far
// from the best, whether the hosts are joined by 1 or 100 Gbit/s.
type Model struct {
	base    sched.Params // the communicator's: ranks, tuning, placement
	figs    []cost.Figures
	cluster cost.Cluster
	regular bool // base's placement is cluster's, laid out as cost.Cluster.Params lays it out
	mu      sync.Mutex
	proj    *cost.Projector
	direct  []*cost.Model // irregular placements: the placement at each rate, made at first use
	classes map[modelKey]*class
	// budget is modelBudget (tests lift it to walk placements whole).
	budget int64
}

// modelKey is a collective and a size class: calls of a class are
// predicted once, at the class's size (classSize).
type modelKey struct {
	coll  sched.Coll
	class int
}

// class is what the model knows of a collective and size class.
type class struct {
	// times holds each candidate predicted so far: its seconds at each
	// rate, nil where it could not be predicted.
	times map[*Entry][]float64
	// over: the prediction passed the budget; the size rules choose.
	over   bool
	picked bool
	pick   *Entry
	// work is what the predictions walked (cost.Prediction's Ops + Visits).
	work int64
}

// sizeClass is the class of a call of bytes: ⌈log2 bytes⌉, so that a
// class's calls are within a factor of two below its size.
func sizeClass(bytes int) int {
	if bytes <= 1 {
		return 0
	}
	return bits.Len(uint(bytes - 1))
}

// classSize is the size a class is predicted at; a call of 0 bytes (a
// barrier) at 0.
func classSize(bytes int) int {
	if bytes <= 0 {
		return 0
	}
	return 1 << sizeClass(bytes)
}

// NewModel is the cost model's choice for the placement of base
// (base.Hosts: the ranks of each host) at netBandwidth bytes/s (0: not
// known), or nil where the size rules choose: on one host, or on more
// than directMaxRanks ranks placed otherwise than a cost.Cluster. base is
// the communicator's part of every call's parameters (ranks, tuning,
// rings, trees, hosts).
func NewModel(base sched.Params, netBandwidth float64) *Model {
	if len(base.Hosts) <= 1 {
		return nil
	}
	rates := []float64{1e9 / 8, 10e9 / 8, 100e9 / 8}
	if netBandwidth > 0 {
		rates = []float64{netBandwidth}
	}
	mc := &Model{base: base, classes: map[modelKey]*class{}, budget: modelBudget}
	for _, bw := range rates {
		f := cost.DefaultFigures()
		f.Links.NICBandwidth = bw
		mc.figs = append(mc.figs, f)
	}
	mc.cluster, mc.regular = cost.ClusterOf(base.Hosts)
	mc.regular = mc.regular && mc.cluster.Ranks() == base.N && base.Rings == nil && engineTrees(base)
	if !mc.regular && base.N > directMaxRanks {
		return nil
	}
	mc.proj = cost.NewProjector(mc.figs...)
	return mc
}

// engineTrees says base's trees are the ones cost.Cluster.Params lays out
// (and the engine: NCCL's over the ranks).
func engineTrees(base sched.Params) bool {
	t := topology.DoubleBinaryTree(base.N)
	return len(base.Trees) == 2 && slices.Equal(base.Trees[0], t[0]) && slices.Equal(base.Trees[1], t[1])
}

// pick returns the candidate the model predicts fastest for a call of
// coll over bytes, or nil if the class could not be predicted.
func (mc *Model) pick(s Shape, candidates []*Entry) *Entry {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	cl := mc.predictLocked(s, candidates)
	if !cl.picked {
		cl.pick, cl.picked = mc.best(cl, candidates), true
	}
	return cl.pick
}

// best is the candidate whose worst ratio to the fastest over the rates
// is least (nil: none predicted, or the class passed the budget).
func (mc *Model) best(cl *class, candidates []*Entry) *Entry {
	if cl.over {
		return nil
	}
	var ok []*Entry
	for _, a := range candidates {
		if cl.times[a] != nil {
			ok = append(ok, a)
		}
	}
	var best *Entry
	bestRegret := 0.0
	for _, a := range ok {
		regret := 0.0
		for m := range mc.figs {
			fastest := cl.times[a][m]
			for _, b := range ok {
				fastest = min(fastest, cl.times[b][m])
			}
			regret = max(regret, cl.times[a][m]/fastest)
		}
		if best == nil || regret < bestRegret {
			best, bestRegret = a, regret
		}
	}
	return best
}

// predict returns each candidate's predicted seconds under each of the
// model's rates, for a call of s's size class (nil where it could not be
// predicted; nil for all where the class passed the budget).
func (mc *Model) predict(s Shape, candidates []*Entry) map[*Entry][]float64 {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	cl := mc.predictLocked(s, candidates)
	out := map[*Entry][]float64{}
	if !cl.over {
		for _, a := range candidates {
			out[a] = cl.times[a]
		}
	}
	return out
}

// predictLocked predicts the candidates of s's class not predicted yet,
// within what is left of the class's budget.
func (mc *Model) predictLocked(s Shape, candidates []*Entry) *class {
	key := modelKey{s.Coll, sizeClass(s.Bytes)}
	cl := mc.classes[key]
	if cl == nil {
		if len(mc.classes) > 256 {
			clear(mc.classes)
		}
		cl = &class{times: map[*Entry][]float64{}}
		mc.classes[key] = cl
	}
	count := classSize(s.Bytes) / 4
	switch s.Coll {
	case sched.AllGather, sched.ReduceScatter, sched.AllToAll:
		count /= mc.base.N
	}
	for _, a := range candidates {
		if _, done := cl.times[a]; done || cl.over {
			continue
		}
		p := mc.base
		p.Coll, p.ElemSize, p.Count = s.Coll, 4, max(count, 0)
		ts, work, err := mc.predictOne(a, p, mc.budget-cl.work)
		cl.work += work
		cl.over = errors.Is(err, cost.ErrBudget)
		cl.times[a] = ts // nil on an error
	}
	return cl
}

// predictOne is a's seconds at each rate for the call p, projected on a
// cost.Cluster or walked whole, and the work it took, within limit.
func (mc *Model) predictOne(a *Entry, p sched.Params, limit int64) ([]float64, int64, error) {
	if limit <= 0 {
		return nil, 0, cost.ErrBudget
	}
	if mc.regular {
		mc.proj.Limit = limit
		pr, err := mc.proj.Project(mc.cluster, a.Build, p, cost.GrowthOf(a.Coll, a.Name))
		if errors.Is(err, cost.ErrBudget) {
			return nil, limit, err
		}
		return pr.Seconds, pr.Ops + pr.Visits, err
	}
	sch, err := a.Build(p)
	// The control tree's time depends on when ranks arrive, which the
	// model cannot see.
	if err != nil || sch.Tree != nil {
		return nil, 0, errors.Join(err, errors.New("choose: no prediction"))
	}
	if mc.direct == nil {
		for _, f := range mc.figs {
			g, err := topology.ForPlacement(mc.base.Hosts, f.Links)
			if err != nil {
				return nil, 0, err
			}
			mc.direct = append(mc.direct, f.Model(g))
		}
	}
	preds, err := cost.PredictEach(sch, mc.direct, limit)
	if errors.Is(err, cost.ErrBudget) {
		return nil, limit, err
	}
	if err != nil {
		return nil, 0, err
	}
	ts := make([]float64, len(preds))
	for i, x := range preds {
		ts[i] = x.Seconds
	}
	return ts, preds[0].Ops + preds[0].Visits, nil
}

// Predicted is the model's time for one call of bytes of each of cs
// (AllReduce on s's placement), summed, each at the slowest rate it
// predicts at; 0 where it has none. The calibration across hosts bounds
// what it times with it (engine/tune.go): every rank computes the same.
func (ch *Chooser) Predicted(bytes int, s Shape, cs []*Entry) float64 {
	if ch.Model == nil {
		return 0
	}
	s.Coll, s.Bytes = sched.AllReduce, bytes
	total := 0.0
	for _, ts := range ch.Model.predict(s, cs) {
		if ts == nil {
			return 0
		}
		total += slices.Max(ts)
	}
	return total
}
