package engine

import (
	"cmp"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/shmcoll"
)

// Buffers are byte slices holding count elements of a DataType. A collective
// whose send and receive buffers start at the same address runs in place.
// The non-blocking forms (I…) return a Request; the caller must not touch the
// buffers until it completed.

// collectives is every collective's descriptor (call.go): a row per
// collective, its runs below. init fills it, as the runs reach back to
// it, and then gives the registry's entries their runs (algorithms).
var collectives [sched.NumColls]collective

func init() {
	collectives = [sched.NumColls]collective{
		sched.AllReduce:     {shm: shmAllReduce, scheduled: schedAllReduce, devicesShm: shmChainAllReduce, devices: chainAllReduce, own: ownWhole, empty: true},
		sched.Reduce:        {shm: shmReduce, scheduled: schedReduce, devices: devicesScheduled, own: ownRoot, empty: true},
		sched.Broadcast:     {shm: shmBroadcast, scheduled: schedBroadcast, own: ownRoot, empty: true},
		sched.AllGather:     {shm: shmAllGather, scheduled: schedAllGather, devices: devicesScheduled, own: ownInto, empty: true},
		sched.ReduceScatter: {shm: shmReduceScatter, scheduled: schedReduceScatter, devices: devicesScheduled, own: ownFrom, empty: true, spread: spreadByDevice},
		sched.AllToAll:      {shm: shmAllToAll, scheduled: schedAllToAll, devices: devicesScheduled, own: ownWhole, empty: true, spread: spreadByLocal},
		sched.AllToAllv:     {shm: shmAllToAllv, scheduled: schedAllToAllv, own: ownBlocks},
		sched.AllToAllw:     {scheduled: schedAllToAllw, own: ownScheduled},
		sched.Barrier:       {shm: shmBarrier, scheduled: schedBarrier},
	}
	algorithms = runs(choose.Registry())
}

// AllReduce combines count elements from every rank with op and leaves the
// result in recv on every rank.
//
//gocoll:forms
func (c *Comm) allReduceReq(r *Request, send, recv []byte, count int, dt DataType, op RedOp) error {
	if err := firstErr(checkType(dt), checkOp(dt, op), checkBuf("send", send, count, dt), checkBuf("recv", recv, count, dt)); err != nil {
		return err
	}
	n := count * dt.Size()
	inPlace, err := checkInPlace(send, n, recv, n, 0)
	if err != nil {
		return err
	}
	send, recv = send[:n], recv[:n]
	r.args = args{send: send, recv: recv, count: count, dt: dt, op: op, root: -1, n: n, inPlace: inPlace}
	return c.call(r, sched.AllReduce)
}

func shmAllReduce(x *execCtx, k args) error {
	return x.shm(x.c.arena.AllReduce(x.light(), x.call(), k.send, k.recv, k.dt, k.op))
}

func schedAllReduce(x *execCtx, k args) error {
	p := x.c.params(sched.AllReduce, k.dt, k.count, k.op, -1)
	if k.inPlace {
		return x.schedule(k.a, p, k.recv, nil, k.dt, k.op)
	}
	return x.scheduleFrom(k.a, p, k.recv, k.send, 0, k.n, k.dt, k.op)
}

// Reduce combines count elements from every rank into recv on root; recv is
// not touched on other ranks.
//
//gocoll:forms
func (c *Comm) reduceReq(r *Request, send, recv []byte, count int, dt DataType, op RedOp, root int) error {
	if err := firstErr(checkType(dt), checkOp(dt, op), c.checkRank("root", root), checkBuf("send", send, count, dt)); err != nil {
		return err
	}
	n := count * dt.Size()
	inPlace := false
	if c.rank == root {
		if err := checkBuf("recv", recv, count, dt); err != nil {
			return err
		}
		var err error
		if inPlace, err = checkInPlace(send, n, recv, n, 0); err != nil {
			return err
		}
		recv = recv[:n]
	}
	send = send[:n]
	r.args = args{send: send, recv: recv, count: count, dt: dt, op: op, root: root, n: n, inPlace: inPlace}
	return c.call(r, sched.Reduce)
}

func shmReduce(x *execCtx, k args) error {
	return x.shm(x.c.arena.Reduce(x.light(), x.call(), k.send, k.recv, k.dt, k.op, k.root))
}

