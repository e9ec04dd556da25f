package exec

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
)

// The executor runs one rank's program of a schedule (package sched) over
// the communicator's transport. It is the only code of the message path
// that touches the transport: algorithms are data.
//
// Operations are taken in program order. Sends and receives run in order
// on one goroutine per peer and direction, a stream (the transports are
// FIFO per directed pair, and two sends to one peer must not overlap), each
// waiting for the earlier operations whose byte ranges it conflicts with;
// copies and divisions run on the issuing goroutine once their conflicts
// are done. A stream rather than a goroutine per operation: a 4-rank ring
// allreduce of 4 MiB across hosts is 192 operations, and starting their
// goroutines delayed the first segment noticeably on emulated hosts (much
// more on a loaded machine); a stream's goroutine starts
// with its first operation and sends its first segment as soon as it runs.
// A RecvReduce receives into scratch without waiting and waits for its
// conflicts only before its first reduction, so two partners can each send
// their vector and receive the other's at the same time.
//
// The first failure cancels the operation's context, so every other
// transport call of the schedule returns at once; the executor then waits
// for all of them, so nothing touches the caller's buffers after it
// returned.

// task is an operation in flight.
type task struct {
	done   chan struct{}
	rd, wr sched.Range // bytes it reads and writes (zero Len: none)
}

// conflicts reports whether n must wait for t: one of them writes what the
// other reads or writes.
func (t *task) conflicts(rd, wr sched.Range) bool {
	return t.wr.Overlaps(rd) || t.wr.Overlaps(wr) || t.rd.Overlaps(wr)
}

type runner struct {
	l    Link
	bufs [sched.NumBufs][]byte
	dt   kernel.DataType
	op   kernel.RedOp
	es   int

	inflight []*task
	sends    []*stream // per peer, made at its first send
	recvs    []*stream // per peer, made at its first receive (matched runs: none)
	kicked   bool      // the first send's stream ran at once (kick)
	wg       sync.WaitGroup

	mu     sync.Mutex
	err    error
	failed chan struct{} // closed on the first failure

	blk  *blockState // block mode (nil: ranges are bytes)
	lazy *LazyWork   // Work still partly a copy not made of the send buffer
	// Matched runs (the control tree) take messages by tag (mail, per
	// peer) and send control messages besides the schedule's, so sends to
	// one peer also take sendMu.
	mail   []*mailbox
	sendMu []sync.Mutex
}

// runSchedule runs ops (this rank's program of s) with Work, In and Tmp
// bound to bufs. dt and op are the call's (RecvReduce reduces with op).
// With lw, Work starts as a copy of lw.src that is made only where an
// operation needs it (LazyWork), and holds all of it past lw's keep range
// only.
func Run(l Link, s *sched.Schedule, ops []sched.Op, bufs [sched.NumBufs][]byte, dt kernel.DataType, op kernel.RedOp, lw *LazyWork) error {
	if s.TmpLen > 0 && bufs[sched.Tmp] == nil {
		bufs[sched.Tmp] = l.Buf(2, s.TmpLen)
	}
	r := newRunner(l, dt, op)
	r.bufs = bufs
	r.lazy = lw
	err := r.runAll(ops)
	if lw != nil && err == nil {
		lw.Fill(bufs[sched.Work], lw.keepLo, lw.keepHi)
	}
	return err
}

// LazyWork spares an out-of-place reduction the copy of its send buffer
// into the vector it works on (Work) before the schedule starts. An
// operation that reads bytes of Work nothing has written yet reads them
// from src instead: a send sends src's bytes, a receive-reduce folds the
// arriving partial with src's into Work. An operation that overwrites
// them just clears them. Only a partial overlap (or a division in place)
// copies, at issue. What the schedule never wrote in the keep range is
// copied when it ends. A 4-rank ring allreduce writes every byte of Work
// before reading it, so it copies nothing: the first segment goes out at
// once instead of after the copy of the whole vector, and the copy's
// memory traffic is saved.
type LazyWork struct {
	src            []byte
	keepLo, keepHi int
	todo           []Span // byte ranges (runs 1) still only in src, sorted
}

func NewLazyWork(src []byte, keepLo, keepHi int) *LazyWork {
	return &LazyWork{src: src, keepLo: keepLo, keepHi: keepHi, todo: []Span{{Off: 0, N: len(src), Runs: 1}}}
}

