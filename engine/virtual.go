package engine

import (
	"strconv"

	"github.com/gocoll/gocoll/engine/sched"
)

// Collectives over virtual devices: M devices placed on the ranks, each
// with its own vectors. A call's constructor (below) checks the placement
// and the devices' buffers into args, with the devices in args.dev, and
// goes through Comm.call like any collective: the registry chooses among
// its collective's virtual entries (engine/internal/choose/registry.go),
// and execCtx.devices (call.go) gathers the local devices' vectors, runs
// the entry and spreads the result to the devices' receive buffers.

// Virtual is a communicator's collectives over virtual devices placed on
// its ranks: devices[v] is the rank of device v. Every rank passes the
// same placement (a rank that passes another fails the call on every
// rank). It is a small value, made per call at no cost. Buffers go one per device of this rank (send[k], recv[k] for the
// k-th, in increasing device order). Every reduction folds the devices'
// vectors in device order, ((x0 op x1) op x2) … op x(M-1) (divided by M
// once for Avg), so its result is bitwise the same for every placement of
// the same devices. The forms of each call are those of a Comm's.
type Virtual struct {
	c       *Comm
	devices []int
}

// Virtual returns the collectives over the virtual devices that devices
// places on the communicator's ranks. It checks nothing and keeps devices:
// each call checks and copies the placement.
func (c *Comm) Virtual(devices []int) Virtual { return Virtual{c: c, devices: devices} }

// devCall is what a call over virtual devices carries besides its plain
// arguments (args.dev): args.send is In, the local devices' vectors back
// to back, or nil to copy them together (send); args.recv is Work when
// the caller's buffer can be, else nil for scratch.
type devCall struct {
	devices []int    // device → rank, copied: a non-blocking call outlives the caller's slice
	place   int      // the placement's hash, in the call's signature
	order   []int    // the ranks along the chain when the arena can fold it (arenaChain), else nil
	send    [][]byte // the local devices' vectors of sendN bytes each
	sendN   int
	workN   int       // Work's bytes
	out     [][]byte  // the local devices' receive buffers, which the result is spread to
	block   int       // a device's block of the result, in bytes (spreadByDevice, spreadByLocal)
	one     [1][]byte // out's backing for a single receive buffer
}

// devCall makes the devCall of a call over v's devices: send holds the
// local vectors of sendN bytes each; root is the rank its schedule
// depends on (-1: none), which the placement's hash includes.
func (v Virtual) devCall(send [][]byte, sendN, root int) *devCall {
	d := &devCall{devices: append([]int(nil), v.devices...), send: send, sendN: sendN}
	d.place = placementHash(d.devices, root)
	if v.c.arena != nil {
		d.order = arenaChain(d.devices, v.c.size)
	}
	return d
}

// work returns b as Work unless one of the local vectors overlaps it (the
// result is written before the vectors are all read), else nil: scratch.
func (d *devCall) work(b []byte) []byte {
	for _, s := range d.send {
		if overlap(s, d.sendN, b, d.workN) {
			return nil
		}
	}
	return b
}

// call makes r the request of coll over d, its plain arguments in r.args.
func (v Virtual) call(r *Request, coll sched.Coll, d *devCall) error {
	r.args.dev, r.args.send = d, contiguous(d.send, d.sendN)
	return v.c.call(r, coll)
}

// AllReduce folds count elements of every virtual device in device order
// into recv on every rank: send holds one vector per device of this rank.
// recv may overlap send (the result is written when the fold is done).
//
// It runs the registry's virtual allreduce: sched.VirtualAllReduce, in
// which each vector is read once on its own rank and the partial sums
// travel the chain of devices in order, so a rank's devices cost it one
// vector's traffic however many they are (when more than two ranks are
// all on this host the chain stops at its last rank and the result goes
// out through the shared-memory broadcast); or, for ranks on one host
// whose devices form one run each, the same fold through the arena's
// slots (shmcoll.ChainAllReduce). send views of one array laid out back
// to back in device order are used in place; otherwise they are copied
// together first.
//
//gocoll:forms
func (v Virtual) allReduceReq(r *Request, send [][]byte, recv []byte, count int, dt DataType, op RedOp) error {
	d, err := v.allReduce(r, send, count, dt, op)
	if err != nil {
		return err
	}
	if err := checkBuf("recv", recv, count, dt); err != nil {
		return err
	}
	d.one[0] = recv[:d.workN]
	d.out = d.one[:]
	r.args.recv = d.work(d.out[0])
	return v.call(r, sched.AllReduce, d)
}

