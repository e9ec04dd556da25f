// Package cost predicts how long a schedule (package engine/sched) takes on
// a machine described by a topology graph.
//
// The model is the schedules' own clock: operations of one round happen at
// the same time on every rank. In a round every message crosses the links
// of its path (topology.Graph.Path); messages that share a link in the same
// direction share its bandwidth, so a link's busy time in the round is the
// bytes it carries over its bandwidth, and a message takes the latency of
// its path plus the busy time of the busiest link it crosses, plus a fixed
// software cost per message. The round lasts as long as its slowest
// message, plus the local work of the busiest rank (reductions at
// ReduceRate, copies at CopyRate). A call adds a fixed cost. A segmented
// send or receive contributes one segment to each round it spans, which is
// how pipelining shows.
//
// Schedules are walked rank by rank side by side, never held whole, so a
// 4,096-rank ring (67 million operations) fits in memory.
package cost

import (
	"errors"
	"fmt"
	"iter"
	"math"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
)

// Model holds what the prediction needs beyond the graph's links.
type Model struct {
	Graph *topology.Graph
	// Ranks maps rank r to its device id (nil: device r).
	Ranks []int
	// ReduceRate and CopyRate are one core's bytes/s folding one vector
	// into another and copying one.
	ReduceRate, CopyRate float64
	// Call is the software cost of one collective call; Message that of one
	// message (posting, waking the receiver), on top of the links' latency.
	Call, Message float64
}

// Rates are the software and core figures of the model, fitted with the
// link figures of topology.DefaultParams (see build/calibrate and the
// docs/topology.md).
type Rates struct {
	ReduceRate, CopyRate float64
	Call, Message        float64
}

// DefaultRates are the calibrated figures: a core folds 39 GB/s and copies
// 30 GB/s (cache-warm blocks), a message costs 16 µs of software and wake-up
// on top of its links, a call nothing measurable beyond its messages. The
// fit alone cannot pin the fold rate (the copies and messages around every
// fold absorb it: a refit on a second run put it at infinity); the fold
// rate is checked against the kernel's own benchmark instead
// (kernel.BenchmarkReduce, float32 sum; docs/performance.md), between its
// 1 and 16 MiB figures.
func DefaultRates() Rates {
	return Rates{ReduceRate: 39e9, CopyRate: 30e9, Call: 0, Message: 16e-6}
}

// New is a model of g with the default rates.
func New(g *topology.Graph) *Model {
	r := DefaultRates()
	return &Model{Graph: g, ReduceRate: r.ReduceRate, CopyRate: r.CopyRate, Call: r.Call, Message: r.Message}
}

// Prediction is the model's answer for one schedule.
type Prediction struct {
	Seconds  float64
	Rounds   int
	Messages int64
	Bytes    int64 // sent, all ranks
	// Busiest is the link that was busy longest over the whole call.
	Busiest     string
	BusiestTime float64
	// Ops is the operations the walk pulled from the ranks' programs and
	// Visits the ranks it visited round by round (every rank, every
	// round): its work, which PredictEach's limit bounds.
	Ops, Visits int64
}

func (m *Model) device(r int) int {
	if m.Ranks != nil {
		return m.Ranks[r]
	}
	return r
}

// Predict walks every rank's program of s round by round.
func (m *Model) Predict(s *sched.Schedule) (Prediction, error) {
	ps, err := PredictEach(s, []*Model{m}, 0)
	if err != nil {
		return Prediction{}, err
	}
	return ps[0], nil
}

// ErrBudget is the error of a walk stopped at its limit (PredictEach).
var ErrBudget = errors.New("cost: the walk passed its limit")

// PredictEach is Predict under each of ms in one walk: the programs are
// pulled once and every model prices the messages and local work with its
// own graph and rates (the engine predicts each schedule at several
// network rates). A positive limit bounds the walk's work (Ops + Visits
// of the Prediction): past it the walk stops with ErrBudget.
func PredictEach(s *sched.Schedule, ms []*Model, limit int64) ([]Prediction, error) {
	vs := make([]*view, len(ms))
	for i, m := range ms {
		vs[i] = newView(m)
	}
	return predictViews(s, vs, limit, nil)
}

