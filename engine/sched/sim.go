package sched

import (
	"fmt"
	"iter"
	"slices"
	"strings"
)

// The simulator runs every rank's program with the executor's semantics
// over symbolic data, so a schedule can be proved correct without a socket.
//
// Execution: a rank issues its operations in order. Sends, receives and
// receive-reduces become tasks that wait for the earlier tasks they
// conflict with (and for the previous task of their per-peer stream);
// copies, divisions and syncs block the issuing until their conflicts are
// done. A send completes only when the matching receive is posted
// (rendezvous), so a schedule that would need a transport to buffer to make
// progress is reported as a deadlock.
//
// Data: every input element is a leaf (rank, index); a reduction makes the
// node (left op right) in operand order, hash-consed so that equal
// expressions are equal ids; a division wraps a node. Two ranks holding the
// same id hold bitwise the same result.
//
// Cost: programs are pulled one operation at a time (a 4,096-rank ring is
// 67 million operations) and a rank keeps only its unfinished tasks, so
// time grows with the operations and memory with the operations in
// flight, plus the symbolic data (ranks × elements). What a barrier's
// ranks have heard of (a rank set per send) is tracked for barriers only.

// Report is what a simulation measured.
type Report struct {
	BytesSent []int // per rank
	Messages  []int // per rank, segments counted
	// CrossHostBytes is, per host of Params.Hosts, the bytes its ranks sent
	// to other hosts (nil without Hosts).
	CrossHostBytes []int
	Rounds         int
}

type node struct {
	kind int8 // 0 leaf, 1 reduce, 2 scale, 3 garbage
	a, b int32
}

type sim struct {
	s      *Schedule
	p      Params
	es     int
	nodes  []node
	index  map[node]int32
	bufs   [][NumBufs][]int32 // per rank, per buffer, per element
	know   [][]bool           // barrier: whom each rank has heard from (nil otherwise)
	host   []int              // per rank, with Params.Hosts
	report Report
	err    error // a send and a receive that do not pair one to one
}

func (m *sim) id(n node) int32 {
	if i, ok := m.index[n]; ok {
		return i
	}
	m.nodes = append(m.nodes, n)
	m.index[n] = int32(len(m.nodes) - 1)
	return int32(len(m.nodes) - 1)
}

func (m *sim) leaf(rank, i int) int32    { return m.id(node{0, int32(rank), int32(i)}) }
func (m *sim) garbage(rank, i int) int32 { return m.id(node{3, int32(rank), int32(i)}) }

type simTask struct {
	op      Op
	rank    int
	deps    []*simTask
	conf    []*simTask // RecvReduce: conflicts before its reduction
	done    bool
	matched bool
	payload []int32 // RecvReduce: what arrived
	know    []bool  // Send: the sender's knowledge when issued
	mark    uint64  // rankState.mark when last found by deps
}

func (t *simTask) ready() bool {
	for _, d := range t.deps {
		if !d.done {
			return false
		}
	}
	return true
}

type rankState struct {
	next     func() (Op, bool) // the program, pulled
	stop     func()
	op       Op         // the next operation to issue
	has      bool       // op is valid (false: the program ended)
	tasks    []*simTask // unfinished (and some finished: see compact)
	done     int        // finished since tasks was last compacted
	reducing []*simTask // RecvReduce tasks whose message arrived, not yet folded
	haz      [NumBufs]hazards
	mark     uint64 // stamp of the current conflict search
	lastSend map[int]*simTask
	lastRecv map[int]*simTask
	sends    map[int][]*simTask // per peer, unmatched, in order
	recvs    map[int][]*simTask
}

// hazards is, for one buffer of one rank, per element, the last task that
// writes it and the tasks that read it since: what an operation touching
// the element must wait for. An earlier writer, or a reader before that
// writer, needs no entry: the last writer waited for it, so it is
// finished once the last writer is. Looking up a range costs its length,
// as moving its data does, where comparing with every unfinished task
// cost a ring rank, which issues its 4(N-1) operations at once, N² per
// rank (N³ in all: a 1,024-rank ring took minutes).
type hazards struct {
	writer  []*simTask
	readers [][]*simTask
}

// elems is the element range of g, widened to whole elements.
func (m *sim) elems(g Range) (lo, hi int) {
	if g.Len <= 0 {
		return 0, 0
	}
	return g.Off / m.es, (g.End() + m.es - 1) / m.es
}

