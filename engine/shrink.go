package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gocoll/gocoll/engine/agree"
	"github.com/gocoll/gocoll/engine/transport"
)

var (
	// ErrRevoked: the communicator was revoked (Revoke), on this rank or
	// on a peer; it can still be shrunk.
	ErrRevoked = errors.New("communicator revoked")
	// ErrExcluded: the other ranks agreed on a new communicator without
	// this one (they took it for failed: stopped, or too slow, past the
	// timeout). It cannot rejoin that communicator's epoch.
	ErrExcluded = agree.ErrExcluded
	// ErrNoQuorum: with Options.ShrinkQuorum "majority", no more than half
	// the ranks could be reached; nothing was decided.
	ErrNoQuorum = agree.ErrNoQuorum
)

// Revoke fails every pending and later operation of the communicator, on
// this rank and (through the transport, as an abort) on every peer, with
// an error wrapping ErrRevoked. It does not wait; calling it again does
// nothing. The communicator stays usable as a parent: Shrink, Failed,
// Destroy.
func (c *Comm) Revoke() {
	c.mu.Lock()
	c.elastic.revoked = true
	c.mu.Unlock()
	c.fail(fmt.Errorf("%w by rank %d", ErrRevoked, c.rank))
}

// revokedBy turns a peer's revocation, which arrives as its abort, into
// an error that is also an ErrRevoked.
func revokedBy(err error) error {
	var rae *transport.RemoteAbortError
	if errors.As(err, &rae) && strings.HasPrefix(rae.Reason, ErrRevoked.Error()) && !errors.Is(err, ErrRevoked) {
		return fmt.Errorf("%w (by rank %d): %w", ErrRevoked, rae.Peer, err)
	}
	return err
}