// AllReduceEach is AllReduce with a receive buffer per local device
// (recv[k] for the k-th, as send): the result is written to recv[0] and
// copied to the others, except those that are recv[0] itself (state kept
// once per rank).
//
//gocoll:forms
func (v Virtual) allReduceEachReq(r *Request, send, recv [][]byte, count int, dt DataType, op RedOp) error {
	if err := checkEach("recv", recv, len(send), count, dt); err != nil {
		return err
	}
	d, err := v.allReduce(r, send, count, dt, op)
	if err != nil {
		return err
	}
	// A rank with no device may relay the result: it folds into scratch.
	if len(recv) > 0 {
		d.out = recv
		r.args.recv = d.work(recv[0][:d.workN])
	}
	return v.call(r, sched.AllReduce, d)
}

// allReduce checks an allreduce's arguments but its receive buffers and
// fills r.args and its devCall.
func (v Virtual) allReduce(r *Request, send [][]byte, count int, dt DataType, op RedOp) (*devCall, error) {
	if err := firstErr(checkType(dt), checkOp(dt, op)); err != nil {
		return nil, err
	}
	if _, err := v.check(send, 1, count, dt); err != nil {
		return nil, err
	}
	n := count * dt.Size()
	r.args = args{count: count, dt: dt, op: op, root: -1, n: n}
	d := v.devCall(send, n, -1)
	d.workN = n
	return d, nil
}

// Reduce folds count elements of every virtual device in device order,
// as AllReduce does, into recv of device root only: recv is read on the
// root device's rank, ignored elsewhere. The chain of devices ends on the
// last device's rank, which sends the result to the root's.
//
//gocoll:forms
func (v Virtual) reduceReq(r *Request, send [][]byte, recv []byte, count int, dt DataType, op RedOp, root int) error {
	if err := firstErr(checkType(dt), checkOp(dt, op)); err != nil {
		return err
	}
	if _, err := v.check(send, 1, count, dt); err != nil {
		return err
	}
	if root < 0 || root >= len(v.devices) {
		return invalidArg("root %d of %d virtual devices", root, len(v.devices))
	}
	n, rootRank := count*dt.Size(), v.devices[root]
	r.args = args{count: count, dt: dt, op: op, root: rootRank, n: n}
	d := v.devCall(send, n, rootRank)
	d.workN = n
	if v.c.rank == rootRank {
		if err := checkBuf("recv", recv, count, dt); err != nil {
			return err
		}
		d.one[0] = recv[:n]
		d.out = d.one[:]
		r.args.recv = d.work(d.out[0])
	}
	return v.call(r, sched.Reduce, d)
}

// ReduceScatter folds the devices' vectors of M·count elements in device
// order (divided by M once for Avg) and leaves block v (count elements)
// of the result in device v's recv.
//
//gocoll:forms
func (v Virtual) reduceScatterReq(r *Request, send, recv [][]byte, count int, dt DataType, op RedOp) error {
	m := len(v.devices)
	if err := firstErr(checkType(dt), checkOp(dt, op)); err != nil {
		return err
	}
	local, err := v.check(send, m, count, dt)
	if err != nil {
		return err
	}
	if err := checkEach("recv", recv, local, count, dt); err != nil {
		return err
	}
	n := count * dt.Size()
	r.args = args{count: count, dt: dt, op: op, root: -1, n: m * n}
	d := v.devCall(send, m*n, -1)
	d.workN, d.out, d.block = m*n, recv, n
	return v.call(r, sched.ReduceScatter, d)
}

