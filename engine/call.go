package engine

import (
	"context"
	"log/slog"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
)

// The issue path of every collective, plain or over virtual devices: its
// constructor (collectives.go, alltoallw.go, virtual.go) checks the
// arguments and cuts the buffers to size into args; call chooses the
// algorithm (the registry, engine/internal/choose) and makes the request;
// issue runs it, on the caller's goroutine or the worker's: where no peer
// takes part, by the collective's own copy (alone); otherwise by the
// algorithm's run, which the collective's descriptor (collectives) gives.
// The public forms of each constructor, blocking, I- and Op-, are
// generated (forms.go) and differ only in what they do with the request
// (Comm.run, start, Op).
//
//go:generate go test -run ^TestForms$ ./internal/forms -update

// args are a collective's arguments, checked and cut to size.
type args struct {
	a          *algorithm
	sig        uint64
	send, recv []byte
	count      int // elements per rank, as the collective's count argument
	dt         DataType
	op         RedOp
	root       int
	n          int // bytes the choice, the flight recorder and logs see
	block      int // bytes per rank's block, where blocks apply
	inPlace    bool
	lay        *exec.Layout // the v and w all-to-alls' blocks
	dev        *devCall     // a call over virtual devices (virtual.go); nil for a plain one
}

// runFunc runs a checked call on this rank.
type runFunc func(x *execCtx, k args) error

// A collective is the descriptor of one collective: how the engine runs
// its calls once its constructor has checked them into args. The runs are
// the registry entries' (algo.go gives each entry one); the rest says
// what a rank does where no peer takes part, and how a call over virtual
// devices hands its result to them.
type collective struct {
	// shm runs a call in the shared-memory arena (the registry's "shm"
	// entry), scheduled by its algorithm's schedule (a.e.Build).
	shm, scheduled runFunc
	// devicesShm and devices are the same for a call over virtual devices
	// (the registry's Virtual entries; virtual.go).
	devicesShm, devices runFunc
	// own is what a rank does with its own data where no peer takes part.
	own own
	// empty: a call of no bytes exchanges nothing.
	empty bool
	// spread is how the result of a call over virtual devices reaches the
	// local devices' receive buffers.
	spread spread
}

// own is what a call does with a rank's own data (execCtx.alone).
type own uint8

const (
	ownNothing   own = iota // the barrier
	ownWhole                // recv is a copy of send
	ownRoot                 // only the root has a result: recv a copy of send (Avg: divided by the ranks)
	ownInto                 // send is recv's block of this rank (allgather)
	ownFrom                 // recv is send's block of this rank (reduce-scatter)
	ownBlocks               // this rank's block of the layout (alltoallv)
	ownScheduled            // by the schedule, which copies it (alltoallw: strided blocks)
)

// spread is how the result reaches the devices' receive buffers
// (devCall.spread).
type spread uint8

const (
	spreadWhole    spread = iota // each device gets all of it
	spreadByDevice               // device v gets block v (reduce-scatter)
	spreadByLocal                // the k-th local device gets block k (all-to-all)
)

// call completes r, whose args its constructor filled in (the algorithm for
// k.n bytes and the signature), into a collective's request. Requests are
// built in place, never returned by value: a request is ~250 bytes, and
// its copies between the constructor, the Op and the run were a sixth of a
// small call's instructions.
func (c *Comm) call(r *Request, coll sched.Coll) error {
	k := &r.args
	root := k.root
	var e *choose.Entry
	if k.dev == nil {
		e = c.choice.Choose(c.shape(coll, k.n))
	} else {
		// Over virtual devices: the collective's virtual entries (the
		// arena's only where it can fold the devices' chain), and the
		// placement in the signature, so that ranks that disagree on it
		// fail at the first message instead of running different
		// schedules.
		s := c.shape(coll, k.n)
		s.Shm = k.dev.order != nil
		e, root = c.choice.OverDevices(s), k.dev.place
	}
	k.a = &algorithms[e.ID]
	dt := k.dt
	if dt == noType && coll != sched.AllToAllw {
		dt = 0 // (the barrier's signature has always hashed type 0)
	}
	k.sig = signature(coll, dt, k.count, k.op, root, k.a.name)
	r.op, r.algo, r.dt, r.hasType, r.bytes, r.peer = coll.String(), k.a.name, k.dt, k.dt != noType, k.n, -1
	return nil
}

// issue runs a collective's request. The one-rank exit is here, before the
// algorithm: the shared-memory arena exists only for two ranks or more.
// k stays the request's: the run gets a copy, as a pointer passed to a
// function value would move the request to the heap.
func (x *execCtx) issue(k *args) error {
	x.start(k.sig, k.a, k.n)
	if k.dev != nil {
		return x.devices(*k)
	}
	if x.c.size == 1 {
		return x.alone(k)
	}
	return k.a.run(x, *k)
}