func (st *rankState) hazard(m *sim, b Buf) *hazards {
	h := &st.haz[b]
	if h.writer == nil {
		n := (m.s.Len(b) + m.es - 1) / m.es
		h.writer, h.readers = make([]*simTask, n), make([][]*simTask, n)
	}
	return h
}

// deps lists the unfinished tasks an operation reading rd and writing wr
// must wait for: the writers of either range, the readers of wr.
func (m *sim) deps(st *rankState, rd, wr Range) []*simTask {
	st.mark++
	var out []*simTask
	add := func(t *simTask) {
		if t != nil && !t.done && t.mark != st.mark {
			t.mark = st.mark
			out = append(out, t)
		}
	}
	for _, g := range [2]Range{rd, wr} {
		lo, hi := m.elems(g)
		if lo == hi {
			continue
		}
		h := st.hazard(m, g.Buf)
		for e := lo; e < hi; e++ {
			add(h.writer[e])
			if g == wr {
				for _, t := range h.readers[e] {
					add(t)
				}
			}
		}
	}
	return out
}

// record notes task t as the reader of its source (Send) or the writer of
// its destination.
func (m *sim) record(st *rankState, t *simTask) {
	if t.op.Kind == Send {
		lo, hi := m.elems(t.op.Src)
		if lo == hi {
			return
		}
		h := st.hazard(m, t.op.Src.Buf)
		for e := lo; e < hi; e++ {
			rs := h.readers[e]
			if len(rs) >= 8 {
				rs = slices.DeleteFunc(rs, func(x *simTask) bool { return x.done })
			}
			h.readers[e] = append(rs, t)
		}
		return
	}
	lo, hi := m.elems(t.op.Dst)
	if lo == hi {
		return
	}
	h := st.hazard(m, t.op.Dst.Buf)
	for e := lo; e < hi; e++ {
		h.writer[e] = t
		h.readers[e] = h.readers[e][:0]
	}
}

func allDone(ts []*simTask) bool {
	for _, t := range ts {
		if !t.done {
			return false
		}
	}
	return true
}

// Simulate runs s (built from p) and checks the result against the
// definition of p.Coll. For all-to-allv, s must be assembled with PerRank
// and layouts[r] gives rank r's Params (its SendBlocks and RecvBlocks).
func Simulate(s *Schedule, p Params, layouts ...Params) (*Report, error) {
	if err := Validate(s); err != nil {
		return nil, err
	}
	if s.Blocks {
		// Each unit is a whole block: the data moves as in an all-to-all
		// of one element per block.
		p.Coll, p.Count, layouts = AllToAll, 1, nil
	}
	m := &sim{s: s, p: p, es: s.ElemSize, index: map[node]int32{}}
	n := s.N
	m.report = Report{BytesSent: make([]int, n), Messages: make([]int, n), Rounds: s.Rounds}
	m.bufs = make([][NumBufs][]int32, n)
	if p.Coll == Barrier {
		m.know = make([][]bool, n)
	}
	for r := 0; r < n; r++ {
		for b := Buf(0); b < NumBufs; b++ {
			m.bufs[r][b] = make([]int32, s.Len(b)/m.es)
			for i := range m.bufs[r][b] {
				m.bufs[r][b][i] = m.garbage(r, int(b)<<28|i)
			}
		}
		if m.know != nil {
			m.know[r] = make([]bool, n)
			m.know[r][r] = true
		}
	}
	if err := m.input(layouts); err != nil {
		return nil, err
	}
	if p.Hosts != nil {
		m.host = make([]int, n)
		for h, g := range p.Hosts {
			for _, r := range g {
				m.host[r] = h
			}
		}
		m.report.CrossHostBytes = make([]int, len(p.Hosts))
	}
	states := make([]*rankState, n)
	for r := range states {
		st := &rankState{lastSend: map[int]*simTask{}, lastRecv: map[int]*simTask{},
			sends: map[int][]*simTask{}, recvs: map[int][]*simTask{}}
		st.next, st.stop = iter.Pull(s.Program(r))
		st.op, st.has = st.next()
		states[r] = st
	}
	defer func() {
		for _, st := range states {
			st.stop()
		}
	}()
	for {
		progress := false
		for r, st := range states {
			if m.issue(r, st) {
				progress = true
			}
		}
		for r, st := range states {
			if m.advance(r, st, states) {
				progress = true
			}
		}
		if !progress || m.err != nil {
			break
		}
	}
	if m.err != nil {
		return nil, m.err
	}
	var stuck []string
	for r, st := range states {
		if st.has || !allDone(st.tasks) {
			for _, t := range st.tasks {
				if !t.done {
					stuck = append(stuck, fmt.Sprintf("rank %d: %v", r, t.op))
				}
			}
			if st.has {
				stuck = append(stuck, fmt.Sprintf("rank %d blocked before %v", r, st.op))
			}
		}
	}
	if len(stuck) > 0 {
		if len(stuck) > 8 {
			stuck = append(stuck[:8], "…")
		}
		return nil, fmt.Errorf("sched: %s %s deadlocks: %s", s.Coll, s.Algo, strings.Join(stuck, "; "))
	}
	return &m.report, m.verify(layouts)
}

