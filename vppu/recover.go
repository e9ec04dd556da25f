package vppu

import (
	"fmt"
	"hash/fnv"
	"maps"
	"slices"

	"github.com/gocoll/gocoll/engine"
)

// ErrTooFewRanks is returned by Recover when the new parent communicator
// has fewer processes than RecoverOptions.MinRanks. It is an
// engine.ErrInvalidUsage (the C library's gocollInvalidUsage).
var ErrTooFewRanks = fmt.Errorf("%w: too few processes left", engine.ErrInvalidUsage)

// ErrStateLost is returned by Recover when a lost device's state cannot
// be restored: every process that held the shared state is gone, or a
// device's own (non-shared) buffers died with it and no Rebuild was given.
// It is an engine.ErrInvalidUsage.
var ErrStateLost = fmt.Errorf("%w: virtual device state lost", engine.ErrInvalidUsage)

// ErrJoinRefused is returned by Join on a joining process whose virtual
// topology, device count, Place or MinRanks differ from the members':
// the members refuse it (Recovery.Refused) and go on without it. It is an
// engine.ErrInvalidArgument.
var ErrJoinRefused = fmt.Errorf("%w: joining process refused", engine.ErrInvalidArgument)

// RecoverOptions tell Recover where the caller stands.
type RecoverOptions struct {
	// Step is how many steps this rank's shared state has completed: the
	// registered shared buffers hold the state after Step steps. Ranks
	// may differ by one (a step whose reduction reached some ranks and
	// not others); all end at the highest.
	Step uint64
	// MinRanks is the fewest processes the job may go on with; fewer
	// make Recover fail with ErrTooFewRanks on every rank (0: any).
	// Every rank passes the same (checked).
	MinRanks int
	// Place places the devices on the new parent explicitly; nil keeps
	// every surviving device where it is and spreads the others (see
	// Rebalance). Every rank passes the same (checked).
	Place Place
	// Rebuild fills a device's own buffer (registered with Register, not
	// shared) that cannot be copied: its process died, or this rank is a
	// step behind. It must be a pure function of (device, name, step),
	// e.g. a random state seeded by (seed, device, step). Nil: such a
	// buffer placed on this rank makes Recover fail with ErrStateLost.
	Rebuild func(dev int, name string, buf []byte, step uint64) error
	// Alloc allocates the buffers arriving at a joining process (Join
	// only; a Comm uses its SetAlloc). Nil: Go memory.
	Alloc func(dev int, name string, n int) ([]byte, error)
}

// Recovery says what Recover did; it is the same on every rank.
type Recovery struct {
	Step   uint64 // the step every rank is at now
	Lost   []int  // devices whose process was gone, now on survivors
	Behind []int  // new-parent ranks that were a step behind and got the state ahead
	Place  Place  // the placement on the new parent
	Bytes  int64  // registered bytes sent between processes
	// Refused lists the joining processes (ranks of the new parent) the
	// members refused: they host no device and leave (their Join fails
	// with ErrJoinRefused). The new parent still counts them: shrink it
	// without them (engine.Comm.Shrink(Refused)) and Recover onto that
	// before the next collective of the parent itself.
	Refused []int
}

// Recover moves the virtual devices onto newParent, a communicator made
// from the old parent by Shrink or Grow (or any communicator of the
// processes that go on), after some processes died or joined. It is a
// collective of newParent: every surviving rank calls c.Recover, every
// joining process calls Join.
//
// The surviving devices stay on their process (unless opts.Place or the
// balance says otherwise); a device whose process died goes to a
// survivor. Its shared state (RegisterShared) is already there, or is sent
// from a live holder; its own buffers (Register) are rebuilt by
// opts.Rebuild or the recovery fails with ErrStateLost. The step in
// flight is settled without an undo log: every rank ends at the highest
// step any holder of the state reached (that holder's shared buffers are
// copied over those of the ranks a step behind); if none completed it,
// all are before it and redo it. Calls pending on the old parent are
// revoked first.
//
// Plan, stage, agree, commit: every rank computes the same plan from the
// ranks' descriptions (planRecovery); stages it (the transfers and
// rebuilds into fresh buffers, the split of the new hosting ranks),
// changing nothing registered; all-gathers whether it staged its part;
// and commits (copies into the registered buffers, a step that does no
// I/O and cannot fail) only if every rank did. So this rank's buffers
// and placement change if and only if Recover returns nil here. A
// failure (another death, a Rebuild or an allocation that failed
// anywhere) leaves them as they were on every rank that took part in the
// final all-gather; the caller shrinks again and calls Recover again on
// the smaller communicator, which redoes it all from that state (a
// failure after the plan revokes newParent, so every rank of it leaves
// what it waits on). A rank that dies during that last all-gather may
// leave some ranks committed and others not; the committed ones are then
// at the settled step and the others where they were, at most one step
// behind it, and each caller's Step says which (it advanced only where
// Recover returned nil). The others revoked newParent and the new
// hosting ranks' communicator, so the committed ones fail at their next
// call, and the retry settles the difference like any step in flight.
func (c *Comm) Recover(newParent *engine.Comm, opts RecoverOptions) (Recovery, error) {
	if newParent == nil {
		return Recovery{}, fmt.Errorf("vppu: recover: %w: nil communicator", engine.ErrInvalidArgument)
	}
	prev, err := c.startChange("recover", true)
	if err != nil {
		return Recovery{}, err
	}
	defer c.endChange()
	c.mu.Lock()
	subs := slices.Collect(maps.Values(c.subs))
	c.mu.Unlock()
	for _, sub := range subs {
		if sub != nil {
			sub.Revoke() // calls waiting on a dead process return now
		}
	}
	if prev != nil {
		prev.Wait() // its error went to its caller
	}
	rec, err := c.recover(newParent, opts, false)
	if err != nil {
		return rec, fmt.Errorf("vppu: recover on rank %d: %w", newParent.Rank(), err)
	}
	return rec, nil
}

