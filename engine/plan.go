package engine

import (
	"fmt"

	"github.com/gocoll/gocoll/engine/sched"
)

// choose picks the algorithm for a call of coll over a vector of bytes:
// GOCOLL_ALGO's when it names one that can run the call; across hosts, the
// one the cost model predicts fastest on the communicator's placement;
// otherwise the size rules of the registry.
func (c *Comm) choose(coll sched.Coll, bytes int) *algorithm {
	s := shape{coll: coll, bytes: bytes, n: c.size, shm: c.arena != nil, hosts: len(c.hosts), even: c.evenHosts}
	if coll == sched.AllToAllv {
		s.shmV = s.shm && c.arena.FitsAllToAllv()
	}
	if a := c.algo.override(coll); a != nil && a.can(s) {
		return a
	}
	// All-to-alls choose by thresholds measured across emulated hosts: the
	// model prices a message by its wire latency, while here a small
	// all-to-all costs the wake-ups of the ranks it sends to (leaderAuto).
	if c.model != nil && !s.shm && coll != sched.AllToAll && coll != sched.AllToAllv && coll != sched.AllToAllw {
		var cands []*algorithm
		for _, a := range algos(coll) {
			if a.build != nil && a.can(s) {
				cands = append(cands, a)
			}
		}
		if a := c.model.pick(c, s, cands); a != nil {
			return a
		}
	}
	return choose(&c.algo, s)
}

// params is the shape of a call as the schedule builders take it.
func (c *Comm) params(coll sched.Coll, dt DataType, count int, op RedOp, root int) sched.Params {
	p := sched.Params{
		Coll: coll, N: c.size, ElemSize: dt.Size(), Count: count, Root: root, Avg: op == Avg,
		Segments: c.opts.Segments, Radix: c.opts.BruckRadix,
		Rings: c.rings, Hosts: c.hosts, Trees: c.trees,
	}
	if len(c.hosts) > 1 {
		// Aggregation by host: the first stage stays in shared memory,
		// only the repacked messages cross the network. (Relay, one
		// message per pair of hosts, measured no faster on emulated hosts
		// where 16 processes share 2 cores; it stays a builder option.)
		p.SrcGroups, p.DstGroups = c.hosts, c.hosts
	}
	return p
}

// planKey identifies a schedule among a communicator's calls: the rest of
// Params (ranks, tuning, placement) is fixed for the communicator.
type planKey struct {
	a       *algorithm
	count   int
	es      int
	root    int
	avg     bool
	devices string // the virtual allreduce's placement
}

type plan struct {
	s   *sched.Schedule
	ops []sched.Op // this rank's program
}

// maxPlans bounds the cache; a training loop calls a handful of shapes.
const maxPlans = 64

// plan returns this rank's program of a for p, built once per shape. It
// runs under execMu, like everything that executes a collective. A
// schedule built from per-rank layouts (alltoallv's pairwise exchange) is
// built per call; a block-mode one does not depend on them and is kept.
func (c *Comm) plan(a *algorithm, p sched.Params) (plan, error) {
	key := planKey{a, p.Count, p.ElemSize, p.Root, p.Avg, ""}
	if p.Devices != nil {
		key.devices = fmt.Sprint(p.Devices)
	}
	perCall := p.SendBlocks != nil || p.RecvBlocks != nil
	if pl, ok := c.plans[key]; ok && (!perCall || pl.s.Blocks) {
		return pl, nil
	}
	s, err := a.build(p)
	if err != nil {
		return plan{}, fmt.Errorf("gocoll: %s schedule %q for %d ranks: %w", p.Coll, a.name, p.N, err)
	}
	var ops []sched.Op
	if s.Tree == nil { // the tree's ranks make their operations as they go
		ops = s.Ops(c.rank)
	}
	pl := plan{s, ops}
	if !perCall || s.Blocks {
		if len(c.plans) >= maxPlans {
			clear(c.plans)
		}
		c.plans[key] = pl
	}
	return pl, nil
}

// schedule runs a's schedule for p on this rank, with the call's vector as
// Work and, for all-to-all, its send buffer as In.
func (x *execCtx) schedule(a *algorithm, p sched.Params, work, in []byte, dt DataType, op RedOp) error {
	return x.runPlan(a, p, work, in, dt, op, nil)
}

// scheduleFrom is schedule for a reduction whose Work starts as a copy of
// src that the caller did not make (lazyWork): after it, Work holds its
// result in [keepLo, keepHi) (past that, bytes of Work the schedule never
// wrote are undefined).
func (x *execCtx) scheduleFrom(a *algorithm, p sched.Params, work, src []byte, keepLo, keepHi int, dt DataType, op RedOp) error {
	return x.runPlan(a, p, work, nil, dt, op, newLazyWork(src, keepLo, keepHi))
}

func (x *execCtx) runPlan(a *algorithm, p sched.Params, work, in []byte, dt DataType, op RedOp, lw *lazyWork) error {
	pl, err := x.c.plan(a, p)
	if err != nil {
		return err
	}
	if pl.s.Tree != nil {
		// An all-to-all of equal blocks under the control tree: blocks of
		// Count elements each. (No reduction runs under it, so no Work
		// copy is left to make lazily; should one, it is made here.)
		if lw != nil {
			lw.fill(work, 0, len(work))
		}
		bs := p.Count * p.ElemSize
		lay := &blockLayout{send: in, recv: work, in: make([]span, p.N), work: make([]span, p.N)}
		for i := range p.N {
			lay.in[i] = span{off: i * bs, n: bs, runs: 1}
			lay.work[i] = lay.in[i]
		}
		return x.runTree(p, lay)
	}
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work], bufs[sched.In] = work, in
	return x.runSchedule(pl.s, pl.ops, bufs, dt, op, lw)
}

// scheduleBlocks runs a's schedule for an alltoallv or alltoallw over the
// call's layout: in block mode, under the control tree, or (alltoallv's
// pairwise exchange, built from p's layouts) over the bytes of the two
// buffers.
func (x *execCtx) scheduleBlocks(a *algorithm, p sched.Params, lay *blockLayout) error {
	pl, err := x.c.plan(a, p)
	if err != nil {
		return err
	}
	switch {
	case pl.s.Tree != nil:
		return x.runTree(p, lay)
	case pl.s.Blocks:
		return x.runBlocks(pl.s, pl.ops, lay)
	}
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work], bufs[sched.In] = lay.recv, lay.send
	return x.runSchedule(pl.s, pl.ops, bufs, Uint8, 0, nil)
}