// issue moves rank r's program counter over what can be issued now.
func (m *sim) issue(r int, st *rankState) bool {
	progress := false
	st.compact()
	for st.has {
		o := st.op
		switch o.Kind {
		case Send:
			t := &simTask{op: o, rank: r, deps: m.deps(st, o.Src, Range{})}
			m.record(st, t)
			if prev := st.lastSend[o.Peer]; prev != nil && !prev.done {
				t.deps = append(t.deps, prev)
			}
			if m.know != nil {
				t.know = slices.Clone(m.know[r])
			}
			st.lastSend[o.Peer] = t
			st.sends[o.Peer] = append(st.sends[o.Peer], t)
			st.tasks = append(st.tasks, t)
			m.report.BytesSent[r] += o.Src.Len
			m.report.Messages[r] += o.NSegs()
			if m.host != nil && m.host[o.Peer] != m.host[r] {
				m.report.CrossHostBytes[m.host[r]] += o.Src.Len
			}
		case Recv, RecvReduce:
			t := &simTask{op: o, rank: r}
			conf := m.deps(st, Range{}, o.Dst)
			m.record(st, t)
			if o.Kind == Recv {
				t.deps = conf
			} else {
				t.conf = conf
			}
			// Matched receives take their message by tag: they need not
			// wait for each other.
			if prev := st.lastRecv[o.Peer]; prev != nil && !prev.done && !m.s.Matched {
				t.deps = append(t.deps, prev)
			}
			st.lastRecv[o.Peer] = t
			st.recvs[o.Peer] = append(st.recvs[o.Peer], t)
			st.tasks = append(st.tasks, t)
		case Copy:
			if len(m.deps(st, o.Src, o.Dst)) > 0 {
				return progress
			}
			copy(m.slice(r, o.Dst), m.slice(r, o.Src))
		case Scale:
			if len(m.deps(st, Range{}, o.Dst)) > 0 {
				return progress
			}
			d := m.slice(r, o.Dst)
			for i := range d {
				d[i] = m.id(node{2, d[i], int32(o.Div)})
			}
		case Accumulate:
			if len(m.deps(st, o.Src, o.Dst)) > 0 {
				return progress
			}
			d, src := m.slice(r, o.Dst), m.slice(r, o.Src)
			for i := range d {
				d[i] = m.id(node{1, d[i], src[i]})
			}
		case Sync:
			if !allDone(st.tasks) {
				return progress
			}
		}
		st.op, st.has = st.next()
		progress = true
	}
	return progress
}

// compact drops finished tasks once they are a good part of the list: a
// rank's conflicts are searched among its unfinished tasks only.
func (st *rankState) compact() {
	if st.done > 0 && 2*st.done >= len(st.tasks) {
		st.tasks = slices.DeleteFunc(st.tasks, func(t *simTask) bool { return t.done })
		st.done = 0
	}
}

func (m *sim) slice(r int, g Range) []int32 {
	return m.bufs[r][g.Buf][g.Off/m.es : g.End()/m.es]
}

