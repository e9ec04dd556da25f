package engine

import (
	"fmt"
	"sync"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
)

// The executor runs one rank's program of a schedule (package sched) over
// the communicator's transport. It is the only code of the message path
// that touches the transport: algorithms are data.
//
// Operations are taken in program order. Sends and receives run on their
// own goroutines, chained per peer and direction (the transports are FIFO
// per directed pair, and two sends to one peer must not overlap), and wait
// for the earlier operations whose byte ranges they conflict with; copies
// and divisions run on the issuing goroutine once their conflicts are done.
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
	x    *execCtx
	bufs [sched.NumBufs][]byte
	dt   DataType
	op   RedOp
	es   int

	inflight []*task
	lastSend []*task // per peer: the last send issued, nil once done
	lastRecv []*task
	wg       sync.WaitGroup

	mu     sync.Mutex
	err    error
	failed chan struct{} // closed on the first failure

	blk *blockState // block mode (nil: ranges are bytes)
	// Matched runs (the control tree) take messages by tag (mail, per
	// peer) and send control messages besides the schedule's, so sends to
	// one peer also take sendMu.
	mail   []*mailbox
	sendMu []sync.Mutex
}

// runSchedule runs ops (this rank's program of s) with Work, In and Tmp
// bound to bufs. dt and op are the call's (RecvReduce reduces with op).
func (x *execCtx) runSchedule(s *sched.Schedule, ops []sched.Op, bufs [sched.NumBufs][]byte, dt DataType, op RedOp) error {
	if s.TmpLen > 0 && bufs[sched.Tmp] == nil {
		bufs[sched.Tmp] = x.scratchBuf(2, s.TmpLen)
	}
	r := x.newRunner(dt, op)
	r.bufs = bufs
	return r.runAll(ops)
}

// runBlocks runs ops (this rank's program of the block-mode schedule s)
// over the call's layout.
func (x *execCtx) runBlocks(s *sched.Schedule, ops []sched.Op, lay *blockLayout) error {
	if !s.Blocks || s.Matched {
		return fmt.Errorf("gocoll: %s schedule %q is not a plain block-mode schedule", s.Coll, s.Algo)
	}
	r := x.newRunner(noType, 0)
	r.blk = &blockState{lay: lay}
	defer r.blk.release(x.c)
	return r.runAll(ops)
}