// Join makes a process that joined the job (engine.Join, then every
// member's Grow) a part of the virtual communicator of the members: it
// is the joiner's side of their Recover, with the same Place and
// MinRanks (a joiner that differs from the members, or runs another
// topology or device count, is refused: ErrJoinRefused, and the members
// go on). It may receive devices (by the balance or opts.Place) and
// their state.
func Join(newParent *engine.Comm, l Logical, opts RecoverOptions) (*Comm, Recovery, error) {
	if newParent == nil {
		return nil, Recovery{}, fmt.Errorf("vppu: join: %w: nil communicator", engine.ErrInvalidArgument)
	}
	c := &Comm{parent: newParent, logical: l, bufs: map[int]map[string][]byte{}, shared: map[string][]byte{}, subs: map[string]*engine.Comm{}}
	c.alloc = func(_ int, _ string, n int) ([]byte, error) { return make([]byte, n), nil }
	if opts.Alloc != nil {
		c.alloc = opts.Alloc
	}
	rec, err := c.recover(newParent, opts, true)
	if err != nil {
		return nil, rec, fmt.Errorf("vppu: join on rank %d: %w", newParent.Rank(), err)
	}
	return c, rec, nil
}

func logicalHash(l Logical) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, l.String())
	return h.Sum64()
}

// recover plans, stages, agrees and commits a recovery onto np; joined
// says c holds no state of its own.
func (c *Comm) recover(np *engine.Comm, opts RecoverOptions, joined bool) (Recovery, error) {
	d, h, alloc := c.describe(opts, joined)
	descs, err := gatherDescs(np, d)
	if err != nil {
		return Recovery{}, err
	}
	// Every rank decides the same from the same descriptions: a refusal
	// happens everywhere, before anything moves.
	p, err := planRecovery(descs)
	if err != nil {
		return Recovery{}, err
	}
	st := stage(np, p, h, alloc, opts.Rebuild)
	if err := agreeStaged(np, st.err); err != nil {
		st.discard()
		// Ranks that committed (the all-gather completed there) fail at
		// their next call on np too, and every rank shrinks it again.
		np.Revoke()
		return p.Recovery, err
	}
	if slices.Contains(p.Refused, np.Rank()) {
		st.discard()
		return p.Recovery, fmt.Errorf("%w: its topology or options differ from the members' (%s)", ErrJoinRefused, differs(descs[slices.IndexFunc(descs, func(x recoverDesc) bool { return !x.Joined })], d))
	}
	old, err := c.commit(np, p, st)
	if err != nil {
		st.discard()
		return p.Recovery, err
	}
	_ = destroyAll(old) // the old parent's: their errors tell nothing new
	return p.Recovery, nil
}