// unwritten says whether all of [lo, hi) (not empty) is still only in src.
func (lw *LazyWork) unwritten(lo, hi int) bool {
	in := 0
	for _, t := range lw.todo {
		if a, b := max(lo, t.Off), min(hi, t.Off+t.N); a < b {
			in += b - a
		}
	}
	return hi > lo && in == hi-lo
}

// drop records that [lo, hi) of Work is being overwritten.
func (lw *LazyWork) drop(lo, hi int) {
	out := lw.todo[:0:0]
	for _, t := range lw.todo {
		if t.Off < lo {
			out = append(out, Span{Off: t.Off, N: min(t.N, lo-t.Off), Runs: 1})
		}
		if end := t.Off + t.N; end > hi {
			a := max(t.Off, hi)
			out = append(out, Span{Off: a, N: end - a, Runs: 1})
		}
	}
	lw.todo = out
}

// Fill copies what of [lo, hi) is still only in src into work.
func (lw *LazyWork) Fill(work []byte, lo, hi int) {
	for _, t := range lw.todo {
		if a, b := max(lo, t.Off), min(hi, t.Off+t.N); a < b {
			copy(work[a:b], lw.src[a:b])
		}
	}
	lw.drop(lo, hi)
}

// source is where an operation reading g finds its bytes: src, when all of
// them are still only there (then the operation reads nothing of Work, and
// rd is empty), else Work, filled first where needed.
func (r *runner) source(g sched.Range) (b []byte, rd sched.Range) {
	if r.lazy != nil && g.Buf == sched.Work && r.lazy.unwritten(g.Off, g.End()) {
		return r.lazy.src[g.Off:g.End()], sched.Range{}
	}
	r.materialize(g)
	return r.slice(g), g
}

// materialize makes Work hold every byte of g (an operation reads or
// changes it in place).
func (r *runner) materialize(g sched.Range) {
	if r.lazy != nil && g.Buf == sched.Work {
		r.lazy.Fill(r.bufs[sched.Work], g.Off, g.End())
	}
}

// overwrite records that an operation replaces every byte of g.
func (r *runner) overwrite(g sched.Range) {
	if r.lazy != nil && g.Buf == sched.Work {
		r.lazy.drop(g.Off, g.End())
	}
}

// runBlocks runs ops (this rank's program of the block-mode schedule s)
// over the call's layout.
func RunBlocks(l Link, s *sched.Schedule, ops []sched.Op, lay *Layout) error {
	if !s.Blocks || s.Matched {
		return fmt.Errorf("gocoll: %s schedule %q is not a plain block-mode schedule", s.Coll, s.Algo)
	}
	r := newRunner(l, NoType, 0)
	r.blk = &blockState{lay: lay}
	defer r.blk.release(l.Pool())
	return r.runAll(ops)
}

func newRunner(l Link, dt kernel.DataType, op kernel.RedOp) *runner {
	es := 1
	if dt != NoType {
		es = dt.Size()
	}
	return &runner{
		l: l, dt: dt, op: op, es: es,
		sends:  make([]*stream, l.Size()),
		recvs:  make([]*stream, l.Size()),
		failed: make(chan struct{}),
	}
}

// runAll issues ops in order and waits for all of them.
func (r *runner) runAll(ops []sched.Op) error {
	for i := range ops {
		if r.stopped() {
			break
		}
		r.issue(&ops[i])
	}
	r.wg.Wait()
	return r.err
}

func (r *runner) slice(g sched.Range) []byte { return r.bufs[g.Buf][g.Off:g.End()] }

func (r *runner) stopped() bool {
	select {
	case <-r.failed:
		return true
	default:
		return false
	}
}

// fail records the first error and cancels the operation's context so that
// every transport call still running returns.
func (r *runner) fail(err error) {
	r.mu.Lock()
	first := r.err == nil
	if first {
		r.err = err
		close(r.failed)
	}
	r.mu.Unlock()
	if first {
		r.l.Stop()
	}
}

// deps returns the tasks in flight that an operation reading rd and
// writing wr must wait for, pruning finished ones.
func (r *runner) deps(rd, wr sched.Range) []*task {
	var out []*task
	live := r.inflight[:0]
	for _, t := range r.inflight {
		select {
		case <-t.done:
			continue
		default:
		}
		live = append(live, t)
		if t.conflicts(rd, wr) {
			out = append(out, t)
		}
	}
	clear(r.inflight[len(live):])
	r.inflight = live
	return out
}

