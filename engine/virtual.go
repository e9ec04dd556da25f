package engine

import (
	"hash/fnv"
	"strconv"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/sched"
)

// virtualChain is the virtual allreduce's algorithm: not in the registry,
// since no plain call may choose it (it folds devices, not ranks).
var virtualChain = algorithm{coll: sched.AllReduce, name: "virtual-chain",
	e: &choose.Entry{Coll: sched.AllReduce, Name: "virtual-chain", Build: sched.VirtualAllReduce}}

// virtualShm is the virtual allreduce through the shared-memory arena:
// ranks on one host whose devices form one run each (arenaChain).
var virtualShm = algorithm{coll: sched.AllReduce, name: "virtual-shm",
	e: &choose.Entry{Coll: sched.AllReduce, Name: "virtual-shm"}}

// VirtualAllReduce folds count elements of every virtual device in device
// order, ((x0 op x1) op x2) … op x(M-1) (divided by M once for Avg), into
// recv on every rank. devices[v] is the rank of device v (every rank
// passes the same placement: a rank that passes another fails the call on
// every rank); send holds one vector per device of this rank, in
// increasing device order. The result is bitwise the same for every
// placement of the same devices. recv may overlap send (the result is
// written when the fold is done).
//
// It runs sched.VirtualAllReduce: each vector is read once on its own rank
// and the partial sums travel the chain of devices in order, so a rank's
// devices cost it one vector's traffic however many they are. When more
// than two ranks are all on this host the chain stops at its last rank and
// the result goes out through the shared-memory broadcast; ranks on one
// host whose devices form one run each pass the partial sums through the
// arena's slots instead (shmcoll.ChainAllReduce). send views of one array
// laid out back to back in device order are used in place; otherwise they
// are copied together first.
func (c *Comm) VirtualAllReduce(send [][]byte, recv []byte, count int, dt DataType, op RedOp, devices []int) error {
	var r Request
	return c.run(&r, c.virtualAllReduceReq(&r, send, recv, nil, count, dt, op, devices))
}

// IVirtualAllReduce is the non-blocking VirtualAllReduce.
func (c *Comm) IVirtualAllReduce(send [][]byte, recv []byte, count int, dt DataType, op RedOp, devices []int) (*Request, error) {
	var r Request
	return c.start(&r, c.virtualAllReduceReq(&r, send, recv, nil, count, dt, op, devices))
}

// VirtualAllReduceEach is VirtualAllReduce with a receive buffer per
// local device (recv[k] for the k-th, as send): the result is written to
// recv[0] and copied to the others, except those that are recv[0] itself
// (state kept once per rank).
func (c *Comm) VirtualAllReduceEach(send, recv [][]byte, count int, dt DataType, op RedOp, devices []int) error {
	var r Request
	return c.run(&r, c.virtualAllReduceEachReq(&r, send, recv, count, dt, op, devices))
}

// IVirtualAllReduceEach is the non-blocking VirtualAllReduceEach.
func (c *Comm) IVirtualAllReduceEach(send, recv [][]byte, count int, dt DataType, op RedOp, devices []int) (*Request, error) {
	var r Request
	return c.start(&r, c.virtualAllReduceEachReq(&r, send, recv, count, dt, op, devices))
}

func (c *Comm) virtualAllReduceEachReq(r *Request, send, recv [][]byte, count int, dt DataType, op RedOp, devices []int) error {
	if err := checkEach("recv", recv, len(send), count, dt); err != nil {
		return err
	}
	if len(recv) == 0 {
		if count < 0 {
			return invalidArg("negative count %d", count)
		}
		// No device here, but the rank may relay the result: it takes a
		// buffer of its own.
		return c.virtualAllReduceReq(r, send, make([]byte, count*dt.Size()), nil, count, dt, op, devices)
	}
	return c.virtualAllReduceReq(r, send, recv[0], recv[1:], count, dt, op, devices)
}

