package vppu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
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

	mu     sync.Mutex
	place  Place
	local  []int                   // devices on this rank, increasing
	hosts  []int                   // parent ranks hosting devices, increasing = sub ranks
	devs   []int                   // device → its host's rank in sub
	sub    *engine.Comm            // nil when this rank hosts no device
	subs   map[string]*engine.Comm // every set of hosting ranks split so far
	bufs   map[int]map[string][]byte
	shared map[string][]byte // state every local device holds alike, kept once (RegisterShared)
	last   *Request          // the last non-blocking call issued
	seq    uint64            // calls issued, for error messages
	broken error             // set by a failed migration
	closed bool
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

// remap makes place current: the sub-communicator of its hosting ranks
// (a collective of the parent) and this rank's device list.
func (c *Comm) remap(place Place) error {
	me := c.parent.Rank()
	var local, hosts []int
	for v, r := range place {
		if r == me {
			local = append(local, v)
		}
		if !slices.Contains(hosts, r) {
			hosts = append(hosts, r)
		}
	}
	slices.Sort(hosts)
	// A split costs tens of milliseconds (it sets up shared memory and
	// connections); the sub-communicator of a set of hosting ranks is
	// kept, so a job moving back and forth pays it once per set. Every
	// rank has seen the same placements, so all agree whether to split.
	key := fmt.Sprint(hosts)
	sub, seen := c.subs[key]
	if !seen {
		color := 0
		if len(local) == 0 {
			color = engine.SplitNoColor
		}
		var err error
		if sub, err = c.parent.Split(color, me); err != nil {
			return err
		}
		c.subs[key] = sub // nil where this rank hosts nothing
	}
	devs := make([]int, len(place))
	for v, r := range place {
		devs[v], _ = slices.BinarySearch(hosts, r)
	}
	c.place, c.local, c.hosts, c.devs, c.sub = slices.Clone(place), local, hosts, devs, sub
	for v := range c.bufs {
		if place[v] != me {
			delete(c.bufs, v)
		}
	}
	if len(local) == 0 {
		clear(c.shared)
	}
	return nil
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
// unusable.
func (c *Comm) Migrate(to Place) (err error) {
	if err := checkPlace(c.parent, c.logical.M, to); err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed || c.broken != nil {
		c.mu.Unlock()
		return fmt.Errorf("vppu: migrate on rank %d: %w: communicator destroyed or broken", c.parent.Rank(), engine.ErrInvalidArgument)
	}
	prev := c.last
	c.mu.Unlock()
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
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.remap(to)
}

// move sends the registered buffers of every device changing rank. First
// every rank learns every device's buffer names and sizes (each rank's
// list, encodeMoves, all-gathered over the parent), then each buffer
// travels in one message, in device then name order on both sides. The
// shared buffers travel once to each rank that hosted no device before,
// with the lowest device it receives.
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
	alloc := c.alloc
	c.mu.Unlock()
	lists, err := allGatherBlobs(c.parent, encodeMoves(list))
	if err != nil {
		return err
	}
	type moving struct {
		dev      int
		name     string
		size     int
		from, to int
		shared   bool
	}
	var moves []moving
	for r, msg := range lists {
		ds, err := decodeMoves(msg)
		if err != nil {
			return fmt.Errorf("rank %d sent a damaged buffer list: %w", r, err)
		}
		for _, d := range ds {
			if d.Dev >= len(to) || from[d.Dev] != r || (d.Shared && !carriesShared(from, to, d.Dev)) {
				return fmt.Errorf("rank %d sent a damaged buffer list: device %d", r, d.Dev)
			}
			moves = append(moves, moving{d.Dev, d.Name, d.Size, r, to[d.Dev], d.Shared})
		}
	}
	slices.SortFunc(moves, func(a, b moving) int {
		if a.dev != b.dev {
			return a.dev - b.dev
		}
		if a.name < b.name {
			return -1
		}
		return 1
	})
	var reqs []*engine.Request
	arrived := map[int]map[string][]byte{}
	arrivedShared := map[string][]byte{}
	for _, m := range moves {
		switch {
		case m.from == me:
			c.mu.Lock()
			buf := c.bufs[m.dev][m.name]
			if m.shared {
				buf = c.shared[m.name]
			}
			c.mu.Unlock()
			if m.size == 0 {
				continue
			}
			r, err := c.parent.ISend(buf, m.size, engine.Uint8, m.to)
			if err != nil {
				return fmt.Errorf("device %d buffer %q to rank %d: %w", m.dev, m.name, m.to, err)
			}
			reqs = append(reqs, r)
		case m.to == me:
			buf, err := alloc(m.dev, m.name, m.size)
			if err != nil || len(buf) != m.size {
				return fmt.Errorf("device %d buffer %q: allocating %d bytes: %v", m.dev, m.name, m.size, err)
			}
			if m.shared {
				arrivedShared[m.name] = buf
			} else {
				put(arrived, m.dev, m.name, buf)
			}
			if m.size == 0 {
				continue
			}
			r, err := c.parent.IRecv(buf, m.size, engine.Uint8, m.from)
			if err != nil {
				return fmt.Errorf("device %d buffer %q from rank %d: %w", m.dev, m.name, m.from, err)
			}
			reqs = append(reqs, r)
		}
	}
	if err := waitAll(reqs); err != nil {
		return err
	}
	c.mu.Lock()
	for v, bs := range arrived {
		c.bufs[v] = bs
	}
	maps.Copy(c.shared, arrivedShared)
	c.mu.Unlock()
	return nil
}

// allGatherBlobs gathers every rank's blob, of any length: the lengths
// first, then the blobs padded to the longest.
func allGatherBlobs(c *engine.Comm, mine []byte) ([][]byte, error) {
	n := c.Size()
	lens := make([]byte, 8*n)
	if err := c.AllGather(binary.LittleEndian.AppendUint64(nil, uint64(len(mine))), lens, 8, engine.Uint8); err != nil {
		return nil, err
	}
	width := 0
	for r := range n {
		width = max(width, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	padded := make([]byte, width)
	copy(padded, mine)
	all := make([]byte, width*n)
	if err := c.AllGather(padded, all, width, engine.Uint8); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for r := range n {
		l := int(binary.LittleEndian.Uint64(lens[8*r:]))
		if l > width {
			return nil, fmt.Errorf("rank %d sent a damaged length", r)
		}
		out[r] = all[r*width : r*width+l]
	}
	return out, nil
}

// waitAll waits for every request and joins their errors.
func waitAll(reqs []*engine.Request) error {
	var errs []error
	for _, r := range reqs {
		if err := r.Wait(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// put files buf as device dev's buffer name in m.
func put(m map[int]map[string][]byte, dev int, name string, buf []byte) {
	if m[dev] == nil {
		m[dev] = map[string][]byte{}
	}
	m[dev][name] = buf
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
	defer c.mu.Unlock()
	var errs []error
	for _, sub := range c.subs {
		if sub != nil {
			errs = append(errs, sub.Destroy())
		}
	}
	c.sub, c.subs = nil, nil
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
