package engine

import (
	"fmt"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/sched"
)

// An algorithm is a registry entry (engine/internal/choose, which chooses
// it) with how this engine runs it: a schedule through the executor, or
// the collective's function of the shared-memory arena.
type algorithm struct {
	coll sched.Coll
	name string
	e    *choose.Entry
	d    *collective // its collective's descriptor
	// run runs a call: scheduled for the plain entries with a builder,
	// else the run the collective's descriptor gives the entry.
	run runFunc
}

// algorithms is the registry with the runs, entry ID at index ID (filled
// by init, after the descriptors).
var algorithms []algorithm

// runs gives each registry entry its run, from its collective's
// descriptor.
func runs(reg []*choose.Entry) []algorithm {
	out := make([]algorithm, len(reg))
	for i, e := range reg {
		d := &collectives[e.Coll]
		run := scheduled
		switch {
		case e.Virtual && e.Arena():
			run = d.devicesShm
		case e.Virtual:
			run = d.devices
		case e.Arena():
			run = d.shm
		}
		if run == nil {
			panic("gocoll: no run for " + e.Coll.String() + "/" + e.Name)
		}
		out[i] = algorithm{coll: e.Coll, name: e.Name, e: e, d: d, run: run}
	}
	return out
}

// shape describes a plain call of coll over a vector of bytes to the
// choice (choose.Chooser: GOCOLL_ALGO, the cost model across hosts, the
// size rules).
func (c *Comm) shape(coll sched.Coll, bytes int) choose.Shape {
	s := choose.Shape{Coll: coll, Bytes: bytes, N: c.size, Shm: c.arena != nil, Hosts: len(c.layout.hosts), Even: c.layout.evenHosts}
	if coll == sched.AllToAllv {
		s.ShmV = s.Shm && c.arena.FitsAllToAllv()
	}
	return s
}

// parseAlgoSpec parses GOCOLL_ALGO.
func parseAlgoSpec(s string) (choose.Overrides, error) {
	o, err := choose.ParseOverrides(s)
	if err != nil {
		return o, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return o, nil
}

// Schedules lists every schedule the engine can run, under the names
// GOCOLL_ALGO takes, collective by collective in order of preference:
// what tools that predict or build schedules by name walk (gocoll-topo).
// The shared-memory collectives ("shm") are not schedules and are not
// listed.
func Schedules() []sched.Entry { return choose.Schedules() }

// params is the shape of a call as the schedule builders take it.
func (c *Comm) params(coll sched.Coll, dt DataType, count int, op RedOp, root int) sched.Params {
	p := sched.Params{
		Coll: coll, N: c.size, ElemSize: dt.Size(), Count: count, Root: root, Avg: op == Avg,
		Segments: c.opts.Segments, Radix: c.opts.BruckRadix,
		Rings: c.layout.rings, Hosts: c.layout.hosts, Trees: c.layout.trees,
	}
	if len(c.layout.hosts) > 1 {
		// Aggregation by host: the first stage stays in shared memory,
		// only the repacked messages cross the network. (Relay, one
		// message per pair of hosts, measured no faster on emulated hosts
		// where 16 processes share 2 cores; it stays a builder option.)
		p.SrcGroups, p.DstGroups = c.layout.hosts, c.layout.hosts
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
	return x.runPlan(a, p, work, nil, dt, op, exec.NewLazyWork(src, keepLo, keepHi))
}

func (x *execCtx) runPlan(a *algorithm, p sched.Params, work, in []byte, dt DataType, op RedOp, lw *exec.LazyWork) error {
	pl, err := x.c.plans.Get(a.e, p, x.c.rank)
	if err != nil {
		return err
	}
	if pl.S.Tree != nil {
		// An all-to-all of equal blocks under the control tree: blocks of
		// Count elements each. (No reduction runs under it, so no Work
		// copy is left to make lazily; should one, it is made here.)
		if lw != nil {
			lw.Fill(work, 0, len(work))
		}
		bs := p.Count * p.ElemSize
		lay := &exec.Layout{Send: in, Recv: work, In: make([]exec.Span, p.N), Work: make([]exec.Span, p.N)}
		for i := range p.N {
			lay.In[i] = exec.Span{Off: i * bs, N: bs, Runs: 1}
			lay.Work[i] = lay.In[i]
		}
		return exec.RunTree(x, p, lay)
	}
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work], bufs[sched.In] = work, in
	return exec.Run(x, pl.S, pl.Ops, bufs, dt, op, lw)
}

// scheduleBlocks runs a's schedule for an alltoallv or alltoallw over the
// call's layout: in block mode, under the control tree, or (alltoallv's
// pairwise exchange, built from p's layouts) over the bytes of the two
// buffers.
func (x *execCtx) scheduleBlocks(a *algorithm, p sched.Params, lay *exec.Layout) error {
	pl, err := x.c.plans.Get(a.e, p, x.c.rank)
	if err != nil {
		return err
	}
	switch {
	case pl.S.Tree != nil:
		return exec.RunTree(x, p, lay)
	case pl.S.Blocks:
		return exec.RunBlocks(x, pl.S, pl.Ops, lay)
	}
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work], bufs[sched.In] = lay.Recv, lay.Send
	return exec.Run(x, pl.S, pl.Ops, bufs, Uint8, 0, nil)
}
