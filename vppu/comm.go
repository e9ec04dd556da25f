package vppu

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/vppu/redist"
)

// Comm is a virtual communicator: M virtual devices with a logical
// topology, placed on ranks of a parent communicator, one or several per
// rank. A rank drives its local devices (Local, in increasing order)
// together: a collective takes one buffer per local device, slot k for
// device Local()[k].
//
// The results do not depend on the placement. Every reduction folds the M
// contributions of an element in device order, ((x0 op x1) op x2) … op
// x(M-1): the partial sums travel the devices in order, each rank folding
// in its own; Avg divides that sum by M once. Two placements, or a
// migration, move bytes differently but compute every element the same
// way.
//
// The collectives are the engine's virtual collectives
// (engine.Comm.VirtualAllReduceEach and its siblings, schedules of
// engine/sched/vcoll.go) run over a sub-communicator of the ranks that
// host devices (ranked by parent rank), in issue order like any of its
// calls; Migrate is a collective of the whole parent communicator.
type Comm struct {
	parent  *engine.Comm
	logical Logical
	alloc   func(dev int, name string, n int) ([]byte, error)

	mu       sync.Mutex
	place    Place
	local    []int                   // devices on this rank, increasing
	hosts    []int                   // parent ranks hosting devices, increasing = sub ranks
	devs     []int                   // device → its host's rank in sub
	sub      *engine.Comm            // nil when this rank hosts no device
	subs     map[string]*engine.Comm // every set of hosting ranks split so far
	bufs     map[int]map[string][]byte
	shared   map[string][]byte // state every local device holds alike, kept once (RegisterShared)
	last     *Request          // the last non-blocking call issued
	seq      uint64            // calls issued, for error messages
	broken   error             // set by a failed migration
	changing bool              // a migration or a recovery is in progress
	closed   bool
}

// ErrNoDevice is returned by a collective called on a rank that hosts no
// virtual device (it should leave, or wait for a migration that gives it
// some).
// It is an engine.ErrInvalidArgument.
var ErrNoDevice = fmt.Errorf("%w: this rank hosts no virtual device", engine.ErrInvalidArgument)

// New creates a virtual communicator of l.M devices on parent, device v on
// parent rank place[v]. It is a collective over parent: every rank calls
// it with the same l and place (checked).
func New(parent *engine.Comm, l Logical, place Place) (*Comm, error) {
	if parent == nil {
		return nil, fmt.Errorf("vppu: %w: nil parent communicator", engine.ErrInvalidArgument)
	}
	if err := checkPlace(parent, l.M, place); err != nil {
		return nil, err
	}
	c := &Comm{parent: parent, logical: l, bufs: map[int]map[string][]byte{}, shared: map[string][]byte{}, subs: map[string]*engine.Comm{}}
	c.alloc = func(_ int, _ string, n int) ([]byte, error) { return make([]byte, n), nil }
	if err := c.agree(l.String(), place); err != nil {
		return nil, fmt.Errorf("vppu: create on rank %d: %w", parent.Rank(), err)
	}
	if err := c.remap(place); err != nil {
		return nil, fmt.Errorf("vppu: create on rank %d: %w", parent.Rank(), err)
	}
	return c, nil
}

func checkPlace(parent *engine.Comm, m int, place Place) error {
	if m < 1 || len(place) != m {
		return fmt.Errorf("vppu: %w: placement of %d devices for %d virtual devices", engine.ErrInvalidArgument, len(place), m)
	}
	for v, r := range place {
		if r < 0 || r >= parent.Size() {
			return fmt.Errorf("vppu: %w: virtual device %d placed on rank %d of a %d-rank communicator", engine.ErrInvalidArgument, v, r, parent.Size())
		}
	}
	return nil
}

