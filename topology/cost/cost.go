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
}

func (m *Model) device(r int) int {
	if m.Ranks != nil {
		return m.Ranks[r]
	}
	return r
}

// Predict walks every rank's program of s round by round.
func (m *Model) Predict(s *sched.Schedule) (Prediction, error) {
	if m.Ranks != nil && len(m.Ranks) != s.N {
		return Prediction{}, fmt.Errorf("cost: %d ranks placed, the schedule has %d", len(m.Ranks), s.N)
	}
	w := m.newWalk(s)
	defer w.progs.close()
	pred := Prediction{Rounds: s.Rounds}
	total := m.Call
	for round := 0; ; round++ {
		more, most, err := w.collect(round)
		if err != nil {
			return Prediction{}, err
		}
		w.countSegments()
		slowest := w.price(&pred)
		total += slowest + most
		if !more {
			break
		}
	}
	pred.Seconds = total
	for i, b := range w.links.busy {
		if b > pred.BusiestTime {
			pred.BusiestTime, pred.Busiest = b, w.links.names[i]
		}
	}
	if math.IsNaN(total) || math.IsInf(total, 0) {
		return pred, fmt.Errorf("cost: prediction is %v (a link without bandwidth?)", total)
	}
	return pred, nil
}

// walk is one prediction under way: the ranks' programs side by side, the
// segmented operations still running, and the round's messages.
type walk struct {
	m       *Model
	s       *sched.Schedule
	progs   programs
	links   *linkLoad
	paths   *pathCache
	running [][]active // per rank
	msgs    []msg      // this round's, in rank order
	// The last path each rank sent on: ring-like schedules send to the same
	// peer round after round.
	lastPeer []int
	lastPath []*path
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

func (m *Model) newWalk(s *sched.Schedule) *walk {
	n := s.N
	w := &walk{m: m, s: s, progs: pullPrograms(s), links: newLinkLoad(m.Graph), paths: newPathCache(m.Graph, m),
		running: make([][]active, n), lastPeer: make([]int, n), lastPath: make([]*path, n)}
	for r := range w.lastPeer {
		w.lastPeer[r] = -1
	}
	return w
}

// collect gathers the round's messages from every rank: a segment of each
// segmented operation still running, then the operations of the round.
// It returns whether any rank has work left after this round, and the
// local work (seconds) of the busiest rank.
func (w *walk) collect(round int) (more bool, most float64, err error) {
	w.msgs = w.msgs[:0]
	s := w.s
	for r := 0; r < s.N; r++ {
		work := 0.0
		keep := w.running[r][:0]
		for _, a := range w.running[r] {
			lo, hi := sched.Segment(a.next, a.op.Bytes(), s.ElemSize, a.op.NSegs())
			if err := w.account(r, &a.op, hi-lo, &work); err != nil {
				return false, 0, err
			}
			if a.next++; a.next < a.op.NSegs() {
				keep = append(keep, a)
			}
		}
		w.running[r] = keep
		for o := w.progs.pull(r); o != nil && o.Round <= round; o = w.progs.pull(r) {
			w.progs.peeked[r] = false
			b := o.Bytes()
			if ns := o.NSegs(); ns > 1 {
				lo, hi := sched.Segment(0, b, s.ElemSize, ns)
				b = hi - lo
				w.running[r] = append(w.running[r], active{op: *o, next: 1})
			}
			if err := w.account(r, o, b, &work); err != nil {
				return false, 0, err
			}
		}
		most = max(most, work)
		more = more || len(w.running[r]) > 0 || w.progs.pull(r) != nil
	}
	return more, most, nil
}

// account adds b bytes of rank r's operation o to the round: a message,
// or local work.
func (w *walk) account(r int, o *sched.Op, b int, work *float64) error {
	switch o.Kind {
	case sched.Send:
		if w.lastPeer[r] != o.Peer {
			p, err := w.paths.get(r, o.Peer)
			if err != nil {
				return err
			}
			w.lastPeer[r], w.lastPath[r] = o.Peer, p
		}
		w.msgs = append(w.msgs, msg{p: w.lastPath[r], bytes: b, from: r})
	case sched.RecvReduce, sched.Scale, sched.Accumulate:
		*work += float64(b) / w.m.ReduceRate
	case sched.Copy:
		*work += float64(b) / w.m.CopyRate
	}
	return nil
}

// countSegments sets each message's segs. A rank's sends to one peer in a
// round are consecutive in msgs.
func (w *walk) countSegments() {
	msgs := w.msgs
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
func (w *walk) price(pred *Prediction) float64 {
	l, m := w.links, w.m
	for _, x := range w.msgs {
		for _, h := range x.p.hops {
			l.add(h, x.bytes)
		}
		pred.Messages++
		pred.Bytes += int64(x.bytes)
	}
	slowest := 0.0
	for _, x := range w.msgs {
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

// programs pulls every rank's program one operation at a time.
type programs struct {
	next   []func() (sched.Op, bool)
	stop   []func()
	peek   []sched.Op
	peeked []bool // peek holds the rank's next operation
	ended  []bool
}

func pullPrograms(s *sched.Schedule) programs {
	n := s.N
	p := programs{next: make([]func() (sched.Op, bool), n), stop: make([]func(), n),
		peek: make([]sched.Op, n), peeked: make([]bool, n), ended: make([]bool, n)}
	for r := 0; r < n; r++ {
		p.next[r], p.stop[r] = iter.Pull(s.Program(r))
	}
	return p
}

// pull peeks at rank r's next operation (nil at the end); clearing
// peeked[r] takes it.
func (p *programs) pull(r int) *sched.Op {
	if !p.peeked[r] && !p.ended[r] {
		p.peek[r], p.peeked[r] = p.next[r]()
		p.ended[r] = !p.peeked[r]
	}
	if !p.peeked[r] {
		return nil
	}
	return &p.peek[r]
}

func (p *programs) close() {
	for _, f := range p.stop {
		f()
	}
}

// linkLoad is the traffic on the graph's link bundles: per direction in
// the current round, and each bundle's busy time over the call.
type linkLoad struct {
	bundle  []int     // per link
	flip    []bool    // per link: drawn from its higher node
	bw      []float64 // per bundle
	names   []string  // per bundle
	load    []float64 // bytes per bundle direction this round
	busy    []float64 // seconds per bundle over the call
	touched []int     // bundle directions loaded this round
}

func newLinkLoad(g *topology.Graph) *linkLoad {
	l := &linkLoad{flip: make([]bool, len(g.Links))}
	l.bundle, l.bw, l.names = bundles(g)
	for i, link := range g.Links {
		l.flip[i] = link.A > link.B
	}
	l.load = make([]float64, 2*len(l.bw))
	l.busy = make([]float64, len(l.bw))
	return l
}

// dir is the bundle direction a hop crosses.
func (l *linkLoad) dir(h topology.Hop) int {
	k := 2 * l.bundle[h.Link]
	if h.Forward == l.flip[h.Link] { // crossing the bundle from its higher node
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
	return l.load[k] / l.bw[k/2]
}

// endRound adds the round's traffic to the busy times and clears it.
func (l *linkLoad) endRound() {
	for _, k := range l.touched {
		l.busy[k/2] += l.load[k] / l.bw[k/2]
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

// pathCache remembers the paths between rank pairs of one prediction: a
// ring uses N of them over and over; a pairwise all-to-all N², each once,
// so the cache is bounded and simply cleared when full.
type pathCache struct {
	g     *topology.Graph
	m     *Model
	paths map[[2]int]*path
}

type path struct {
	hops    []topology.Hop
	latency float64
	shm     bool // shared memory only: the cores copy, nothing overlaps them
}

func newPathCache(g *topology.Graph, m *Model) *pathCache {
	return &pathCache{g: g, m: m, paths: map[[2]int]*path{}}
}

func (c *pathCache) get(from, to int) (*path, error) {
	key := [2]int{from, to}
	if p, ok := c.paths[key]; ok {
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
	if len(c.paths) > 1<<16 {
		clear(c.paths)
	}
	c.paths[key] = p
	return p, nil
}
