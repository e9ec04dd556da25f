package vppu

import (
	"fmt"
	"hash/fnv"
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

// RecoverOptions tell Recover where the caller stands.
type RecoverOptions struct {
	// Step is how many steps this rank's shared state has completed: the
	// registered shared buffers hold the state after Step steps. Ranks
	// may differ by one (a step whose reduction reached some ranks and
	// not others); all end at the highest.
	Step uint64
	// MinRanks is the fewest processes the job may go on with; fewer
	// make Recover fail with ErrTooFewRanks on every rank (0: any).
	MinRanks int
	// Place places the devices on the new parent explicitly; nil keeps
	// every surviving device where it is and spreads the others (see
	// Rebalance).
	Place Place
	// Rebuild fills a device's own buffer (registered with Register, not
	// shared) that cannot be copied: its process died, or this rank is a
	// step behind. It must be a pure function of (device, name, step),
	// e.g. a random state seeded by (seed, device, step). Nil: such a
	// buffer makes Recover fail with ErrStateLost.
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
}

// recoverDesc is what a rank tells the others at the start of a recovery
// (encodeRecover).
type recoverDesc struct {
	Logical uint64
	M       int
	Step    uint64
	Local   []int
	Shared  map[string]int   // name → size
	Own     []map[string]int // per local device, name → size
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
// A failure during the recovery (another death) returns an error on every
// rank within the engine's timeout; the caller shrinks again and calls
// Recover again on the smaller communicator, which works from the state
// left (a recovery changes buffers only once every transfer arrived).
func (c *Comm) Recover(newParent *engine.Comm, opts RecoverOptions) (Recovery, error) {
	if newParent == nil {
		return Recovery{}, fmt.Errorf("vppu: recover: %w: nil communicator", engine.ErrInvalidArgument)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return Recovery{}, fmt.Errorf("vppu: recover on rank %d: %w: communicator destroyed", newParent.Rank(), engine.ErrInvalidArgument)
	}
	prev := c.last
	for _, sub := range c.subs {
		if sub != nil {
			sub.Revoke() // calls waiting on a dead process return now
		}
	}
	c.mu.Unlock()
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
// is the joiner's side of their Recover, with the same options. It may
// receive devices (by the balance or opts.Place) and their state.
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

// Rebalance is the placement Recover chooses on n processes when devices
// were on owner (owner[v] a process of the new communicator, or -1 for a
// lost device): each process ends with ⌊M/n⌋ or ⌈M/n⌉ devices, the
// larger share going to the processes that hold most already (lowest
// first); each process keeps its lowest devices up to its share, and the
// rest, lost devices included, fill the processes below their share in
// rank order.
func Rebalance(owner []int, n int) Place {
	m := len(owner)
	count := make([]int, n)
	for _, r := range owner {
		if r >= 0 && r < n {
			count[r]++
		}
	}
	order := make([]int, n)
	for r := range order {
		order[r] = r
	}
	slices.SortStableFunc(order, func(a, b int) int { return count[b] - count[a] })
	share := make([]int, n)
	for i, r := range order {
		share[r] = m / n
		if i < m%n {
			share[r]++
		}
	}
	place := make(Place, m)
	held := make([]int, n)
	var homeless []int
	for v, r := range owner {
		if r >= 0 && r < n && held[r] < share[r] {
			place[v] = r
			held[r]++
		} else {
			homeless = append(homeless, v)
		}
	}
	r := 0
	for _, v := range homeless {
		for held[r] >= share[r] {
			r++
		}
		place[v] = r
		held[r]++
	}
	return place
}

func logicalHash(l Logical) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, l.String())
	return h.Sum64()
}

// recover runs the recovery; joined says c holds no state of its own.
func (c *Comm) recover(np *engine.Comm, opts RecoverOptions, joined bool) (Recovery, error) {
	n, me := np.Size(), np.Rank()
	if opts.MinRanks > 0 && n < opts.MinRanks {
		return Recovery{}, fmt.Errorf("%w: %d process(es), the job needs at least %d", ErrTooFewRanks, n, opts.MinRanks)
	}
	if opts.Place != nil {
		if err := checkPlace(np, c.logical.M, opts.Place); err != nil {
			return Recovery{}, err
		}
	}
	// What this rank holds.
	c.mu.Lock()
	d := recoverDesc{Logical: logicalHash(c.logical), M: c.logical.M, Step: opts.Step, Shared: map[string]int{}}
	if !joined {
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
	}
	alloc := c.alloc
	c.mu.Unlock()
	descs, err := gatherDescs(np, d)
	if err != nil {
		return Recovery{}, err
	}
	// Every rank decides the same from the same descriptions.
	m := c.logical.M
	owner := make([]int, m)
	for v := range owner {
		owner[v] = -1
	}
	own := make([]map[string]int, m)
	src, step := -1, uint64(0) // the first rank holding the most advanced state
	for r, x := range descs {
		if x.Logical != d.Logical || x.M != m {
			return Recovery{}, fmt.Errorf("%w: rank %d has another virtual topology", engine.ErrInvalidArgument, r)
		}
		if len(x.Own) != len(x.Local) {
			return Recovery{}, fmt.Errorf("rank %d sent a damaged description", r)
		}
		for k, v := range x.Local {
			if v < 0 || v >= m {
				return Recovery{}, fmt.Errorf("%w: rank %d hosts device %d of %d", engine.ErrInvalidArgument, r, v, m)
			}
			// A device two ranks claim (a migration that a death cut
			// short after some ranks switched to the new placement)
			// stays with the lower: both hold its state.
			if owner[v] < 0 {
				owner[v], own[v] = r, x.Own[k]
			}
		}
		if len(x.Local) > 0 && (src < 0 || x.Step > step) {
			src, step = r, x.Step
		}
	}
	if src < 0 {
		return Recovery{}, fmt.Errorf("%w: no process left holds any device", ErrStateLost)
	}
	rec := Recovery{Step: step}
	var template map[string]int // a lost device's own buffers: those of the lowest live device
	for v := range m {
		if owner[v] < 0 {
			rec.Lost = append(rec.Lost, v)
		} else if template == nil {
			template = own[v]
		}
	}
	for r, x := range descs {
		if len(x.Local) == 0 {
			continue
		}
		if x.Step+1 < step {
			return Recovery{}, fmt.Errorf("%w: rank %d is at step %d, rank %d at %d: more than one step apart", engine.ErrInvalidArgument, r, x.Step, src, step)
		}
		if x.Step < step {
			rec.Behind = append(rec.Behind, r)
		}
		if !equalSizes(x.Shared, descs[src].Shared) {
			return Recovery{}, fmt.Errorf("%w: rank %d's shared buffers differ from rank %d's", engine.ErrInvalidArgument, r, src)
		}
	}
	place := opts.Place
	if place == nil {
		place = Rebalance(owner, n)
	}
	rec.Place = slices.Clone(place)
	needsRebuild := func(v int) bool { return owner[v] < 0 || slices.Contains(rec.Behind, owner[v]) }
	if opts.Rebuild == nil {
		for v := range m {
			if needsRebuild(v) && len(template) > 0 && (owner[v] < 0 || len(own[v]) > 0) {
				return Recovery{}, fmt.Errorf("%w: device %d's own buffers %v cannot be copied (its process died or is a step behind) and no Rebuild was given: register them shared or rebuild them from (seed, device, step)", ErrStateLost, v, sortedKeys(template))
			}
		}
	}
	// The transfers, in the same order on every rank: the shared state to
	// each new host without it (or a step behind), then the own buffers of
	// live devices that change process.
	type xfer struct {
		dev      int // -1: shared
		name     string
		size     int
		from, to int
	}
	var xs []xfer
	sharedNames := sortedKeys(descs[src].Shared)
	for r := range n {
		if !slices.Contains(place, r) {
			continue
		}
		x := descs[r]
		if len(x.Local) > 0 && x.Step == step {
			continue
		}
		for _, name := range sharedNames {
			xs = append(xs, xfer{-1, name, descs[src].Shared[name], src, r})
		}
	}
	for v := range m {
		if owner[v] < 0 || owner[v] == place[v] || needsRebuild(v) {
			continue
		}
		for _, name := range sortedKeys(own[v]) {
			xs = append(xs, xfer{v, name, own[v][name], owner[v], place[v]})
		}
	}
	// Post every transfer, then wait: nothing registered changes until all
	// arrived, so a failure here leaves the state as it was.
	c.mu.Lock()
	sharedNow := c.shared
	bufsNow := c.bufs
	c.mu.Unlock()
	var reqs []*engine.Request
	arrivedShared := map[string][]byte{}
	arrived := map[int]map[string][]byte{}
	for _, x := range xs {
		rec.Bytes += int64(x.size)
		switch {
		case x.from == me:
			buf := sharedNow[x.name]
			if x.dev >= 0 {
				buf = bufsNow[x.dev][x.name]
			}
			if x.size == 0 {
				continue
			}
			r, err := np.ISend(buf, x.size, engine.Uint8, x.to)
			if err != nil {
				return rec, fmt.Errorf("device %d buffer %q to rank %d: %w", x.dev, x.name, x.to, err)
			}
			reqs = append(reqs, r)
		case x.to == me:
			buf, err := alloc(max(x.dev, 0), x.name, x.size)
			if err != nil || len(buf) != x.size {
				return rec, fmt.Errorf("buffer %q: allocating %d bytes: %v", x.name, x.size, err)
			}
			if x.dev < 0 {
				arrivedShared[x.name] = buf
			} else {
				put(arrived, x.dev, x.name, buf)
			}
			if x.size == 0 {
				continue
			}
			r, err := np.IRecv(buf, x.size, engine.Uint8, x.from)
			if err != nil {
				return rec, fmt.Errorf("device %d buffer %q from rank %d: %w", x.dev, x.name, x.from, err)
			}
			reqs = append(reqs, r)
		}
	}
	if err := waitAll(reqs); err != nil {
		return rec, err
	}
	// Own buffers that cannot be copied are rebuilt at the agreed step.
	rebuilt := map[int]map[string][]byte{}
	for v := range m {
		if place[v] != me || !needsRebuild(v) {
			continue
		}
		names := template
		if owner[v] >= 0 {
			names = own[v]
		}
		for _, name := range sortedKeys(names) {
			buf := bufsNow[v][name]
			if owner[v] != me {
				if buf, err = alloc(v, name, names[name]); err != nil || len(buf) != names[name] {
					return rec, fmt.Errorf("device %d buffer %q: allocating %d bytes: %v", v, name, names[name], err)
				}
			}
			if err := opts.Rebuild(v, name, buf, step); err != nil {
				return rec, fmt.Errorf("rebuilding device %d buffer %q at step %d: %w", v, name, step, err)
			}
			put(rebuilt, v, name, buf)
		}
	}
	// Commit: the new parent, the arrived state, the new placement.
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, b := range arrivedShared {
		if old, ok := c.shared[name]; ok && len(old) == len(b) {
			copy(old, b) // the caller's registered buffer stays valid
		} else {
			c.shared[name] = b
		}
	}
	for v, bs := range arrived {
		c.bufs[v] = bs
	}
	for v, bs := range rebuilt {
		c.bufs[v] = bs
	}
	for _, sub := range c.subs {
		if sub != nil {
			sub.Destroy() // on the old parent: its errors tell nothing new
		}
	}
	c.parent, c.subs, c.broken, c.last = np, map[string]*engine.Comm{}, nil, nil
	// remap splits the new parent: every rank reaches it, or all failed
	// above on the same transfer error.
	if err := c.remap(place); err != nil {
		c.broken = err
		return rec, err
	}
	return rec, nil
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

func equalSizes(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