// predictViews is PredictEach over views kept between walks (a
// Projector's), copying small programs into *buf (nil: a buffer of its
// own), which it keeps for the next walk.
func predictViews(s *sched.Schedule, vs []*view, limit int64, buf *[]sched.Op) ([]Prediction, error) {
	for _, v := range vs {
		if v.m.Ranks != nil && len(v.m.Ranks) != s.N {
			return nil, fmt.Errorf("cost: %d ranks placed, the schedule has %d", len(v.m.Ranks), s.N)
		}
	}
	w := newWalk(s, vs, buf)
	defer w.progs.close()
	for round, ok := w.first(); ok; round, ok = w.next(round) {
		if err := w.collect(round); err != nil {
			return nil, err
		}
		for _, p := range w.pricers {
			p.countSegments()
			p.total += p.price() + p.most
		}
		if limit > 0 && w.ops+w.visits > limit {
			return nil, fmt.Errorf("%w: %d operations and %d rank visits by round %d of %d", ErrBudget, w.ops, w.visits, round, s.Rounds)
		}
	}
	out := make([]Prediction, len(vs))
	for i, p := range w.pricers {
		pred := p.pred
		pred.Rounds, pred.Seconds = s.Rounds, p.total
		pred.Ops, pred.Visits = w.ops, w.visits
		for j, b := range p.links.busy {
			if b > pred.BusiestTime {
				pred.BusiestTime, pred.Busiest = b, p.links.v.names[j]
			}
		}
		if math.IsNaN(p.total) || math.IsInf(p.total, 0) {
			return nil, fmt.Errorf("cost: prediction is %v (a link without bandwidth?)", p.total)
		}
		out[i] = pred
	}
	return out, nil
}

// walk is one prediction under way: the ranks' programs side by side and
// the segmented operations still running, priced by each model. A round
// visits only the ranks with an operation in it or a segment still
// running, in rank order: the others add nothing to it (a chain's ranks
// wait for most of its rounds), so skipping them, and rounds where no
// rank does anything, changes no sum.
type walk struct {
	s       *sched.Schedule
	progs   programs
	running [][]active // per rank
	pricers []*pricer
	// due holds round<<32 | rank for each rank's next operation, least
	// first; queued[r] says r is in it. busy lists the ranks with
	// segments running after the round collected last, in rank order.
	due    dueHeap
	queued []bool
	busy   []int
	// visit is the round's ranks, in rank order.
	visit []int
	// ops counts the operations pulled, visits the ranks visited round
	// by round: the walk's work.
	ops, visits int64
}

// pricer is one model's side of a walk: its links' loads and the round's
// messages.
type pricer struct {
	m     *Model
	links *linkLoad
	paths *pathCache
	msgs  []msg // this round's, in rank order
	// The last path each rank sent on: ring-like schedules send to the same
	// peer round after round.
	lastPeer []int
	lastPath []*path
	pred     Prediction
	total    float64
	// work is the local work (seconds) of the rank being collected, most
	// that of the round's busiest rank so far.
	work, most float64
}

// active is a segmented operation still contributing segments.
type active struct {
	op   sched.Op
	next int // next segment
}

// msg is one message of a round.
type msg struct {
	p     *path
	bytes int
	from  int
	segs  int // messages from the same rank on the same path this round
}

func newWalk(s *sched.Schedule, vs []*view, buf *[]sched.Op) *walk {
	n := s.N
	w := &walk{s: s, progs: pullPrograms(s, buf), running: make([][]active, n), queued: make([]bool, n)}
	for r := 0; r < n; r++ {
		w.queue(r)
	}
	for _, v := range vs {
		m := v.m
		p := &pricer{m: m, links: newLinkLoad(v), paths: v.paths,
			lastPeer: make([]int, n), lastPath: make([]*path, n), total: m.Call}
		for r := range p.lastPeer {
			p.lastPeer[r] = -1
		}
		v.paths.size(n)
		w.pricers = append(w.pricers, p)
	}
	return w
}

// queue puts rank r in due at its next operation's round, unless it has
// none or is there already.
func (w *walk) queue(r int) {
	if o := w.progs.pull(r); o != nil && !w.queued[r] {
		w.due.push(int64(o.Round)<<32 | int64(r))
		w.queued[r] = true
	}
}

// first is the first round with work, if any.
func (w *walk) first() (int, bool) {
	if len(w.due) == 0 {
		return 0, false
	}
	return int(w.due[0] >> 32), true
}

// next is the round after round with work, if any: the next one while
// segments run, else the next operation's.
func (w *walk) next(round int) (int, bool) {
	if len(w.busy) > 0 {
		return round + 1, true
	}
	return w.first()
}