// devices runs a call over virtual devices: the local devices' vectors
// copied together into In unless they lie back to back, Work made scratch
// unless the caller's buffer can be, the entry's run, and the result
// spread from Work to the devices' receive buffers. A broadcast, which
// has no entries of its own, is a plain call, its result spread.
func (x *execCtx) devices(k args) error {
	c, d := x.c, k.dev
	if !k.a.e.Virtual {
		var err error
		if c.size == 1 {
			err = x.alone(&k)
		} else {
			err = k.a.run(x, k)
		}
		if err != nil {
			return err
		}
		copyOut(d.out, k.recv)
		return nil
	}
	if d.workN == 0 {
		return nil // nothing to fold or move on this rank
	}
	if k.send == nil && len(d.send) > 0 {
		k.send = c.pool.Get(len(d.send) * d.sendN)
		defer c.pool.Put(k.send)
		for i, s := range d.send {
			copy(k.send[i*d.sendN:], s[:d.sendN])
		}
	}
	if k.recv == nil {
		k.recv = c.pool.Get(d.workN)
		defer c.pool.Put(k.recv)
	}
	if err := k.a.run(x, k); err != nil {
		return err
	}
	d.spread(k.a.d.spread, k.recv, c.rank)
	return nil
}

// scheduled is the run of the registry's schedule entries: a call of no
// bytes has nothing to exchange.
func scheduled(x *execCtx, k args) error {
	d := k.a.d
	if k.n == 0 && d.empty {
		return x.alone(&k)
	}
	return d.scheduled(x, k)
}

// alone does a call in which no peer takes part (a one-rank communicator,
// or a call of no bytes): local copies at most, as the collective's
// descriptor says. One function rather than one per collective: called
// directly, k stays on the caller's stack.
func (x *execCtx) alone(k *args) error {
	c := x.c
	switch d := k.a.d; d.own {
	case ownWhole:
		if !k.inPlace {
			copy(k.recv, k.send)
		}
	case ownRoot:
		if c.rank != k.root {
			break
		}
		if !k.inPlace {
			copy(k.recv, k.send)
		}
		if k.op == Avg {
			// An average over the ranks even of nothing, as the
			// schedules' is.
			kernel.DivideBy(k.recv, k.dt, c.size)
		}
	case ownInto:
		if !k.inPlace {
			copy(k.recv[k.block*c.rank:], k.send)
		}
	case ownFrom:
		if !k.inPlace { // (in place, its block already is the result)
			copy(k.recv, k.send[k.block*c.rank:k.block*(c.rank+1)])
		}
	case ownBlocks:
		s, r := k.lay.SendBlocks[c.rank], k.lay.RecvBlocks[c.rank]
		copy(k.recv[r.Off:r.Off+r.Len], k.send[s.Off:s.Off+s.Len])
	case ownScheduled:
		return d.scheduled(x, *k)
	}
	return nil
}

// start records the collective's signature and algorithm, and logs which
// algorithm runs it: at INFO the first time the communicator uses it for
// this collective, at DEBUG every time.
func (x *execCtx) start(sig uint64, a *algorithm, bytes int) {
	x.sig, x.algo, x.bytes = sig, a.name, bytes
	// At the default level (WARN) this costs one level check, nothing more
	// (a handler that drops INFO drops DEBUG too).
	if !x.c.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	if _, seen := x.c.announced.LoadOrStore(a, true); !seen {
		x.c.log.Info("algorithm chosen", "op", x.op, "algo", a.name, "bytes", bytes)
	}
	if x.c.log.Enabled(context.Background(), slog.LevelDebug) {
		x.c.log.Debug("collective", "op", x.op, "seq", x.seq, "algo", a.name, "bytes", bytes)
	}
}

// signature fingerprints a collective call so that ranks calling different
// collectives (or the same with another type, count, op, root or algorithm)
// find out from the first message header instead of exchanging garbage.
func signature(coll sched.Coll, dt DataType, count int, op RedOp, root int, algo string) uint64 {
	// This runs on every call: no fmt, no allocation, and whole words mixed
	// at once (byte-wise FNV-1a over the fields showed in a small call's
	// profile). Only equality across ranks matters, not the function.
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	mix := func(v uint64) {
		h = (h ^ v) * prime
		h ^= h >> 29
	}
	for i := 0; i < len(algo); i++ {
		h = (h ^ uint64(algo[i])) * prime
	}
	mix(uint64(coll) | uint64(uint16(len(algo)))<<8 | uint64(uint8(dt))<<24 | uint64(uint8(op))<<32)
	mix(uint64(count))
	mix(uint64(int64(root)))
	return h
}

// pointToPoint stands for sends and receives in signatures: they are no
// collective, but their messages are fingerprinted the same way.
const pointToPoint = sched.Coll(0xff)
