// Package redist moves a distributed array from one layout to another
// without contention (the CSS of docs/design/redistribution.md): the communication table COM
// says how many elements each sender owes each receiver; the schedule
// table cuts the messages into steps in which no processor receives two
// messages (and none sends two), messages of similar length sharing a
// step, so no receiver becomes a bottleneck and no step waits on one long
// message while the others idle.
//
// Two kinds of plan:
//
//   - Affine: the paper's case. B (the source) is block-cyclic(y) over Q
//     processors (element g on ⌊g/y⌋ mod Q), A (the destination)
//     block-cyclic(x) over P, and a loop copies A(a1·i+b1) = B(a2·i+b2) for
//     i = 0..n-1 (a plain redistribution is a1 = a2 = 1, b1 = b2 = 0). COM
//     comes from one period of the access pattern (Lemma 1: over k periods
//     every entry is k times its one-period value); Theorem 1's recurrence
//     COM(i, j) = COM((i+k·m) mod Q, (j+k·n) mod P) builds the whole
//     schedule from one sender's row when it reaches every sender with
//     distinct receivers (Algorithm 1), which gives the fewest steps and
//     messages of equal length in each; otherwise a heuristic (Algorithm 2)
//     groups messages by length.
//   - General: any two resource maps of one index space (package resmap).
//     Its schedule is a bipartite edge colouring (König: as many steps as
//     the busiest processor has messages, the lower bound), filled longest
//     message first so lengths in a step are similar.
//
// A plan is data: inspectable (COM and steps), serialisable as JSON, and
// the same on every rank (it is computed, not exchanged).
package redist

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
)

// Msg is one message of a step.
type Msg struct {
	Src   int `json:"src"`
	Dst   int `json:"dst"`
	Elems int `json:"elems"`
}

// Plan is a redistribution between Q senders and P receivers.
type Plan struct {
	Q, P  int
	COM   [][]int // COM[i][j]: elements sender i sends receiver j
	Steps [][]Msg
	// Method says how the steps were made: "algorithm-1", "algorithm-2",
	// "coloring" (or "algorithm-2+coloring" when the heuristic needed more
	// steps than the bound and the colouring was used instead).
	Method string
	// LowerBound is the largest number of messages any one processor sends
	// or receives: no contention-free schedule has fewer steps.
	LowerBound int

	mover              mover
	desc               any   // what the plan was made from, for JSON
	srcRanks, dstRanks []int // see Place

	mu        sync.Mutex
	runs      map[int]*rankRuns    // per rank, built on its first run (see roles)
	sendCache map[int]map[int]runs // per sender, per receiver (see sendRuns)
	recvCache map[int]map[int]runs // per receiver, per sender
}

// sendRuns is what sender i packs for each receiver, computed once: a
// training job reshards the same tensors over and over.
func (p *Plan) sendRuns(i int) map[int]runs {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.sendCache[i]; ok {
		return r
	}
	if p.sendCache == nil {
		p.sendCache = map[int]map[int]runs{}
	}
	r := p.mover.sends(i)
	p.sendCache[i] = r
	return r
}

// recvRuns is where receiver j unpacks what each sender sends.
func (p *Plan) recvRuns(j int) map[int]runs {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.recvCache[j]; ok {
		return r
	}
	if p.recvCache == nil {
		p.recvCache = map[int]map[int]runs{}
	}
	r := p.mover.recvs(j)
	p.recvCache[j] = r
	return r
}

// rankRuns is what one rank packs and unpacks: as sender i, per receiver;
// as receiver j, per sender (i or j -1 where it plays none).
type rankRuns struct {
	i, j  int
	sends map[int]runs
	recvs map[int]runs
}

// roles returns rank's runs under the plan's placement.
func (p *Plan) roles(rank int) *rankRuns {
	p.mu.Lock()
	if r, ok := p.runs[rank]; ok {
		p.mu.Unlock()
		return r
	}
	p.mu.Unlock()
	r := &rankRuns{i: -1, j: -1}
	for i := 0; i < p.Q; i++ {
		if p.srcRank(i) == rank {
			r.i, r.sends = i, p.sendRuns(i)
		}
	}
	for j := 0; j < p.P; j++ {
		if p.dstRank(j) == rank {
			r.j, r.recvs = j, p.recvRuns(j)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runs == nil {
		p.runs = map[int]*rankRuns{}
	}
	p.runs[rank] = r
	return r
}

// Elems is the number of elements the plan moves.
func (p *Plan) Elems() int {
	n := 0
	for _, row := range p.COM {
		for _, c := range row {
			n += c
		}
	}
	return n
}

// MarshalJSON writes {"from": …, "q", "p", "com", "steps", "method", "lower_bound"}.
func (p *Plan) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		From       any     `json:"from"`
		Q          int     `json:"q"`
		P          int     `json:"p"`
		COM        [][]int `json:"com"`
		Steps      [][]Msg `json:"steps"`
		Method     string  `json:"method"`
		LowerBound int     `json:"lower_bound"`
	}{p.desc, p.Q, p.P, p.COM, p.Steps, p.Method, p.LowerBound})
}