// AllGather concatenates every device's count elements, device 0 first,
// into every local device's recv (M·count elements each; they may all be
// one buffer, written once).
//
//gocoll:forms
func (v Virtual) allGatherReq(r *Request, send, recv [][]byte, count int, dt DataType) error {
	m := len(v.devices)
	if err := checkType(dt); err != nil {
		return err
	}
	local, err := v.check(send, 1, count, dt)
	if err != nil {
		return err
	}
	if err := checkEach("recv", recv, local, m*count, dt); err != nil {
		return err
	}
	n := count * dt.Size()
	r.args = args{count: count, dt: dt, root: -1, n: n}
	d := v.devCall(send, n, -1)
	d.workN, d.out = m*n, recv
	if local > 0 {
		r.args.recv = d.work(recv[0][:m*n])
	}
	return v.call(r, sched.AllGather, d)
}

// AllToAll sends block w (count elements) of device v's send (M blocks)
// to device w, which keeps it as block v of its recv.
//
//gocoll:forms
func (v Virtual) allToAllReq(r *Request, send, recv [][]byte, count int, dt DataType) error {
	m := len(v.devices)
	if err := checkType(dt); err != nil {
		return err
	}
	local, err := v.check(send, m, count, dt)
	if err != nil {
		return err
	}
	if err := checkEach("recv", recv, local, m*count, dt); err != nil {
		return err
	}
	each := m * count * dt.Size()
	r.args = args{count: count, dt: dt, root: -1, n: each}
	d := v.devCall(send, each, -1)
	d.workN, d.out, d.block = local*each, recv, each
	r.args.recv = d.work(contiguous(recv, each))
	return v.call(r, sched.AllToAll, d)
}

// Broadcast copies count elements of device root's vector into every
// local device's recv (they may all be one buffer, written once). send is
// the root device's vector on its rank, ignored elsewhere. It is the
// plain broadcast from the root device's rank, with the algorithm the
// registry chooses for it, into the first local device's recv.
//
//gocoll:forms
func (v Virtual) broadcastReq(r *Request, send []byte, recv [][]byte, count int, dt DataType, root int) error {
	if err := checkType(dt); err != nil {
		return err
	}
	local, err := v.checkDevices()
	if err != nil {
		return err
	}
	if root < 0 || root >= len(v.devices) {
		return invalidArg("root %d of %d virtual devices", root, len(v.devices))
	}
	if err := checkEach("recv", recv, local, count, dt); err != nil {
		return err
	}
	n := count * dt.Size()
	if local == 0 {
		// No device here, but the broadcast may pass through the rank.
		recv = [][]byte{make([]byte, n)}
	}
	if v.devices[root] != v.c.rank {
		send = recv[0]
	}
	if err := v.c.broadcastReq(r, send, recv[0], count, dt, v.devices[root]); err != nil {
		return err
	}
	// A plain call, whose result then goes to the other devices' buffers.
	r.args.dev = &devCall{workN: n, out: recv[1:]}
	return nil
}

// check checks a call's placement and send buffers (mult·count elements
// per local device), and returns the number of local devices.
func (v Virtual) check(send [][]byte, mult, count int, dt DataType) (int, error) {
	if count < 0 {
		return 0, invalidArg("negative count %d", count)
	}
	local, err := v.checkDevices()
	if err != nil {
		return 0, err
	}
	return local, checkEach("send", send, local, mult*count, dt)
}

// checkDevices checks the placement and returns the number of devices on
// this rank.
func (v Virtual) checkDevices() (local int, err error) {
	if len(v.devices) == 0 {
		return 0, invalidArg("virtual collective of no devices")
	}
	for d, r := range v.devices {
		if r < 0 || r >= v.c.size {
			return 0, invalidArg("virtual device %d placed on rank %d of %d", d, r, v.c.size)
		}
		if r == v.c.rank {
			local++
		}
	}
	return local, nil
}

// checkEach checks one buffer per local device, each of count elements.
func checkEach(name string, bufs [][]byte, local, count int, dt DataType) error {
	if len(bufs) != local {
		return invalidArg("%d %s buffers for %d local virtual devices", len(bufs), name, local)
	}
	for k, b := range bufs {
		if err := checkBuf(name+" buffer "+strconv.Itoa(k), b, count, dt); err != nil {
			return err
		}
	}
	return nil
}

// The runs of the registry's virtual entries.