// Failed lists the ranks this rank knows failed, ascending. After a
// Shrink of c, the ranks it left out (as agreed: the same on every rank
// that went on); before, the ranks whose connection broke or that a
// Shrink found dead or silent so far. Ranks that merely aborted or
// revoked are not among them.
func (c *Comm) Failed() []int {
	c.mu.Lock()
	if c.elastic.shrunk {
		defer c.mu.Unlock()
		return append([]int{}, c.elastic.leftOut...)
	}
	set := map[int]bool{}
	if p := lostRank(c.asyncErr); p >= 0 {
		set[p] = true
	}
	s := c.elastic.rec
	c.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		for p := range s.down {
			set[p] = true
		}
		for p := range s.suspect {
			set[p] = true
		}
		s.mu.Unlock()
	}
	delete(set, c.rank)
	out := []int{}
	for p := range set {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// lostRank is the rank err says went away (not one that aborted), or -1.
func lostRank(err error) int {
	var lost *transport.PeerLostError
	if errors.As(err, &lost) {
		return lost.Peer
	}
	return -1
}

// Shrink makes a communicator of the ranks of c that go on, renumbered
// 0, 1, … in their order in c. Every such rank calls it; a rank it leaves
// out gets ErrExcluded if it calls it.
//
// With exclude nil, the ranks agree among themselves which ranks failed
// (see docs/elastic.md): those whose connection broke or that stay silent
// past the timeout. Otherwise exclude lists the ranks of c to leave out
// (they do not call Shrink); every caller should pass the same list, and
// ranks found dead on the way are left out too.
//
// It works on a failed or revoked communicator (it talks over the
// communicator's control links, not its transport), and a rank dying
// during it costs one more round. Each wait is bounded by the
// communicator's timeout; the whole call by shrinkBound, then an
// ErrTimeout. c itself is left as it was: destroy it when done.
func (c *Comm) Shrink(exclude []int) (*Comm, error) { return c.ShrinkWith(exclude, c.opts) }

// ShrinkWith is Shrink, the new communicator having opts (defaults
// filled in) instead of c's (the C ABI's config). The agreement itself
// follows c's timeout.
func (c *Comm) ShrinkWith(exclude []int, opts Options) (*Comm, error) {
	opts = opts.withDefaults()
	if err := c.CheckExclude(exclude); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return nil, fmt.Errorf("gocoll: shrink on rank %d: %w", c.rank, ErrDestroyed)
	}
	c.mu.Unlock()
	s, err := c.recovery()
	if err != nil {
		return nil, err
	}
	s.shrinkMu.Lock()
	defer s.shrinkMu.Unlock()
	if s.excluded != nil {
		return nil, c.shrinkError(s.excluded)
	}
	c.mu.Lock()
	shrunk := c.elastic.shrunk
	c.mu.Unlock()
	if shrunk {
		// The others are done with this communicator: an agreement run
		// now would be this rank's alone.
		return nil, fmt.Errorf("gocoll: shrink on rank %d: %w: this communicator was shrunk already (shrink the communicator it gave)", c.rank, ErrInvalidUsage)
	}
	began := time.Now()
	deadline := began.Add(c.shrinkBound())
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()

	// The rank the communicator's own failure names is no suspect: the
	// rank that cut a connection may only have aborted (its peers see it
	// close while writing to it, as they would a crash), and the control
	// mesh tells a dead rank from a live one at the agreement's first
	// message to it (nobody listens).
	suspects := slices.Clone(exclude)
	c.log.Info("shrink", "exclude", exclude, "timeout", c.opts.Timeout)
	view, err := s.agree(ctx, suspects)
	for attempt := 1; ; attempt++ {
		if err != nil {
			return nil, c.shrinkError(err)
		}
		agreed := time.Now()
		c.log.Info("agreed", "view_size", len(view), "attempt", attempt)
		if c.opts.hooks.crashAt(c.rank, "agreed") {
			return nil, c.crashForTest()
		}
		newRank := slices.Index(view, c.rank)
		inst := s.inst
		l, sp, cerr := c.split.shrunk(c, s, inst, view, newRank, opts, ctx)
		if cerr == nil && c.opts.hooks.crashAt(c.rank, "connected") {
			l.close()
			return nil, c.crashForTest()
		}
		if cerr != nil {
			p := culprit(cerr, view)
			s.gaveUpOn(inst, view, p, cerr)
			if p < 0 || p == c.rank {
				// The others go on without this rank (gaveUpOn told them):
				// it is out, and a later Shrink of c must say so rather
				// than run agreements of its own.
				s.excluded = fmt.Errorf("%w: this rank gave up setting up the shrunk communicator: %v", ErrExcluded, cerr)
				return nil, c.shrinkError(cerr)
			}
			c.log.Info("shrink: a rank failed while connecting; agreeing again", "peer", p, "err", cerr)
			suspects = append(suspects, p)
		}
		// Whether every member connected is itself agreed on: a member
		// that lost a peer in the last setup round must not be the only
		// one to start over.
		var again []int
		again, err = s.agree(ctx, append(suspects, outside(c.size, view)...))
		s.forget(inst)
		if err == nil && cerr == nil && slices.Equal(again, view) {
			child, err := adopt(newRank, len(view), l, sp, opts)
			if err != nil {
				return nil, err
			}
			child.elastic.keep = s.hold()
			c.mu.Lock()
			c.elastic.leftOut, c.elastic.shrunk = outside(c.size, view), true
			c.elastic.shrinkTook = [2]time.Duration{agreed.Sub(began), time.Since(began)}
			c.mu.Unlock()
			c.log.Info("shrunk", "new_rank", newRank, "new_size", len(view), "left_out", c.elastic.leftOut, "attempts", attempt,
				"agreed_ms", float64(agreed.Sub(began).Microseconds())/1e3, "total_ms", float64(time.Since(began).Microseconds())/1e3)
			return child, nil
		}
		if cerr == nil {
			l.close()
		}
		view = again
	}
}

