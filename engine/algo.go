package engine

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gocoll/gocoll/engine/sched"
)

// An algorithm is an entry of the registry: a collective, a name (what
// GOCOLL_ALGO and logs call it), how it runs a call (its schedule's builder,
// or the shared-memory arena), whether it can run a call, and whether the
// size rules pick it by default. The choice for
// a call walks the table in order, so the order of a collective's entries is
// its order of preference.
type algorithm struct {
	coll sched.Coll
	name string
	// build makes the schedule; nil for the shared-memory collectives
	// (package shmcoll), which read each other's memory instead of
	// exchanging messages.
	build sched.Builder
	// run runs a call: scheduled for the entries with a builder, a
	// function of the arena for the others.
	run runFunc
	// can says whether the algorithm can run the call at all.
	can func(s shape) bool
	// auto says whether the size rules pick it when nothing earlier did.
	auto func(s shape) bool
}

// shape is what the choice may depend on: values every rank agrees on, so
// that every rank picks the same algorithm (the choice is also part of
// every message's signature).
type shape struct {
	coll  sched.Coll
	bytes int // the call's vector in bytes (nccl-tests sizes)
	n     int // ranks
	shm   bool
	shmV  bool // the arena has room for AllToAllv's columns (shmcoll.Arena.FitsAllToAllv)
	hosts int  // hosts the ranks are on
	even  bool
}

func (s shape) pow2() bool { return s.n&(s.n-1) == 0 }

// multiHost: the ranks span hosts, each holding as many: the hierarchical
// forms apply.
func (s shape) multiHost() bool { return s.hosts > 1 && s.even }

// Size thresholds of the automatic choice, in bytes of the call's vector.
const (
	smallAllreduce = 16 << 10 // below: recursive doubling (latency bound)
	largeAllreduce = 4 << 20  // above: ring when ranks are not a power of two
	smallAlltoall  = 256      // per-peer block size below which Bruck aggregates
	smallBroadcast = 256 << 10
	hierMin        = 64 << 10 // across hosts, from here the hierarchical forms
)

// All-to-all across hosts, in bytes per peer (measured with build/hosts on
// 2x4, 4x2, 8x1, 2x8 and 4x4 emulated hosts at 1 Gbit/s; the table in
// docs/algorithms.md, "Choice"): where hosts hold leaderRanks ranks or more, one
// repacking rank per host up to leaderBlock, at 16 ranks and more up to
// leaderBigBlock; Bruck up to hostsBruckBlock; with one rank per host,
// every block sent at once from there up to leaderOneBlock.
const (
	leaderRanks     = 4
	leaderBlock     = 1 << 10
	hostsBruckBlock = 4 << 10
	leaderBigBlock  = 8 << 10
	leaderOneBlock  = 64 << 10
)

func always(shape) bool    { return true }
func onlyShm(s shape) bool { return s.shm }
func shmV(s shape) bool    { return s.shmV }
func hier(s shape) bool    { return s.multiHost() }
func hierAuto(s shape) bool {
	return s.multiHost() && s.bytes >= hierMin
}

// builder is the catalogue's builder for coll and name (the registry and
// gocoll-topo share the catalogue of package sched).
func builder(coll sched.Coll, name string) sched.Builder {
	e, err := sched.Find(coll, name)
	if err != nil {
		panic(err) // the table below names only catalogue entries
	}
	return e.Build
}

// byName is the registry entry that runs the catalogue's schedule coll/name.
func byName(coll sched.Coll, name string, can, auto func(shape) bool) algorithm {
	return algorithm{coll: coll, name: name, build: builder(coll, name), run: scheduled, can: can, auto: auto}
}

// inArena is the registry entry "shm" that runs coll by run in the
// shared-memory arena, wherever can allows (first in its collective's
// order: preferred whenever it can run).
func inArena(coll sched.Coll, run runFunc, can func(shape) bool) algorithm {
	return algorithm{coll: coll, name: "shm", run: run, can: can, auto: always}
}