// collect gathers the round's messages from its ranks (the ones due in
// it and the busy ones, in rank order): a segment of each segmented
// operation still running, then the operations of the round. Each
// pricer's most is the local work (seconds) of its busiest rank.
func (w *walk) collect(round int) error {
	s := w.s
	for _, p := range w.pricers {
		p.msgs, p.most = p.msgs[:0], 0
	}
	w.visit = w.visit[:0]
	busy := w.busy
	for len(w.due) > 0 && int(w.due[0]>>32) <= round {
		r := int(w.due.pop() & (1<<32 - 1))
		w.queued[r] = false
		for len(busy) > 0 && busy[0] < r {
			w.visit, busy = append(w.visit, busy[0]), busy[1:]
		}
		if len(busy) > 0 && busy[0] == r {
			busy = busy[1:]
		}
		w.visit = append(w.visit, r)
	}
	w.visit = append(w.visit, busy...)
	w.busy = w.busy[:0]
	w.visits += int64(len(w.visit))
	for _, r := range w.visit {
		for _, p := range w.pricers {
			p.work = 0
		}
		keep := w.running[r][:0]
		for _, a := range w.running[r] {
			lo, hi := sched.Segment(a.next, a.op.Bytes(), s.ElemSize, a.op.NSegs())
			if err := w.account(r, &a.op, hi-lo); err != nil {
				return err
			}
			if a.next++; a.next < a.op.NSegs() {
				keep = append(keep, a)
			}
		}
		w.running[r] = keep
		for o := w.progs.pull(r); o != nil && o.Round <= round; o = w.progs.pull(r) {
			w.progs.take(r)
			w.ops++
			b := o.Bytes()
			if ns := o.NSegs(); ns > 1 {
				lo, hi := sched.Segment(0, b, s.ElemSize, ns)
				b = hi - lo
				w.running[r] = append(w.running[r], active{op: *o, next: 1})
			}
			if err := w.account(r, o, b); err != nil {
				return err
			}
		}
		for _, p := range w.pricers {
			p.most = max(p.most, p.work)
		}
		if len(w.running[r]) > 0 {
			w.busy = append(w.busy, r)
		}
		w.queue(r)
	}
	return nil
}

// dueHeap is a min-heap of round<<32 | rank.
type dueHeap []int64

func (h *dueHeap) push(x int64) {
	*h = append(*h, x)
	a := *h
	for i := len(a) - 1; i > 0; {
		up := (i - 1) / 2
		if a[up] <= a[i] {
			break
		}
		a[up], a[i] = a[i], a[up]
		i = up
	}
}

func (h *dueHeap) pop() int64 {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	for i := 0; ; {
		l, least := 2*i+1, i
		if l < len(a) && a[l] < a[least] {
			least = l
		}
		if l+1 < len(a) && a[l+1] < a[least] {
			least = l + 1
		}
		if least == i {
			break
		}
		a[i], a[least] = a[least], a[i]
		i = least
	}
	*h = a
	return top
}

// account adds b bytes of rank r's operation o to the round of every
// pricer: a message, or local work.
func (w *walk) account(r int, o *sched.Op, b int) error {
	for _, p := range w.pricers {
		if err := p.account(r, o, b); err != nil {
			return err
		}
	}
	return nil
}

func (p *pricer) account(r int, o *sched.Op, b int) error {
	switch o.Kind {
	case sched.Send:
		if p.lastPeer[r] != o.Peer {
			path, err := p.paths.get(r, o.Peer)
			if err != nil {
				return err
			}
			p.lastPeer[r], p.lastPath[r] = o.Peer, path
		}
		p.msgs = append(p.msgs, msg{p: p.lastPath[r], bytes: b, from: r})
	case sched.RecvReduce, sched.Scale, sched.Accumulate:
		p.work += float64(b) / p.m.ReduceRate
	case sched.Copy:
		p.work += float64(b) / p.m.CopyRate
	}
	return nil
}

// countSegments sets each message's segs. A rank's sends to one peer in a
// round are consecutive in msgs.
func (p *pricer) countSegments() {
	msgs := p.msgs
	for i := 0; i < len(msgs); {
		j := i + 1
		for j < len(msgs) && msgs[j].from == msgs[i].from && msgs[j].p == msgs[i].p {
			j++
		}
		for k := i; k < j; k++ {
			msgs[k].segs = j - i
		}
		i = j
	}
}

