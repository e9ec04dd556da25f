package engine

import (
	"github.com/gocoll/gocoll/engine/sched"
)

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
	pl, err := x.c.plans.Get(a.e, p, x.c.rank)
	if err != nil {
		return err
	}
	if pl.S.Tree != nil {
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
	return x.runSchedule(pl.S, pl.Ops, bufs, dt, op, lw)
}

// scheduleBlocks runs a's schedule for an alltoallv or alltoallw over the
// call's layout: in block mode, under the control tree, or (alltoallv's
// pairwise exchange, built from p's layouts) over the bytes of the two
// buffers.
func (x *execCtx) scheduleBlocks(a *algorithm, p sched.Params, lay *blockLayout) error {
	pl, err := x.c.plans.Get(a.e, p, x.c.rank)
	if err != nil {
		return err
	}
	switch {
	case pl.S.Tree != nil:
		return x.runTree(p, lay)
	case pl.S.Blocks:
		return x.runBlocks(pl.S, pl.Ops, lay)
	}
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work], bufs[sched.In] = lay.recv, lay.send
	return x.runSchedule(pl.S, pl.Ops, bufs, Uint8, 0, nil)
}
