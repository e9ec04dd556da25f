package cost

import (
	"fmt"
	"math"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
)

// Projection: a schedule's time on a large cluster from walks of small
// ones. A walk pulls every operation of every rank, which for a ring over
// N ranks is Θ(N²) and for the log-depth schedules Θ(N log N): minutes to
// hours at 65,536 ranks, and more than a first call may spend at 1,024
// (millions of operations for one allreduce size). But on a Cluster
// (identical hosts, ranks numbered host by host) the engine's schedules
// grow in a few known ways (Form): their steps are alike, so the time of
// H hosts is the time of a few small clusters walked whole, combined by
// the form's rule. Each form's rule is exact in the model where its
// assumptions hold (docs/scale.md, TestProjectMatchesDirect); the walks
// it takes depend on the ranks per host, not on the hosts.

// Cluster is H hosts of R ranks each, numbered host by host (rank h·R+l is
// local rank l of host h), every host's ranks sharing its memory and one
// NIC to a non-blocking switch (topology.ForPlacement): the placement of a
// job launched host by host, and the one Project predicts at any size.
type Cluster struct{ Hosts, PerHost int }

// Ranks is H·R.
func (c Cluster) Ranks() int { return c.Hosts * c.PerHost }

// Placement lists the ranks of each host.
func (c Cluster) Placement() [][]int {
	hosts := make([][]int, c.Hosts)
	for h := range hosts {
		hosts[h] = make([]int, c.PerHost)
		for l := range hosts[h] {
			hosts[h][l] = h*c.PerHost + l
		}
	}
	return hosts
}

// ClusterOf is the Cluster whose placement hosts is, if it is one.
func ClusterOf(hosts [][]int) (Cluster, bool) {
	if len(hosts) == 0 || len(hosts[0]) == 0 {
		return Cluster{}, false
	}
	c := Cluster{Hosts: len(hosts), PerHost: len(hosts[0])}
	for h, ranks := range hosts {
		if len(ranks) != c.PerHost {
			return Cluster{}, false
		}
		for l, r := range ranks {
			if r != h*c.PerHost+l {
				return Cluster{}, false
			}
		}
	}
	return c, true
}

// Params is base laid out on c as the engine lays out a communicator
// (engine/place.go): N and the hosts, the ring in rank order (Rings nil),
// NCCL's double binary trees over the ranks.
func (c Cluster) Params(base sched.Params) sched.Params {
	p := base
	p.N, p.Hosts, p.Rings = c.Ranks(), c.Placement(), nil
	t := topology.DoubleBinaryTree(p.N)
	p.Trees = [][]int{t[0], t[1]}
	return p
}

// Form is how a schedule's time grows with the hosts of a Cluster.
type Form uint8

const (
	// Whole: no rule known; Project walks the whole schedule.
	Whole Form = iota
	// PerRank: a ring over all ranks, each phase one alike step per rank
	// beyond the first. With the same blocks (Keep Blocks) a step costs
	// the same on any cluster, whatever its ranks per host (each rank's
	// memory link carries its own block, each NIC one block each way), so
	// the time beyond the call's fixed cost is proportional to N-1: it is
	// walked on 2 hosts of at most 2 ranks.
	PerRank
	// PerHost: a part inside each host, then alike steps across hosts,
	// one per host beyond the first (the hierarchical allreduce): with
	// the same blocks across hosts (Keep HostBlocks),
	// T(H, L) = T(1, L) + (H-1)·(T(2, L') - T(1, L')), L' = 2L/H.
	PerHost
	// Affine: steps across hosts one per host beyond the first, and
	// steps inside a host that carry one block per host (the hierarchical
	// allgather and reduce-scatter, Keep Blocks): T = a + b·H, through
	// walks of 2 and 4 hosts.
	Affine
	// Linear: affine in the hosts (a pipeline whose depth grows with the
	// hosts), plus the log2 N rounds of a barrier appended (sched.Agreed):
	// T = a + b·H + c·log2 H, fitted on walks of three small clusters
	// (fitHosts: 4, 8 and 16 hosts where H is a power of two).
	Linear
	// Log: one round, or a few, per doubling of the ranks (recursive
	// doubling, trees, halving–doubling, whose added round moves half the
	// block of the one before): T = a + b·log2 H + c/H, fitted on walks of
	// three small clusters (fitHosts). Exact in the model where the ranks
	// are a power of two; otherwise which ranks pair across hosts changes
	// with the hosts (the fold of sched's halving–doubling, the trees'
	// shapes) and the fit is near (docs/scale.md).
	Log
	// Depth: a tree one level deeper per doubling of the hosts, each
	// level alike (the double binary tree): T = a + b·log2 H, through the
	// two larger of fitHosts (8 and 16 hosts where H is a power of two).
	// Its first levels across hosts are not alike (a tree over 4 hosts
	// crosses them differently), which a third point would read as a
	// transient and extrapolate wrong.
	Depth
)