// advance matches ready sends with ready receives and finishes reductions.
func (m *sim) advance(r int, st *rankState, states []*rankState) bool {
	progress := false
	for peer, q := range st.recvs {
		for {
			ti, si, ok := m.pair(q, states[peer].sends[r])
			if !ok {
				break
			}
			t, snd := q[ti], states[peer].sends[r][si]
			if snd.op.Src.Len != t.op.Dst.Len {
				// Validate matched the segments; the simulator needs the
				// operations to pair one to one too.
				m.err = fmt.Errorf("sched: %s %s: rank %d's %v pairs with rank %d's %v: the simulator needs operations that match one to one", m.s.Coll, m.s.Algo, peer, snd.op, r, t.op)
				return false
			}
			data := slices.Clone(m.slice(peer, snd.op.Src))
			states[peer].sends[r] = cut(states[peer].sends[r], si)
			snd.done = true
			states[peer].done++
			for i, k := range snd.know {
				m.know[r][i] = m.know[r][i] || k
			}
			if t.op.Kind == Recv {
				copy(m.slice(r, t.op.Dst), data)
				t.done = true
				st.done++
			} else {
				t.payload, t.matched = data, true
				st.reducing = append(st.reducing, t)
			}
			q = cut(q, ti)
			progress = true
		}
		st.recvs[peer] = q
	}
	keep := st.reducing[:0]
	for _, t := range st.reducing {
		if !allDone(t.conf) {
			keep = append(keep, t)
			continue
		}
		d := m.slice(r, t.op.Dst)
		for i := range d {
			if t.op.TheirsFirst {
				d[i] = m.id(node{1, t.payload[i], d[i]})
			} else {
				d[i] = m.id(node{1, d[i], t.payload[i]})
			}
		}
		t.done, t.payload = true, nil
		st.done++
		progress = true
	}
	st.reducing = keep
	return progress
}

// cut removes q[i]; the head, the usual case, without moving the rest (a
// ring rank posts all its 2(N-1) receives at once).
func cut(q []*simTask, i int) []*simTask {
	if i == 0 {
		return q[1:]
	}
	return slices.Delete(q, i, i+1)
}

// pair picks the receive of q and the send of sq (the peer's unmatched
// sends to this rank) that meet next: the first of each when both are
// ready, or, in a Matched schedule, any ready receive and the ready send
// of its tag.
func (m *sim) pair(q, sq []*simTask) (ti, si int, ok bool) {
	if !m.s.Matched {
		return 0, 0, len(q) > 0 && len(sq) > 0 && q[0].ready() && sq[0].ready()
	}
	for ti, t := range q {
		if !t.ready() {
			continue
		}
		for si, snd := range sq {
			if snd.op.Tag == t.op.Tag && snd.ready() {
				return ti, si, true
			}
		}
	}
	return 0, 0, false
}

// input fills the buffers with what the collective starts from.
func (m *sim) input(layouts []Params) error {
	p, n := m.p, m.s.N
	if p.Devices != nil {
		m.inputVirtual()
		return nil
	}
	for r := 0; r < n; r++ {
		w, in := m.bufs[r][Work], m.bufs[r][In]
		switch p.Coll {
		case AllReduce, Reduce, ReduceScatter:
			for i := range w {
				w[i] = m.leaf(r, i)
			}
		case Broadcast:
			if r == p.Root {
				for i := range w {
					w[i] = m.leaf(r, i)
				}
			}
		case AllGather:
			for i := r * p.Count; i < (r+1)*p.Count; i++ {
				w[i] = m.leaf(r, i)
			}
		case AllToAll, AllToAllv:
			for i := range in {
				in[i] = m.leaf(r, i)
			}
		}
	}
	if p.Coll == AllToAllv && len(layouts) != n {
		return fmt.Errorf("sched: simulating alltoallv needs every rank's layouts")
	}
	return nil
}

// leaves checks that expression x holds exactly one leaf (q, i) for every
// rank q, and whether it is divided, once, at the top.
func (m *sim) leaves(x int32, i int) (ok, scaled bool) {
	if nd := m.nodes[x]; nd.kind == 2 {
		x, scaled = nd.a, true
	}
	seen := make([]bool, m.s.N)
	var walk func(x int32) bool
	walk = func(x int32) bool {
		nd := m.nodes[x]
		switch nd.kind {
		case 0:
			if int(nd.b) != i || seen[nd.a] {
				return false
			}
			seen[nd.a] = true
			return true
		case 1:
			return walk(nd.a) && walk(nd.b)
		}
		return false
	}
	if !walk(x) {
		return false, scaled
	}
	for _, s := range seen {
		if !s {
			return false, scaled
		}
	}
	return true, scaled
}