func (x *execCtx) newRunner(dt DataType, op RedOp) *runner {
	es := 1
	if dt != noType {
		es = dt.Size()
	}
	return &runner{
		x: x, dt: dt, op: op, es: es,
		lastSend: make([]*task, x.size()),
		lastRecv: make([]*task, x.size()),
		failed:   make(chan struct{}),
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
		r.x.context() // make sure there is a context to cancel
		r.x.cancel()
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

// spawn runs fn on its own goroutine after deps; a failure stops the run.
func (r *runner) spawn(rd, wr sched.Range, deps []*task, fn func() error) *task {
	t := &task{done: make(chan struct{}), rd: rd, wr: wr}
	r.inflight = append(r.inflight, t)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(t.done)
		wait(deps)
		if r.stopped() {
			return
		}
		if err := fn(); err != nil {
			r.fail(err)
		}
	}()
	return t
}

// chained adds the previous task of a per-peer stream to deps.
func chained(deps []*task, prev *task) []*task {
	if prev != nil {
		deps = append(deps, prev)
	}
	return deps
}

func (r *runner) issue(o *sched.Op) {
	if r.blk != nil {
		r.issueBlocks(o)
		return
	}
	switch o.Kind {
	case sched.Send:
		deps := chained(r.deps(o.Src, sched.Range{}), r.lastSend[o.Peer])
		src := r.slice(o.Src)
		r.lastSend[o.Peer] = r.spawn(o.Src, sched.Range{}, deps, func() error { return r.send(o, src) })
	case sched.Recv:
		deps := chained(r.deps(sched.Range{}, o.Dst), r.lastRecv[o.Peer])
		dst := r.slice(o.Dst)
		r.lastRecv[o.Peer] = r.spawn(sched.Range{}, o.Dst, deps, func() error { return r.x.recv(o.Peer, int(o.Tag), dst) })
	case sched.RecvReduce:
		// Receiving waits only for the previous receive from this peer;
		// the conflicts on Dst are waited for before the first reduction.
		conf := r.deps(sched.Range{}, o.Dst)
		prev := r.lastRecv[o.Peer]
		r.lastRecv[o.Peer] = r.spawn(sched.Range{}, o.Dst, chained(nil, prev), func() error { return r.recvReduce(o, conf) })
	case sched.Copy:
		wait(r.deps(o.Src, o.Dst))
		copy(r.slice(o.Dst), r.slice(o.Src))
	case sched.Scale:
		wait(r.deps(sched.Range{}, o.Dst))
		kernel.DivideBy(r.slice(o.Dst), r.dt, o.Div)
	case sched.Sync:
		wait(r.inflight)
		r.inflight = r.inflight[:0]
	}
}

// issueBlocks is issue in block mode: the same dependencies, over units.
func (r *runner) issueBlocks(o *sched.Op) {
	switch o.Kind {
	case sched.Send:
		deps := chained(r.deps(o.Src, sched.Range{}), r.lastSend[o.Peer])
		r.lastSend[o.Peer] = r.spawn(o.Src, sched.Range{}, deps, func() error { return r.sendBlocks(o) })
	case sched.Recv:
		deps := r.deps(sched.Range{}, o.Dst)
		if r.mail == nil {
			deps = chained(deps, r.lastRecv[o.Peer])
		}
		r.lastRecv[o.Peer] = r.spawn(sched.Range{}, o.Dst, deps, func() error { return r.recvBlocks(o) })
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
	return r.x.send(peer, tag, msg)
}

// send streams src to the peer as the op's segments, in order.
func (r *runner) send(o *sched.Op, src []byte) error {
	ns := o.NSegs()
	for k := 0; k < ns; k++ {
		lo, hi := sched.Segment(k, len(src), r.es, ns)
		if err := r.x.send(o.Peer, int(o.Tag)+k, src[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

// recvReduce receives the op's segments into two alternating scratch
// buffers and folds each into Dst while the next one is in flight
// (document 000's pipelining; see sched/hd.go).
func (r *runner) recvReduce(o *sched.Op, conf []*task) error {
	dst := r.slice(o.Dst)
	ns := o.NSegs()
	most := (len(dst)/r.es + ns - 1) / ns * r.es
	bufs := [2][]byte{r.x.c.getScratch(most)}
	defer r.x.c.putScratch(bufs[0])
	if ns > 1 {
		bufs[1] = r.x.c.getScratch(most)
		defer r.x.c.putScratch(bufs[1])
	}
	lo, hi := sched.Segment(0, len(dst), r.es, ns)
	in := bufs[0][:hi-lo]
	if err := r.x.recv(o.Peer, int(o.Tag), in); err != nil {
		return err
	}
	wait(conf)
	for k := 0; ; k++ {
		var next pending
		var nlo, nhi int
		if k+1 < ns {
			nlo, nhi = sched.Segment(k+1, len(dst), r.es, ns)
			next = r.x.goRecv(o.Peer, int(o.Tag)+k+1, bufs[(k+1)%2][:nhi-nlo])
		}
		if r.stopped() {
			if next != nil {
				next.wait()
			}
			return nil
		}
		combine(dst[lo:hi], in, o.TheirsFirst, r.dt, r.op)
		if next == nil {
			return nil
		}
		if err := next.wait(); err != nil {
			return err
		}
		lo, hi, in = nlo, nhi, bufs[(k+1)%2][:nhi-nlo]
	}
}

// combine sets mine = lower op higher, where lower is the buffer of the
// lower-numbered side, so both partners of an exchange compute the same
// expression and end with the same bytes.
func combine(mine, theirs []byte, theirsLower bool, dt DataType, op RedOp) {
	if theirsLower {
		kernel.Reduce3(mine, theirs, mine, dt, op)
	} else {
		kernel.Reduce(mine, theirs, dt, op)
	}
}

// getScratch returns a buffer of at least n bytes from the communicator's
// pool; concurrent receives of one schedule each take their own.
func (c *Comm) getScratch(n int) []byte {
	c.poolMu.Lock()
	defer c.poolMu.Unlock()
	for i, b := range c.pool {
		if cap(b) >= n {
			c.pool[i] = c.pool[len(c.pool)-1]
			c.pool = c.pool[:len(c.pool)-1]
			return b[:n]
		}
	}
	return make([]byte, n)
}

func (c *Comm) putScratch(b []byte) {
	c.poolMu.Lock()
	c.pool = append(c.pool, b)
	c.poolMu.Unlock()
}