// Check verifies what a schedule promises: every non-zero COM entry is
// sent exactly once, with its size, and no processor sends or receives two
// messages in one step.
func (p *Plan) Check() error {
	seen := make(map[[2]int]bool)
	for k, step := range p.Steps {
		srcs, dsts := map[int]bool{}, map[int]bool{}
		for _, m := range step {
			if srcs[m.Src] || dsts[m.Dst] {
				return fmt.Errorf("redist: step %d: sender %d or receiver %d has two messages", k, m.Src, m.Dst)
			}
			srcs[m.Src], dsts[m.Dst] = true, true
			if m.Src < 0 || m.Src >= p.Q || m.Dst < 0 || m.Dst >= p.P || p.COM[m.Src][m.Dst] != m.Elems || m.Elems == 0 {
				return fmt.Errorf("redist: step %d: message %+v does not match COM", k, m)
			}
			key := [2]int{m.Src, m.Dst}
			if seen[key] {
				return fmt.Errorf("redist: message %d→%d scheduled twice", m.Src, m.Dst)
			}
			seen[key] = true
		}
	}
	for i, row := range p.COM {
		for j, c := range row {
			if c > 0 && !seen[[2]int{i, j}] {
				return fmt.Errorf("redist: message %d→%d (%d elements) never scheduled", i, j, c)
			}
		}
	}
	return nil
}

// lowerBound is the largest number of non-zero entries of a row or column.
func lowerBound(com [][]int, q, p int) int {
	b := 0
	cols := make([]int, p)
	for _, row := range com {
		r := 0
		for j, c := range row {
			if c > 0 {
				r++
				cols[j]++
			}
		}
		b = max(b, r)
	}
	for _, c := range cols {
		b = max(b, c)
	}
	return b
}

// messages lists COM's non-zero entries, longest first (ties by sender,
// receiver: every rank orders alike).
func messages(com [][]int) []Msg {
	var ms []Msg
	for i, row := range com {
		for j, c := range row {
			if c > 0 {
				ms = append(ms, Msg{i, j, c})
			}
		}
	}
	sort.SliceStable(ms, func(a, b int) bool { return ms[a].Elems > ms[b].Elems })
	return ms
}

// greedy is the length-grouping heuristic (Algorithm 2's aim): each step
// takes the longest remaining messages whose sender and receiver are still
// free in it.
func greedy(com [][]int, q, p int) [][]Msg {
	left := messages(com)
	var steps [][]Msg
	for len(left) > 0 {
		srcs, dsts := make([]bool, q), make([]bool, p)
		var step []Msg
		rest := left[:0]
		for _, m := range left {
			if !srcs[m.Src] && !dsts[m.Dst] {
				srcs[m.Src], dsts[m.Dst] = true, true
				step = append(step, m)
			} else {
				rest = append(rest, m)
			}
		}
		left = rest
		steps = append(steps, step)
	}
	return steps
}

// coloring schedules COM in exactly lowerBound steps: a proper edge
// colouring of the bipartite graph senders × receivers (König's theorem:
// a bipartite graph's edges can be coloured with as many colours as its
// largest degree). Edges are coloured longest first; when the colours free
// at the sender and at the receiver differ, the alternating path of those
// two colours from the receiver is flipped.
func coloring(com [][]int, q, p int) [][]Msg {
	delta := lowerBound(com, q, p)
	// at[side][vertex][colour] = the edge (index into ms) or -1.
	ms := messages(com)
	sAt := make([][]int, q)
	rAt := make([][]int, p)
	for i := range sAt {
		sAt[i] = fill(delta)
	}
	for j := range rAt {
		rAt[j] = fill(delta)
	}
	color := make([]int, len(ms))
	free := func(at []int) int {
		for c, e := range at {
			if e < 0 {
				return c
			}
		}
		return -1
	}
	for e, m := range ms {
		a := free(sAt[m.Src]) // free at the sender
		b := free(rAt[m.Dst]) // free at the receiver
		if rAt[m.Dst][a] >= 0 {
			// a is taken at the receiver: swap colours a and b along the
			// path that starts at the receiver with colour a. The path
			// cannot reach the sender (bipartite parity), so afterwards a
			// is free at both ends.
			var path []int
			side, v, c := 1, m.Dst, a
			for {
				var f int
				if side == 1 {
					f = rAt[v][c]
				} else {
					f = sAt[v][c]
				}
				if f < 0 {
					break
				}
				path = append(path, f)
				if side == 1 {
					side, v = 0, ms[f].Src
				} else {
					side, v = 1, ms[f].Dst
				}
				if c == a {
					c = b
				} else {
					c = a
				}
			}
			for _, f := range path {
				sAt[ms[f].Src][color[f]], rAt[ms[f].Dst][color[f]] = -1, -1
			}
			for _, f := range path {
				if color[f] == a {
					color[f] = b
				} else {
					color[f] = a
				}
				sAt[ms[f].Src][color[f]], rAt[ms[f].Dst][color[f]] = f, f
			}
		}
		color[e] = a
		sAt[m.Src][a], rAt[m.Dst][a] = e, e
	}
	steps := make([][]Msg, delta)
	for e, m := range ms {
		steps[color[e]] = append(steps[color[e]], m)
	}
	// Longest steps first, then by sender within a step.
	for _, s := range steps {
		sort.Slice(s, func(a, b int) bool { return s[a].Src < s[b].Src })
	}
	sort.SliceStable(steps, func(a, b int) bool { return longest(steps[a]) > longest(steps[b]) })
	return steps
}

func longest(s []Msg) int {
	l := 0
	for _, m := range s {
		l = max(l, m.Elems)
	}
	return l
}

func fill(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = -1
	}
	return s
}

// schedule picks the steps for a COM without Algorithm 1: the length
// heuristic when it reaches the bound, the colouring otherwise.
func schedule(com [][]int, q, p int) ([][]Msg, string) {
	g := greedy(com, q, p)
	if len(g) <= lowerBound(com, q, p) {
		return g, "algorithm-2"
	}
	return coloring(com, q, p), "algorithm-2+coloring"
}
