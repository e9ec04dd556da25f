package sched

import "fmt"

// Entry is a builder in the catalogue: the schedules gocoll has for each
// collective, under the names GOCOLL_ALGO, logs and gocoll-topo use.
type Entry struct {
	Coll  Coll
	Name  string
	Build Builder
	// Hosts says the builder needs Params.Hosts (the hierarchical forms).
	Hosts bool
}

var catalog = []Entry{
	{AllReduce, "ring", RingAllReduce, false},
	{AllReduce, "hd", HDAllReduce, false},
	{AllReduce, "rd", RDAllReduce, false},
	{AllReduce, "hier", HierAllReduce, true},
	{AllReduce, "dbtree", DBTreeAllReduce, false},
	{Reduce, "tree", TreeReduce, false},
	{Reduce, "hd", HDReduce, false},
	// Message broadcasts close with an agreement round (Agreed): only the
	// tree each rank believes in carries data, so without it ranks that
	// pass different roots could return different data and no error.
	{Broadcast, "tree", Agreed(TreeBroadcast), false},
	{Broadcast, "pipeline", Agreed(ChainBroadcast), false},
	{Broadcast, "hier", Agreed(HierBroadcast), true},
	{AllGather, "ring", RingAllGather, false},
	{AllGather, "hier", HierAllGather, true},
	{ReduceScatter, "ring", RingReduceScatter, false},
	{ReduceScatter, "hd", HDReduceScatter, false},
	{ReduceScatter, "hier", HierReduceScatter, true},
	{AllToAll, "pairwise", PairwiseAllToAll, false},
	{AllToAll, "bruck", BruckAllToAll, false},
	{AllToAll, "aggregate", AggregateAllToAll, false},
	{AllToAll, "aggregate-tree", AggregateTreeAllToAll, false},
	{AllToAll, "aggregate-leader", LeaderAllToAll, false},
	{AllToAllv, "pairwise", PairwiseAllToAllv, false},
	{AllToAllv, "aggregate", AggregateAllToAllv, false},
	{AllToAllv, "aggregate-tree", InBlocks(AllToAllv, AggregateTreeAllToAll), false},
	{AllToAllw, "pairwise", PairwiseAllToAllw, false},
	{AllToAllw, "aggregate", AggregateAllToAllw, false},
	{AllToAllw, "aggregate-tree", InBlocks(AllToAllw, AggregateTreeAllToAll), false},
	{Barrier, "dissemination", DisseminationBarrier, false},
}

// Catalog lists every builder, collective by collective.
func Catalog() []Entry { return append([]Entry(nil), catalog...) }

// Find returns the catalogue's entry for coll and name.
func Find(coll Coll, name string) (Entry, error) {
	for _, e := range catalog {
		if e.Coll == coll && e.Name == name {
			return e, nil
		}
	}
	return Entry{}, fmt.Errorf("sched: no %s algorithm %q", coll, name)
}
