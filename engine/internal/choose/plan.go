package choose

import (
	"fmt"

	"github.com/gocoll/gocoll/engine/sched"
)

// planKey identifies a schedule among a communicator's calls: the rest of
// Params (ranks, tuning, placement) is fixed for the communicator.
type planKey struct {
	a       *Entry
	count   int
	es      int
	root    int
	avg     bool
	devices string // the virtual allreduce's placement
}

// A Plan is a schedule and one rank's program of it.
type Plan struct {
	S   *sched.Schedule
	Ops []sched.Op // the rank's program (nil under a control tree)
}

// maxPlans bounds the cache; a training loop calls a handful of shapes.
const maxPlans = 64

// Plans caches one rank's plans, built once per shape. The zero value is
// ready; it is not safe for concurrent use (the engine calls it under the
// lock that runs its collectives).
type Plans struct {
	m map[planKey]Plan
}

// Get returns rank's program of a for p, built once per shape. A schedule
// built from per-rank layouts (alltoallv's pairwise exchange) is built per
// call; a block-mode one does not depend on them and is kept.
func (c *Plans) Get(a *Entry, p sched.Params, rank int) (Plan, error) {
	key := planKey{a, p.Count, p.ElemSize, p.Root, p.Avg, ""}
	if p.Devices != nil {
		key.devices = fmt.Sprint(p.Devices)
	}
	perCall := p.SendBlocks != nil || p.RecvBlocks != nil
	if pl, ok := c.m[key]; ok && (!perCall || pl.S.Blocks) {
		return pl, nil
	}
	s, err := a.Build(p)
	if err != nil {
		return Plan{}, fmt.Errorf("gocoll: %s schedule %q for %d ranks: %w", p.Coll, a.Name, p.N, err)
	}
	var ops []sched.Op
	if s.Tree == nil { // the tree's ranks make their operations as they go
		ops = s.Ops(rank)
	}
	pl := Plan{s, ops}
	if !perCall || s.Blocks {
		if c.m == nil {
			c.m = map[planKey]Plan{}
		}
		if len(c.m) >= maxPlans {
			clear(c.m)
		}
		c.m[key] = pl
	}
	return pl, nil
}
