package sched

// InBlocks runs an all-to-all builder in block mode (see the package
// comment) for coll, alltoallv or alltoallw: the builder makes its
// all-to-all of one one-byte element per block, so that its ranges count
// blocks, whatever sizes the blocks turn out to have. Any schedule that
// only moves blocks works: no segments, reductions or divisions (Validate
// says so of one that has them).
func InBlocks(coll Coll, b Builder) Builder {
	return func(p Params) (*Schedule, error) {
		q := p
		q.Coll, q.ElemSize, q.Count = AllToAll, 1, 1
		q.SendBlocks, q.RecvBlocks = nil, nil
		s, err := b(q)
		if err != nil {
			return nil, err
		}
		s.Coll, s.Blocks = coll, true
		return s, nil
	}
}

// The block-mode forms of the all-to-all builders: alltoallv and
// alltoallw through repacking ranks, and alltoallw by pairwise exchange
// (alltoallv's pairwise exchange knows its sizes from the call and needs
// no block mode).
var (
	AggregateAllToAllv = InBlocks(AllToAllv, AggregateAllToAll)
	AggregateAllToAllw = InBlocks(AllToAllw, AggregateAllToAll)
	PairwiseAllToAllw  = InBlocks(AllToAllw, PairwiseAllToAll)
)