// chainAllReduce is the virtual allreduce's schedule ("virtual-chain").
// On one host the result goes out through the shared-memory broadcast:
// every rank copies it once out of the root's memory, where a chain of
// messages would wake the ranks one after another. With two ranks the
// chain's broadcast is one hop that overlaps the reduction of the later
// chunks, which the broadcast after the reduction cannot.
func chainAllReduce(x *execCtx, k args) error {
	c := x.c
	if c.arena == nil || c.size <= 2 {
		return x.schedule(k.a, x.deviceParams(sched.AllReduce, k), k.recv, k.send, k.dt, k.op)
	}
	k.root = sched.VirtualRoot(k.dev.devices)
	if err := x.schedule(k.a, x.deviceParams(sched.Reduce, k), k.recv, k.send, k.dt, k.op); err != nil {
		return err
	}
	return x.shm(c.arena.Broadcast(x.light(), x.call(), k.recv, k.root))
}

// shmChainAllReduce is the virtual allreduce through the arena's slots
// ("virtual-shm"): ranks on one host whose devices form one run each pass
// the running sum along the chain (arenaChain), the same fold.
func shmChainAllReduce(x *execCtx, k args) error {
	div := 1
	if k.op == Avg {
		div = len(k.dev.devices)
	}
	return x.shm(x.c.arena.ChainAllReduce(x.light(), x.call(), k.send, len(k.dev.send), k.recv, k.dev.order, k.dt, k.op, div))
}

// devicesScheduled runs the schedule of the other virtual entries.
func devicesScheduled(x *execCtx, k args) error {
	return x.schedule(k.a, x.deviceParams(k.a.coll, k), k.recv, k.send, k.dt, k.op)
}

// deviceParams is the shape of a call over virtual devices as the
// schedule builders take it.
func (x *execCtx) deviceParams(coll sched.Coll, k args) sched.Params {
	p := x.c.params(coll, k.dt, k.count, k.op, k.root)
	p.Devices = k.dev.devices
	return p
}

// spread copies the result, w, to the local devices' receive buffers:
// each the whole of it, or (how) its device's block.
func (d *devCall) spread(how spread, w []byte, rank int) {
	switch how {
	case spreadByDevice: // device v gets block v of the fold
		k := 0
		for v, r := range d.devices {
			if r == rank {
				copy(d.out[k][:d.block], w[v*d.block:])
				k++
			}
		}
	case spreadByLocal: // the k-th local device gets the k-th block of Work
		for k, o := range d.out {
			if addr(o) != addr(w[k*d.block:]) {
				copy(o[:d.block], w[k*d.block:])
			}
		}
	default:
		copyOut(d.out, w)
	}
}

// arenaChain is the order of the ranks along the virtual chain when every
// one of n ranks hosts one run of consecutive devices (a block placement,
// the ranks in any order), else nil.
func arenaChain(devices []int, n int) []int {
	hops := sched.VirtualChain(devices)
	if n < 2 || len(hops) != n {
		return nil
	}
	order := make([]int, n)
	seen := make([]bool, n)
	for h, hop := range hops {
		if seen[hop.Rank] {
			return nil // a rank twice ([0 1 0]), so another has no device
		}
		seen[hop.Rank] = true
		order[h] = hop.Rank
	}
	return order
}

// contiguous returns the vectors as one slice when they lie back to back
// in one array (send[0]'s, which must hold them all), else nil.
func contiguous(send [][]byte, n int) []byte {
	if len(send) == 0 || cap(send[0]) < len(send)*n {
		return nil
	}
	whole := send[0][:len(send)*n]
	for k, s := range send {
		if n > 0 && addr(s) != addr(whole[k*n:]) {
			return nil
		}
	}
	return whole
}

// placementHash is the placement's part of a virtual call's signature,
// with the root rank its schedule depends on: ranks that disagree on them
// fail at the first message instead of running different schedules.
func placementHash(devices []int, root int) int {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for _, r := range devices {
		h = (h ^ uint64(r)) * prime
	}
	h = (h ^ uint64(int64(root))) * prime
	return int(h >> 2)
}

// copyOut copies src into every buffer of dsts that is not src itself.
func copyOut(dsts [][]byte, src []byte) {
	for _, d := range dsts {
		if len(src) > 0 && addr(d) != addr(src) {
			copy(d[:len(src)], src)
		}
	}
}
