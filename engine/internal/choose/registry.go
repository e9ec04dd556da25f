// Package choose picks the algorithm of each call: the registry of every
// algorithm the engine has, the GOCOLL_ALGO overrides, the cost model's
// choice across hosts, and the cache of the schedules built for a
// communicator. It knows nothing of a communicator: the engine describes a
// call by its Shape and runs the Entry it gets back.
package choose

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gocoll/gocoll/engine/sched"
)

// An Entry is an algorithm of the registry: a collective, a name (what
// GOCOLL_ALGO and logs call it), how it runs a call (its schedule's builder,
// or the shared-memory arena), whether it can run a call, and whether the
// size rules pick it by default. The choice for a call walks the table in
// order, so the order of a collective's entries is its order of preference.
type Entry struct {
	Coll sched.Coll
	Name string
	// Build makes the schedule; nil for the shared-memory collectives
	// (package shmcoll, Arena), which read each other's memory instead of
	// exchanging messages.
	Build sched.Builder
	// Hosts says the builder needs sched.Params.Hosts (the hierarchical
	// forms, which run only across hosts of as many ranks each).
	Hosts bool
	// Virtual says the entry runs calls over virtual devices (its builder
	// needs sched.Params.Devices) and only those (Chooser.OverDevices): a
	// plain call never takes it, GOCOLL_ALGO cannot name it, and it is no
	// schedule of Schedules.
	Virtual bool
	// ID is the entry's index in the registry (Registry()[ID]): what the
	// engine keeps its run of the entry under.
	ID int
	// can says whether the algorithm can run the call at all.
	can func(s Shape) bool
	// auto says whether the size rules pick it when nothing earlier did.
	auto func(s Shape) bool
}

// Arena says the entry runs in the shared-memory arena, not by a schedule.
func (e *Entry) Arena() bool { return e.Build == nil }

// Can says whether the entry can run a call of shape s.
func (e *Entry) Can(s Shape) bool { return e.can != nil && e.can(s) }

// Shape is what the choice may depend on: values every rank agrees on, so
// that every rank picks the same algorithm (the choice is also part of
// every message's signature).
type Shape struct {
	Coll  sched.Coll
	Bytes int // the call's vector in bytes (nccl-tests sizes)
	N     int // ranks
	// Shm: the shared-memory arena can run the call (every rank is on
	// one host; over virtual devices, also each rank holds one run of
	// them, so the devices' chain visits each rank once).
	Shm   bool
	ShmV  bool // the arena has room for AllToAllv's columns (shmcoll.Arena.FitsAllToAllv)
	Hosts int  // hosts the ranks are on
	Even  bool // every host holds as many ranks
}

func (s Shape) pow2() bool { return s.N&(s.N-1) == 0 }

// multiHost: the ranks span hosts, each holding as many: the hierarchical
// forms apply.
func (s Shape) multiHost() bool { return s.Hosts > 1 && s.Even }