func schedReduce(x *execCtx, k args) error {
	c := x.c
	// acc is where this rank accumulates: the result buffer on the root,
	// scratch elsewhere (the user's send buffer is read-only).
	acc, keep := k.recv, k.n
	if c.rank != k.root {
		acc, keep = x.Buf(1, k.n), 0
	}
	p := c.params(sched.Reduce, k.dt, k.count, k.op, k.root)
	if k.inPlace {
		return x.schedule(k.a, p, acc, nil, k.dt, k.op)
	}
	return x.scheduleFrom(k.a, p, acc, k.send, 0, keep, k.dt, k.op)
}

// Broadcast copies count elements from root's send into recv on every rank.
// As with NCCL, a rank's return says that its own part is done: on one
// host, the root returns once its data is staged in shared memory, possibly
// before the others have read it (they still get it if the root has
// closed or exited meanwhile).
//
//gocoll:forms
func (c *Comm) broadcastReq(r *Request, send, recv []byte, count int, dt DataType, root int) error {
	if err := firstErr(checkType(dt), c.checkRank("root", root), checkBuf("recv", recv, count, dt)); err != nil {
		return err
	}
	n := count * dt.Size()
	inPlace := false
	if c.rank == root {
		if err := checkBuf("send", send, count, dt); err != nil {
			return err
		}
		var err error
		if inPlace, err = checkInPlace(send, n, recv, n, 0); err != nil {
			return err
		}
		send = send[:n]
	}
	recv = recv[:n]
	r.args = args{send: send, recv: recv, count: count, dt: dt, root: root, n: n, inPlace: inPlace}
	return c.call(r, sched.Broadcast)
}

func shmBroadcast(x *execCtx, k args) error {
	x.alone(&k) // the root's own copy, where every algorithm starts
	return x.shm(x.c.arena.Broadcast(x.light(), x.call(), k.recv, k.root))
}

func schedBroadcast(x *execCtx, k args) error {
	x.alone(&k) // the root's own copy, where every algorithm starts
	return x.schedule(k.a, x.c.params(sched.Broadcast, k.dt, k.count, 0, k.root), k.recv, nil, k.dt, 0)
}

// AllGather concatenates every rank's sendcount elements, in rank order,
// into recv (size*sendcount elements) on every rank. In place when send is
// recv's block of this rank.
//
//gocoll:forms
func (c *Comm) allGatherReq(r *Request, send, recv []byte, sendcount int, dt DataType) error {
	if err := firstErr(checkType(dt), checkBuf("send", send, sendcount, dt), checkBuf("recv", recv, sendcount*c.size, dt)); err != nil {
		return err
	}
	block := sendcount * dt.Size()
	inPlace, err := checkInPlace(send, block, recv, block*c.size, block*c.rank)
	if err != nil {
		return err
	}
	send, recv = send[:block], recv[:block*c.size]
	r.args = args{send: send, recv: recv, count: sendcount, dt: dt, root: -1, n: block * c.size, block: block, inPlace: inPlace}
	return c.call(r, sched.AllGather)
}

func shmAllGather(x *execCtx, k args) error {
	return x.shm(x.c.arena.AllGather(x.light(), x.call(), k.send, k.recv))
}

func schedAllGather(x *execCtx, k args) error {
	x.alone(&k) // this rank's own block, where the schedules start
	return x.schedule(k.a, x.c.params(sched.AllGather, k.dt, k.count, 0, -1), k.recv, nil, k.dt, 0)
}

// ReduceScatter combines size*recvcount elements from every rank with op and
// leaves block r of the result (recvcount elements) in recv on rank r. In
// place when recv is send's block of this rank.
//
//gocoll:forms
func (c *Comm) reduceScatterReq(r *Request, send, recv []byte, recvcount int, dt DataType, op RedOp) error {
	if err := firstErr(checkType(dt), checkOp(dt, op), checkBuf("send", send, recvcount*c.size, dt), checkBuf("recv", recv, recvcount, dt)); err != nil {
		return err
	}
	block := recvcount * dt.Size()
	// In place means recv == send + rank*block; overlap is judged from send's side.
	inPlace := block > 0 && addr(recv) == addr(send)+uintptr(block*c.rank)
	if !inPlace && overlap(send, block*c.size, recv, block) {
		return invalidArg("send and receive buffers overlap without being in place")
	}
	send, recv = send[:block*c.size], recv[:block]
	r.args = args{send: send, recv: recv, count: recvcount, dt: dt, op: op, root: -1, n: block * c.size, block: block, inPlace: inPlace}
	return c.call(r, sched.ReduceScatter)
}

func shmReduceScatter(x *execCtx, k args) error {
	return x.shm(x.c.arena.ReduceScatter(x.light(), x.call(), k.send, k.recv, k.dt, k.op))
}

