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

// active is a segmented operation still contributing segments.
type active struct {
	op   sched.Op
	next int // next segment
}

// Predict walks every rank's program of s round by round.
func (m *Model) Predict(s *sched.Schedule) (Prediction, error) {
	n := s.N
	if m.Ranks != nil && len(m.Ranks) != n {
		return Prediction{}, fmt.Errorf("cost: %d ranks placed, the schedule has %d", len(m.Ranks), n)
	}
	g := m.Graph
	bundle, bw, names := bundles(g)
	flip := make([]bool, len(g.Links)) // link drawn from its higher node
	for i, l := range g.Links {
		flip[i] = l.A > l.B
	}
	nl := len(bw)
	load := make([]float64, 2*nl) // bytes per bundle direction this round
	busy := make([]float64, nl)   // seconds per link over the call
	var touched []int             // link directions loaded this round
	next := make([]func() (sched.Op, bool), n)
	stop := make([]func(), n)
	peek := make([]sched.Op, n)
	peeked := make([]bool, n)
	ended := make([]bool, n)
	for r := 0; r < n; r++ {
		next[r], stop[r] = iter.Pull(s.Program(r))
	}
	defer func() {
		for _, f := range stop {
			f()
		}
	}()
	// pull peeks at rank r's next operation (nil at the end).
	pull := func(r int) *sched.Op {
		if !peeked[r] && !ended[r] {
			peek[r], peeked[r] = next[r]()
			ended[r] = !peeked[r]
		}
		if !peeked[r] {
			return nil
		}
		return &peek[r]
	}
	paths := newPathCache(g, m)
	running := make([][]active, n)
	type msg struct {
		p     *path
		bytes int
		from  int
		segs  int // messages from the same rank on the same path this round
	}
	var msgs []msg
	// The last path each rank sent on: ring-like schedules send to the same
	// peer round after round.
	lastPeer := make([]int, n)
	lastPath := make([]*path, n)
	for r := range lastPeer {
		lastPeer[r] = -1
	}
	pred := Prediction{Rounds: s.Rounds}
	total := m.Call
	for round := 0; ; round++ {
		msgs = msgs[:0]
		more := false
		most := 0.0 // local work of the busiest rank
		for r := 0; r < n; r++ {
			work := 0.0
			account := func(o *sched.Op, b int) error {
				switch o.Kind {
				case sched.Send:
					if lastPeer[r] != o.Peer {
						p, err := paths.get(r, o.Peer)
						if err != nil {
							return err
						}
						lastPeer[r], lastPath[r] = o.Peer, p
					}
					msgs = append(msgs, msg{p: lastPath[r], bytes: b, from: r})
				case sched.RecvReduce, sched.Scale, sched.Accumulate:
					work += float64(b) / m.ReduceRate
				case sched.Copy:
					work += float64(b) / m.CopyRate
				}
				return nil
			}
			keep := running[r][:0]
			for _, a := range running[r] {
				lo, hi := sched.Segment(a.next, a.op.Bytes(), s.ElemSize, a.op.NSegs())
				if err := account(&a.op, hi-lo); err != nil {
					return Prediction{}, err
				}
				if a.next++; a.next < a.op.NSegs() {
					keep = append(keep, a)
				}
			}
			running[r] = keep
			for o := pull(r); o != nil && o.Round <= round; o = pull(r) {
				peeked[r] = false
				b := o.Bytes()
				if ns := o.NSegs(); ns > 1 {
					lo, hi := sched.Segment(0, b, s.ElemSize, ns)
					b = hi - lo
					running[r] = append(running[r], active{op: *o, next: 1})
				}
				if err := account(o, b); err != nil {
					return Prediction{}, err
				}
			}
			most = max(most, work)
			more = more || len(running[r]) > 0 || pull(r) != nil
		}
		// A rank's sends to one peer in a round are consecutive in msgs.
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
		// Link loads of the round, then each message's time.
		for _, x := range msgs {
			for _, h := range x.p.hops {
				k := 2 * bundle[h.Link]
				if h.Forward == flip[h.Link] { // crossing the bundle from its higher node
					k++
				}
				if load[k] == 0 {
					touched = append(touched, k)
				}
				load[k] += float64(x.bytes)
			}
			pred.Messages++
			pred.Bytes += int64(x.bytes)
		}
		slowest := 0.0
		for _, x := range msgs {
			worst := 0.0
			for _, h := range x.p.hops {
				k := 2 * bundle[h.Link]
				if h.Forward == flip[h.Link] { // crossing the bundle from its higher node
					k++
				}
				worst = max(worst, load[k]/bw[k/2])
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
		for _, k := range touched {
			busy[k/2] += load[k] / bw[k/2]
			load[k] = 0
		}
		touched = touched[:0]
		total += slowest + most
		if !more {
			break
		}
	}
	pred.Seconds = total
	for i, b := range busy {
		if b > pred.BusiestTime {
			pred.BusiestTime, pred.Busiest = b, names[i]
		}
	}
	if math.IsNaN(total) || math.IsInf(total, 0) {
		return pred, fmt.Errorf("cost: prediction is %v (a link without bandwidth?)", total)
	}
	return pred, nil
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