func (m *sim) verify(layouts []Params) error {
	p, n, s := m.p, m.s.N, m.s
	fail := func(r int, format string, args ...any) error {
		return fmt.Errorf("sched: %s %s on %d ranks: rank %d: %s", s.Coll, s.Algo, n, r, fmt.Sprintf(format, args...))
	}
	if p.Devices != nil {
		return m.verifyVirtual(fail)
	}
	reduced := func(r, i int, x int32) error {
		ok, scaled := m.leaves(x, i)
		if !ok {
			return fail(r, "element %d is %s, not one contribution of every rank", i, m.show(x))
		}
		// Dividing by one rank is no division: builders may leave it out.
		if scaled != (p.Avg && n > 1) {
			return fail(r, "element %d divided %v, want %v", i, scaled, p.Avg && n > 1)
		}
		return nil
	}
	switch p.Coll {
	case AllReduce:
		for i := 0; i < p.Count; i++ {
			x := m.bufs[0][Work][i]
			if err := reduced(0, i, x); err != nil {
				return err
			}
			for r := 1; r < n; r++ {
				if y := m.bufs[r][Work][i]; y != x {
					return fail(r, "element %d is %s, rank 0 has %s: not bitwise identical", i, m.show(y), m.show(x))
				}
			}
		}
	case Reduce:
		for i := 0; i < p.Count; i++ {
			if err := reduced(p.Root, i, m.bufs[p.Root][Work][i]); err != nil {
				return err
			}
		}
	case ReduceScatter:
		for r := 0; r < n; r++ {
			for i := r * p.Count; i < (r+1)*p.Count; i++ {
				if err := reduced(r, i, m.bufs[r][Work][i]); err != nil {
					return err
				}
			}
		}
	case Broadcast:
		for r := 0; r < n; r++ {
			for i, x := range m.bufs[r][Work] {
				if x != m.leaf(p.Root, i) {
					return fail(r, "element %d is %s, want the root's", i, m.show(x))
				}
			}
		}
	case AllGather:
		for r := 0; r < n; r++ {
			for i, x := range m.bufs[r][Work][:n*p.Count] {
				if x != m.leaf(i/max(p.Count, 1), i) {
					return fail(r, "element %d is %s, want rank %d's", i, m.show(x), i/max(p.Count, 1))
				}
			}
		}
	case AllToAll:
		for r := 0; r < n; r++ {
			for i, x := range m.bufs[r][Work][:n*p.Count] {
				q, e := i/max(p.Count, 1), i%max(p.Count, 1)
				if want := m.leaf(q, r*p.Count+e); x != want {
					return fail(r, "element %d is %s, want %s", i, m.show(x), m.show(want))
				}
			}
		}
	case AllToAllv:
		for r := 0; r < n; r++ {
			for q := 0; q < n; q++ {
				rb, sb := layouts[r].RecvBlocks[q], layouts[q].SendBlocks[r]
				for e := 0; e < rb.Len/m.es; e++ {
					if x, want := m.bufs[r][Work][rb.Off/m.es+e], m.leaf(q, sb.Off/m.es+e); x != want {
						return fail(r, "element %d of the block from rank %d is %s, want %s", e, q, m.show(x), m.show(want))
					}
				}
			}
		}
	case Barrier:
		for r := 0; r < n; r++ {
			for q, k := range m.know[r] {
				if !k {
					return fail(r, "finished without hearing, even indirectly, from rank %d", q)
				}
			}
		}
	}
	return nil
}

// show prints an expression (shortened).
func (m *sim) show(x int32) string {
	var b strings.Builder
	var walk func(x int32)
	walk = func(x int32) {
		if b.Len() > 200 {
			return
		}
		nd := m.nodes[x]
		switch nd.kind {
		case 0:
			if m.p.Devices != nil {
				fmt.Fprintf(&b, "d%d[%d]", nd.a, nd.b)
				break
			}
			fmt.Fprintf(&b, "r%d[%d]", nd.a, nd.b)
		case 1:
			b.WriteString("(")
			walk(nd.a)
			b.WriteString("+")
			walk(nd.b)
			b.WriteString(")")
		case 2:
			b.WriteString("(")
			walk(nd.a)
			fmt.Fprintf(&b, ")/%d", nd.b)
		case 3:
			fmt.Fprintf(&b, "garbage(r%d)", nd.a)
		}
	}
	walk(x)
	return b.String()
}
