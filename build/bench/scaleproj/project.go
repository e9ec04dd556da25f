package main

import (
	"fmt"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology/cost"
)

// A cluster is H hosts of R ranks each (cost.Cluster: inside a host shared
// memory, between hosts one NIC per host to a non-blocking switch), with
// the figures f.
type cluster struct {
	cost.Cluster
	f cost.Figures
}

// predict is the cost model's time for one allreduce of bytes (float32)
// with the registry's algorithm algo, built as the engine builds it on
// this placement (cost.Cluster.Params: host-contiguous ring, the hosts
// for the hierarchical form, NCCL-style double binary trees): the walk of
// the whole schedule, or, when project is set, its projection from small
// clusters by the way it grows (cost.GrowthOf, cost.Projector), which is
// what the engine's choice predicts (engine/internal/choose/model.go).
// The flat ring and the hierarchical form are Θ(N²) and Θ(N·H)
// operations, the others Θ(N log N): walked whole they take minutes from
// 4,096 ranks on and hours at 65,536; projected, milliseconds.
func (c cluster) predict(algo string, bytes int, project bool) (float64, error) {
	e, err := sched.Find(engine.Schedules(), sched.AllReduce, algo)
	if err != nil {
		return 0, err
	}
	g := cost.Growth{}
	if project {
		g = cost.GrowthOf(sched.AllReduce, algo)
	}
	p := sched.Params{Coll: sched.AllReduce, ElemSize: 4, Count: bytes / 4}
	pr, err := cost.NewProjector(c.f).Project(c.Cluster, e.Build, p, g)
	if err != nil {
		return 0, fmt.Errorf("%s on %d×%d: %w", algo, c.Hosts, c.PerHost, err)
	}
	return pr.Seconds[0], nil
}

// busBW is nccl-tests' bus bandwidth of an allreduce (doc/PERFORMANCE.md
// there): bytes/time · 2(N−1)/N.
func busBW(bytes, n int, seconds float64) float64 {
	return float64(bytes) / seconds * 2 * float64(n-1) / float64(n)
}