// virtualAllReduceReq: copies, when set, get the result too (after the
// fold; they may overlap send).
func (c *Comm) virtualAllReduceReq(r *Request, send [][]byte, recv []byte, copies [][]byte, count int, dt DataType, op RedOp, devices []int) error {
	if err := firstErr(checkType(dt), checkOp(dt, op)); err != nil {
		return err
	}
	local, err := c.checkDevices(devices)
	if err != nil {
		return err
	}
	if err := firstErr(checkBuf("recv", recv, count, dt), checkEach("send", send, local, count, dt)); err != nil {
		return err
	}
	n := count * dt.Size()
	recv = recv[:n]
	in := contiguous(send, n)
	overlaps := false
	for _, s := range send {
		overlaps = overlaps || overlap(s, n, recv, n)
	}
	// The placement is part of the call's signature: ranks that disagree
	// on it fail at the first message instead of folding different chains.
	place := placementHash(devices)
	a := &virtualChain
	devs := append([]int(nil), devices...)
	// Ranks on one host whose devices form one run each: the chain
	// through the arena's slots (shmcoll.ChainAllReduce), the same fold.
	order := arenaChain(devs, c.size)
	if c.arena != nil && order != nil {
		a = &virtualShm
	}
	sig := signature(sched.AllReduce, dt, count, op, place, a.name)
	return c.newReq(r, sched.AllReduce, a, dt, n, func(x *execCtx) error {
		x.start(sig, a, n)
		if n == 0 {
			return nil
		}
		src := in
		if src == nil {
			src = c.pool.Get(local * n)
			defer c.pool.Put(src)
			for k, s := range send {
				copy(src[k*n:], s[:n])
			}
		}
		work := recv
		if overlaps {
			work = c.pool.Get(n)
			defer c.pool.Put(work)
		}
		if err := c.virtualFold(x, a, src, local, work, count, dt, op, devs, order); err != nil {
			return err
		}
		if overlaps {
			copy(recv, work)
		}
		copyOut(copies, recv)
		return nil
	})
}

// virtualFold leaves the fold of the devices' vectors (src, local of them
// back to back) in work on every rank: through the arena's slots
// (virtualShm, along order), or by a's schedule.
func (c *Comm) virtualFold(x *execCtx, a *algorithm, src []byte, local int, work []byte, count int, dt DataType, op RedOp, devs, order []int) error {
	if a == &virtualShm {
		div := 1
		if op == Avg {
			div = len(devs)
		}
		return x.shm(c.arena.ChainAllReduce(x.light(), x.call(), src, local, work, order, dt, op, div))
	}
	// On one host the result goes out through the shared-memory
	// broadcast: every rank copies it once out of the root's memory,
	// where a chain of messages would wake the ranks one after another.
	// With two ranks the chain's broadcast is one hop that overlaps the
	// reduction of the later chunks, which the broadcast after the
	// reduction cannot.
	shmBcast := c.arena != nil && c.size > 2
	p := c.params(sched.AllReduce, dt, count, op, -1)
	if shmBcast {
		p = c.params(sched.Reduce, dt, count, op, sched.VirtualRoot(devs))
	}
	p.Devices = devs
	pl, err := c.plans.Get(a.e, p, c.rank)
	if err != nil {
		return err
	}
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work], bufs[sched.In] = work, src
	if err := exec.Run(x, pl.S, pl.Ops, bufs, dt, op, nil); err != nil {
		return err
	}
	if shmBcast {
		return x.shm(c.arena.Broadcast(x.light(), x.call(), work, p.Root))
	}
	return nil
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

