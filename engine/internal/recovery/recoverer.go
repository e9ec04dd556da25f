package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/gocoll/gocoll/engine/agree"
)

// ErrTimeout: a wait of the recovery passed its deadline. engine's
// ErrTimeout is this error, so that errors.Is holds either way.
var ErrTimeout = errors.New("timed out")

// Config is what a Recoverer knows of its communicator.
type Config struct {
	Rank, Size int
	Log        *slog.Logger
	// Timeout is how long a member may stay silent when waited for (twice
	// that for the coordinator), and each exchange round's bound.
	Timeout time.Duration
	// Majority: an agreement needs more than half the members (else
	// ErrNoQuorum); otherwise the live ones suffice.
	Majority bool
	Net      Net
	// Now is the clock silences and stalls are judged by; nil is
	// time.Now (tests set their own, to stall a member deterministically).
	Now func() time.Time
}

// Bound is how long a Shrink may take in all: 8 timeouts. Crashed ranks
// cost no timeout (their connections close); each silent rank costs one,
// or two when it was the coordinator, and a silent first few coordinators
// in a row is already far-fetched.
func Bound(timeout time.Duration) time.Duration {
	return min(timeout, math.MaxInt64/8) * 8
}

// Recoverer is a communicator's recovery state, made on first use: the
// agreement instances run so far (each member numbers them alike, so an
// instance is the same on every member) and what the control mesh said.
// Its goroutine answers peers from then on, also for instances this rank
// finished: a member that missed a decision, or one that was left out,
// learns it from any member still here.
type Recoverer struct {
	rank, size int
	log        *slog.Logger
	timeout    time.Duration
	majority   bool
	net        Net
	now        func() time.Time
	base       uint64     // agree.BaseOf the members 0..size-1, which every instance has
	shrinkMu   sync.Mutex // one Shrink (or Grow) at a time
	inst       uint64     // the next instance (shrinkMu)
	excluded   error      // ErrExcluded once an agreement left this rank out (shrinkMu)

	mu      sync.Mutex
	changed chan struct{}
	nodes   map[uint64]*agree.Node
	pending map[uint64][]Event    // messages of instances not begun here
	blobs   map[blobKey][]byte    // exchange contributions, at the root
	tables  map[blobKey][]byte    // exchange tables (packTable), from the parent
	gaveUp  map[uint64]*LostError // setups a member gave up, by instance, and on whom
	down    map[int]string        // peers whose control link broke, and how
	dead    map[int]bool          // of those, the ones whose process ended (transport.Died)
	suspect map[int]bool          // peers an agreement took for failed
	// stalledPast: this process stalled for the timeout or longer since
	// its last decided agreement; see stalled.
	stalledPast bool
	judged      time.Time // when the loop last judged silences (checkSilence)
	heard       map[int]time.Time
	since       map[uint64]map[int]time.Time
	joiners     []*Conn    // processes waiting to join (Grow)
	watches     []*upWatch // setups to end when a member goes down (WhileUp)
	refs        int        // holders: c, and each communicator shrunk from it
	stop        context.CancelFunc
	done        chan struct{}
}

type blobKey struct {
	inst  uint64
	round int
	from  int
}

// New starts a recoverer over cfg.Net: from now on it answers peers,
// until every holder released it (Release, Hold).
func New(cfg Config) *Recoverer {
	ctx, stop := context.WithCancel(context.Background())
	s := &Recoverer{rank: cfg.Rank, size: cfg.Size, log: cfg.Log, timeout: cfg.Timeout, majority: cfg.Majority,
		net: cfg.Net, now: cfg.Now, base: agree.BaseOf(ranks(cfg.Size)), changed: make(chan struct{}, 1),
		nodes: map[uint64]*agree.Node{}, pending: map[uint64][]Event{}, blobs: map[blobKey][]byte{},
		tables: map[blobKey][]byte{}, gaveUp: map[uint64]*LostError{}, down: map[int]string{}, dead: map[int]bool{}, suspect: map[int]bool{}, heard: map[int]time.Time{}, since: map[uint64]map[int]time.Time{},
		refs: 1, stop: stop, done: make(chan struct{})}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	go s.loop(ctx)
	return s
}