// Keep is what stays the same between a cluster and the small ones its
// projection walks.
type Keep uint8

const (
	// Vector: the call's vector.
	Vector Keep = iota
	// Blocks: each rank's block (the vector scaled by N'/N).
	Blocks
	// HostBlocks: each rank's block across hosts (the vector scaled by H'/H).
	HostBlocks
)

// Growth is how a schedule grows, for Project.
type Growth struct {
	Form Form
	Keep Keep
	// PipeFrom, if positive: beyond a vector of PipeFrom + PipePerRank·R
	// bytes (R ranks a host) the schedule is a pipeline of fixed
	// segments, one more round per segment, each round alike once the
	// pipeline is full. Project predicts that vector by the form and adds
	// the rest at the slope of a full pipeline, walked on pipeHosts hosts
	// from Slope + PipePerRank·R bytes (Slope 0: PipeFrom) to that plus
	// the first vector. The slope is the same on any cluster of pipeHosts
	// hosts or more; how soon a pipeline fills may not be (a deeper tree
	// fills later), which the line does not see.
	PipeFrom, Slope, PipePerRank int
}

// fitHosts are the host counts a Linear, Log or Depth form on h hosts is
// fitted on: three points for three coefficients, of 4 hosts or more (a double
// binary tree over two hosts crosses them differently from one over
// many). Where the ranks are not a power of two, halving–doubling and
// recursive doubling first fold the ranks beyond the largest power of
// two into their neighbours, and a fit on powers of two would miss that
// step: so on hosts that are no power of two the points are 6, 12 and 24
// hosts, which fold too, evaluated at h: near (docs/scale.md).
func fitHosts(h int) [3]int {
	if h&(h-1) != 0 {
		return [3]int{6, 12, 24}
	}
	return [3]int{4, 8, 16}
}

// pipeHosts is the most hosts a pipeline's slope is walked on.
const pipeHosts = 4

// GrowthOf is how the engine's schedule coll/algo grows (the names of the
// registry, engine/internal/choose/registry.go); Whole for one it does not
// know. The all-to-alls are Whole: the engine chooses them by measured
// thresholds, not by the model.
func GrowthOf(coll sched.Coll, algo string) Growth {
	// Chain, hierarchical broadcast and double binary tree segments are
	// 256 KiB (sched's chainSeg). The hierarchical broadcast's chain
	// across hosts is full from its first segments; a chain over every
	// rank once its segments span a host (every round then crosses one),
	// R+1 of them; a double binary tree's two halves on 4 hosts from 16
	// segments each, 8 MiB (TestProjectMatchesDirect).
	const pipe, seg, treeFull = 2 << 20, 256 << 10, 8 << 20
	switch {
	case algo == "ring" && (coll == sched.AllReduce || coll == sched.AllGather || coll == sched.ReduceScatter):
		return Growth{Form: PerRank, Keep: Blocks}
	case algo == "hier" && coll == sched.AllReduce:
		return Growth{Form: PerHost, Keep: HostBlocks}
	case algo == "hier" && (coll == sched.AllGather || coll == sched.ReduceScatter):
		return Growth{Form: Affine, Keep: Blocks}
	case algo == "hier" && coll == sched.Broadcast:
		return Growth{Form: Linear, PipeFrom: pipe}
	case algo == "pipeline" && coll == sched.Broadcast:
		return Growth{Form: Linear, PipeFrom: seg, PipePerRank: seg}
	case algo == "dbtree" && coll == sched.AllReduce:
		return Growth{Form: Depth, PipeFrom: pipe, Slope: treeFull}
	case algo == "rd" && (coll == sched.AllReduce || coll == sched.Barrier),
		algo == "hd" && (coll == sched.AllReduce || coll == sched.Reduce || coll == sched.ReduceScatter),
		algo == "tree" && (coll == sched.Reduce || coll == sched.Broadcast),
		algo == "dissemination" && coll == sched.Barrier:
		return Growth{Form: Log}
	}
	return Growth{}
}

