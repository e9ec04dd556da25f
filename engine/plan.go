package engine

import (
	"fmt"

	"github.com/gocoll/gocoll/engine/sched"
)

// choose picks the algorithm for a call of coll over a vector of bytes.
func (c *Comm) choose(coll sched.Coll, bytes int) *algorithm {
	return choose(c.algo, shape{coll: coll, bytes: bytes, n: c.size, shm: c.arena != nil, hosts: len(c.hosts), even: c.evenHosts})
}

// params is the shape of a call as the schedule builders take it.
func (c *Comm) params(coll sched.Coll, dt DataType, count int, op RedOp, root int) sched.Params {
	return sched.Params{
		Coll: coll, N: c.size, ElemSize: dt.Size(), Count: count, Root: root, Avg: op == Avg,
		Segments: c.opts.Segments, Radix: c.opts.BruckRadix,
		Rings: c.rings, Hosts: c.hosts,
	}
}

// planKey identifies a schedule among a communicator's calls: the rest of
// Params (ranks, tuning, placement) is fixed for the communicator.
type planKey struct {
	a     *algorithm
	count int
	es    int
	root  int
	avg   bool
}

type plan struct {
	s   *sched.Schedule
	ops []sched.Op // this rank's program
}

// maxPlans bounds the cache; a training loop calls a handful of shapes.
const maxPlans = 64

// plan returns this rank's program of a for p, built once per shape. It
// runs under execMu, like everything that executes a collective.
func (c *Comm) plan(a *algorithm, p sched.Params) (plan, error) {
	cacheable := p.SendBlocks == nil && p.RecvBlocks == nil
	key := planKey{a, p.Count, p.ElemSize, p.Root, p.Avg}
	if cacheable {
		if pl, ok := c.plans[key]; ok {
			return pl, nil
		}
	}
	s, err := a.build(p)
	if err != nil {
		return plan{}, fmt.Errorf("gocoll: %s schedule %q for %d ranks: %w", p.Coll, a.name, p.N, err)
	}
	pl := plan{s, s.Ops(c.rank)}
	if cacheable {
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
	pl, err := x.c.plan(a, p)
	if err != nil {
		return err
	}
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work], bufs[sched.In] = work, in
	return x.runSchedule(pl.s, pl.ops, bufs, dt, op)
}