var registry = []algorithm{
	inArena(sched.AllReduce, shmAllReduce, onlyShm),
	byName(sched.AllReduce, "hier", hier, hierAuto),
	byName(sched.AllReduce, "rd", always, func(s shape) bool { return s.bytes <= smallAllreduce }),
	byName(sched.AllReduce, "ring", always, func(s shape) bool { return s.bytes >= largeAllreduce && !s.pow2() }),
	byName(sched.AllReduce, "hd", always, always),
	byName(sched.AllReduce, "dbtree", always, never),

	inArena(sched.Reduce, shmReduce, onlyShm),
	byName(sched.Reduce, "tree", always, func(s shape) bool { return s.bytes <= smallAllreduce }),
	byName(sched.Reduce, "hd", always, always),

	inArena(sched.Broadcast, shmBroadcast, onlyShm),
	byName(sched.Broadcast, "hier", hier, hierAuto),
	byName(sched.Broadcast, "tree", always, func(s shape) bool { return s.bytes <= smallBroadcast || s.n <= 2 }),
	byName(sched.Broadcast, "pipeline", always, always),

	inArena(sched.AllGather, shmAllGather, onlyShm),
	byName(sched.AllGather, "hier", hier, hierAuto),
	byName(sched.AllGather, "ring", always, always),

	inArena(sched.ReduceScatter, shmReduceScatter, onlyShm),
	byName(sched.ReduceScatter, "hier", hier, hierAuto),
	byName(sched.ReduceScatter, "ring", always, always),
	byName(sched.ReduceScatter, "hd", always, never),

	inArena(sched.AllToAll, shmAllToAll, onlyShm),
	// The aggregation of docs/design/aggregated-alltoall.md with one repacking rank per host, which
	// also relays: the fewest messages of all (36 on 4 hosts × 4 ranks,
	// Bruck 64, pairwise 240), every byte sent three times.
	byName(sched.AllToAll, "aggregate-leader", always, leaderAuto),
	byName(sched.AllToAll, "bruck", always, bruckAuto),
	byName(sched.AllToAll, "pairwise", always, always),
	// The same aggregation with the sub-matrices spread over the
	// ranks (about 2√N messages per rank, every byte sent twice): measured
	// never clearly ahead of the leader form or Bruck, so by name only.
	byName(sched.AllToAll, "aggregate", always, never),
	// The same under its control tree, which pairs sub-groups
	// as their ranks arrive (engine/tree.go): by name only.
	byName(sched.AllToAll, "aggregate-tree", always, never),

	// Through the arena's slots, a column per rank, its owner's block sizes
	// in a line beside the slots (one barrier per column-wide piece; the
	// pairwise schedule over the shared-memory transport, which ran before,
	// took an order of magnitude longer than AllToAll for small calls and
	// allocated per call).
	inArena(sched.AllToAllv, shmAllToAllv, shmV),
	byName(sched.AllToAllv, "pairwise", always, always),
	// Aggregation with the block sizes in the messages (block mode).
	byName(sched.AllToAllv, "aggregate", always, never),
	byName(sched.AllToAllv, "aggregate-tree", always, never),

	byName(sched.AllToAllw, "pairwise", always, always),
	byName(sched.AllToAllw, "aggregate", always, never),
	byName(sched.AllToAllw, "aggregate-tree", always, never),

	inArena(sched.Barrier, shmBarrier, onlyShm),
	byName(sched.Barrier, "dissemination", always, always),
}

func never(shape) bool { return false }

// block is an all-to-all's bytes per peer.
func (s shape) block() int { return s.bytes / max(s.n, 1) }

