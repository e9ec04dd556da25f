package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/shmcoll"
	"github.com/gocoll/gocoll/engine/transport"
)

// Comm is one rank's membership in a group of ranks that run collectives
// together. Operations run one at a time, in the order they were issued, on
// the communicator's own goroutine (like an NCCL stream); blocking calls are
// issue-and-wait. A Comm is safe for use by several goroutines, but the order
// of operations must be the same on every rank.
type Comm struct {
	rank, size int
	tr         transport.Transport
	opts       Options
	choice     choose.Chooser // GOCOLL_ALGO and, across hosts, the cost model
	log        *slog.Logger
	id         uint64    // communicator id, equal on every rank (0: none)
	flight     *recorder // nil when Options.FlightRecords < 0
	epoch      time.Time // creation, with its monotonic reading: what mono counts from
	announced  sync.Map  // *algorithm → true once logged at INFO

	queue    chan *Request
	worker   sync.WaitGroup
	abortCtx context.Context
	abort    context.CancelCauseFunc

	// pending counts issued operations not yet finished. A blocking call
	// runs inline only if it moves it from 0 to 1 (runReq), so an atomic, not
	// mu: two mutex round trips per call were a large part of a small
	// call's bookkeeping. Queued operations add to it under mu (start).
	pending atomic.Int64
	// unusable is set, under mu, once asyncErr is set or the communicator
	// is destroyed: what run checks without taking mu.
	unusable atomic.Bool
	// vbuf is a blocking AllToAllv's block lists, claimed atomically
	// (collectives.go): not execMu's, since the request is built first.
	vbuf vScratch

	mu        sync.Mutex
	asyncErr  error // first failure; the communicator is unusable after it
	destroyed bool
	allocs    map[uintptr]allocation // MemAlloc'd regions by start address
	splits    uint64                 // Split calls so far: names the children consistently on every rank

	// execMu is held by whoever executes a collective: the worker goroutine,
	// or a blocking call that found nothing pending and runs inline (saving
	// two goroutine hand-offs on small messages). It guards what follows.
	execMu  sync.Mutex
	inline  execCtx // the execution context of a blocking call run inline
	seq     uint64  // collective sequence number
	scratch [4][]byte
	plans   choose.Plans // schedules built so far
	pool    exec.Pool    // scratch for concurrent receives of one schedule

	p2p   p2pState       // sends and receives (p2p.go)
	arena *shmcoll.Arena // shared-memory collectives, when every rank is on this host

	layout hostLayout // where the ranks are, equal on every rank
	split  splitter   // how to build sub-communicators

	ctl     recovery.Net // control links: what Shrink and Grow talk over
	elastic elasticState // Shrink, Grow and Revoke (mu)
}

// Request is a non-blocking operation in flight.
type Request struct {
	op string
	// What the flight recorder notes (see recorder.begin).
	algo    string
	bytes   int
	dt      DataType
	hasType bool
	// Point-to-point requests (peer ≥ 0) are not numbered in the collective
	// sequence and do not wait for each other unless they share a peer and
	// direction, so a send and a receive issued back to back both progress.
	peer   int
	tag    int
	isSend bool
	// anySrc marks a receive from any source (peer is -1 then); src gets
	// the sender's rank before done closes.
	anySrc bool
	src    *int
	// What runs it: args (the collectives, through issue: plain values, so
	// that a blocking call run inline allocates nothing), or run, a closure
	// (point-to-point, which runs outside the collective sequence).
	args args
	run  func(x *execCtx) error
	done chan struct{}
	err  error
}