// agree fails on every rank unless every rank passed the same layout: a
// rank that thinks device 3 lives elsewhere would wait for messages
// nobody sends.
func (c *Comm) agree(logical string, place Place) error {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%v", logical, []int(place))
	mine := binary.LittleEndian.AppendUint64(nil, h.Sum64())
	all := make([]byte, 8*c.parent.Size())
	if err := c.parent.AllGather(mine, all, 8, engine.Uint8); err != nil {
		return err
	}
	for r := 0; r < c.parent.Size(); r++ {
		if !slices.Equal(all[8*r:8*r+8], mine) {
			return fmt.Errorf("%w: rank %d passed another topology or placement (this rank: %s on %v)", engine.ErrInvalidArgument, r, logical, place)
		}
	}
	return nil
}

// view is a placement made current: this rank's devices, the hosting
// ranks and the sub-communicator that joins them.
type view struct {
	place Place
	local []int // devices on this rank, increasing
	hosts []int // parent ranks hosting devices, increasing = sub ranks
	devs  []int // device → its host's rank in sub
	key   string
}

// newView is place seen from parent rank me.
func newView(place Place, me int) view {
	v := view{place: slices.Clone(place)}
	for d, r := range place {
		if r == me {
			v.local = append(v.local, d)
		}
		if !slices.Contains(v.hosts, r) {
			v.hosts = append(v.hosts, r)
		}
	}
	slices.Sort(v.hosts)
	v.devs = make([]int, len(place))
	for d, r := range place {
		v.devs[d], _ = slices.BinarySearch(v.hosts, r)
	}
	v.key = fmt.Sprint(v.hosts)
	return v
}

// splitHosts is the sub-communicator of v's hosting ranks, split from
// parent (a collective of parent): nil where this rank hosts nothing.
func splitHosts(parent *engine.Comm, v view) (*engine.Comm, error) {
	color := 0
	if len(v.local) == 0 {
		color = engine.SplitNoColor
	}
	return parent.Split(color, parent.Rank())
}

// remap makes place current: the sub-communicator of its hosting ranks
// (a collective of the parent) and this rank's device list. It holds no
// lock across the split.
func (c *Comm) remap(place Place) error {
	v := newView(place, c.parent.Rank())
	// A split costs tens of milliseconds (it sets up shared memory and
	// connections); the sub-communicator of a set of hosting ranks is
	// kept, so a job moving back and forth pays it once per set. Every
	// rank has seen the same placements, so all agree whether to split.
	c.mu.Lock()
	sub, seen := c.subs[v.key]
	c.mu.Unlock()
	if !seen {
		var err error
		if sub, err = splitHosts(c.parent, v); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.subs[v.key] = sub // nil where this rank hosts nothing
	c.install(v, sub)
	return nil
}

// install makes v current with its sub-communicator and drops the state
// of the devices that left. Called with c.mu held; it does no I/O.
func (c *Comm) install(v view, sub *engine.Comm) {
	me := c.parent.Rank()
	c.place, c.local, c.hosts, c.devs, c.sub = v.place, v.local, v.hosts, v.devs, sub
	for d := range c.bufs {
		if v.place[d] != me {
			delete(c.bufs, d)
		}
	}
	if len(v.local) == 0 {
		clear(c.shared)
	}
}

// SetAlloc replaces how Migrate allocates the buffers of devices arriving
// on this rank (default: Go memory). The C library uses it to hand out C
// memory that callers may keep.
func (c *Comm) SetAlloc(f func(dev int, name string, n int) ([]byte, error)) {
	c.mu.Lock()
	c.alloc = f
	c.mu.Unlock()
}

// Logical is the virtual topology.
func (c *Comm) Logical() Logical { return c.logical }

// Size is the number of virtual devices.
func (c *Comm) Size() int { return c.logical.M }

// Parent is the communicator the devices are placed on.
func (c *Comm) Parent() *engine.Comm { return c.parent }

// Place is the current placement: device v on parent rank Place()[v].
func (c *Comm) Place() Place {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.place)
}

// Local lists the devices on this rank, in increasing order: slot k of a
// collective's buffers belongs to device Local()[k].
func (c *Comm) Local() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.local)
}