// shrinkQuorum is Options.ShrinkQuorum, checked.
func (c *Comm) shrinkQuorum() (string, error) {
	switch q := strings.ToLower(c.opts.ShrinkQuorum); q {
	case "", "majority":
		return "majority", nil
	case "live":
		return q, nil
	}
	return "", invalidArg("Options.ShrinkQuorum %q: want live or majority", c.opts.ShrinkQuorum)
}

// shrinkBound is how long a Shrink may take in all: 8 timeouts. Crashed
// ranks cost no timeout (their connections close); each silent rank costs
// one, or two when it was the coordinator, and a silent first few
// coordinators in a row is already far-fetched.
func (c *Comm) shrinkBound() time.Duration {
	return min(c.opts.Timeout, math.MaxInt64/8) * 8
}

// CheckExclude says what is wrong with exclude as Shrink's list, if
// anything (bindings check before they revoke).
func (c *Comm) CheckExclude(exclude []int) error {
	seen := map[int]bool{}
	for _, r := range exclude {
		switch {
		case r < 0 || r >= c.size:
			return invalidArg("shrink: exclude rank %d out of range [0, %d)", r, c.size)
		case seen[r]:
			return invalidArg("shrink: rank %d listed twice in exclude", r)
		case r == c.rank:
			return invalidArg("shrink: rank %d excludes itself (an excluded rank does not call Shrink)", r)
		}
		seen[r] = true
	}
	return nil
}

// crashForTest makes this rank look dead to the others (testHooks.shrink).
func (c *Comm) crashForTest() error {
	c.ctl.crash()
	c.Abort()
	c.tr.Close()
	return errors.New("crashed by the test")
}

func (c *Comm) shrinkError(err error) error {
	return fmt.Errorf("gocoll: shrink on rank %d: %w", c.rank, err)
}

// outside is the ranks of [0, n) not in view.
func outside(n int, view []int) []int {
	var out []int
	for r := 0; r < n; r++ {
		if !slices.Contains(view, r) {
			out = append(out, r)
		}
	}
	return out
}

// recoverer is a communicator's recovery state, made on first use: the
// agreement instances run so far (each member numbers them alike, so an
// instance is the same on every member) and what the control mesh said.
// Its goroutine answers peers from then on, also for instances this rank
// finished: a member that missed a decision, or one that was left out,
// learns it from any member still here.
type recoverer struct {
	c        *Comm
	net      ctlNet
	timeout  time.Duration
	shrinkMu sync.Mutex // one Shrink (or Grow) at a time
	inst     uint64     // the next instance (shrinkMu)
	excluded error      // ErrExcluded once an agreement left this rank out (shrinkMu)

	mu      sync.Mutex
	changed chan struct{}
	nodes   map[uint64]*agree.Node
	pending map[uint64][]ctlEvent    // messages of instances not begun here
	blobs   map[blobKey][]byte       // exchange contributions, at the root
	tables  map[blobKey][][]byte     // exchange results, from the root
	gaveUp  map[uint64]*ctlLostError // setups a member gave up, by instance, and on whom
	down    map[int]string           // peers whose control link broke, and how
	dead    map[int]bool             // of those, the ones whose process ended (transport.Died)
	suspect map[int]bool             // peers an agreement took for failed
	heard   map[int]time.Time
	since   map[uint64]map[int]time.Time
	joiners []*ctlConn // processes waiting to join (Grow)
	watches []*upWatch // setups to end when a member goes down (whileUp)
	refs    int        // holders: c, and each communicator shrunk from it
	stop    context.CancelFunc
	done    chan struct{}
}

type blobKey struct {
	inst  uint64
	round int
	from  int
}