// Size thresholds of the automatic choice, in bytes of the call's vector.
const (
	smallAllreduce = 16 << 10 // below: recursive doubling (latency bound)
	largeAllreduce = 4 << 20  // above: ring when ranks are not a power of two
	smallAlltoall  = 256      // per-peer block size below which Bruck aggregates
	smallBroadcast = 256 << 10
	hierMin        = 64 << 10 // across hosts, from here the hierarchical forms
	// hierMinChunk: and from this many bytes per rank, since their ring
	// across H hosts takes 2(H-1) steps of a chunk each: with many hosts
	// and small chunks it is latency-bound where halving–doubling is not.
	// (With one rank per host they are the flat ring: never by size.)
	hierMinChunk = 4 << 10
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

func always(Shape) bool    { return true }
func never(Shape) bool     { return false }
func onlyShm(s Shape) bool { return s.Shm }
func shmV(s Shape) bool    { return s.ShmV }
func hier(s Shape) bool    { return s.multiHost() }
func hierAuto(s Shape) bool {
	return s.multiHost() && s.N > s.Hosts && s.Bytes >= hierMin && s.Bytes >= hierMinChunk*s.N
}

// schedule is the registry entry that runs build's schedule as coll/name.
func schedule(coll sched.Coll, name string, build sched.Builder, can, auto func(Shape) bool) Entry {
	return Entry{Coll: coll, Name: name, Build: build, can: can, auto: auto}
}

// acrossHosts is the entry of a hierarchical schedule: it runs only
// across hosts of as many ranks each (it needs sched.Params.Hosts), and
// the size rules take it from hierMin bytes.
func acrossHosts(coll sched.Coll, build sched.Builder) Entry {
	return Entry{Coll: coll, Name: "hier", Build: build, Hosts: true, can: hier, auto: hierAuto}
}

// inArena is the registry entry "shm" that runs coll in the shared-memory
// arena, wherever can allows (first in its collective's order: preferred
// whenever it can run).
func inArena(coll sched.Coll, can func(Shape) bool) Entry {
	return Entry{Coll: coll, Name: "shm", can: can, auto: always}
}

// overDevices is the entry of a collective over virtual devices: its
// schedule's builder (package sched, virtual.go and vcoll.go), or nil for
// the arena's (shmcoll, chain.go). It runs every such call its can allows.
func overDevices(coll sched.Coll, name string, build sched.Builder, can func(Shape) bool) Entry {
	return Entry{Coll: coll, Name: name, Build: build, Virtual: true, can: can, auto: always}
}

// registry is every algorithm, collective by collective in order of
// preference. Adding one is a builder in engine/sched and a line here:
// TestRegistrySchedules (registry_test.go) validates and simulates every
// schedule entry over many rank counts and sizes.
var registry = numbered([]Entry{
	inArena(sched.AllReduce, onlyShm),
	acrossHosts(sched.AllReduce, sched.HierAllReduce),
	schedule(sched.AllReduce, "rd", sched.RDAllReduce, always, func(s Shape) bool { return s.Bytes <= smallAllreduce }),
	schedule(sched.AllReduce, "ring", sched.RingAllReduce, always, func(s Shape) bool { return s.Bytes >= largeAllreduce && !s.pow2() }),
	schedule(sched.AllReduce, "hd", sched.HDAllReduce, always, always),
	schedule(sched.AllReduce, "dbtree", sched.DBTreeAllReduce, always, never),

	inArena(sched.Reduce, onlyShm),
	schedule(sched.Reduce, "tree", sched.TreeReduce, always, func(s Shape) bool { return s.Bytes <= smallAllreduce }),
	schedule(sched.Reduce, "hd", sched.HDReduce, always, always),

	// Message broadcasts close with an agreement round (Agreed): only the
	// tree each rank believes in carries data, so without it ranks that
	// pass different roots could return different data and no error.
	inArena(sched.Broadcast, onlyShm),
	acrossHosts(sched.Broadcast, sched.Agreed(sched.HierBroadcast)),
	schedule(sched.Broadcast, "tree", sched.Agreed(sched.TreeBroadcast), always, func(s Shape) bool { return s.Bytes <= smallBroadcast || s.N <= 2 }),
	schedule(sched.Broadcast, "pipeline", sched.Agreed(sched.ChainBroadcast), always, always),

	inArena(sched.AllGather, onlyShm),
	acrossHosts(sched.AllGather, sched.HierAllGather),
	schedule(sched.AllGather, "ring", sched.RingAllGather, always, always),

	inArena(sched.ReduceScatter, onlyShm),
	acrossHosts(sched.ReduceScatter, sched.HierReduceScatter),
	schedule(sched.ReduceScatter, "ring", sched.RingReduceScatter, always, always),
	schedule(sched.ReduceScatter, "hd", sched.HDReduceScatter, always, never),

	inArena(sched.AllToAll, onlyShm),
	// The aggregation of docs/design/aggregated-alltoall.md with one repacking rank per host, which
	// also relays: the fewest messages of all (36 on 4 hosts × 4 ranks,
	// Bruck 64, pairwise 240), every byte sent three times.
	schedule(sched.AllToAll, "aggregate-leader", sched.LeaderAllToAll, always, leaderAuto),
	schedule(sched.AllToAll, "bruck", sched.BruckAllToAll, always, bruckAuto),
	schedule(sched.AllToAll, "pairwise", sched.PairwiseAllToAll, always, always),
	// The same aggregation with the sub-matrices spread over the
	// ranks (about 2√N messages per rank, every byte sent twice): measured
	// never clearly ahead of the leader form or Bruck, so by name only.
	schedule(sched.AllToAll, "aggregate", sched.AggregateAllToAll, always, never),
	// The same under its control tree, which pairs sub-groups
	// as their ranks arrive (engine/internal/exec/tree.go): by name only.
	schedule(sched.AllToAll, "aggregate-tree", sched.AggregateTreeAllToAll, always, never),

	// Through the arena's slots, a column per rank, its owner's block sizes
	// in a line beside the slots (one barrier per column-wide piece; the
	// pairwise schedule over the shared-memory transport, which ran before,
	// took an order of magnitude longer than AllToAll for small calls and
	// allocated per call).
	inArena(sched.AllToAllv, shmV),
	schedule(sched.AllToAllv, "pairwise", sched.PairwiseAllToAllv, always, always),
	// Aggregation with the block sizes in the messages (block mode).
	schedule(sched.AllToAllv, "aggregate", sched.AggregateAllToAllv, always, never),
	schedule(sched.AllToAllv, "aggregate-tree", sched.InBlocks(sched.AllToAllv, sched.AggregateTreeAllToAll), always, never),

	schedule(sched.AllToAllw, "pairwise", sched.PairwiseAllToAllw, always, always),
	schedule(sched.AllToAllw, "aggregate", sched.AggregateAllToAllw, always, never),
	schedule(sched.AllToAllw, "aggregate-tree", sched.InBlocks(sched.AllToAllw, sched.AggregateTreeAllToAll), always, never),

	inArena(sched.Barrier, onlyShm),
	schedule(sched.Barrier, "rd", sched.RDBarrier, always, always),
	schedule(sched.Barrier, "dissemination", sched.DisseminationBarrier, always, never),

	// Over virtual devices: every reduction folds the devices' vectors in
	// device order, whatever the placement (docs/virtual.md). The
	// allreduce passes the running sum along the chain of devices: through
	// the arena's slots where each rank holds one run of them
	// (shmcoll.ChainAllReduce), else as messages.
	overDevices(sched.AllReduce, "virtual-shm", nil, onlyShm),
	overDevices(sched.AllReduce, "virtual-chain", sched.VirtualAllReduce, always),
	overDevices(sched.Reduce, "virtual-reduce", sched.VirtualReduce, always),
	overDevices(sched.ReduceScatter, "virtual-reducescatter", sched.VirtualReduceScatter, always),
	overDevices(sched.AllGather, "virtual-allgather", sched.VirtualAllGather, always),
	overDevices(sched.AllToAll, "virtual-alltoall", sched.VirtualAllToAll, always),
})

// numbered sets each entry's ID to its index.
func numbered(t []Entry) []Entry {
	for i := range t {
		t[i].ID = i
	}
	return t
}

// Registry lists every entry, in the registry's order (entry ID at index
// ID). The entries are the registry's own: read them, never write.
func Registry() []*Entry {
	out := make([]*Entry, len(registry))
	for i := range registry {
		out[i] = &registry[i]
	}
	return out
}

// Schedules lists the registry's schedule entries under their names, for
// the tools that build schedules by name (gocoll-topo, topology/cost): the
// plain ones, whose shape a call's Params describe whole.
func Schedules() []sched.Entry {
	var out []sched.Entry
	for _, e := range registry {
		if e.Build != nil && !e.Virtual {
			out = append(out, sched.Entry{Coll: e.Coll, Name: e.Name, Build: e.Build, Hosts: e.Hosts})
		}
	}
	return out
}

// block is an all-to-all's bytes per peer.
func (s Shape) block() int { return s.Bytes / max(s.N, 1) }

// leaderAuto: across hosts with at least leaderRanks ranks each, where the
// messages a rank sends and wakes for cost more than moving every byte
// once more (with two ranks a host, a leader saves one message and Bruck
// stays ahead); with one rank per host, where it is every block sent at
// once (groups of one), for the mid-sized blocks past Bruck's.
func leaderAuto(s Shape) bool {
	if s.Hosts <= 1 {
		return false
	}
	b := s.block()
	switch perHost := s.N / s.Hosts; {
	case perHost == 1:
		return b > hostsBruckBlock && b <= leaderOneBlock
	case perHost >= leaderRanks:
		return b <= leaderBlock || (s.N >= 16 && b <= leaderBigBlock)
	}
	return false
}

// bruckAuto: log N rounds instead of N-1 messages while blocks are small;
// across hosts, where each message crosses the network, up to larger ones.
func bruckAuto(s Shape) bool {
	if s.N <= 2 {
		return false
	}
	if s.Hosts > 1 {
		return s.block() <= hostsBruckBlock
	}
	return s.block() <= smallAlltoall
}

// byColl and byDevices are the registry's plain and virtual entries per
// collective, in the registry's order: the choice walks only its call's.
var byColl, byDevices = func() (plain, virtual [sched.NumColls][]*Entry) {
	for i := range registry {
		e := &registry[i]
		if e.Virtual {
			virtual[e.Coll] = append(virtual[e.Coll], e)
		} else {
			plain[e.Coll] = append(plain[e.Coll], e)
		}
	}
	return plain, virtual
}()

// Lookup returns the registry's plain entry for coll and name, or nil.
func Lookup(coll sched.Coll, name string) *Entry {
	for i := range registry {
		if registry[i].Coll == coll && registry[i].Name == name && !registry[i].Virtual {
			return &registry[i]
		}
	}
	return nil
}

// Overrides is a parsed GOCOLL_ALGO: the forced algorithm per collective
// (nil: none), from a name given for that collective or, failing that, a
// bare name that applies to every collective that has it. Resolved once:
// every call consults it.
type Overrides struct {
	forced [sched.NumColls]*Entry
}

// ParseOverrides parses a GOCOLL_ALGO value: a bare name for every
// collective that has it, or collective=name pairs, separated by commas.
func ParseOverrides(s string) (Overrides, error) {
	var spec Overrides
	if strings.TrimSpace(s) == "" {
		return spec, nil
	}
	per := map[sched.Coll]*Entry{}
	bare := ""
	for _, part := range strings.Split(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		cname, name, found := strings.Cut(part, "=")
		if !found {
			if !knownAnywhere(part) {
				return spec, fmt.Errorf("unknown algorithm %q; known: %s", part, Known())
			}
			bare = part
			continue
		}
		coll, ok := sched.ParseColl(cname)
		a := Lookup(coll, name)
		if !ok || a == nil {
			return spec, fmt.Errorf("unknown algorithm %q; known: %s", part, Known())
		}
		per[coll] = a
	}
	for coll := range sched.NumColls {
		if a, ok := per[coll]; ok {
			spec.forced[coll] = a
		} else if bare != "" {
			spec.forced[coll] = Lookup(coll, bare)
		}
	}
	return spec, nil
}

func knownAnywhere(name string) bool {
	for _, a := range registry {
		if a.Name == name && !a.Virtual {
			return true
		}
	}
	return false
}

// Known lists the registry's names, collective=name|name… per collective.
func Known() string {
	var out []string
	for _, coll := range sched.Colls() {
		var names []string
		for _, a := range byColl[coll] {
			names = append(names, a.Name)
		}
		out = append(out, coll.String()+"="+strings.Join(names, "|"))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// override returns the forced algorithm for coll, if any applies to it.
func (s *Overrides) override(coll sched.Coll) *Entry { return s.forced[coll] }

// Forces says whether the overrides name an algorithm for coll.
func (s *Overrides) Forces(coll sched.Coll) bool { return s.forced[coll] != nil }

// Force returns the overrides with a forced for a's collective.
func (s Overrides) Force(a *Entry) Overrides {
	s.forced[a.Coll] = a
	return s
}

// Chooser picks the algorithms of one communicator's calls.
type Chooser struct {
	// Overrides are GOCOLL_ALGO's.
	Overrides Overrides
	// Model predicts across hosts (nil: the size rules choose).
	Model *Model
	// Measured is the calibration's table across hosts (nil: none; tune.go).
	Measured *Measured
}

// OverDevices picks the algorithm for a call over virtual devices of
// shape s: the first of its collective's virtual entries that can run
// it. GOCOLL_ALGO, the calibration and the cost model have no say: the
// entries are few and each fits its calls.
func (ch *Chooser) OverDevices(s Shape) *Entry {
	for _, a := range byDevices[s.Coll] {
		if a.can(s) {
			return a
		}
	}
	panic("gocoll: no algorithm over virtual devices for " + s.Coll.String()) // every virtual collective ends with an unconditional entry
}

// Choose picks the algorithm for a call of shape s: GOCOLL_ALGO's when it
// names one that can run the call; across hosts, the one the calibration
// measured fastest for the call's size class (measured.go), else the one
// the cost model predicts fastest on the communicator's placement;
// otherwise the size rules of the registry.
func (ch *Chooser) Choose(s Shape) *Entry {
	if a := ch.Overrides.override(s.Coll); a != nil && a.Can(s) {
		return a
	}
	if a := ch.Measured.pick(s); a != nil && !s.Shm {
		return a
	}
	// All-to-alls choose by thresholds measured across emulated hosts: the
	// model prices a message by its wire latency, while here a small
	// all-to-all costs the wake-ups of the ranks it sends to (leaderAuto).
	if ch.Model != nil && !s.Shm && s.Coll != sched.AllToAll && s.Coll != sched.AllToAllv && s.Coll != sched.AllToAllw {
		var cands []*Entry
		for _, a := range byColl[s.Coll] {
			if a.Build != nil && a.can(s) {
				cands = append(cands, a)
			}
		}
		if a := ch.Model.pick(s, cands); a != nil {
			return a
		}
	}
	return bySize(s)
}

// bySize is the first entry of the table for s's collective that can run
// the call and whose size rule holds.
func bySize(s Shape) *Entry {
	for _, a := range byColl[s.Coll] {
		if a.can(s) && a.auto(s) {
			return a
		}
	}
	panic("gocoll: no algorithm for " + s.Coll.String()) // every collective ends with an unconditional entry
}