// Tables are the routing tables of the current placement on the parent's
// topology (topology.ForPlacement of its hosts: a link per rank to its
// host's memory, a NIC per host).
func (c *Comm) Tables() (Tables, error) {
	g, err := topology.ForPlacement(c.parent.Hosts(), topology.DefaultParams())
	if err != nil {
		return Tables{}, err
	}
	return RoutingTables(c.logical, c.Place(), g)
}

// Register attaches buf to local device dev under name: Migrate moves it
// with the device. Registering a name again replaces the buffer.
func (c *Comm) Register(dev int, name string, buf []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.local, dev) {
		return fmt.Errorf("vppu: %w: register %q: device %d is not on rank %d", engine.ErrInvalidArgument, name, dev, c.parent.Rank())
	}
	if _, ok := c.shared[name]; ok {
		return fmt.Errorf("vppu: %w: register %q for device %d: the name is registered shared", engine.ErrInvalidArgument, name, dev)
	}
	if c.bufs[dev] == nil {
		c.bufs[dev] = map[string][]byte{}
	}
	c.bufs[dev][name] = buf
	return nil
}

// RegisterShared attaches buf to every local device under name, kept once
// on this rank: for state every device holds alike by construction
// (parameters, momentum, a step counter, updated the same way from the
// same allreduced gradients), so a rank keeps one copy and updates it
// once per step however many devices it hosts. Buffer and Buffers find it
// with every local device. Migrate sends one copy to each rank that hosts
// devices after the move and hosted none before (from the rank of the
// lowest device it receives); ranks that keep devices keep their copy,
// ranks left without devices drop it. Registering a name again replaces
// the buffer; a name is either shared or per device.
func (c *Comm) RegisterShared(name string, buf []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.local) == 0 {
		return fmt.Errorf("vppu: register shared %q on rank %d: %w", name, c.parent.Rank(), ErrNoDevice)
	}
	for _, v := range c.local {
		if _, ok := c.bufs[v][name]; ok {
			return fmt.Errorf("vppu: %w: register shared %q: device %d has a buffer of that name", engine.ErrInvalidArgument, name, v)
		}
	}
	c.shared[name] = buf
	return nil
}

// Buffer is the buffer registered as name with local device dev (after a
// migration, the one the device brought), or the rank's shared buffer of
// that name (RegisterShared).
func (c *Comm) Buffer(dev int, name string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.bufs[dev][name]; ok {
		return b, ok
	}
	if !slices.Contains(c.local, dev) {
		return nil, false
	}
	b, ok := c.shared[name]
	return b, ok
}