// Test reports whether the operation finished, and its error if it did.
func (r *Request) Test() (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// Wait blocks until the operation finished. It never blocks longer than the
// communicator's timeout after the operation started, and returns at once
// after an Abort.
func (r *Request) Wait() error {
	<-r.done
	return r.err
}

// Done is closed when the operation finished.
func (r *Request) Done() <-chan struct{} { return r.done }

// Source is the rank a receive from any source (IRecvAny) took its message
// from, once it finished without an error; otherwise -1.
func (r *Request) Source() int {
	if !r.anySrc {
		return -1
	}
	select {
	case <-r.done:
		if r.err == nil {
			return *r.src
		}
	default:
	}
	return -1
}

// p2p reports a point-to-point operation: it runs beside the others of
// other peers and tags instead of in the collective sequence.
func (r *Request) p2p() bool { return r.peer >= 0 || r.anySrc }

func newComm(rank, size int, tr transport.Transport, opts Options) (*Comm, error) {
	opts = opts.withDefaults()
	spec, err := parseAlgoSpec(opts.Algo)
	if err != nil {
		return nil, err
	}
	c := &Comm{
		rank: rank, size: size, tr: tr, opts: opts, choice: choose.Chooser{Overrides: spec},
		queue: make(chan *Request, 256),
		p2p: p2pState{chain: map[p2pKey]chan struct{}{}, inboxes: newInboxes(size),
			sendSeq: make([]uint64, size), recvSeq: make([]uint64, size)},
	}
	c.log = opts.Logger.With("rank", rank, "nranks", size)
	c.epoch = time.Now()
	c.place(nil, nil)
	c.abortCtx, c.abort = context.WithCancelCause(context.Background())
	if c.flight = newRecorder(opts.FlightRecords, c.epoch); c.flight != nil {
		processDumps.add(c)
	}
	c.worker.Add(1)
	go c.loop()
	return c, nil
}

// Rank is this rank's number in [0, Size()).
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Options returns the options in force (defaults filled in).
func (c *Comm) Options() Options { return c.opts }

// loop is the worker: it runs queued operations in issue order.
func (c *Comm) loop() {
	defer c.worker.Done()
	for r := range c.queue {
		if err := c.AsyncError(); err != nil {
			r.err = &OpError{Op: r.op, Seq: c.seq, Rank: c.rank, Peer: -1, Err: fmt.Errorf("%w: communicator failed earlier: %v", ErrInvalidUsage, err)}
			if errors.Is(err, ErrRevoked) {
				r.err = &OpError{Op: r.op, Seq: c.seq, Rank: c.rank, Peer: -1, Err: err}
			}
			close(r.done)
			c.finished()
			continue
		}
		if r.p2p() {
			c.startP2P(r)
			continue
		}
		// A collective uses every peer's stream: let point-to-point
		// operations issued before it finish first.
		c.p2p.wg.Wait()
		c.execMu.Lock()
		x := &execCtx{c: c, op: r.op, seq: c.seq}
		c.seq++
		c.execute(r, x)
		c.execMu.Unlock()
		c.finished()
	}
	c.p2p.wg.Wait()
}

// mono is the time since the communicator was made, from the monotonic
// clock alone. time.Now reads the wall clock too, two vDSO reads for each
// of the two calls per operation, which showed in a small call's profile;
// as a Duration it also costs no time.Time arithmetic. epoch.Add(mono) is
// the wall time, which drifts from the system's only by clock adjustments
// made since the communicator was created: the flight recorder's
// timestamps can bear that.
func (c *Comm) mono() time.Duration { return time.Since(c.epoch) }

func (c *Comm) finished() { c.pending.Add(-1) }

func (c *Comm) execute(r *Request, x *execCtx) {
	began := c.mono()
	// Saturating: a Go caller may pass the largest Duration for "never".
	x.deadline = began + min(c.opts.Timeout, math.MaxInt64-began)
	c.flight.begin(x, r, began)
	var err error
	if r.run != nil {
		err = r.run(x)
	} else {
		err = x.issue(&r.args)
	}
	if x.cancel != nil {
		x.cancel()
	}
	if err != nil {
		err = c.opError(x, err)
	}
	// Before fail, whose dump must show this operation's outcome.
	ended := c.mono()
	c.flight.end(x, err, ended)
	if err != nil {
		c.fail(err)
	}
	if c.opts.Metrics != nil {
		c.opts.Metrics.observe(x.op, x.algo, x.bytes, ended-began, err)
	}
	r.err = err
	if r.done != nil { // nil for a blocking call run inline: nobody waits on it
		close(r.done)
	}
}

// startP2P runs a send or receive on its own goroutine, after the previous
// one of its chain (see p2pKey).
func (c *Comm) startP2P(r *Request) {
	var x *execCtx
	key := p2pKey{peer: r.peer, tag: r.tag, send: r.isSend}
	switch {
	case r.anySrc:
		key.peer = AnySource
		x = &execCtx{c: c, op: r.op, seq: c.p2p.anySeq | p2pSeqBit}
		c.p2p.anySeq++
	case r.isSend:
		key.tag = 0
		x = &execCtx{c: c, op: r.op, seq: c.p2p.sendSeq[r.peer] | p2pSeqBit}
		c.p2p.sendSeq[r.peer]++
	default:
		x = &execCtx{c: c, op: r.op, seq: c.p2p.recvSeq[r.peer] | p2pSeqBit}
		c.p2p.recvSeq[r.peer]++
	}
	c.p2p.pruneChains(c.size)
	prev := c.p2p.chain[key]
	c.p2p.chain[key] = r.done
	c.p2p.wg.Add(1)
	go func() {
		defer c.p2p.wg.Done()
		if prev != nil {
			<-prev
		}
		c.execute(r, x)
		c.finished()
	}()
}

func (c *Comm) opError(x *execCtx, err error) error {
	var oe *OpError
	if errors.As(err, &oe) {
		return err
	}
	peer := -1
	var pe *peerError
	if errors.As(err, &pe) {
		peer = pe.peer
	}
	// The transports watch every peer: a wait on one rank may end because
	// another failed, and the error must name that one.
	if failed := failedRank(err); failed >= 0 {
		peer = failed
	}
	if cause := context.Cause(c.abortCtx); cause != nil && errors.Is(err, context.Canceled) {
		err = fmt.Errorf("%w: %v", ErrAborted, cause)
	}
	err = revokedBy(err)
	c.mu.Lock()
	revoked := c.elastic.revoked
	c.mu.Unlock()
	if revoked && !errors.Is(err, ErrRevoked) {
		err = fmt.Errorf("%w: %w", ErrRevoked, err)
	}
	return &OpError{Op: x.op, Seq: x.seq, Rank: c.rank, Peer: peer, Err: err}
}

// fail records the first error and aborts the transport so that every peer
// stops waiting on this rank too: a failed collective leaves buffers in an
// unknown state on every rank, so the communicator cannot continue.
func (c *Comm) fail(err error) {
	c.mu.Lock()
	first := c.asyncErr == nil
	if first {
		c.asyncErr = err
		c.unusable.Store(true)
	}
	c.mu.Unlock()
	if first {
		c.log.Warn("communicator failed", "err", err)
		c.tr.Abort(err)
		if c.arena != nil {
			c.arena.Abort(err)
		}
		c.abort(err)
		// After the abort: the peers stop waiting on this rank first.
		c.dumpOnFailure()
	}
}

// AsyncError returns the error that made the communicator unusable, if any.
func (c *Comm) AsyncError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asyncErr
}