// describe is this rank's description, the buffers its sends will read,
// and how it allocates arriving buffers.
func (c *Comm) describe(opts RecoverOptions, joined bool) (recoverDesc, holds, func(int, string, int) ([]byte, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := recoverDesc{Logical: logicalHash(c.logical), M: c.logical.M, Step: opts.Step, Joined: joined,
		Rebuild: opts.Rebuild != nil, MinRanks: opts.MinRanks, Shared: map[string]int{}}
	if opts.Place != nil {
		d.Place = slices.Clone([]int(opts.Place))
	}
	if joined {
		d.Step = 0 // a joiner's Step tells nothing
		return d, holds{}, c.alloc
	}
	d.Local = slices.Clone(c.local)
	for name, b := range c.shared {
		d.Shared[name] = len(b)
	}
	for _, v := range c.local {
		own := map[string]int{}
		for name, b := range c.bufs[v] {
			own[name] = len(b)
		}
		d.Own = append(d.Own, own)
	}
	return d, c.snapshot(), c.alloc
}

// gatherDescs all-gathers every rank's description (encodeRecover).
func gatherDescs(np *engine.Comm, d recoverDesc) ([]recoverDesc, error) {
	blobs, err := allGatherBlobs(np, encodeRecover(d))
	if err != nil {
		return nil, err
	}
	out := make([]recoverDesc, len(blobs))
	for r, b := range blobs {
		if out[r], err = decodeRecover(b); err != nil {
			return nil, fmt.Errorf("rank %d sent a damaged description: %w", r, err)
		}
	}
	return out, nil
}

// staged is this rank's part of a recovery, done but not committed: the
// buffers that arrived or were rebuilt, and the new hosting ranks'
// sub-communicator.
type staged struct {
	got     arrivals
	rebuilt map[int]map[string][]byte
	view    view
	sub     *engine.Comm
	err     error // the first local failure; nil: all staged
}

// stage carries out this rank's part of plan p on np without changing
// anything registered. It goes through every collective step even after
// a failure (a split that other ranks enter must be entered here too),
// and records the failure for the agreement.
func stage(np *engine.Comm, p recoveryPlan, h holds, alloc func(int, string, int) ([]byte, error),
	rebuildFn func(dev int, name string, buf []byte, step uint64) error) *staged {
	me := np.Rank()
	st := &staged{rebuilt: map[int]map[string][]byte{}, view: newView(p.Place, me)}
	st.got, st.err = exchange(np, me, p.Transfers, h.source, alloc)
	for _, b := range p.Rebuilds {
		if b.Rank != me || st.err != nil {
			continue
		}
		buf, err := alloc(b.Dev, b.Name, b.Size)
		if err != nil || len(buf) != b.Size {
			st.err = fmt.Errorf("device %d buffer %q: allocating %d bytes: %v", b.Dev, b.Name, b.Size, err)
			break
		}
		if err := rebuildFn(b.Dev, b.Name, buf, p.Step); err != nil {
			st.err = fmt.Errorf("rebuilding device %d buffer %q at step %d: %w", b.Dev, b.Name, p.Step, err)
			break
		}
		put(st.rebuilt, b.Dev, b.Name, buf)
	}
	sub, err := splitHosts(np, st.view)
	if err != nil && st.err == nil {
		st.err = fmt.Errorf("splitting the hosting ranks: %w", err)
	}
	st.sub = sub
	return st
}

// discard drops what was staged: the new sub-communicator is revoked
// (ranks that committed and use it fail at once, and recover again) and
// destroyed.
func (st *staged) discard() {
	if st.sub != nil {
		st.sub.Revoke()
		_ = st.sub.Destroy()
		st.sub = nil
	}
}

// agreeStaged all-gathers whether every rank staged its part (an empty
// message) or why not, and fails unless all did: the all-or-nothing step
// of the commit. A failure here (a rank dying in it) leaves the
// all-gather done on some ranks only; see Recover for what follows.
func agreeStaged(np *engine.Comm, mine error) error {
	var msg []byte
	if mine != nil {
		msg = []byte(mine.Error())
		if len(msg) == 0 {
			msg = []byte("failed")
		}
	}
	all, err := allGatherBlobs(np, msg)
	if err != nil {
		if mine != nil {
			return mine
		}
		return fmt.Errorf("agreeing on the commit: %w", err)
	}
	if mine != nil {
		return mine
	}
	for r, m := range all {
		if len(m) > 0 {
			return fmt.Errorf("%w: rank %d could not do its part of the recovery, so no rank committed it: %s", engine.ErrRemoteAbort, r, m)
		}
	}
	return nil
}

// commit makes the staged recovery current: the arrived and rebuilt
// buffers (copied into the caller's registered buffer of the same name
// and size, which stays valid; installed otherwise), the new parent and
// placement. It does no I/O and, once the communicator is known to be
// open, cannot fail. It returns the old parent's sub-communicators for
// the caller to destroy.
func (c *Comm) commit(np *engine.Comm, p recoveryPlan, st *staged) ([]*engine.Comm, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("%w: communicator destroyed during the recovery", engine.ErrInvalidArgument)
	}
	for name, b := range st.got.shared {
		if cur, ok := c.shared[name]; ok && len(cur) == len(b) {
			copy(cur, b)
		} else {
			c.shared[name] = b
		}
	}
	for _, bufs := range []map[int]map[string][]byte{st.got.own, st.rebuilt} {
		for v, bs := range bufs {
			for name, b := range bs {
				if cur, ok := c.bufs[v][name]; ok && len(cur) == len(b) {
					copy(cur, b)
				} else {
					put(c.bufs, v, name, b)
				}
			}
		}
	}
	old := c.takeSubs()
	c.parent, c.broken, c.last = np, nil, nil
	c.subs[st.view.key] = st.sub
	c.install(st.view, st.sub)
	st.sub = nil // the communicator's now
	return old, nil
}