// checkDevices checks a virtual collective's placement and returns the
// number of devices on this rank.
func (c *Comm) checkDevices(devices []int) (local int, err error) {
	if len(devices) == 0 {
		return 0, invalidArg("virtual collective of no devices")
	}
	for v, r := range devices {
		if r < 0 || r >= c.size {
			return 0, invalidArg("virtual device %d placed on rank %d of %d", v, r, c.size)
		}
		if r == c.rank {
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

// placementHash is the placement's part of a virtual call's signature:
// ranks that disagree on it fail at the first message instead of running
// different schedules.
func placementHash(devices []int) int {
	h := fnv.New64a()
	for _, r := range devices {
		h.Write([]byte(strconv.Itoa(r) + ","))
	}
	return int(h.Sum64() >> 2)
}

// copyOut copies src into every buffer of dsts that is not src itself.
func copyOut(dsts [][]byte, src []byte) {
	for _, d := range dsts {
		if len(src) > 0 && addr(d) != addr(src) {
			copy(d[:len(src)], src)
		}
	}
}

// The other virtual collectives (sched/vcoll.go): as the allreduce, not in
// the registry.
var (
	virtualReduce = algorithm{coll: sched.Reduce, name: "virtual-reduce",
		e: &choose.Entry{Coll: sched.Reduce, Name: "virtual-reduce", Build: sched.VirtualReduce}}
	virtualReduceScatter = algorithm{coll: sched.ReduceScatter, name: "virtual-reducescatter",
		e: &choose.Entry{Coll: sched.ReduceScatter, Name: "virtual-reducescatter", Build: sched.VirtualReduceScatter}}
	virtualAllGather = algorithm{coll: sched.AllGather, name: "virtual-allgather",
		e: &choose.Entry{Coll: sched.AllGather, Name: "virtual-allgather", Build: sched.VirtualAllGather}}
	virtualAllToAll = algorithm{coll: sched.AllToAll, name: "virtual-alltoall",
		e: &choose.Entry{Coll: sched.AllToAll, Name: "virtual-alltoall", Build: sched.VirtualAllToAll}}
)

// vcall is a checked virtual collective run by a's schedule.
type vcall struct {
	a       *algorithm
	dt      DataType
	op      RedOp
	count   int
	root    int // reduce: the root device's rank
	devices []int
	send    [][]byte // In: the local devices' vectors of sendN bytes
	sendN   int
	work    []byte // Work when it can be (nil: scratch of workN bytes)
	workN   int
	// finish takes the result out of Work (w) into the caller's buffers.
	finish func(w []byte)
}

// vreq makes v's request: the local vectors are read in place where they
// lie back to back (else copied together), Work is v.work where it is
// disjoint from them (else scratch).
func (c *Comm) vreq(r *Request, v vcall) error {
	in := contiguous(v.send, v.sendN)
	for _, s := range v.send {
		if overlap(s, v.sendN, v.work, v.workN) {
			v.work = nil
		}
	}
	devs := append([]int(nil), v.devices...)
	// The root is part of the placement's hash: it decides the schedule.
	sig := signature(v.a.coll, v.dt, v.count, v.op, placementHash(append(devs, v.root)), v.a.name)
	return c.newReq(r, v.a.coll, v.a, v.dt, v.sendN, func(x *execCtx) error {
		x.start(sig, v.a, v.sendN)
		if v.workN == 0 {
			return nil
		}
		p := c.params(v.a.coll, v.dt, v.count, v.op, v.root)
		p.Devices = devs
		pl, err := c.plans.Get(v.a.e, p, c.rank)
		if err != nil {
			return err
		}
		src := in
		if src == nil && len(v.send) > 0 {
			src = c.pool.Get(len(v.send) * v.sendN)[:len(v.send)*v.sendN]
			defer c.pool.Put(src)
			for k, s := range v.send {
				copy(src[k*v.sendN:], s[:v.sendN])
			}
		}
		w := v.work
		if w == nil {
			w = c.pool.Get(v.workN)[:v.workN]
			defer c.pool.Put(w)
		}
		var bufs [sched.NumBufs][]byte
		bufs[sched.Work], bufs[sched.In] = w[:v.workN], src
		if err := exec.Run(x, pl.S, pl.Ops, bufs, v.dt, v.op, nil); err != nil {
			return err
		}
		v.finish(w[:v.workN])
		return nil
	})
}

// VirtualReduce folds count elements of every virtual device in device
// order (divided by M once for Avg), as VirtualAllReduce does, into recv
// of device root only: recv is read on the root device's rank, ignored
// elsewhere. The chain of devices ends on the last device's rank, which
// sends the result to the root's.
func (c *Comm) VirtualReduce(send [][]byte, recv []byte, count int, dt DataType, op RedOp, root int, devices []int) error {
	var r Request
	return c.run(&r, c.virtualReduceReq(&r, send, recv, count, dt, op, root, devices))
}

// IVirtualReduce is the non-blocking VirtualReduce.
func (c *Comm) IVirtualReduce(send [][]byte, recv []byte, count int, dt DataType, op RedOp, root int, devices []int) (*Request, error) {
	var r Request
	return c.start(&r, c.virtualReduceReq(&r, send, recv, count, dt, op, root, devices))
}

func (c *Comm) virtualReduceReq(r *Request, send [][]byte, recv []byte, count int, dt DataType, op RedOp, root int, devices []int) error {
	if _, err := c.vcheck(send, 1, count, dt, op, true, devices); err != nil {
		return err
	}
	if root < 0 || root >= len(devices) {
		return invalidArg("root %d of %d virtual devices", root, len(devices))
	}
	n := count * dt.Size()
	rootRank := devices[root]
	v := vcall{a: &virtualReduce, dt: dt, op: op, count: count, root: rootRank, devices: devices, send: send, sendN: n, workN: n, finish: func([]byte) {}}
	if c.rank == rootRank {
		if err := checkBuf("recv", recv, count, dt); err != nil {
			return err
		}
		v.work = recv[:n]
		v.finish = func(w []byte) { copyOut([][]byte{recv}, w) }
	}
	return c.vreq(r, v)
}

// VirtualReduceScatter folds the devices' vectors of M·count elements in
// device order (divided by M once for Avg) and leaves block v (count
// elements) of the result in device v's recv: send[k] and recv[k] belong
// to the k-th device of this rank.
func (c *Comm) VirtualReduceScatter(send, recv [][]byte, count int, dt DataType, op RedOp, devices []int) error {
	var r Request
	return c.run(&r, c.virtualReduceScatterReq(&r, send, recv, count, dt, op, devices))
}

// IVirtualReduceScatter is the non-blocking VirtualReduceScatter.
func (c *Comm) IVirtualReduceScatter(send, recv [][]byte, count int, dt DataType, op RedOp, devices []int) (*Request, error) {
	var r Request
	return c.start(&r, c.virtualReduceScatterReq(&r, send, recv, count, dt, op, devices))
}

func (c *Comm) virtualReduceScatterReq(r *Request, send, recv [][]byte, count int, dt DataType, op RedOp, devices []int) error {
	m := len(devices)
	local, err := c.vcheck(send, m, count, dt, op, true, devices)
	if err != nil {
		return err
	}
	if err := checkEach("recv", recv, local, count, dt); err != nil {
		return err
	}
	n := count * dt.Size()
	mine := sched.LocalDevices(devices, c.rank)
	return c.vreq(r, vcall{a: &virtualReduceScatter, dt: dt, op: op, count: count, root: -1, devices: devices, send: send, sendN: m * n, workN: m * n,
		finish: func(w []byte) {
			for k, d := range mine {
				copy(recv[k][:n], w[d*n:(d+1)*n])
			}
		}})
}

// VirtualAllGather concatenates every device's count elements, device 0
// first, into every local device's recv (M·count elements each; they may
// all be one buffer, written once).
func (c *Comm) VirtualAllGather(send, recv [][]byte, count int, dt DataType, devices []int) error {
	var r Request
	return c.run(&r, c.virtualAllGatherReq(&r, send, recv, count, dt, devices))
}

// IVirtualAllGather is the non-blocking VirtualAllGather.
func (c *Comm) IVirtualAllGather(send, recv [][]byte, count int, dt DataType, devices []int) (*Request, error) {
	var r Request
	return c.start(&r, c.virtualAllGatherReq(&r, send, recv, count, dt, devices))
}

func (c *Comm) virtualAllGatherReq(r *Request, send, recv [][]byte, count int, dt DataType, devices []int) error {
	m := len(devices)
	local, err := c.vcheck(send, 1, count, dt, 0, false, devices)
	if err != nil {
		return err
	}
	if err := checkEach("recv", recv, local, m*count, dt); err != nil {
		return err
	}
	n := count * dt.Size()
	v := vcall{a: &virtualAllGather, dt: dt, count: count, root: -1, devices: devices, send: send, sendN: n, workN: m * n,
		finish: func(w []byte) { copyOut(recv, w) }}
	if local > 0 {
		v.work = recv[0][:m*n]
	}
	return c.vreq(r, v)
}

// VirtualAllToAll sends block w (count elements) of device v's send (M
// blocks) to device w, which keeps it as block v of its recv.
func (c *Comm) VirtualAllToAll(send, recv [][]byte, count int, dt DataType, devices []int) error {
	var r Request
	return c.run(&r, c.virtualAllToAllReq(&r, send, recv, count, dt, devices))
}

// IVirtualAllToAll is the non-blocking VirtualAllToAll.
func (c *Comm) IVirtualAllToAll(send, recv [][]byte, count int, dt DataType, devices []int) (*Request, error) {
	var r Request
	return c.start(&r, c.virtualAllToAllReq(&r, send, recv, count, dt, devices))
}

func (c *Comm) virtualAllToAllReq(r *Request, send, recv [][]byte, count int, dt DataType, devices []int) error {
	m := len(devices)
	local, err := c.vcheck(send, m, count, dt, 0, false, devices)
	if err != nil {
		return err
	}
	if err := checkEach("recv", recv, local, m*count, dt); err != nil {
		return err
	}
	each := m * count * dt.Size()
	v := vcall{a: &virtualAllToAll, dt: dt, count: count, root: -1, devices: devices, send: send, sendN: each, workN: local * each,
		finish: func(w []byte) {
			for k := range recv {
				if addr(recv[k]) != addr(w[k*each:]) {
					copy(recv[k][:each], w[k*each:])
				}
			}
		}}
	v.work = contiguous(recv, each)
	return c.vreq(r, v)
}

// vcheck checks a virtual collective's type, op (where it reduces),
// placement and send buffers (mult·count elements per local device), and
// returns the number of local devices.
func (c *Comm) vcheck(send [][]byte, mult, count int, dt DataType, op RedOp, reduces bool, devices []int) (int, error) {
	if err := checkType(dt); err != nil {
		return 0, err
	}
	if reduces {
		if err := checkOp(dt, op); err != nil {
			return 0, err
		}
	}
	if count < 0 {
		return 0, invalidArg("negative count %d", count)
	}
	local, err := c.checkDevices(devices)
	if err != nil {
		return 0, err
	}
	return local, checkEach("send", send, local, mult*count, dt)
}

// VirtualBroadcast copies count elements of device root's vector into
// every local device's recv (they may all be one buffer, written once).
// send is the root device's vector on its rank, ignored elsewhere. It is
// the engine's broadcast from the root's rank, with the algorithm the
// registry chooses for it.
func (c *Comm) VirtualBroadcast(send []byte, recv [][]byte, count int, dt DataType, root int, devices []int) error {
	var r Request
	return c.run(&r, c.virtualBroadcastReq(&r, send, recv, count, dt, root, devices))
}

// IVirtualBroadcast is the non-blocking VirtualBroadcast.
func (c *Comm) IVirtualBroadcast(send []byte, recv [][]byte, count int, dt DataType, root int, devices []int) (*Request, error) {
	var r Request
	return c.start(&r, c.virtualBroadcastReq(&r, send, recv, count, dt, root, devices))
}

func (c *Comm) virtualBroadcastReq(r *Request, send []byte, recv [][]byte, count int, dt DataType, root int, devices []int) error {
	if err := checkType(dt); err != nil {
		return err
	}
	local, err := c.checkDevices(devices)
	if err != nil {
		return err
	}
	if root < 0 || root >= len(devices) {
		return invalidArg("root %d of %d virtual devices", root, len(devices))
	}
	if err := checkEach("recv", recv, local, count, dt); err != nil {
		return err
	}
	n := count * dt.Size()
	if local == 0 {
		// No device here, but the broadcast may pass through the rank.
		recv = [][]byte{make([]byte, n)}
	}
	if devices[root] != c.rank {
		send = recv[0]
	}
	var b Request
	if err := c.broadcastReq(&b, send, recv[0], count, dt, devices[root]); err != nil {
		return err
	}
	k := b.args
	return c.newReq(r, sched.Broadcast, k.a, dt, n, func(x *execCtx) error {
		if err := x.issue(&k); err != nil {
			return err
		}
		copyOut(recv[1:], recv[0][:n])
		return nil
	})
}