// A Projector predicts schedules on Clusters under one or more sets of
// figures at once (one walk prices them all), keeping the small clusters'
// graphs between calls. Not safe for concurrent use.
type Projector struct {
	figs  []Figures
	views map[Cluster][]*view
	buf   []sched.Op // the walks' copied programs
	// Limit bounds the work of one Project, all its walks together
	// (Prediction's Ops + Visits); 0: none. Past it Project fails with
	// ErrBudget.
	Limit int64
}

// NewProjector predicts under each of figs.
func NewProjector(figs ...Figures) *Projector {
	return &Projector{figs: figs, views: map[Cluster][]*view{}}
}

// Projection is Project's answer: the seconds under each figure set, and
// what the walks behind them took.
type Projection struct {
	Seconds     []float64
	Walks       int
	Ops, Visits int64
}

// Project predicts the schedule build makes of p laid out on c
// (Cluster.Params), under each of the projector's figure sets, by g's rule
// from small clusters where c is larger than they are, else by walking it.
// p's Count is the call's on c (per rank for allgather and reduce-scatter).
func (pj *Projector) Project(c Cluster, build sched.Builder, p sched.Params, g Growth) (Projection, error) {
	if c.Hosts < 1 || c.PerHost < 1 {
		return Projection{}, fmt.Errorf("cost: a cluster of %d hosts of %d ranks", c.Hosts, c.PerHost)
	}
	j := &job{pj: pj, build: build, memo: map[walkKey][]float64{}}
	var ts []float64
	var err error
	l0, l1 := g.PipeFrom+g.PipePerRank*c.PerHost, g.Slope+g.PipePerRank*c.PerHost
	if g.Slope == 0 {
		l1 = l0
	}
	if l, es := vectorBytes(p, c.Ranks()), max(p.ElemSize, 1); g.PipeFrom > 0 && l > l0 && l0%es == 0 && l1%es == 0 {
		ts, err = j.pipeline(c, p, g, l, l0, l1)
	} else {
		ts, err = j.grow(c, p, g)
	}
	if err != nil {
		return Projection{}, err
	}
	j.pr.Seconds = ts
	return j.pr, nil
}

// job is one Project under way: its walks so far, each done once.
type job struct {
	pj    *Projector
	build sched.Builder
	pr    Projection
	memo  map[walkKey][]float64
}

type walkKey struct {
	c     Cluster
	count int
}

// pipeline is T(L) = T(L0) + (L-L0)/L0·(T_s(L1+L0) - T_s(L1)) (Growth's
// PipeFrom and Slope), the slope walked on at most pipeHosts hosts.
func (j *job) pipeline(c Cluster, p sched.Params, g Growth, l, l0, l1 int) ([]float64, error) {
	t0, err := j.grow(c, withVector(p, c.Ranks(), l0), g)
	if err != nil {
		return nil, err
	}
	s := Cluster{min(c.Hosts, pipeHosts), c.PerHost}
	a, err := j.walk(s, withVector(p, s.Ranks(), l1))
	if err != nil {
		return nil, err
	}
	b, err := j.walk(s, withVector(p, s.Ranks(), l1+l0))
	if err != nil {
		return nil, err
	}
	k := float64(l-l0) / float64(l0)
	for i := range t0 {
		t0[i] += k * (b[i] - a[i])
	}
	return t0, nil
}