// leaderAuto: across hosts with at least leaderRanks ranks each, where the
// messages a rank sends and wakes for cost more than moving every byte
// once more (with two ranks a host, a leader saves one message and Bruck
// stays ahead); with one rank per host, where it is every block sent at
// once (groups of one), for the mid-sized blocks past Bruck's.
func leaderAuto(s shape) bool {
	if s.hosts <= 1 {
		return false
	}
	b := s.block()
	switch perHost := s.n / s.hosts; {
	case perHost == 1:
		return b > hostsBruckBlock && b <= leaderOneBlock
	case perHost >= leaderRanks:
		return b <= leaderBlock || (s.n >= 16 && b <= leaderBigBlock)
	}
	return false
}

// bruckAuto: log N rounds instead of N-1 messages while blocks are small;
// across hosts, where each message crosses the network, up to larger ones.
func bruckAuto(s shape) bool {
	if s.n <= 2 {
		return false
	}
	if s.hosts > 1 {
		return s.block() <= hostsBruckBlock
	}
	return s.block() <= smallAlltoall
}

// algos lists the registry's entries for coll, in preference order.
func algos(coll sched.Coll) []*algorithm {
	var out []*algorithm
	for i := range registry {
		if registry[i].coll == coll {
			out = append(out, &registry[i])
		}
	}
	return out
}

// byColl is the registry's entries per collective, in the registry's
// order: choose walks only its collective's.
var byColl = func() (t [sched.NumColls][]*algorithm) {
	for i := range registry {
		a := &registry[i]
		t[a.coll] = append(t[a.coll], a)
	}
	return t
}()

func lookup(coll sched.Coll, name string) *algorithm {
	for i := range registry {
		if registry[i].coll == coll && registry[i].name == name {
			return &registry[i]
		}
	}
	return nil
}

// algoSpec is a parsed GOCOLL_ALGO: the forced algorithm per collective
// (nil: none), from a name given for that collective or, failing that, a
// bare name that applies to every collective that has it. Resolved once:
// every call consults it.
type algoSpec struct {
	forced [sched.NumColls]*algorithm
}

func parseAlgoSpec(s string) (algoSpec, error) {
	var spec algoSpec
	if strings.TrimSpace(s) == "" {
		return spec, nil
	}
	per := map[sched.Coll]*algorithm{}
	bare := ""
	for _, part := range strings.Split(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		cname, name, found := strings.Cut(part, "=")
		if !found {
			if !knownAnywhere(part) {
				return spec, fmt.Errorf("%w: unknown algorithm %q; known: %s", ErrInvalidArgument, part, knownAlgos())
			}
			bare = part
			continue
		}
		coll, ok := sched.ParseColl(cname)
		a := lookup(coll, name)
		if !ok || a == nil {
			return spec, fmt.Errorf("%w: unknown algorithm %q; known: %s", ErrInvalidArgument, part, knownAlgos())
		}
		per[coll] = a
	}
	for coll := range sched.NumColls {
		if a, ok := per[coll]; ok {
			spec.forced[coll] = a
		} else if bare != "" {
			spec.forced[coll] = lookup(coll, bare)
		}
	}
	return spec, nil
}

func knownAnywhere(name string) bool {
	for _, a := range registry {
		if a.name == name {
			return true
		}
	}
	return false
}

func knownAlgos() string {
	var out []string
	for _, coll := range sched.Colls() {
		var names []string
		for _, a := range algos(coll) {
			names = append(names, a.name)
		}
		out = append(out, coll.String()+"="+strings.Join(names, "|"))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// override returns the forced algorithm for coll, if any applies to it.
func (s *algoSpec) override(coll sched.Coll) *algorithm { return s.forced[coll] }

// choose picks the algorithm for one call: GOCOLL_ALGO when it names one
// that can run the call, else the first entry of the table whose size rule
// holds.
func choose(spec *algoSpec, s shape) *algorithm {
	if a := spec.override(s.coll); a != nil && a.can(s) {
		return a
	}
	for _, a := range byColl[s.coll] {
		if a.can(s) && a.auto(s) {
			return a
		}
	}
	panic("gocoll: no algorithm for " + s.coll.String()) // every collective ends with an unconditional entry
}
