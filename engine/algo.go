package engine

import (
	"fmt"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/sched"
)

// An algorithm is a registry entry (engine/internal/choose, which chooses
// it) with how this engine runs it: a schedule through the executor, or
// the collective's function of the shared-memory arena.
type algorithm struct {
	coll sched.Coll
	name string
	e    *choose.Entry
	// run runs a call: scheduled for the entries with a builder, a
	// function of the arena for the others.
	run runFunc
}

// arenaRuns is each collective's run in the shared-memory arena, for the
// registry's arena entries ("shm").
var arenaRuns = [sched.NumColls]runFunc{
	sched.AllReduce:     shmAllReduce,
	sched.Reduce:        shmReduce,
	sched.Broadcast:     shmBroadcast,
	sched.AllGather:     shmAllGather,
	sched.ReduceScatter: shmReduceScatter,
	sched.AllToAll:      shmAllToAll,
	sched.AllToAllv:     shmAllToAllv,
	sched.Barrier:       shmBarrier,
}

// algorithms is the registry with the runs, entry ID at index ID.
var algorithms = func() []algorithm {
	reg := choose.Registry()
	out := make([]algorithm, len(reg))
	for i, e := range reg {
		run := scheduled
		if e.Arena() {
			run = arenaRuns[e.Coll]
			if run == nil {
				panic("gocoll: no shared-memory run for " + e.Coll.String())
			}
		}
		out[i] = algorithm{coll: e.Coll, name: e.Name, e: e, run: run}
	}
	return out
}()

// choose picks the algorithm for a call of coll over a vector of bytes
// (choose.Chooser: GOCOLL_ALGO, the cost model across hosts, the size
// rules).
func (c *Comm) choose(coll sched.Coll, bytes int) *algorithm {
	s := choose.Shape{Coll: coll, Bytes: bytes, N: c.size, Shm: c.arena != nil, Hosts: len(c.hosts), Even: c.evenHosts}
	if coll == sched.AllToAllv {
		s.ShmV = s.Shm && c.arena.FitsAllToAllv()
	}
	return &algorithms[c.choice.Choose(s).ID]
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
