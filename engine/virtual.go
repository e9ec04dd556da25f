package engine

import (
	"hash/fnv"
	"strconv"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/sched"
)

// virtualChain is the virtual allreduce's algorithm: not in the registry,
// since no plain call may choose it (it folds devices, not ranks).
var virtualChain = algorithm{coll: sched.AllReduce, name: "virtual-chain",
	e: &choose.Entry{Coll: sched.AllReduce, Name: "virtual-chain", Build: sched.VirtualAllReduce}}

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
// the result goes out through the shared-memory broadcast. send views of one array
// laid out back to back in device order are used in place; otherwise they
// are copied together first.
func (c *Comm) VirtualAllReduce(send [][]byte, recv []byte, count int, dt DataType, op RedOp, devices []int) error {
	return c.run(c.virtualAllReduceReq(send, recv, count, dt, op, devices))
}

// IVirtualAllReduce is the non-blocking VirtualAllReduce.
func (c *Comm) IVirtualAllReduce(send [][]byte, recv []byte, count int, dt DataType, op RedOp, devices []int) (*Request, error) {
	return c.start(c.virtualAllReduceReq(send, recv, count, dt, op, devices))
}

func (c *Comm) virtualAllReduceReq(send [][]byte, recv []byte, count int, dt DataType, op RedOp, devices []int) (Request, error) {
	if err := firstErr(checkType(dt), checkOp(dt, op), checkBuf("recv", recv, count, dt)); err != nil {
		return Request{}, err
	}
	if len(devices) == 0 {
		return Request{}, invalidArg("virtual allreduce of no devices")
	}
	local := 0
	for v, r := range devices {
		if r < 0 || r >= c.size {
			return Request{}, invalidArg("virtual device %d placed on rank %d of %d", v, r, c.size)
		}
		if r == c.rank {
			local++
		}
	}
	if len(send) != local {
		return Request{}, invalidArg("%d send buffers for the %d virtual devices on rank %d", len(send), local, c.rank)
	}
	n := count * dt.Size()
	for k := range send {
		if err := checkBuf("send buffer "+strconv.Itoa(k), send[k], count, dt); err != nil {
			return Request{}, err
		}
	}
	recv = recv[:n]
	in := contiguous(send, n)
	overlaps := false
	for _, s := range send {
		overlaps = overlaps || overlap(s, n, recv, n)
	}
	// The placement is part of the call's signature: ranks that disagree
	// on it fail at the first message instead of folding different chains.
	h := fnv.New64a()
	for _, r := range devices {
		h.Write([]byte(strconv.Itoa(r) + ","))
	}
	place := int(h.Sum64() >> 2)
	a := &virtualChain
	sig := signature(sched.AllReduce, dt, count, op, place, a.name)
	devs := append([]int(nil), devices...)
	return c.newReq(sched.AllReduce, a, dt, n, func(x *execCtx) error {
		x.start(sig, a, n)
		if n == 0 {
			return nil
		}
		// On one host the result goes out through the shared-memory
		// broadcast: every rank copies it once out of the root's memory,
		// where a chain of messages would wake the ranks one after
		// another. With two ranks the chain's broadcast is one hop that
		// overlaps the reduction of the later chunks, which the
		// broadcast after the reduction cannot.
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
		src := in
		if src == nil {
			src = c.getScratch(local * n)
			defer c.putScratch(src)
			for k, s := range send {
				copy(src[k*n:], s[:n])
			}
		}
		work := recv
		if overlaps {
			work = c.getScratch(n)
			defer c.putScratch(work)
		}
		var bufs [sched.NumBufs][]byte
		bufs[sched.Work], bufs[sched.In] = work, src
		if err := x.runSchedule(pl.S, pl.Ops, bufs, dt, op, nil); err != nil {
			return err
		}
		if shmBcast {
			if err := x.shm(c.arena.Broadcast(x.light(), x.call(), work, p.Root)); err != nil {
				return err
			}
		}
		if overlaps {
			copy(recv, work)
		}
		return nil
	})
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