// Lock makes the caller the one Shrink or Grow of the communicator under
// way (Unlock ends it); Inst, NextInst, Excluded and SetExcluded want it
// held, and so do Agree and the exchanges, through their callers.
func (s *Recoverer) Lock()   { s.shrinkMu.Lock() }
func (s *Recoverer) Unlock() { s.shrinkMu.Unlock() }

// Inst is the instance the next Agree runs: a setup between two
// agreements is numbered by the one that confirms it.
func (s *Recoverer) Inst() uint64 { return s.inst }

// NextInst takes an instance number for a Grow: every member numbers it
// alike, whatever fails on it alone afterwards.
func (s *Recoverer) NextInst() uint64 {
	inst := s.inst
	s.inst++
	return inst
}

// Excluded is why this rank is out, once an agreement left it out or it
// gave up a setup (SetExcluded); nil while it is in.
func (s *Recoverer) Excluded() error { return s.excluded }

// SetExcluded records that this rank is out: a later Shrink must say so
// rather than run agreements of its own.
func (s *Recoverer) SetExcluded(err error) { s.excluded = err }

// Failed is the peers this rank knows failed so far: those whose control
// link broke and those an agreement took for failed, in no order.
func (s *Recoverer) Failed() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for p := range s.down {
		out = append(out, p)
	}
	for p := range s.suspect {
		if _, ok := s.down[p]; !ok {
			out = append(out, p)
		}
	}
	return out
}

// Hold is one more holder of s (a communicator shrunk from it): s keeps
// answering until every holder released it.
func (s *Recoverer) Hold() func() {
	s.mu.Lock()
	s.refs++
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(s.Release) }
}

func (s *Recoverer) Release() {
	s.mu.Lock()
	s.refs--
	last := s.refs == 0
	s.mu.Unlock()
	if last {
		s.stop()
		<-s.done
		s.net.Close()
		for _, j := range s.joiners {
			j.Close()
		}
	}
}

func (s *Recoverer) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// tick is how often silences are checked.
func (s *Recoverer) tick() time.Duration {
	return min(max(s.timeout/20, 5*time.Millisecond), 500*time.Millisecond)
}

