package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// TestHierarchicalInProcess runs the hierarchical collectives on in-process
// ranks that pretend to sit on several hosts, contiguous or not, against
// the reference.
func TestHierarchicalInProcess(t *testing.T) {
	placements := [][][]int{
		{{0, 1}, {2, 3}},
		{{0, 2}, {1, 3}},
		{{0, 1, 2}, {3, 4, 5}},
		{{0, 1}, {2, 3}, {4, 5}},
		{{0}, {1}, {2}, {3}},
		{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}},
	}
	for _, hosts := range placements {
		n := len(hosts) * len(hosts[0])
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			t.Parallel()
			comms, err := newLocalWorld(mem.NewWorld(n), hosts, Options{Algo: "hier", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, c := range comms {
					c.Abort()
					c.Destroy()
				}
			})
			for _, c := range comms {
				if a := c.choose(sched.AllReduce, 1<<20); a.name != "hier" {
					t.Fatalf("allreduce on %v picks %q, want hier", hosts, a.name)
				}
			}
			s := suite{dtypes: []DataType{Float32, Int8, Bfloat16}, ops: kernel.AllRedOps(), counts: awkwardCounts,
				colls: map[string]bool{"allreduce": true, "allgather": true, "reducescatter": true, "broadcast": true}}
			mustRanks(t, comms, func(c *Comm) error { return conformance(c, s) })
		})
	}
}