// Op is an operation checked and prepared but not yet issued: Run issues it
// and waits (on the caller's goroutine when nothing else is pending, which
// is what makes small blocking calls cheap); Start issues it without
// waiting. Bindings that offer both forms of a call can use it to share the
// argument handling. An Op is used once. The …Op constructors build the
// request inside the Op they return, and Run takes it by pointer: an Op is
// ~270 bytes, and each copy of it cost a small call more than its lock.
type Op struct {
	c   *Comm
	r   Request
	err error
}

// ErrOp is an operation that fails with err when run or started: for
// bindings whose own argument checks failed.
func ErrOp(err error) Op { return Op{err: err} }

// Run issues the operation and waits for it. (A pointer receiver: an Op
// holds a whole request, which a value receiver would copy on every call.)
func (o *Op) Run() error {
	if o.err != nil {
		return o.err
	}
	return o.c.runReq(&o.r)
}

// Start issues the operation and returns its request.
func (o Op) Start() (*Request, error) {
	if o.err != nil {
		return nil, o.err
	}
	return o.c.start(&o.r, nil)
}

// noType stands for the datatype of a call that has none (barrier).
const noType = exec.NoType

// usable says why no operation may be issued now, if so. Called with mu held.
func (c *Comm) usable(op string) error {
	if c.destroyed {
		return fmt.Errorf("gocoll: %s on rank %d: %w", op, c.rank, ErrDestroyed)
	}
	if c.elastic.revoked || errors.Is(c.asyncErr, ErrRevoked) {
		return fmt.Errorf("gocoll: %s on rank %d: %w (shrink it, or destroy it): %v", op, c.rank, ErrRevoked, c.asyncErr)
	}
	if c.asyncErr != nil {
		return fmt.Errorf("gocoll: %s on rank %d: %w: communicator failed earlier: %v", op, c.rank, ErrInvalidUsage, c.asyncErr)
	}
	return nil
}

// start queues an operation for the worker. Argument errors come back at
// once and do not poison the communicator: nothing was sent.
func (c *Comm) start(req *Request, err error) (*Request, error) {
	if err != nil {
		return nil, err
	}
	r := new(Request)
	*r = *req
	r.done = make(chan struct{})
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(r.op); err != nil {
		return nil, err
	}
	c.pending.Add(1)
	// The queue is large; if it is full we block here while holding mu,
	// which only delays other submitters and Destroy, never the worker.
	c.queue <- r
	return r, nil
}

