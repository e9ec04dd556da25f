package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gocoll/gocoll/engine/agree"
	"github.com/gocoll/gocoll/engine/internal/recovery"
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
		for _, p := range s.Failed() {
			set[p] = true
		}
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
	s.Lock()
	defer s.Unlock()
	if err := s.Excluded(); err != nil {
		return nil, c.shrinkError(err)
	}
	c.mu.Lock()
	shrunk := c.elastic.shrunk
	c.mu.Unlock()
	if shrunk {
		// The others are done with this communicator: an agreement run
		// now would be this rank's alone.
		return nil, fmt.Errorf("gocoll: shrink on rank %d: %w: this communicator was shrunk already (shrink the communicator it gave)", c.rank, ErrInvalidUsage)
	}
	if _, err := c.shrinkQuorum(); err != nil {
		return nil, c.shrinkError(err)
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
	view, err := s.Agree(ctx, suspects)
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
		inst := s.Inst()
		l, sp, cerr := c.split.shrunk(c, s, inst, view, newRank, opts, ctx)
		if cerr == nil && c.opts.hooks.crashAt(c.rank, "connected") {
			l.close()
			return nil, c.crashForTest()
		}
		if cerr != nil {
			p := culprit(cerr, view)
			s.GaveUpOn(inst, view, p, cerr)
			if p < 0 || p == c.rank {
				// The others go on without this rank (gaveUpOn told them):
				// it is out, and a later Shrink of c must say so rather
				// than run agreements of its own.
				s.SetExcluded(fmt.Errorf("%w: this rank gave up setting up the shrunk communicator: %v", ErrExcluded, cerr))
				return nil, c.shrinkError(cerr)
			}
			c.log.Info("shrink: a rank failed while connecting; agreeing again", "peer", p, "err", cerr)
			suspects = append(suspects, p)
		}
		// Whether every member connected is itself agreed on: a member
		// that lost a peer in the last setup round must not be the only
		// one to start over.
		var again []int
		again, err = s.Agree(ctx, append(suspects, outside(c.size, view)...))
		s.Forget(inst)
		if err == nil && cerr == nil && slices.Equal(again, view) {
			child, err := adopt(newRank, len(view), l, sp, opts)
			if err != nil {
				return nil, err
			}
			child.elastic.keep = s.Hold()
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

// shrinkBound is how long a Shrink may take in all (recovery.Bound).
func (c *Comm) shrinkBound() time.Duration { return recovery.Bound(c.opts.Timeout) }

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
	c.ctl.Crash()
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

// recovery starts c's recovery state if it was not yet.
func (c *Comm) recovery() (*recovery.Recoverer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.elastic.rec != nil {
		return c.elastic.rec, nil
	}
	if c.ctl == nil {
		return nil, fmt.Errorf("gocoll: rank %d: %w: this communicator has no control links (made by an older setup path)", c.rank, ErrInvalidUsage)
	}
	// An unknown quorum fails each Shrink (shrinkQuorum), before it agrees.
	q, _ := c.shrinkQuorum()
	c.elastic.rec = recovery.New(recovery.Config{Rank: c.rank, Size: c.size, Log: c.log, Timeout: c.opts.Timeout,
		Majority: q != "live", Net: c.ctl})
	return c.elastic.rec, nil
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

func (s *netSplitter) shrunk(c *Comm, rec *recovery.Recoverer, inst uint64, view []int, newRank int, opts Options, ctx context.Context) (links, splitter, error) {
	tag := shrunkTag(s.tag, inst, view)
	// A member found down meanwhile, or one that gave this setup up, ends
	// it at once, naming whom (a dial to it would otherwise retry until
	// the shrink's deadline).
	ctx, stop := rec.WhileUp(ctx, inst, view)
	defer stop()
	// Members of view, in c's ranks, are mapped to view's in connect's
	// errors: name the rank of c.
	l, err := connect(ctx, newRank, len(view), tag, s.secret, s.host, rec.Exchange(inst, view), opts)
	if err != nil {
		var lost *recovery.LostError
		if cause := context.Cause(ctx); errors.As(cause, &lost) {
			err = fmt.Errorf("%w (setting up the shrunk communicator: %v)", cause, err)
		}
		return links{}, nil, err
	}
	return l, &netSplitter{secret: s.secret, tag: tag, host: s.host}, nil
}

// culprit is the rank of the shrinking communicator that err, from
// setting up view's links, blames; -1 if none. The control mesh names
// ranks of that communicator, the new transport ranks of view.
func culprit(err error, view []int) int {
	var cl *recovery.LostError
	if errors.As(err, &cl) {
		return cl.Peer
	}
	if p := failedRank(err); p >= 0 && p < len(view) {
		return view[p]
	}
	return -1
}

func (s *localSplitter) shrunk(c *Comm, rec *recovery.Recoverer, inst uint64, view []int, newRank int, _ Options, ctx context.Context) (links, splitter, error) {
	ch := s.hub.child(fmt.Sprintf("shrink/%d/%v", inst, view), len(view))
	// Every member must have taken its part before any uses it: that is
	// what the exchange of the net path checks too.
	if _, err := rec.Exchange(inst, view)(ctx, nil); err != nil {
		return links{}, nil, err
	}
	return links{tr: ch.world.Endpoint(newRank), hosts: restrictHosts(c.layout.hosts, view), id: ch.id, ctl: ch.ctl.Member(newRank)}, ch, nil
}

// elasticState is a communicator's part in recovery, guarded by its mu.
type elasticState struct {
	rec     *recovery.Recoverer // recovery state, from the first Shrink or Grow
	revoked bool                // Revoke was called
	leftOut []int               // the ranks a Shrink of this communicator left out
	shrunk  bool                // a Shrink of this communicator succeeded
	// How long the last Shrink took to agree, and in all: for the figures
	// in docs/elastic.md.
	shrinkTook [2]time.Duration
	keep       func() // releases the recovery state of the communicator this one was shrunk from
}