func schedReduceScatter(x *execCtx, k args) error {
	c := x.c
	// Work on scratch that starts as a copy of send (made only where the
	// schedule needs it): the user's send buffer is read-only.
	work := x.Buf(1, len(k.send))
	lo, hi := k.block*c.rank, k.block*(c.rank+1)
	if err := x.scheduleFrom(k.a, c.params(sched.ReduceScatter, k.dt, k.count, k.op, -1), work, k.send, lo, hi, k.dt, k.op); err != nil {
		return err
	}
	mine := work[lo:hi]
	if !k.inPlace {
		copy(k.recv, mine)
	} else {
		copy(k.send[lo:], mine)
	}
	return nil
}

// AllToAll sends block j (count elements) of send to rank j, which stores it
// as block i of its recv, for every pair (i, j).
//
//gocoll:forms
func (c *Comm) allToAllReq(r *Request, send, recv []byte, count int, dt DataType) error {
	if err := firstErr(checkType(dt), checkBuf("send", send, count*c.size, dt), checkBuf("recv", recv, count*c.size, dt)); err != nil {
		return err
	}
	block := count * dt.Size()
	total := block * c.size
	inPlace, err := checkInPlace(send, total, recv, total, 0)
	if err != nil {
		return err
	}
	send, recv = send[:total], recv[:total]
	r.args = args{send: send, recv: recv, count: count, dt: dt, root: -1, n: total, block: block, inPlace: inPlace}
	return c.call(r, sched.AllToAll)
}

func shmAllToAll(x *execCtx, k args) error {
	return x.shm(x.c.arena.AllToAll(x.light(), x.call(), k.send, k.recv))
}

func schedAllToAll(x *execCtx, k args) error {
	src := k.send
	if k.inPlace {
		src = x.Buf(1, k.n)
		copy(src, k.send)
	}
	return x.schedule(k.a, x.c.params(sched.AllToAll, k.dt, k.count, 0, -1), k.recv, src, k.dt, 0)
}

// vScratch holds a blocking AllToAllv's block lists from one call to the
// next, so that the call allocates nothing, as the other blocking calls
// do: its request is dead once it returns. One call at a time claims it;
// a concurrent one allocates its own.
type vScratch struct {
	busy   atomic.Bool
	lay    exec.Layout
	blocks []sched.Block
}

// claim returns v if no other call holds it, else nil.
func (v *vScratch) claim() *vScratch {
	if v.busy.CompareAndSwap(false, true) {
		return v
	}
	return nil
}

// release gives back a claimed v (nil: nothing to do), letting go of the
// call's buffers.
func (v *vScratch) release() {
	if v != nil {
		v.lay = exec.Layout{}
		v.busy.Store(false)
	}
}

// AllToAllv is AllToAll with a count and a displacement (both in elements)
// per peer on each side. sendcounts[j] on rank i must equal recvcounts[i] on
// rank j; a difference is reported as a mismatch on both ranks.
//
//gocoll:forms
func (c *Comm) allToAllvReq(r *Request, v *vScratch, send []byte, sendcounts, sdispls []int, recv []byte, recvcounts, rdispls []int, dt DataType) error {
	// The block lists go in v, the blocking form's scratch, or (nil) in
	// memory of their own: the request may outlive the call.
	if err := checkType(dt); err != nil {
		return err
	}
	es := dt.Size()
	var blocks []sched.Block
	var lay *exec.Layout
	if v != nil {
		if cap(v.blocks) < 2*c.size {
			v.blocks = make([]sched.Block, 2*c.size)
		}
		blocks, lay = v.blocks[:2*c.size], &v.lay
	} else {
		blocks, lay = make([]sched.Block, 2*c.size), new(exec.Layout) // (both sides' blocks in one allocation)
	}
	sl, rl := blocks[:c.size:c.size], blocks[c.size:]
	if err := layout(sl, "send", send, sendcounts, sdispls, es); err != nil {
		return err
	}
	if err := layout(rl, "recv", recv, recvcounts, rdispls, es); err != nil {
		return err
	}
	if overlap(send, len(send), recv, len(recv)) { // (separate buffers, the usual case: n² checks saved)
		for _, r := range rl {
			for _, s := range sl {
				if overlap(send[s.Off:], s.Len, recv[r.Off:], r.Len) {
					return invalidArg("alltoallv send and receive blocks overlap")
				}
			}
		}
	}
	if i, j, ok := overlappingBlocks(rl); ok {
		return invalidArg("alltoallv receive blocks %d and %d overlap", i, j)
	}
	if sl[c.rank].Len != rl[c.rank].Len {
		return invalidArg("counts differ: rank %d sends itself %d elements but expects %d", c.rank, sendcounts[c.rank], recvcounts[c.rank])
	}
	sent := 0
	for i := range sl {
		sent += sl[i].Len
	}
	*lay = exec.Layout{Send: send, Recv: recv, SendBlocks: sl, RecvBlocks: rl}
	r.args = args{send: send, recv: recv, dt: dt, root: -1, n: sent, lay: lay}
	return c.call(r, sched.AllToAllv)
}