// price loads the links with the round's messages, counts them into pred,
// and returns the time of the slowest.
func (p *pricer) price() float64 {
	l, m := p.links, p.m
	for _, x := range p.msgs {
		for _, h := range x.p.hops {
			l.add(h, x.bytes)
		}
		p.pred.Messages++
		p.pred.Bytes += int64(x.bytes)
	}
	slowest := 0.0
	for _, x := range p.msgs {
		worst := 0.0
		for _, h := range x.p.hops {
			worst = max(worst, l.time(h))
		}
		// A step cut into k segments to one peer is a pipeline (the
		// ring's): the next step forwards segment j once segment j has
		// arrived, so only 1/k of the latency and software cost is not
		// hidden behind the step's busy time, which is the link's or,
		// on a fast link, the software's for the other k-1 segments.
		// Not in shared memory, where the cores that would overlap the
		// segments are the ones copying them (measured on one host, 4
		// ranks on 2 cores: the credit made ring predictions 10-20
		// points too fast).
		k := float64(x.segs)
		if x.p.shm {
			k = 1
		}
		slowest = max(slowest, (x.p.latency+m.Message)/k+max(worst, (k-1)*m.Message))
	}
	l.endRound()
	return slowest
}

// programs yields every rank's program one operation at a time. Small
// schedules are copied out whole first (every walk of a projection is
// one): pulling an operation through a coroutine (iter.Pull) costs more
// than the rest of its pricing. A large one is pulled, so that a walk
// never holds more than materializeMax operations.
type programs struct {
	// Copied programs: rank r's are flat[from[r]:from[r+1]], the next
	// at at[r]; ranks from len(from)-1 on are pulled.
	flat     []sched.Op
	from, at []int
	next     []func() (sched.Op, bool)
	stop     []func()
	peek     []sched.Op
	peeked   []bool // peek holds the rank's next operation
	ended    []bool
}

// materializeMax bounds the operations a walk copies out.
const materializeMax = 1 << 16

func pullPrograms(s *sched.Schedule, buf *[]sched.Op) programs {
	n := s.N
	p := programs{from: []int{0}}
	if buf != nil {
		p.flat = (*buf)[:0]
		defer func() { *buf = p.flat[:0] }()
	}
	for r := 0; r < n; r++ {
		room := materializeMax - len(p.flat)
		whole := true
		for o := range s.Program(r) {
			if room == 0 {
				whole = false
				break
			}
			p.flat = append(p.flat, o)
			room--
		}
		if !whole {
			p.flat = p.flat[:p.from[len(p.from)-1]]
			break
		}
		p.from = append(p.from, len(p.flat))
	}
	p.at = append([]int(nil), p.from[:len(p.from)-1]...)
	if copied := len(p.from) - 1; copied < n {
		p.next, p.stop = make([]func() (sched.Op, bool), n), make([]func(), n)
		p.peek, p.peeked, p.ended = make([]sched.Op, n), make([]bool, n), make([]bool, n)
		for r := copied; r < n; r++ {
			p.next[r], p.stop[r] = iter.Pull(s.Program(r))
		}
	}
	return p
}

// pull peeks at rank r's next operation (nil at the end); take takes it.
func (p *programs) pull(r int) *sched.Op {
	if r < len(p.at) {
		if p.at[r] < p.from[r+1] {
			return &p.flat[p.at[r]]
		}
		return nil
	}
	if !p.peeked[r] && !p.ended[r] {
		p.peek[r], p.peeked[r] = p.next[r]()
		p.ended[r] = !p.peeked[r]
	}
	if !p.peeked[r] {
		return nil
	}
	return &p.peek[r]
}

func (p *programs) take(r int) {
	if r < len(p.at) {
		p.at[r]++
	} else {
		p.peeked[r] = false
	}
}

func (p *programs) close() {
	for _, f := range p.stop {
		if f != nil {
			f()
		}
	}
}

// A view is what walks need of a model that no walk changes: its links'
// bundles and the paths between ranks met so far. PredictEach makes them
// per call; a Projector keeps one per small cluster and figure set.
type view struct {
	m      *Model
	bundle []int     // per link
	flip   []bool    // per link: drawn from its higher node
	bw     []float64 // per bundle
	names  []string  // per bundle
	paths  *pathCache
}

func newView(m *Model) *view {
	g := m.Graph
	v := &view{m: m, flip: make([]bool, len(g.Links)), paths: newPathCache(g, m)}
	v.bundle, v.bw, v.names = bundles(g)
	for i, link := range g.Links {
		v.flip[i] = link.A > link.B
	}
	return v
}