func wait(ts []*task) {
	for _, t := range ts {
		<-t.done
	}
}

// stream runs its operations in order on one goroutine, started when an
// operation arrives and none is running: the issuing goroutine adds while
// the stream drains.
type stream struct {
	mu      sync.Mutex
	items   []item
	running bool
}

// item is an operation queued on a stream: fn, once deps are done.
type item struct {
	t    *task
	deps []*task
	fn   func() error
}

// track records a task that reads rd and writes wr, for the conflicts of
// later operations.
func (r *runner) track(rd, wr sched.Range) *task {
	t := &task{done: make(chan struct{}), rd: rd, wr: wr}
	r.inflight = append(r.inflight, t)
	r.wg.Add(1)
	return t
}

// spawn runs fn on its own goroutine after deps: for the receives of a
// matched run, which take their messages by tag and so need not wait for
// each other.
func (r *runner) spawn(rd, wr sched.Range, deps []*task, fn func() error) {
	go r.run(item{r.track(rd, wr), deps, fn})
}

// enqueue adds fn to *sp (made on first use), to run after deps and the
// stream's earlier operations.
func (r *runner) enqueue(sp **stream, rd, wr sched.Range, deps []*task, fn func() error) {
	t := r.track(rd, wr)
	if *sp == nil {
		*sp = &stream{}
	}
	s := *sp
	s.mu.Lock()
	s.items = append(s.items, item{t, deps, fn})
	start := !s.running
	s.running = true
	s.mu.Unlock()
	if start {
		go r.drain(s)
	}
}

// kick yields to the stream just started for the call's first ready send
// (one that waits for nothing), which the Go scheduler then runs next on
// this thread, before the rest of the program is issued: otherwise its
// first segment waits for another thread to be scheduled, which on a busy
// machine took milliseconds while the peer's first receive waited on it.
// Once per call, and not for a caller locked to its thread (every call
// from C): there a yield hands the P to another thread and back, and the
// stream runs on the idle P anyway (through the C ABI the kick made a
// 2-rank 4 KiB ring allreduce over the shared-memory rings slower).
func (r *runner) kick(deps []*task) {
	if r.kicked || len(deps) > 0 || r.l.Locked() {
		return
	}
	r.kicked = true
	runtime.Gosched()
}

func (r *runner) drain(s *stream) {
	for {
		s.mu.Lock()
		if len(s.items) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		it := s.items[0]
		s.items[0] = item{}
		s.items = s.items[1:]
		s.mu.Unlock()
		r.run(it)
	}
}

// run runs one operation once its dependencies are done; after a failure
// it only marks it done, so that nothing waits for it forever.
func (r *runner) run(it item) {
	defer r.wg.Done()
	defer close(it.t.done)
	wait(it.deps)
	if r.stopped() {
		return
	}
	if err := it.fn(); err != nil {
		r.fail(err)
	}
}

func (r *runner) issue(o *sched.Op) {
	if r.blk != nil {
		r.issueBlocks(o)
		return
	}
	switch o.Kind {
	case sched.Send:
		src, rd := r.source(o.Src)
		deps := r.deps(rd, sched.Range{})
		r.enqueue(&r.sends[o.Peer], rd, sched.Range{}, deps, func() error { return r.send(o, src) })
		r.kick(deps)
	case sched.Recv:
		deps := r.deps(sched.Range{}, o.Dst)
		dst := r.slice(o.Dst)
		r.overwrite(o.Dst)
		r.enqueue(&r.recvs[o.Peer], sched.Range{}, o.Dst, deps, func() error { return r.l.Recv(o.Peer, int(o.Tag), dst) })
	case sched.RecvReduce:
		// Receiving waits only for the previous receive from this peer;
		// the conflicts on Dst are waited for before the first reduction.
		conf := r.deps(sched.Range{}, o.Dst)
		mine, _ := r.source(o.Dst)
		r.overwrite(o.Dst)
		r.enqueue(&r.recvs[o.Peer], sched.Range{}, o.Dst, nil, func() error { return r.recvReduce(o, mine, conf) })
	case sched.Copy:
		src, rd := r.source(o.Src)
		wait(r.deps(rd, o.Dst))
		r.overwrite(o.Dst)
		copy(r.slice(o.Dst), src)
	case sched.Scale:
		r.materialize(o.Dst) // divided in place
		wait(r.deps(sched.Range{}, o.Dst))
		kernel.DivideBy(r.slice(o.Dst), r.dt, o.Div)
	case sched.Accumulate:
		src, rd := r.source(o.Src)
		r.materialize(o.Dst) // folded in place
		wait(r.deps(rd, o.Dst))
		kernel.Reduce(r.slice(o.Dst), src, r.dt, r.op)
	case sched.Sync:
		wait(r.inflight)
		r.inflight = r.inflight[:0]
	}
}