// grow predicts p on c by g's form.
func (j *job) grow(c Cluster, p sched.Params, g Growth) ([]float64, error) {
	switch g.Form {
	case PerRank:
		small := Cluster{2, min(c.PerHost, 2)}
		if c.Hosts <= small.Hosts {
			break
		}
		t, err := j.walk(small, scaled(p, c, small, g.Keep))
		if err != nil {
			return nil, err
		}
		n, ns := float64(c.Ranks()-1), float64(small.Ranks()-1)
		for i, f := range j.pj.figs {
			t[i] = f.Rates.Call + (t[i]-f.Rates.Call)*n/ns
		}
		return t, nil
	case PerHost:
		one, two := Cluster{1, c.PerHost}, Cluster{2, c.PerHost}
		if c.Hosts <= two.Hosts {
			break
		}
		p2 := scaled(p, c, two, g.Keep)
		inside, err := j.walk(one, p)
		if err != nil {
			return nil, err
		}
		t2, err := j.walk(two, p2)
		if err != nil {
			return nil, err
		}
		t1, err := j.walk(one, p2)
		if err != nil {
			return nil, err
		}
		for i := range inside {
			inside[i] += float64(c.Hosts-1) * (t2[i] - t1[i])
		}
		return inside, nil
	case Affine:
		if c.Hosts <= 4 {
			break
		}
		a, b := Cluster{2, c.PerHost}, Cluster{4, c.PerHost}
		ta, err := j.walk(a, scaled(p, c, a, g.Keep))
		if err != nil {
			return nil, err
		}
		tb, err := j.walk(b, scaled(p, c, b, g.Keep))
		if err != nil {
			return nil, err
		}
		for i := range ta {
			ta[i] += (tb[i] - ta[i]) * float64(c.Hosts-a.Hosts) / float64(b.Hosts-a.Hosts)
		}
		return ta, nil
	case Linear, Log, Depth:
		if c.Hosts <= fitHosts(c.Hosts)[2] {
			break
		}
		return j.fit(c, p, g)
	}
	return j.walk(c, p)
}

// fit is the Linear, Log or Depth form: the basis's coefficients through
// walks of fitHosts hosts, evaluated at c's.
func (j *job) fit(c Cluster, p sched.Params, g Growth) ([]float64, error) {
	basis := func(h float64) [3]float64 {
		switch g.Form {
		case Linear:
			return [3]float64{1, h, math.Log2(h)}
		case Depth:
			return [3]float64{1, math.Log2(h), 0}
		}
		return [3]float64{1, math.Log2(h), 1 / h}
	}
	hosts := fitHosts(c.Hosts)
	var ts [3][]float64
	for k, h := range hosts {
		if g.Form == Depth && k == 0 {
			continue
		}
		s := Cluster{h, c.PerHost}
		t, err := j.walk(s, scaled(p, c, s, g.Keep))
		if err != nil {
			return nil, err
		}
		ts[k] = t
	}
	at := basis(float64(c.Hosts))
	out := make([]float64, len(j.pj.figs))
	for i := range out {
		if g.Form == Depth {
			// Through the two points, in log2 H.
			b := (ts[2][i] - ts[1][i]) / (math.Log2(float64(hosts[2])) - math.Log2(float64(hosts[1])))
			out[i] = ts[2][i] + b*(at[1]-math.Log2(float64(hosts[2])))
			continue
		}
		var a [3][3]float64
		for k, h := range hosts {
			a[k] = basis(float64(h))
		}
		coef, err := solve3(a, [3]float64{ts[0][i], ts[1][i], ts[2][i]})
		if err != nil {
			return nil, err
		}
		out[i] = coef[0]*at[0] + coef[1]*at[1] + coef[2]*at[2]
	}
	return out, nil
}

// solve3 solves a·x = b by Cramer's rule (a is one of fit's fixed, well
// conditioned bases).
func solve3(a [3][3]float64, b [3]float64) ([3]float64, error) {
	det := func(m [3][3]float64) float64 {
		return m[0][0]*(m[1][1]*m[2][2]-m[1][2]*m[2][1]) -
			m[0][1]*(m[1][0]*m[2][2]-m[1][2]*m[2][0]) +
			m[0][2]*(m[1][0]*m[2][1]-m[1][1]*m[2][0])
	}
	d := det(a)
	if d == 0 {
		return [3]float64{}, fmt.Errorf("cost: a singular fit")
	}
	var x [3]float64
	for k := range x {
		m := a
		for j := range m {
			m[j][k] = b[j]
		}
		x[k] = det(m) / d
	}
	return x, nil
}