// run is a blocking call: inline on the caller's goroutine when nothing else
// is pending (the common case of a training loop), queued otherwise.
//
// Run inline, a collective allocates nothing: the request stays on the
// caller's stack and the execution context is the communicator's own
// (inline, guarded by execMu). Each allocation mattered beyond its own
// cost: at a few hundred thousand calls a second the garbage collector ran
// many times a second per rank, and each cycle stops the caller's thread, which
// for a thread locked by a C caller means handing its P to another thread
// and back.
func (c *Comm) run(r *Request, err error) error {
	if err != nil {
		return err
	}
	return c.runReq(r)
}

// runReq is run on a request the caller holds (a copy of a Request is
// ~250 bytes: Op.Run makes none).
func (c *Comm) runReq(r *Request) error {
	// Claiming the count from zero is what "nothing pending" means: a
	// concurrent start either came first (the claim fails and this call
	// queues behind it) or queues behind this one (the worker then waits
	// for execMu).
	if r.p2p() || !c.pending.CompareAndSwap(0, 1) {
		q, err := c.start(r, nil)
		if err != nil {
			return err
		}
		return q.Wait()
	}
	// Destroy marks the communicator before it waits for execMu: whoever
	// holds execMu after that sees the mark.
	c.execMu.Lock()
	if c.unusable.Load() {
		c.execMu.Unlock()
		c.finished()
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.usable(r.op)
	}
	// Nothing keeps x past execute: the helpers of a schedule are waited
	// for, and the flight recorder lets go of it at the end.
	x := &c.inline
	*x = execCtx{c: c, op: r.op, seq: c.seq, locked: c.opts.LockedCallers}
	c.seq++
	c.execute(r, x)
	c.execMu.Unlock()
	c.finished()
	return r.err
}

// Abort fails every pending and later operation at once, on this rank and,
// through the transport, on its peers. It does not wait for anything.
func (c *Comm) Abort() {
	c.fail(fmt.Errorf("%w by rank %d", ErrAborted, c.rank))
}

// Destroy waits for the operations already issued, then releases the
// communicator's connections and shared memory. Later calls fail with
// ErrDestroyed. Destroy after Abort returns promptly.
func (c *Comm) Destroy() error {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return fmt.Errorf("gocoll: destroy on rank %d: %w", c.rank, ErrDestroyed)
	}
	c.destroyed = true
	c.unusable.Store(true)
	close(c.queue)
	c.mu.Unlock()
	processDumps.remove(c)
	c.worker.Wait()
	c.execMu.Lock() // an inline call may still run
	c.execMu.Unlock()
	c.abort(ErrDestroyed)
	// MemAlloc'd memory stays valid: C or Python may still hold it.
	err := c.tr.Close()
	if c.arena != nil {
		err = errors.Join(err, c.arena.Close())
	}
	c.mu.Lock()
	rec := c.elastic.rec
	c.mu.Unlock()
	switch {
	case rec != nil:
		rec.Release() // closes the control links unless a shrunk child still answers through them
	case c.ctl != nil:
		c.ctl.Close()
	}
	if c.elastic.keep != nil {
		c.elastic.keep()
	}
	return err
}

// execCtx is what an algorithm sees: the transport, its deadline, and the
// identity of the collective for message headers.
type execCtx struct {
	c        *Comm
	deadline time.Duration   // since c.epoch
	ctxOnce  sync.Once       // helpers of one operation may ask at once
	ctx      context.Context // made on first use by context()
	cancel   context.CancelFunc
	op       string
	seq      uint64
	sig      uint64
	algo     string // for logs and metrics
	bytes    int
	locked   bool // running on the caller's goroutine, locked to its thread (Options.LockedCallers)

	// For the flight recorder: the peer waited on now, plus one (0: none,
	// so that a new context starts with none without an atomic store:
	// waitedOn), and the ring slot and operation number (recorder.begin).
	peer  atomic.Int32
	slot  int
	slotN uint64

	lctx lightCtx // light's
}

func (x *execCtx) header(step int, n int) transport.Header {
	return transport.Header{Kind: transport.KindData, Seq: x.seq, Sig: x.sig, Step: uint32(step), Len: uint64(n)}
}