// Buffers lists the names registered with local device dev, its own and
// the shared ones, sorted.
func (c *Comm) Buffers(dev int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for n := range c.bufs[dev] {
		names = append(names, n)
	}
	if slices.Contains(c.local, dev) {
		for n := range c.shared {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// Request is a virtual collective in flight: the engine's request of the
// call on the sub-communicator, which the engine runs in issue order.
type Request = engine.Request

// call is what a collective needs of the communicator, read when it is
// issued (a migration may change the communicator's afterwards).
type call struct {
	name    string
	me      int          // parent rank
	sub     *engine.Comm // the hosting ranks
	place   Place        // device → parent rank
	local   []int        // this rank's devices, increasing
	devices []int        // device → its rank in sub
}

// begin checks that a collective may be issued now and returns its view
// of the communicator. Called with c.mu held.
func (c *Comm) begin(name string) (call, error) {
	me := c.parent.Rank()
	if c.closed {
		return call{}, fmt.Errorf("vppu: %s on rank %d: %w: communicator destroyed", name, me, engine.ErrInvalidArgument)
	}
	if c.broken != nil {
		return call{}, fmt.Errorf("vppu: %s on rank %d: unusable after a failed migration: %w", name, me, c.broken)
	}
	if c.changing {
		return call{}, fmt.Errorf("vppu: %s on rank %d: %w: a migration or recovery is in progress", name, me, engine.ErrInvalidUsage)
	}
	if len(c.local) == 0 {
		return call{}, fmt.Errorf("vppu: %s on rank %d: %w", name, me, ErrNoDevice)
	}
	return call{name: name, me: me, sub: c.sub, place: c.place, local: c.local, devices: c.devs}, nil
}

// wrap names the call and this rank's devices in err.
func (k call) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("vppu: %s on rank %d (devices %v): %w", k.name, k.me, k.local, err)
}

// blocking runs a blocking collective: the engine's blocking call, inline
// on the caller's goroutine once the requests issued before it are done.
func (c *Comm) blocking(name string, run func(k call) error) error {
	c.mu.Lock()
	k, err := c.begin(name)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return k.wrap(run(k))
}

// nonBlocking issues a non-blocking collective. Migrate, Recover and
// Destroy wait for the last one issued, and so for all of them: the
// engine runs a communicator's requests in order.
func (c *Comm) nonBlocking(name string, start func(k call) (*Request, error)) (*Request, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, err := c.begin(name)
	if err != nil {
		return nil, err
	}
	r, err := start(k)
	if err != nil {
		return nil, k.wrap(err)
	}
	c.last = r
	return r, nil
}

// rootBuf is device root's buffer among bufs (one per local device) on
// the root's rank, nil elsewhere.
func (k call) rootBuf(what string, bufs [][]byte, root int) ([]byte, error) {
	if root < 0 || root >= len(k.place) {
		return nil, fmt.Errorf("%w: root %d of %d virtual devices", engine.ErrInvalidArgument, root, len(k.place))
	}
	i := slices.Index(k.local, root)
	if i < 0 {
		return nil, nil
	}
	if len(bufs) != len(k.local) {
		return nil, fmt.Errorf("%w: %d %s buffers for %d local devices", engine.ErrInvalidArgument, len(bufs), what, len(k.local))
	}
	return bufs[i], nil
}

// Migrate moves the virtual devices to the placement to (device v onto
// parent rank to[v]): every buffer registered with a device that changes
// rank is sent to its new rank, the routing tables follow, and the
// collectives continue on the new ranks with the same results. It is a
// collective over the parent communicator: every parent rank calls it with
// the same placement, including ranks that host devices neither before nor
// after. Ranks left without devices return normally and may Destroy. A
// rank that fails or dies during the move makes every other rank's
// Migrate fail (within the engine's timeout); the communicator is then
// unusable. Collectives issued while it runs are refused.
func (c *Comm) Migrate(to Place) (err error) {
	if err := checkPlace(c.parent, c.logical.M, to); err != nil {
		return err
	}
	prev, err := c.startChange("migrate", false)
	if err != nil {
		return err
	}
	defer c.endChange()
	if prev != nil {
		prev.Wait() // its error went to its caller
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("vppu: migrate on rank %d: %w", c.parent.Rank(), err)
			c.mu.Lock()
			c.broken = err
			c.mu.Unlock()
		}
	}()
	if err := c.agree(c.logical.String(), to); err != nil {
		return err
	}
	if err := c.move(to); err != nil {
		return err
	}
	return c.remap(to)
}

// startChange marks a migration or a recovery in progress (what changes
// the placement, during which collectives are refused) and returns the
// last non-blocking call, for the caller to wait for. A broken
// communicator may only recover.
func (c *Comm) startChange(name string, mayBeBroken bool) (*Request, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	me := c.parent.Rank()
	switch {
	case c.closed:
		return nil, fmt.Errorf("vppu: %s on rank %d: %w: communicator destroyed", name, me, engine.ErrInvalidArgument)
	case c.broken != nil && !mayBeBroken:
		return nil, fmt.Errorf("vppu: %s on rank %d: %w: unusable after a failed migration: %v", name, me, engine.ErrInvalidArgument, c.broken)
	case c.changing:
		return nil, fmt.Errorf("vppu: %s on rank %d: %w: a migration or recovery is in progress", name, me, engine.ErrInvalidUsage)
	}
	c.changing = true
	return c.last, nil
}

func (c *Comm) endChange() {
	c.mu.Lock()
	c.changing = false
	c.mu.Unlock()
}

// holds is what a rank's registered buffers were when a migration or a
// recovery described them: the buffers its sends read.
type holds struct {
	own    map[int]map[string][]byte
	shared map[string][]byte
}

// snapshot copies the tables of the registered buffers (not their bytes).
// Called with c.mu held.
func (c *Comm) snapshot() holds {
	h := holds{own: map[int]map[string][]byte{}, shared: maps.Clone(c.shared)}
	for v, bs := range c.bufs {
		h.own[v] = maps.Clone(bs)
	}
	return h
}

// source is the buffer a transfer sends.
func (h holds) source(x transfer) []byte {
	if x.Shared {
		return h.shared[x.Name]
	}
	return h.own[x.Dev][x.Name]
}

// move sends the registered buffers of every device changing rank. First
// every rank learns every device's buffer names and sizes (each rank's
// list, encodeMoves, all-gathered over the parent; planMoves), then each
// buffer travels in one message (exchange). The shared buffers travel
// once to each rank that hosted no device before, with the lowest device
// it receives.
func (c *Comm) move(to Place) error {
	me := c.parent.Rank()
	c.mu.Lock()
	from := c.place
	var list []bufDesc
	for _, v := range c.local {
		if to[v] == me {
			continue
		}
		for _, name := range sortedNames(c.bufs[v]) {
			list = append(list, bufDesc{Dev: v, Name: name, Size: len(c.bufs[v][name])})
		}
		if carriesShared(from, to, v) {
			for _, name := range sortedNames(c.shared) {
				list = append(list, bufDesc{Dev: v, Name: name, Size: len(c.shared[name]), Shared: true})
			}
		}
	}
	h, alloc := c.snapshot(), c.alloc
	c.mu.Unlock()
	lists, err := allGatherBlobs(c.parent, encodeMoves(list))
	if err != nil {
		return err
	}
	xs, err := planMoves(lists, from, to)
	if err != nil {
		return err
	}
	got, err := exchange(c.parent, me, xs, h.source, alloc)
	if err != nil {
		return err
	}
	c.mu.Lock()
	for v, bs := range got.own {
		c.bufs[v] = bs
	}
	maps.Copy(c.shared, got.shared)
	c.mu.Unlock()
	return nil
}

// planMoves turns every rank's buffer list (lists[r], encodeMoves) into
// the transfers of a migration from one placement to another, in device
// then name order.
func planMoves(lists [][]byte, from, to Place) ([]transfer, error) {
	var xs []transfer
	for r, msg := range lists {
		ds, err := decodeMoves(msg)
		if err != nil {
			return nil, fmt.Errorf("rank %d sent a damaged buffer list: %w", r, err)
		}
		for _, d := range ds {
			if d.Dev >= len(to) || from[d.Dev] != r || (d.Shared && !carriesShared(from, to, d.Dev)) {
				return nil, fmt.Errorf("rank %d sent a damaged buffer list: device %d", r, d.Dev)
			}
			xs = append(xs, transfer{Dev: d.Dev, Name: d.Name, Size: d.Size, From: r, To: to[d.Dev], Shared: d.Shared})
		}
	}
	slices.SortStableFunc(xs, func(a, b transfer) int {
		if a.Dev != b.Dev {
			return cmp.Compare(a.Dev, b.Dev)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return xs, nil
}

// carriesShared says whether device v brings the shared buffers along
// when the devices move from one placement to another: it is the lowest
// device of a rank that hosted none before.
func carriesShared(from, to Place, v int) bool {
	dst := to[v]
	if slices.Contains(from, dst) {
		return false
	}
	return slices.Index(to, dst) == v
}

func sortedNames(m map[string][]byte) []string {
	var names []string
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Destroy waits for the calls in flight and frees the sub-communicators;
// the parent stays. Registered buffers are the caller's.
func (c *Comm) Destroy() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	last := c.last
	c.mu.Unlock()
	if last != nil {
		last.Wait()
	}
	c.mu.Lock()
	subs := c.takeSubs()
	c.mu.Unlock()
	return destroyAll(subs)
}

// takeSubs empties the table of sub-communicators and returns them, for
// the caller to destroy once it let go of c.mu (a destroy may wait).
// Called with c.mu held.
func (c *Comm) takeSubs() []*engine.Comm {
	var subs []*engine.Comm
	for _, sub := range c.subs {
		if sub != nil {
			subs = append(subs, sub)
		}
	}
	c.sub, c.subs = nil, map[string]*engine.Comm{}
	return subs
}

func destroyAll(subs []*engine.Comm) error {
	var errs []error
	for _, sub := range subs {
		errs = append(errs, sub.Destroy())
	}
	return errors.Join(errs...)
}

// AllReduce reduces count elements over the M devices into every device's
// recv (send[k] and recv[k] belong to device Local()[k]; they may be the
// same slice). Every element is folded over the devices in device order,
// ((x0 op x1) op x2) … op x(M-1), whatever the placement: the engine's
// virtual allreduce (engine.Comm.VirtualAllReduceEach) passes each chunk's
// partial sum along the devices in order, each rank folding in its own
// devices' contributions, so a rank's vectors are read where they are and
// its traffic is one vector's, however many devices it hosts.
//
// Send buffers that are views of one array, back to back in slot order,
// are read in place (otherwise they are copied together first). Every
// device gets the same result: recv slices may all be the same buffer
// (state replicated once per rank, see RegisterShared), which is then
// written once.
func (c *Comm) AllReduce(send, recv [][]byte, count int, dt engine.DataType, op engine.RedOp) error {
	return c.blocking("allreduce", func(k call) error {
		return k.sub.Virtual(k.devices).AllReduceEach(send, recv, count, dt, op)
	})
}

// IAllReduce is the non-blocking AllReduce. The buffers must stay
// untouched until the request finishes.
func (c *Comm) IAllReduce(send, recv [][]byte, count int, dt engine.DataType, op engine.RedOp) (*Request, error) {
	return c.nonBlocking("allreduce", func(k call) (*Request, error) {
		return k.sub.Virtual(k.devices).IAllReduceEach(send, recv, count, dt, op)
	})
}

// Reduce folds count elements over the M devices, in device order as
// AllReduce does, into recv of device root only (recv of the other
// devices may be nil).
func (c *Comm) Reduce(send, recv [][]byte, count int, dt engine.DataType, op engine.RedOp, root int) error {
	return c.blocking("reduce", func(k call) error {
		out, err := k.rootBuf("recv", recv, root)
		if err != nil {
			return err
		}
		return k.sub.Virtual(k.devices).Reduce(send, out, count, dt, op, root)
	})
}

// IReduce is the non-blocking Reduce.
func (c *Comm) IReduce(send, recv [][]byte, count int, dt engine.DataType, op engine.RedOp, root int) (*Request, error) {
	return c.nonBlocking("reduce", func(k call) (*Request, error) {
		out, err := k.rootBuf("recv", recv, root)
		if err != nil {
			return nil, err
		}
		return k.sub.Virtual(k.devices).IReduce(send, out, count, dt, op, root)
	})
}

// Broadcast copies count elements of device root's send into every
// device's recv (send of the other devices may be nil).
func (c *Comm) Broadcast(send, recv [][]byte, count int, dt engine.DataType, root int) error {
	return c.blocking("broadcast", func(k call) error {
		in, err := k.rootBuf("send", send, root)
		if err != nil {
			return err
		}
		return k.sub.Virtual(k.devices).Broadcast(in, recv, count, dt, root)
	})
}

// IBroadcast is the non-blocking Broadcast.
func (c *Comm) IBroadcast(send, recv [][]byte, count int, dt engine.DataType, root int) (*Request, error) {
	return c.nonBlocking("broadcast", func(k call) (*Request, error) {
		in, err := k.rootBuf("send", send, root)
		if err != nil {
			return nil, err
		}
		return k.sub.Virtual(k.devices).IBroadcast(in, recv, count, dt, root)
	})
}

// AllGather concatenates every device's sendcount elements, device 0
// first, into every device's recv (M·sendcount elements).
func (c *Comm) AllGather(send, recv [][]byte, sendcount int, dt engine.DataType) error {
	return c.blocking("allgather", func(k call) error {
		return k.sub.Virtual(k.devices).AllGather(send, recv, sendcount, dt)
	})
}

// IAllGather is the non-blocking AllGather.
func (c *Comm) IAllGather(send, recv [][]byte, sendcount int, dt engine.DataType) (*Request, error) {
	return c.nonBlocking("allgather", func(k call) (*Request, error) {
		return k.sub.Virtual(k.devices).IAllGather(send, recv, sendcount, dt)
	})
}

// ReduceScatter folds the M devices' send (M·recvcount elements each) in
// device order and leaves block v of the result in device v's recv.
func (c *Comm) ReduceScatter(send, recv [][]byte, recvcount int, dt engine.DataType, op engine.RedOp) error {
	return c.blocking("reducescatter", func(k call) error {
		return k.sub.Virtual(k.devices).ReduceScatter(send, recv, recvcount, dt, op)
	})
}

// IReduceScatter is the non-blocking ReduceScatter.
func (c *Comm) IReduceScatter(send, recv [][]byte, recvcount int, dt engine.DataType, op engine.RedOp) (*Request, error) {
	return c.nonBlocking("reducescatter", func(k call) (*Request, error) {
		return k.sub.Virtual(k.devices).IReduceScatter(send, recv, recvcount, dt, op)
	})
}

// AllToAll sends block w (count elements) of device v's send to device w,
// which keeps it as block v of its recv.
func (c *Comm) AllToAll(send, recv [][]byte, count int, dt engine.DataType) error {
	return c.blocking("alltoall", func(k call) error {
		return k.sub.Virtual(k.devices).AllToAll(send, recv, count, dt)
	})
}

// IAllToAll is the non-blocking AllToAll.
func (c *Comm) IAllToAll(send, recv [][]byte, count int, dt engine.DataType) (*Request, error) {
	return c.nonBlocking("alltoall", func(k call) (*Request, error) {
		return k.sub.Virtual(k.devices).IAllToAll(send, recv, count, dt)
	})
}

// Barrier returns once every device has entered it.
func (c *Comm) Barrier() error {
	return c.blocking("barrier", func(k call) error { return k.sub.Barrier() })
}

// IBarrier is the non-blocking Barrier.
func (c *Comm) IBarrier() (*Request, error) {
	return c.nonBlocking("barrier", func(k call) (*Request, error) { return k.sub.IBarrier() })
}

// Redistribute moves a tensor from one layout of the virtual devices to
// another with the plan's contention-free steps: the plan's sender i and
// receiver j are devices i and j, wherever they are placed now; src[k] and
// dst[k] are local device k's buffers in the source and destination
// layouts (nil where it holds none). Messages between devices on one rank
// are copies; the others travel over the parent communicator, once the
// calls issued before it are done.
func (c *Comm) Redistribute(p *redist.Plan, src, dst [][]byte, dt engine.DataType) error {
	c.mu.Lock()
	k, err := c.begin("redistribute")
	prev, parent := c.last, c.parent
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if prev != nil {
		prev.Wait() // its error went to its caller
	}
	m := len(k.place)
	if p == nil {
		return k.wrap(fmt.Errorf("%w: nil plan", engine.ErrInvalidArgument))
	}
	if p.Q > m || p.P > m {
		return k.wrap(fmt.Errorf("%w: a plan of %d senders and %d receivers for %d virtual devices", engine.ErrInvalidArgument, p.Q, p.P, m))
	}
	if len(src) != len(k.local) || len(dst) != len(k.local) {
		return k.wrap(fmt.Errorf("%w: %d source and %d destination buffers for %d local devices", engine.ErrInvalidArgument, len(src), len(dst), len(k.local)))
	}
	slot := func(v int) int { return slices.Index(k.local, v) }
	return k.wrap(redist.RedistributeAt(parent, p, redist.Endpoints{
		SrcRank: func(i int) int { return k.place[i] },
		DstRank: func(j int) int { return k.place[j] },
		Src:     func(i int) []byte { return src[slot(i)] },
		Dst:     func(j int) []byte { return dst[slot(j)] },
	}, dt))
}