// issueBlocks is issue in block mode: the same dependencies, over units.
func (r *runner) issueBlocks(o *sched.Op) {
	switch o.Kind {
	case sched.Send:
		deps := r.deps(o.Src, sched.Range{})
		r.enqueue(&r.sends[o.Peer], o.Src, sched.Range{}, deps, func() error { return r.sendBlocks(o) })
		r.kick(deps)
	case sched.Recv:
		deps := r.deps(sched.Range{}, o.Dst)
		fn := func() error { return r.recvBlocks(o) }
		if r.mail != nil {
			r.spawn(sched.Range{}, o.Dst, deps, fn)
		} else {
			r.enqueue(&r.recvs[o.Peer], sched.Range{}, o.Dst, deps, fn)
		}
	case sched.Copy:
		wait(r.deps(o.Src, o.Dst))
		if !r.stopped() {
			if err := r.copyBlocks(o); err != nil {
				r.fail(err)
			}
		}
	case sched.Sync:
		wait(r.inflight)
		r.inflight = r.inflight[:0]
	default:
		r.fail(fmt.Errorf("gocoll: no %s in a block-mode schedule", o.Kind))
	}
}

// sendMsg sends one message, never overlapping another send to the peer
// in a matched run (whose control messages bypass the schedule's chains).
func (r *runner) sendMsg(peer, tag int, msg []byte) error {
	if r.sendMu != nil {
		r.sendMu[peer].Lock()
		defer r.sendMu[peer].Unlock()
	}
	return r.l.Send(peer, tag, msg)
}

// send streams src to the peer as the op's segments, in order.
func (r *runner) send(o *sched.Op, src []byte) error {
	ns := o.NSegs()
	for k := 0; k < ns; k++ {
		lo, hi := sched.Segment(k, len(src), r.es, ns)
		if err := r.l.Send(o.Peer, int(o.Tag)+k, src[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

// recvReduce receives the op's segments into two alternating scratch
// buffers and folds each with mine (Dst's bytes, or where they still are:
// LazyWork) into Dst while the next one is in flight (the pipelining of
// docs/design/halving-doubling.md; see sched/hd.go).
func (r *runner) recvReduce(o *sched.Op, mine []byte, conf []*task) error {
	dst := r.slice(o.Dst)
	ns := o.NSegs()
	most := (len(dst)/r.es + ns - 1) / ns * r.es
	bufs := [2][]byte{r.l.Pool().Get(most)}
	defer r.l.Pool().Put(bufs[0])
	if ns > 1 {
		bufs[1] = r.l.Pool().Get(most)
		defer r.l.Pool().Put(bufs[1])
	}
	lo, hi := sched.Segment(0, len(dst), r.es, ns)
	in := bufs[0][:hi-lo]
	if err := r.l.Recv(o.Peer, int(o.Tag), in); err != nil {
		return err
	}
	wait(conf)
	for k := 0; ; k++ {
		var next pending
		var nlo, nhi int
		if k+1 < ns {
			nlo, nhi = sched.Segment(k+1, len(dst), r.es, ns)
			next = r.goRecv(o.Peer, int(o.Tag)+k+1, bufs[(k+1)%2][:nhi-nlo])
		}
		if r.stopped() {
			if next != nil {
				next.wait()
			}
			return nil
		}
		combine(dst[lo:hi], mine[lo:hi], in, o.TheirsFirst, r.dt, r.op)
		if next == nil {
			return nil
		}
		if err := next.wait(); err != nil {
			return err
		}
		lo, hi, in = nlo, nhi, bufs[(k+1)%2][:nhi-nlo]
	}
}

// combine sets dst = lower op higher of mine and theirs, where lower is
// the buffer of the lower-numbered side, so both partners of an exchange
// compute the same expression and end with the same bytes.
func combine(dst, mine, theirs []byte, theirsLower bool, dt kernel.DataType, op kernel.RedOp) {
	if theirsLower {
		kernel.Reduce3(dst, theirs, mine, dt, op)
	} else {
		kernel.Reduce3(dst, mine, theirs, dt, op)
	}
}