// recovery starts c's recovery state if it was not yet.
func (c *Comm) recovery() (*recoverer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.elastic.rec != nil {
		return c.elastic.rec, nil
	}
	if c.ctl == nil {
		return nil, fmt.Errorf("gocoll: rank %d: %w: this communicator has no control links (made by an older setup path)", c.rank, ErrInvalidUsage)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &recoverer{c: c, net: c.ctl, timeout: c.opts.Timeout, changed: make(chan struct{}, 1),
		nodes: map[uint64]*agree.Node{}, pending: map[uint64][]ctlEvent{}, blobs: map[blobKey][]byte{},
		tables: map[blobKey][][]byte{}, gaveUp: map[uint64]*ctlLostError{}, down: map[int]string{}, dead: map[int]bool{}, suspect: map[int]bool{}, heard: map[int]time.Time{}, since: map[uint64]map[int]time.Time{},
		refs: 1, stop: stop, done: make(chan struct{})}
	c.elastic.rec = s
	go s.loop(ctx)
	return s, nil
}

// hold is one more holder of s (a communicator shrunk from it): s keeps
// answering until every holder released it.
func (s *recoverer) hold() func() {
	s.mu.Lock()
	s.refs++
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(s.release) }
}

func (s *recoverer) release() {
	s.mu.Lock()
	s.refs--
	last := s.refs == 0
	s.mu.Unlock()
	if last {
		s.stop()
		<-s.done
		s.net.close()
		for _, j := range s.joiners {
			j.Close()
		}
	}
}

func (s *recoverer) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// tick is how often silences are checked.
func (s *recoverer) tick() time.Duration {
	return min(max(s.timeout/20, 5*time.Millisecond), 500*time.Millisecond)
}

