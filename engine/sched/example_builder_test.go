package sched

import (
	"fmt"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/schedtest"
)

// DirectAllGather is the worked example of CONTRIBUTING.md: a builder as it
// would appear in its own file of this package (direct.go). Every rank
// sends its block to every peer at once and receives each peer's block into
// place: one round of N-1 messages per rank, for few ranks and small blocks,
// where one round trip beats the ring's N-1 steps.
func DirectAllGather(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	n, bs := p.N, p.Count*p.ElemSize
	s := New(AllGather, "direct", n, p.ElemSize, func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		for k := 1; k < n; k++ {
			to, from := mod(r+k, n), mod(r-k, n)
			e.send(to, 0, 0, work(r*bs, bs), 1)
			e.recv(from, 0, 0, work(from*bs, bs))
		}
	})
	s.WorkLen = n * bs // allgather: rank r's block is already in place at r·bs
	s.Rounds = 1
	return s, nil
}

// A new builder is checked as data before it runs anywhere: the validator
// pairs every send with its receive, and the simulator proves that every
// rank ends with every rank's block, without a transport that buffers.
func Example_newBuilder() {
	for _, n := range []int{1, 2, 3, 5, 8} {
		p := Params{Coll: AllGather, N: n, ElemSize: 4, Count: 3}
		s, err := DirectAllGather(p)
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := Validate(s); err != nil {
			fmt.Println("validate:", err)
			return
		}
		if _, err := Simulate(s, p); err != nil {
			fmt.Println("simulate:", err)
			return
		}
	}
	s, _ := DirectAllGather(Params{Coll: AllGather, N: 3, ElemSize: 4, Count: 3})
	for _, op := range s.Ops(0) {
		fmt.Println(op)
	}
	// Output:
	// r0 send work[0:12] -> 1 tag 0 segs 1
	// r0 recv work[24:36] <- 2 tag 0
	// r0 send work[0:12] -> 2 tag 0 segs 1
	// r0 recv work[12:24] <- 1 tag 0
}

// The registry's algorithms are checked by TestRegistrySchedules
// (engine/internal/choose) over every rank count and awkward counts,
// without a line per builder. The example's builder, which is not in the
// registry, is checked the same way here.
func TestDirectAllGather(t *testing.T) {
	for _, n := range schedtest.RankCounts() {
		for _, count := range []int{0, 1, n - 1, 7, 37} {
			simulate(t, DirectAllGather, Params{Coll: AllGather, N: n, ElemSize: 4, Count: max(count, 0)})
		}
	}
}
