package engine

import (
	"context"
	"log/slog"

	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
)

// The issue path of every collective: its constructor (collectives.go)
// checks the arguments and cuts the buffers to size into args, call
// chooses the algorithm and makes the request, and issue runs it, on the
// caller's goroutine or the worker's: where no peer takes part, by the
// collective's alone; otherwise by the algorithm's run, the shared-memory
// arena or a schedule (the registry, engine/internal/choose). The blocking, I- and Op-
// forms differ only in what they do with the request (Comm.run, start, op).

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
}

// runFunc runs a checked call on this rank.
type runFunc func(x *execCtx, k args) error

// A collective is how its calls run by a schedule.
type collective struct {
	// scheduled runs a call by its algorithm's schedule (a.e.Build).
	scheduled runFunc
	// empty: a call of no bytes exchanges nothing (all but the barrier).
	empty bool
}

// collectives is each collective's entry, filled by collectives.go.
var collectives [sched.NumColls]collective

// call completes r, whose args its constructor filled in (the algorithm for
// k.n bytes and the signature), into a collective's request. Requests are
// built in place, never returned by value: a request is ~250 bytes, and
// its copies between the constructor, the Op and the run were a sixth of a
// small call's instructions.
func (c *Comm) call(r *Request, coll sched.Coll) error {
	k := &r.args
	k.a = c.choose(coll, k.n)
	dt := k.dt
	if dt == noType && coll != sched.AllToAllw {
		dt = 0 // (the barrier's signature has always hashed type 0)
	}
	k.sig = signature(coll, dt, k.count, k.op, k.root, k.a.name)
	r.op, r.algo, r.dt, r.hasType, r.bytes, r.peer = coll.String(), k.a.name, k.dt, k.dt != noType, k.n, -1
	return nil
}

// issue runs a collective's request. The one-rank exit is here, before the
// algorithm: the shared-memory arena exists only for two ranks or more.
// k stays the request's: the run gets a copy, as a pointer passed to a
// function value would move the request to the heap.
func (x *execCtx) issue(k *args) error {
	x.start(k.sig, k.a, k.n)
	if x.c.size == 1 {
		return x.alone(k)
	}
	return k.a.run(x, *k)
}

// scheduled is the run of the registry's schedule entries: a call of no
// bytes has nothing to exchange.
func scheduled(x *execCtx, k args) error {
	d := &collectives[k.a.coll]
	if k.n == 0 && d.empty {
		return x.alone(&k)
	}
	return d.scheduled(x, k)
}

// alone does a call in which no peer takes part (a one-rank communicator,
// or a call of no bytes): local copies at most. One switch rather than a
// function per collective: called directly, k stays on the caller's stack.
func (x *execCtx) alone(k *args) error {
	c := x.c
	switch k.a.coll {
	case sched.AllReduce, sched.AllToAll:
		if !k.inPlace {
			copy(k.recv, k.send)
		}
	case sched.Reduce:
		// Only the root has a result (an average over the ranks even of
		// nothing, as the schedules' is).
		if c.rank != k.root {
			break
		}
		if !k.inPlace {
			copy(k.recv, k.send)
		}
		if k.op == Avg {
			kernel.DivideBy(k.recv, k.dt, c.size)
		}
	case sched.Broadcast:
		if c.rank == k.root && !k.inPlace {
			copy(k.recv, k.send)
		}
	case sched.AllGather:
		if !k.inPlace {
			copy(k.recv[k.block*c.rank:], k.send)
		}
	case sched.ReduceScatter:
		if !k.inPlace { // (in place, its block already is the result)
			copy(k.recv, k.send[k.block*c.rank:k.block*(c.rank+1)])
		}
	case sched.AllToAllv:
		s, r := k.lay.SendBlocks[c.rank], k.lay.RecvBlocks[c.rank]
		copy(k.recv[r.Off:r.Off+r.Len], k.send[s.Off:s.Off+s.Len])
	case sched.AllToAllw:
		// Its schedule copies a rank's own block, strided or not.
		return schedAllToAllw(x, *k)
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