// loop handles control events as they come and, between them, gives up
// on peers silent past the timeout. Every event already queued is handled
// before silences are judged: a rank whose own process stalled (a pause,
// a long stall) finds its peers' answers queued when it resumes, and must
// not take them for silent. A stall of this rank's own — an iteration
// that came far later than the tick — is not counted against its peers
// either: their silence clocks move on by it (stalled).
func (s *recoverer) loop(ctx context.Context) {
	defer close(s.done)
	last := time.Now()
	for {
		tctx, cancel := context.WithTimeout(ctx, s.tick())
		ev, err := s.net.next(tctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		s.mu.Lock()
		if gap := now.Sub(last); gap > s.stallGap() {
			s.stalled(gap)
		}
		for err == nil {
			s.handle(ev)
			ev, err = s.net.next(expired)
		}
		s.checkSilence()
		s.checkWatchesLocked()
		s.mu.Unlock()
		last = time.Now()
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
func (s *recoverer) stallGap() time.Duration {
	return 4*s.tick() + 250*time.Millisecond
}

// stalled moves every silence clock on by gap, a stall of this process:
// a peer is judged by how long it was silent while this rank ran. Called
// with mu held.
func (s *recoverer) stalled(gap time.Duration) {
	s.c.log.Warn("recovery: this process stalled; peers' silences restart", "stalled_ms", gap.Milliseconds())
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
func (s *recoverer) handle(ev ctlEvent) {
	switch {
	case ev.conn != nil:
		s.joiners = append(s.joiners, ev.conn)
	case ev.down:
		if _, ok := s.down[ev.from]; !ok {
			s.down[ev.from] = ev.why
		}
		if ev.dead {
			s.dead[ev.from] = true
		}
		for inst, n := range s.nodes {
			if ev.dead {
				s.sendAll(inst, n.Dead(ev.from))
			} else {
				s.sendAll(inst, n.Down(ev.from))
			}
		}
	case ev.msg.Agree != nil:
		s.heard[ev.from] = time.Now()
		n := s.nodes[ev.msg.Inst]
		if n == nil && s.suspect[ev.from] {
			// A rank left out, asking in an agreement the others will
			// never run: tell it at once.
			s.net.send(ev.from, ctlMsg{Inst: ev.msg.Inst, Agree: &agree.Msg{Kind: agree.Excluded}})
			return
		}
		if n == nil {
			s.pending[ev.msg.Inst] = append(s.pending[ev.msg.Inst], ev)
			return
		}
		s.sendAll(ev.msg.Inst, n.Recv(ev.from, *ev.msg.Agree))
	case ev.msg.Lost != 0:
		s.heard[ev.from] = time.Now()
		if s.gaveUp[ev.msg.Inst] == nil {
			s.gaveUp[ev.msg.Inst] = &ctlLostError{peer: ev.msg.Lost - 1, why: fmt.Sprintf("%s (as rank %d found)", ev.msg.Why, ev.from)}
		}
	case ev.msg.Round != 0 && ev.msg.Table != nil:
		s.heard[ev.from] = time.Now()
		s.tables[blobKey{ev.msg.Inst, ev.msg.Round, ev.from}] = ev.msg.Table
	case ev.msg.Round != 0:
		s.heard[ev.from] = time.Now()
		s.blobs[blobKey{ev.msg.Inst, ev.msg.Round, ev.from}] = ev.msg.Blob
	}
}

// checkSilence gives up on peers an unfinished agreement waited for
// longer than the timeout (twice that for a member waiting on its
// coordinator, which may itself be waiting on a silent member). Called
// with mu held.
func (s *recoverer) checkSilence() {
	now := time.Now()
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
				s.c.log.Warn("recovery: a rank stayed silent past the timeout: taking it for failed", "peer", p, "timeout", limit)
				s.sendAll(inst, n.Down(p))
			}
		}
		s.since[inst] = cur
	}
}

func (s *recoverer) sendAll(inst uint64, outs []agree.Out) {
	for _, o := range outs {
		m := o.Msg
		s.net.send(o.To, ctlMsg{Inst: inst, Agree: &m})
	}
}

// agree runs the next agreement instance from suspects and returns the
// decided view.
func (s *recoverer) agree(ctx context.Context, suspects []int) ([]int, error) {
	inst := s.inst
	s.inst++
	members := make([]int, s.c.size)
	for i := range members {
		members[i] = i
	}
	s.mu.Lock()
	for p := range s.down {
		suspects = append(suspects, p)
	}
	for p := range s.suspect {
		suspects = append(suspects, p)
	}
	n, err := agree.New(s.c.rank, members, suspects)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if q, err := s.c.shrinkQuorum(); err != nil {
		s.mu.Unlock()
		return nil, err
	} else if q != "live" {
		n.SetMajority()
	}
	var dead []int
	for p := range s.dead {
		dead = append(dead, p)
	}
	n.SetDead(dead)
	s.nodes[inst] = n
	s.sendAll(inst, n.Start())
	for _, ev := range s.pending[inst] {
		s.sendAll(inst, n.Recv(ev.from, *ev.msg.Agree))
	}
	delete(s.pending, inst)
	s.mu.Unlock()
	err = s.await(ctx, func() bool { return n.Done() })
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%w: the agreement on the surviving ranks did not finish within %v (waiting for ranks %v): %w", ErrTimeout, s.c.shrinkBound(), n.Waiting(), err)
	}
	for _, p := range n.Suspects() {
		s.suspect[p] = true
	}
	view, err := n.Result()
	if errors.Is(err, ErrExcluded) {
		s.excluded = err
	}
	if err != nil {
		return nil, err
	}
	return view, nil
}