func shmAllToAllv(x *execCtx, k args) error {
	return x.shm(countsPeer(x.c.arena.AllToAllv(x.light(), x.call(), k.send, k.lay.SendBlocks, k.recv, k.lay.RecvBlocks)))
}

func schedAllToAllv(x *execCtx, k args) error {
	c, lay := x.c, k.lay
	p := c.params(sched.AllToAllv, k.dt, 0, 0, -1)
	p.SendBlocks, p.RecvBlocks, p.Mine = lay.SendBlocks, lay.RecvBlocks, c.rank
	lay.In, lay.Work = make([]exec.Span, c.size), make([]exec.Span, c.size)
	for i, b := range lay.SendBlocks {
		lay.In[i] = exec.Span{Off: b.Off, N: b.Len, Runs: 1}
	}
	for i, b := range lay.RecvBlocks {
		lay.Work[i] = exec.Span{Off: b.Off, N: b.Len, Runs: 1}
	}
	return x.scheduleBlocks(k.a, p, lay)
}

// overlappingBlocks finds two non-empty blocks of l that overlap: pairwise
// for a few ranks, else in offset order (a 64-rank alltoallv would check
// 2016 pairs per call).
func overlappingBlocks(l []sched.Block) (i, j int, ok bool) {
	over := func(a, b sched.Block) bool {
		return a.Len > 0 && b.Len > 0 && a.Off < b.Off+b.Len && b.Off < a.Off+a.Len
	}
	if len(l) <= 8 {
		for i := range l {
			for j := i + 1; j < len(l); j++ {
				if over(l[i], l[j]) {
					return i, j, true
				}
			}
		}
		return 0, 0, false
	}
	order := make([]int, 0, len(l))
	for i, b := range l {
		if b.Len > 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(l[a].Off, l[b].Off) })
	// Each block against the one reaching furthest among those before it.
	far := -1
	for _, k := range order {
		if far >= 0 && l[k].Off < l[far].Off+l[far].Len {
			return min(far, k), max(far, k), true
		}
		if far < 0 || l[k].Off+l[k].Len > l[far].Off+l[far].Len {
			far = k
		}
	}
	return 0, 0, false
}

// countsPeer names, in the operation's error, the other rank of a pair
// whose AllToAllv counts disagree, as the schedules' errors do.
func countsPeer(err error) error {
	if err == nil {
		return nil // (errors.As would move ce to the heap on every call)
	}
	var ce *shmcoll.CountsError
	if errors.As(err, &ce) {
		return &peerError{peer: ce.Peer(), err: err}
	}
	return err
}

// layout fills l (one block per rank) from counts and displacements in
// elements of es bytes, checked against buf.
func layout(l []sched.Block, name string, buf []byte, counts, displs []int, es int) error {
	n := len(l)
	if len(counts) != n || len(displs) != n {
		return invalidArg("%scounts and %sdispls need %d entries, got %d and %d", name[:1], name[:1], n, len(counts), len(displs))
	}
	for i := range l {
		if counts[i] < 0 || displs[i] < 0 {
			return invalidArg("%s count/displacement for rank %d is negative", name, i)
		}
		l[i] = sched.Block{Off: displs[i] * es, Len: counts[i] * es}
		if l[i].Off+l[i].Len > len(buf) {
			return invalidArg("%s block for rank %d ends at byte %d past the buffer (%d bytes)", name, i, l[i].Off+l[i].Len, len(buf))
		}
	}
	return nil
}

// Barrier returns once every rank called it.
//
//gocoll:forms
func (c *Comm) barrierReq(r *Request) error {
	r.args = args{dt: noType, root: -1}
	return c.call(r, sched.Barrier)
}

func shmBarrier(x *execCtx, _ args) error { return x.shm(x.c.arena.Barrier(x.light(), x.call())) }

func schedBarrier(x *execCtx, k args) error {
	return x.schedule(k.a, x.c.params(sched.Barrier, 0, 0, 0, -1), nil, nil, 0, 0)
}