// walk builds p on c and walks it whole under every figure set, once
// per job (the pipeline's slope and a small cluster's own prediction walk
// the same schedule).
func (j *job) walk(c Cluster, p sched.Params) ([]float64, error) {
	key := walkKey{c, p.Count}
	if t, ok := j.memo[key]; ok {
		return append([]float64(nil), t...), nil
	}
	s, err := j.build(c.Params(p))
	if err != nil {
		return nil, err
	}
	// The control tree's time depends on when ranks arrive, which the
	// model cannot see.
	if s.Tree != nil {
		return nil, fmt.Errorf("cost: %s/%s is decided by its control tree as it runs", s.Coll, s.Algo)
	}
	vs, err := j.pj.viewsOf(c)
	if err != nil {
		return nil, err
	}
	pr := &j.pr
	limit := int64(0)
	if j.pj.Limit > 0 {
		if limit = j.pj.Limit - pr.Ops - pr.Visits; limit <= 0 {
			return nil, fmt.Errorf("%w before a walk of %d×%d", ErrBudget, c.Hosts, c.PerHost)
		}
	}
	preds, err := predictViews(s, vs, limit, &j.pj.buf)
	if err != nil {
		return nil, err
	}
	pr.Walks++
	pr.Ops += preds[0].Ops
	pr.Visits += preds[0].Visits
	out := make([]float64, len(preds))
	for i, x := range preds {
		out[i] = x.Seconds
	}
	j.memo[key] = append([]float64(nil), out...)
	return out, nil
}

// viewsOf is c's model under each figure set.
func (pj *Projector) viewsOf(c Cluster) ([]*view, error) {
	if vs, ok := pj.views[c]; ok {
		return vs, nil
	}
	var vs []*view
	for _, f := range pj.figs {
		g, err := topology.ForPlacement(c.Placement(), f.Links)
		if err != nil {
			return nil, err
		}
		vs = append(vs, newView(f.Model(g)))
	}
	// Only the small clusters come back; a large one walked whole (a
	// form without a rule) is not kept.
	if c.Ranks() <= pathTableMax {
		pj.views[c] = vs
	}
	return vs, nil
}

// perRank says p.Count is each rank's block, not the vector.
func perRank(coll sched.Coll) bool {
	return coll == sched.AllGather || coll == sched.ReduceScatter || coll == sched.AllToAll
}

// vectorBytes is p's vector on n ranks.
func vectorBytes(p sched.Params, n int) int {
	if perRank(p.Coll) {
		return p.Count * p.ElemSize * n
	}
	return p.Count * p.ElemSize
}

// withVector is p with a vector of l bytes on n ranks.
func withVector(p sched.Params, n, l int) sched.Params {
	es := max(p.ElemSize, 1)
	p.Count = l / es
	if perRank(p.Coll) {
		p.Count /= n
	}
	return p
}

// scaled is p on the small cluster s for the call p on c, keeping what k
// says: the vector, or the blocks of every rank or of every rank across
// hosts, to the nearest element (and at least an element per block while
// the call has them).
func scaled(p sched.Params, c, s Cluster, k Keep) sched.Params {
	num, den := int64(1), int64(1)
	switch {
	case k == Blocks && !perRank(p.Coll):
		num, den = int64(s.Ranks()), int64(c.Ranks())
	case k == HostBlocks && !perRank(p.Coll):
		num, den = int64(s.Hosts), int64(c.Hosts)
	case k == Vector && perRank(p.Coll):
		num, den = int64(c.Ranks()), int64(s.Ranks())
	}
	if num == den {
		return p
	}
	count := int((int64(p.Count)*num + den/2) / den)
	if num < den {
		count = max(count, min(p.Count, int(num*int64(c.Ranks())/den)))
	}
	p.Count = count
	return p
}