// await waits until done() holds (checked with mu held) or ctx ends.
func (s *recoverer) await(ctx context.Context, done func() bool) error {
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

// exchange is connect's exchange among view (ranks of c), over the
// control mesh, through the view's lowest rank (the new communicator's
// rank 0): every member sends it its blob, it sends every member the
// table of all. A star rather than every member to every other: each
// member dials one peer, not N-1 (the root dials N-1), and the mesh stays
// as sparse as the agreement's.
func (s *recoverer) exchange(inst uint64, view []int) exchangeFunc {
	round := 0
	return func(ctx context.Context, blob []byte) ([][]byte, error) {
		round++
		me, root := s.c.rank, view[0]
		// A member silent for a timeout is lost like a dead one: the
		// agreement that follows leaves it out.
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		if me != root {
			s.net.send(root, ctlMsg{Inst: inst, Round: round, Blob: blob})
			k := blobKey{inst, round, root}
			missing := func() int {
				if s.tables[k] == nil {
					return root
				}
				return -1
			}
			if err := s.awaitFrom(ctx, rctx, inst, []int{root}, missing); err != nil {
				return nil, err
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			t := s.tables[k]
			delete(s.tables, k)
			if len(t) != len(view) {
				return nil, &ctlLostError{peer: root, why: fmt.Sprintf("its setup table has %d entries for %d members", len(t), len(view))}
			}
			return t, nil
		}
		others := view[1:]
		missing := func() int {
			for _, p := range others {
				if _, ok := s.blobs[blobKey{inst, round, p}]; !ok {
					return p
				}
			}
			return -1
		}
		if err := s.awaitFrom(ctx, rctx, inst, others, missing); err != nil {
			return nil, err
		}
		s.mu.Lock()
		out := make([][]byte, len(view))
		out[0] = blob
		for i, p := range others {
			k := blobKey{inst, round, p}
			out[i+1] = s.blobs[k]
			delete(s.blobs, k)
		}
		s.mu.Unlock()
		for _, p := range others {
			s.net.send(p, ctlMsg{Inst: inst, Round: round, Table: out})
		}
		return out, nil
	}
}

// awaitFrom waits until missing() (called with mu held) finds no member
// of from still to answer, failing with a ctlLostError when one of from is
// down or suspected, when a member gave up instance inst's setup (naming
// whom it lost), or when rctx ends first (blaming the first that has not
// answered); ctx's end is the shrink's own.
func (s *recoverer) awaitFrom(ctx, rctx context.Context, inst uint64, from []int, missing func() int) error {
	lost, why := -1, ""
	err := s.await(rctx, func() bool {
		if g := s.gaveUp[inst]; g != nil {
			lost, why = g.peer, g.why
			return true
		}
		for _, p := range from {
			if w, ok := s.down[p]; ok {
				lost, why = p, w
				return true
			}
			if s.suspect[p] {
				lost, why = p, "taken for failed"
				return true
			}
		}
		return missing() < 0
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		s.mu.Lock()
		lost, why = missing(), fmt.Sprintf("no setup data from it within %v", s.timeout)
		s.mu.Unlock()
	}
	if lost >= 0 {
		return &ctlLostError{peer: lost, why: why}
	}
	return nil
}

// shrunkTag is the tag of the communicator shrunk from the one tagged tag
// in agreement instance inst to view: every member derives the same, and
// no connection of another epoch presents it.
func shrunkTag(tag [8]byte, inst uint64, view []int) [8]byte {
	b := append([]byte("gocoll-shrink\x00"), tag[:]...)
	b = binary.LittleEndian.AppendUint64(b, inst)
	for _, r := range view {
		b = binary.LittleEndian.AppendUint64(b, uint64(r))
	}
	sum := sha256.Sum256(b)
	var t [8]byte
	copy(t[:], sum[:])
	return t
}

func (s *netSplitter) shrunk(c *Comm, rec *recoverer, inst uint64, view []int, newRank int, opts Options, ctx context.Context) (links, splitter, error) {
	tag := shrunkTag(s.tag, inst, view)
	// A member found down meanwhile ends the setup at once, naming it (a
	// dial to it would otherwise retry until the shrink's deadline).
	ctx, stop := rec.whileUp(ctx, view)
	defer stop()
	// Members of view, in c's ranks, are mapped to view's in connect's
	// errors: name the rank of c.
	l, err := connect(ctx, newRank, len(view), tag, s.secret, s.host, rec.exchange(inst, view), opts)
	if err != nil {
		var lost *ctlLostError
		if cause := context.Cause(ctx); errors.As(cause, &lost) {
			err = fmt.Errorf("%w (setting up the shrunk communicator: %v)", cause, err)
		}
		return links{}, nil, err
	}
	return l, &netSplitter{secret: s.secret, tag: tag, host: s.host}, nil
}

// forget drops what the setup of instance inst left: it is over on every
// member once the agreement that confirms it decided.
func (s *recoverer) forget(inst uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.blobs {
		if k.inst == inst {
			delete(s.blobs, k)
		}
	}
	for k := range s.tables {
		if k.inst == inst {
			delete(s.tables, k)
		}
	}
	delete(s.gaveUp, inst)
}

// gaveUpOn tells the other members of view that this rank gave up the
// setup of instance inst because of member p (this rank itself when none
// is to blame), so that none waits out a timeout on this rank or on p:
// each agrees again without p.
func (s *recoverer) gaveUpOn(inst uint64, view []int, p int, err error) {
	if p < 0 {
		p = s.c.rank
	}
	for _, q := range view {
		if q != s.c.rank && q != p {
			s.net.send(q, ctlMsg{Inst: inst, Lost: p + 1, Why: err.Error()})
		}
	}
}

// whileUp is ctx, cancelled with a *ctlLostError as its cause when a
// member of view is found down or taken for failed.
func (s *recoverer) whileUp(ctx context.Context, view []int) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &upWatch{view: view, cancel: cancel}
	s.mu.Lock()
	s.watches = append(s.watches, w)
	s.checkWatchesLocked()
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		s.watches = slices.DeleteFunc(s.watches, func(x *upWatch) bool { return x == w })
		s.mu.Unlock()
		cancel(nil)
	}
}

// upWatch is a setup among view waiting on whileUp's context.
type upWatch struct {
	view   []int
	cancel context.CancelCauseFunc
}

// checkWatchesLocked cancels the setups whose view holds a member down or
// suspected. Called with mu held.
func (s *recoverer) checkWatchesLocked() {
	for _, w := range s.watches {
		for _, p := range w.view {
			if p == s.c.rank {
				continue
			}
			if why, ok := s.down[p]; ok {
				w.cancel(&ctlLostError{peer: p, why: why})
				break
			}
			if s.suspect[p] {
				w.cancel(&ctlLostError{peer: p, why: "taken for failed"})
				break
			}
		}
	}
}

// ctlLostError: a member of the view went away (or was taken for failed)
// while the new communicator was being set up. peer is a rank of the
// communicator being shrunk.
type ctlLostError struct {
	peer int
	why  string
}

func (e *ctlLostError) Error() string {
	return fmt.Sprintf("%v: rank %d: %s", ErrPeerLost, e.peer, e.why)
}
func (e *ctlLostError) Unwrap() error { return ErrPeerLost }

// culprit is the rank of the shrinking communicator that err, from
// setting up view's links, blames; -1 if none. The control mesh names
// ranks of that communicator, the new transport ranks of view.
func culprit(err error, view []int) int {
	var cl *ctlLostError
	if errors.As(err, &cl) {
		return cl.peer
	}
	if p := failedRank(err); p >= 0 && p < len(view) {
		return view[p]
	}
	return -1
}

func (s *localSplitter) shrunk(c *Comm, rec *recoverer, inst uint64, view []int, newRank int, _ Options, ctx context.Context) (links, splitter, error) {
	ch := s.hub.child(fmt.Sprintf("shrink/%d/%v", inst, view), len(view))
	// Every member must have taken its part before any uses it: that is
	// what the exchange of the net path checks too.
	if _, err := rec.exchange(inst, view)(ctx, nil); err != nil {
		return links{}, nil, err
	}
	return links{tr: ch.world.Endpoint(newRank), hosts: restrictHosts(c.layout.hosts, view), id: ch.id, ctl: localCtl{ch.ctl, newRank}}, ch, nil
}

// elasticState is a communicator's part in recovery, guarded by its mu.
type elasticState struct {
	rec     *recoverer // recovery state, from the first Shrink or Grow
	revoked bool       // Revoke was called
	leftOut []int      // the ranks a Shrink of this communicator left out
	shrunk  bool       // a Shrink of this communicator succeeded
	// How long the last Shrink took to agree, and in all: for the figures
	// in docs/elastic.md.
	shrinkTook [2]time.Duration
	keep       func() // releases the recovery state of the communicator this one was shrunk from
}