// linkLoad is the traffic on a view's link bundles: per direction in the
// current round, and each bundle's busy time over the call.
type linkLoad struct {
	v       *view
	load    []float64 // bytes per bundle direction this round
	busy    []float64 // seconds per bundle over the call
	touched []int     // bundle directions loaded this round
}

func newLinkLoad(v *view) *linkLoad {
	return &linkLoad{v: v, load: make([]float64, 2*len(v.bw)), busy: make([]float64, len(v.bw))}
}

// dir is the bundle direction a hop crosses.
func (l *linkLoad) dir(h topology.Hop) int {
	k := 2 * l.v.bundle[h.Link]
	if h.Forward == l.v.flip[h.Link] { // crossing the bundle from its higher node
		k++
	}
	return k
}

func (l *linkLoad) add(h topology.Hop, bytes int) {
	k := l.dir(h)
	if l.load[k] == 0 {
		l.touched = append(l.touched, k)
	}
	l.load[k] += float64(bytes)
}

// time is how long the round's traffic keeps the hop's direction busy.
func (l *linkLoad) time(h topology.Hop) float64 {
	k := l.dir(h)
	return l.load[k] / l.v.bw[k/2]
}

// endRound adds the round's traffic to the busy times and clears it.
func (l *linkLoad) endRound() {
	for _, k := range l.touched {
		l.busy[k/2] += l.load[k] / l.v.bw[k/2]
		l.load[k] = 0
	}
	l.touched = l.touched[:0]
}

// bundles groups parallel links (same two nodes, same kind) into one with
// their summed bandwidth: paths name one of them, but traffic between the
// two nodes — the cube-mesh's two rings through one pair of units, each on
// its own link — spreads over all. It returns each link's bundle, each
// bundle's bandwidth and name (its links' ids joined by "+").
func bundles(g *topology.Graph) ([]int, []float64, []string) {
	type key struct {
		a, b int
		kind topology.LinkKind
	}
	index := map[key]int{}
	of := make([]int, len(g.Links))
	var bw []float64
	var names []string
	for i, l := range g.Links {
		k := key{min(l.A, l.B), max(l.A, l.B), l.Kind}
		b, ok := index[k]
		if !ok {
			b = len(bw)
			index[k] = b
			bw = append(bw, 0)
			names = append(names, "")
		}
		of[i] = b
		bw[b] += l.Bandwidth
		if names[b] != "" {
			names[b] += "+"
		}
		names[b] += l.ID
	}
	return of, bw, names
}

// pathCache remembers the paths between rank pairs: a ring uses N of them
// over and over; a pairwise all-to-all N², each once, so the cache is
// bounded and simply cleared when full. Between few ranks (a projection's
// small clusters, kept across its walks) it is a table.
type pathCache struct {
	g     *topology.Graph
	m     *Model
	n     int     // ranks of the table; 0 before the first walk
	table []*path // n×n, from·n + to
	paths map[[2]int]*path
}

type path struct {
	hops    []topology.Hop
	latency float64
	shm     bool // shared memory only: the cores copy, nothing overlaps them
}

// pathTableMax is the most ranks a table of paths is kept for.
const pathTableMax = 256

func newPathCache(g *topology.Graph, m *Model) *pathCache {
	return &pathCache{g: g, m: m, paths: map[[2]int]*path{}}
}

// size readies the cache for n ranks.
func (c *pathCache) size(n int) {
	if c.n == 0 && n <= pathTableMax {
		c.n, c.table = n, make([]*path, n*n)
	}
}

func (c *pathCache) get(from, to int) (*path, error) {
	inTable := from < c.n && to < c.n
	if inTable {
		if p := c.table[from*c.n+to]; p != nil {
			return p, nil
		}
	} else if p, ok := c.paths[[2]int{from, to}]; ok {
		return p, nil
	}
	hops, err := c.g.Path(c.m.device(from), c.m.device(to))
	if err != nil {
		return nil, fmt.Errorf("cost: rank %d → rank %d: %w", from, to, err)
	}
	p := &path{hops: hops, shm: true}
	for _, h := range hops {
		l := c.g.Links[h.Link]
		p.latency += l.Latency
		p.shm = p.shm && l.Kind == topology.Shm
	}
	if inTable {
		c.table[from*c.n+to] = p
		return p, nil
	}
	if len(c.paths) > 1<<16 {
		clear(c.paths)
	}
	c.paths[[2]int{from, to}] = p
	return p, nil
}