// loop handles control events as they come and, between them, gives up
// on peers silent past the timeout. Every event already queued is handled
// before silences are judged: a rank whose own process stalled (a pause,
// a long stall) finds its peers' answers queued when it resumes, and must
// not take them for silent. A stall of this rank's own — an iteration
// that came far later than the tick — is not counted against its peers
// either: their silence clocks move on by it (stalled).
func (s *Recoverer) loop(ctx context.Context) {
	defer close(s.done)
	last := s.now()
	for {
		tctx, cancel := context.WithTimeout(ctx, s.tick())
		ev, err := s.net.Next(tctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := s.now()
		s.mu.Lock()
		if gap := now.Sub(last); gap > s.stallGap() {
			s.stalled(gap)
		}
		// Silences are judged when the loop woke for its tick, or a tick
		// after the last judgement: a coordinator that hears from its N
		// members one by one would otherwise list whom it waits for
		// (N log N) after each of them.
		judge := err != nil || now.Sub(s.judged) >= s.tick()
		for err == nil {
			s.handle(ev)
			ev, err = s.net.Next(expired)
		}
		if judge {
			s.checkSilence()
			s.judged = now
		}
		s.checkWatchesLocked()
		s.mu.Unlock()
		last = s.now()
		s.notify()
	}
}

// expired is a context already done: next with it returns what is queued,
// without waiting.
var expired = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// stallGap is the gap between two iterations of the loop (each waits at
// most a tick) past which this process is taken to have stalled.
func (s *Recoverer) stallGap() time.Duration {
	return 4*s.tick() + 250*time.Millisecond
}

// stalled moves every silence clock on by gap, a stall of this process:
// a peer is judged by how long it was silent while this rank ran. Called
// with mu held.
//
// A stall of the timeout or longer may have been long enough for the
// others to agree without this rank and close their control meshes, too
// late for their goodbyes to reach it: their listeners then refuse it as
// a dead process's would. Until its next decided agreement, such a rank
// takes a peer's closed connection or refused dial for down, not dead: a
// majority of the job still has to answer it, so a zombie cannot agree a
// view of its own (chaos seed 3034).
func (s *Recoverer) stalled(gap time.Duration) {
	s.log.Warn("recovery: this process stalled; peers' silences restart", "stalled_ms", gap.Milliseconds())
	if gap >= s.timeout {
		s.stalledPast = true
	}
	for _, m := range s.since {
		for p, t0 := range m {
			m[p] = t0.Add(gap)
		}
	}
	for p, h := range s.heard {
		s.heard[p] = h.Add(gap)
	}
}

// handle takes one control event. Called with mu held.
func (s *Recoverer) handle(ev Event) {
	switch {
	case ev.conn != nil:
		s.joiners = append(s.joiners, ev.conn)
	case ev.down:
		if _, ok := s.down[ev.from]; !ok {
			s.down[ev.from] = ev.why
		}
		dead := ev.dead && !s.stalledPast
		if dead {
			s.dead[ev.from] = true
		}
		for inst, n := range s.nodes {
			if dead {
				s.sendAll(inst, n.Dead(ev.from))
			} else {
				s.sendAll(inst, n.Down(ev.from))
			}
		}
	case ev.msg.Agree != nil:
		s.heard[ev.from] = s.now()
		n := s.nodes[ev.msg.Inst]
		if n == nil && s.suspect[ev.from] {
			// A rank left out, asking in an agreement the others will
			// never run: tell it at once.
			s.net.Send(ev.from, Msg{Inst: ev.msg.Inst, Agree: &agree.Msg{Kind: agree.Excluded, Base: s.base}})
			return
		}
		if n == nil {
			s.pending[ev.msg.Inst] = append(s.pending[ev.msg.Inst], ev)
			return
		}
		s.recv(ev.msg.Inst, n, ev.from, *ev.msg.Agree)
	case ev.msg.Lost != 0:
		s.heard[ev.from] = s.now()
		if s.gaveUp[ev.msg.Inst] == nil {
			s.gaveUp[ev.msg.Inst] = &LostError{Peer: ev.msg.Lost - 1, Why: fmt.Sprintf("%s (as rank %d found)", ev.msg.Why, ev.from)}
		}
	case ev.msg.Round != 0 && ev.msg.Table != nil:
		s.heard[ev.from] = s.now()
		s.tables[blobKey{ev.msg.Inst, ev.msg.Round, ev.from}] = ev.msg.Table
	case ev.msg.Round != 0:
		s.heard[ev.from] = s.now()
		s.blobs[blobKey{ev.msg.Inst, ev.msg.Round, ev.from}] = ev.msg.Blob
	}
}

// checkSilence gives up on peers an unfinished agreement waited for
// longer than the timeout (twice that for a member waiting on its
// coordinator, which may itself be waiting on a silent member). Called
// with mu held.
func (s *Recoverer) checkSilence() {
	now := s.now()
	for inst, n := range s.nodes {
		if n.Done() {
			delete(s.since, inst)
			continue
		}
		limit := s.timeout
		if !n.Leading() {
			limit *= 2
		}
		old := s.since[inst]
		cur := map[int]time.Time{}
		for _, p := range n.Waiting() {
			t0, ok := old[p]
			if !ok {
				t0 = now
			}
			cur[p] = t0
			if h := s.heard[p]; h.After(t0) {
				t0 = h
			}
			if now.Sub(t0) > limit {
				s.suspect[p] = true
				s.log.Warn("recovery: a rank stayed silent past the timeout: taking it for failed", "peer", p, "timeout", limit)
				s.sendAll(inst, n.Down(p))
			}
		}
		s.since[inst] = cur
	}
}

// pruneBefore drops the agreements, and the messages parked for them,
// that no member can still need once this rank starts instance inst
// (called with mu held). Every member of a view took part in the
// agreement that confirmed it, so a member still in an older instance
// lags by one at most: the last two are kept to answer it. Messages
// parked for an instance below inst belong to one this rank will never
// run (it ran or skipped it): a member left behind there learns its fate
// from the others' Excluded answers (handle), not from these.
func (s *Recoverer) pruneBefore(inst uint64) {
	for k := range s.nodes {
		if k+2 < inst {
			delete(s.nodes, k)
			delete(s.since, k)
		}
	}
	for k := range s.pending {
		if k < inst {
			delete(s.pending, k)
		}
	}
}

// recv hands instance inst's node an agreement message from peer from,
// unless the node refuses it (agree.Node.Check: a view against another
// member list, or malformed), which is logged and dropped, as if lost.
// Called with mu held.
func (s *Recoverer) recv(inst uint64, n *agree.Node, from int, m agree.Msg) {
	if err := n.Check(from, m); err != nil {
		s.log.Warn("recovery: refused an agreement message", "rank", s.rank, "peer", from, "instance", inst, "err", err)
		return
	}
	s.sendAll(inst, n.Recv(from, m))
}

func (s *Recoverer) sendAll(inst uint64, outs []agree.Out) {
	for _, o := range outs {
		m := o.Msg
		s.net.Send(o.To, Msg{Inst: inst, Agree: &m})
	}
}

// Agree runs the next agreement instance from suspects and returns the
// decided view.
func (s *Recoverer) Agree(ctx context.Context, suspects []int) ([]int, error) {
	inst := s.inst
	s.inst++
	members := ranks(s.size)
	s.mu.Lock()
	for p := range s.down {
		suspects = append(suspects, p)
	}
	for p := range s.suspect {
		suspects = append(suspects, p)
	}
	n, err := agree.New(s.rank, members, suspects)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if s.majority {
		n.SetMajority()
	}
	var dead []int
	for p := range s.dead {
		dead = append(dead, p)
	}
	n.SetDead(dead)
	s.nodes[inst] = n
	s.pruneBefore(inst)
	s.sendAll(inst, n.Start())
	for _, ev := range s.pending[inst] {
		s.recv(inst, n, ev.from, *ev.msg.Agree)
	}
	delete(s.pending, inst)
	s.mu.Unlock()
	err = s.await(ctx, func() bool { return n.Done() })
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%w: the agreement on the surviving ranks did not finish within %v (waiting for ranks %v): %w", ErrTimeout, Bound(s.timeout), n.Waiting(), err)
	}
	for _, p := range n.Suspects() {
		s.suspect[p] = true
	}
	view, err := n.Result()
	if errors.Is(err, agree.ErrExcluded) {
		s.excluded = err
	}
	if err != nil {
		return nil, err
	}
	s.stalledPast = false // the others answered it since
	return view, nil
}

// ranks is 0..size-1: the members of every agreement instance.
func ranks(size int) []int {
	r := make([]int, max(size, 0))
	for i := range r {
		r[i] = i
	}
	return r
}

// await waits until done() holds (checked with mu held) or ctx ends.
func (s *Recoverer) await(ctx context.Context, done func() bool) error {
	for {
		s.mu.Lock()
		ok := done()
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-s.changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// GaveUpOn tells the other members of view that this rank gave up the
// setup of instance inst because of member p (this rank itself when none
// is to blame), so that none waits out a timeout on this rank or on p:
// each agrees again without p.
func (s *Recoverer) GaveUpOn(inst uint64, view []int, p int, err error) {
	if p < 0 {
		p = s.rank
	}
	for _, q := range view {
		if q != s.rank && q != p {
			s.net.Send(q, Msg{Inst: inst, Lost: p + 1, Why: err.Error()})
		}
	}
}