// context is the operation's deadline and the communicator's abort, as a
// context the transports can watch. It is made on first use: the
// shared-memory path never needs one (see light).
//
// It is not marked shmsync.WithLocked even for a locked caller: the
// transports are waited on by the executor's goroutines (its streams, the
// control tree's receives), which are not locked, and a wait marked locked
// yields with bare sched_yield, keeping its P from the goroutines that
// would make progress (through the C ABI, marking it nearly doubled a
// 2-rank 4 KiB ring allreduce over the shared-memory rings). Only the
// control tree's control messages go out from the caller's own goroutine,
// where a wait's runtime.Gosched costs a little more.
func (x *execCtx) context() context.Context {
	x.ctxOnce.Do(func() {
		x.ctx, x.cancel = context.WithDeadline(x.c.abortCtx, x.c.epoch.Add(x.deadline))
	})
	return x.ctx
}

// light is a context for waits that only poll Err and Deadline (the
// shared-memory path): it costs no timer and no allocation (it lives in x:
// a lightCtx value boxed into the interface would be allocated per call).
func (x *execCtx) light() context.Context {
	x.lctx = lightCtx{x.c.abortCtx, x.c.epoch, x.deadline}
	return &x.lctx
}

type lightCtx struct {
	context.Context               // the communicator's abort context: Done, Value
	epoch           time.Time     // the communicator's
	deadline        time.Duration // since epoch
}

func (l lightCtx) Deadline() (time.Time, bool) { return l.epoch.Add(l.deadline), true }

func (l lightCtx) Err() error {
	if err := l.Context.Err(); err != nil {
		return err
	}
	if time.Since(l.epoch) >= l.deadline { // (monotonic clock only)
		return context.DeadlineExceeded
	}
	return nil
}

// The executor's link (exec.Link): the operation's messages over the
// communicator's transport, with its deadline, flight record and errors.

func (x *execCtx) Rank() int { return x.c.rank }
func (x *execCtx) Size() int { return x.c.size }

func (x *execCtx) Send(peer, step int, data []byte) error {
	return x.sendHeader(peer, x.header(step, len(data)), data)
}

func (x *execCtx) Recv(peer, step int, buf []byte) error {
	return x.recvHeader(peer, x.header(step, len(buf)), buf)
}

func (x *execCtx) CheckStep(peer, step int, h transport.Header) error {
	return wrapPeer(peer, transport.Check(peer, x.header(step, int(h.Len)), h), x.c.opts.Timeout)
}

func (x *execCtx) PeerError(peer int, err error) error { return &peerError{peer: peer, err: err} }

// Stop cancels the operation's context (made first if no call has).
func (x *execCtx) Stop() {
	x.context()
	x.cancel()
}

func (x *execCtx) Locked() bool     { return x.locked }
func (x *execCtx) Pool() *exec.Pool { return &x.c.pool }

func (x *execCtx) sendHeader(peer int, h transport.Header, data []byte) error {
	x.waitingFor(peer)
	return wrapPeer(peer, x.c.tr.Send(x.context(), peer, h, data), x.c.opts.Timeout)
}

func (x *execCtx) recvHeader(peer int, want transport.Header, buf []byte) error {
	x.waitingFor(peer)
	return wrapPeer(peer, x.c.tr.Recv(x.context(), peer, want, buf), x.c.opts.Timeout)
}

// RecvVar receives the next message of this collective from peer, whatever
// its step and length, into a buffer of the communicator's pool (block
// mode and the control tree; the caller gives it back).
func (x *execCtx) RecvVar(peer int) (transport.Header, []byte, error) {
	v, ok := x.c.tr.(transport.VarReceiver)
	if !ok {
		return transport.Header{}, nil, fmt.Errorf("%w: this transport cannot receive messages of unknown length", ErrInvalidUsage)
	}
	x.waitingFor(peer)
	h, buf, err := v.RecvVar(x.context(), peer, x.header(0, 0), func(n int) ([]byte, error) { return x.c.pool.Get(n), nil })
	return h, buf, wrapPeer(peer, err, x.c.opts.Timeout)
}

// call identifies the collective to the shared-memory path, which checks
// that every rank runs the same one.
func (x *execCtx) call() shmcoll.Call {
	return shmcoll.Call{Seq: x.seq, Sig: x.sig, Locked: x.locked}
}

// shm turns a deadline in the shared-memory path into ErrTimeout.
func (x *execCtx) shm(err error) error {
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w after %v: %w", ErrTimeout, x.c.opts.Timeout, err)
	}
	return err
}

// Buf returns buffer i (0..3) of n bytes, owned by the worker goroutine
// and reused between operations so that steady-state collectives allocate
// nothing.
func (x *execCtx) Buf(i, n int) []byte {
	if cap(x.c.scratch[i]) < n {
		x.c.scratch[i] = make([]byte, n)
	}
	return x.c.scratch[i][:n]
}
