package main

import (
	"fmt"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/topology/cost"
)

// A cluster is H hosts of R ranks each: inside a host shared memory,
// between hosts one NIC per host to a non-blocking switch
// (topology.ForPlacement), with the figures f.
type cluster struct {
	hosts, perHost int
	f              cost.Figures
}

func (c cluster) ranks() int { return c.hosts * c.perHost }

// placement lists the ranks of each host, host-contiguous: what the
// engine's layout gives a job launched host by host.
func (c cluster) placement() [][]int {
	hosts := make([][]int, c.hosts)
	for h := range hosts {
		hosts[h] = make([]int, c.perHost)
		for l := range hosts[h] {
			hosts[h][l] = h*c.perHost + l
		}
	}
	return hosts
}

// predict is the cost model's time for one allreduce of bytes (float32)
// with the registry's algorithm algo, built as the engine builds it on
// this placement: host-contiguous ring, the hosts for the hierarchical
// form, NCCL-style double binary trees (engine/place.go).
func (c cluster) predict(algo string, bytes int) (float64, error) {
	e, err := sched.Find(engine.Schedules(), sched.AllReduce, algo)
	if err != nil {
		return 0, err
	}
	n, hosts := c.ranks(), c.placement()
	g, err := topology.ForPlacement(hosts, c.f.Links)
	if err != nil {
		return 0, err
	}
	trees := topology.DoubleBinaryTree(n)
	p := sched.Params{Coll: sched.AllReduce, N: n, ElemSize: 4, Count: bytes / 4, Trees: [][]int{trees[0], trees[1]}}
	if e.Hosts {
		p.Hosts = hosts
	}
	s, err := e.Build(p)
	if err != nil {
		return 0, fmt.Errorf("%s on %d×%d: %w", algo, c.hosts, c.perHost, err)
	}
	m := &cost.Model{Graph: g, ReduceRate: c.f.Rates.ReduceRate, CopyRate: c.f.Rates.CopyRate, Call: c.f.Rates.Call, Message: c.f.Rates.Message}
	pr, err := m.Predict(s)
	if err != nil {
		return 0, fmt.Errorf("%s on %d×%d: %w", algo, c.hosts, c.perHost, err)
	}
	return pr.Seconds, nil
}

// The flat ring and the hierarchical allreduce are Θ(N²) and Θ(N·H)
// operations (2(N-1) steps of every rank; 2(H-1) steps of every rank
// across hosts): the cost model walks them all, which takes minutes from
// 4,096 ranks on and hours at 65,536. Their steps are alike, though: in
// the cost model a round's time depends only on the messages and links
// of that round, and on this cluster every step of the ring (every step
// across hosts of the hierarchical form) loads each host's NIC and each
// rank's memory link the same way, with blocks of the same size, whatever
// the number of hosts. So the time is the time of a smaller cluster with
// the same blocks, its steps counted again:
//
//	ring(N, L) = call + (ring(N', L·N'/N) − call)·(N−1)/(N'−1)
//	hier(H, L) = hier(1 host, L) + 2(H−1)·x,  x = (hier(H', L') − hier(1 host, L'))/(2(H'−1)),
//	             L' = L·H'/H (the same blocks across hosts)
//
// exact in the model up to the rounding of blocks to whole elements;
// TestPeriodicMatchesDirect holds both to the direct walk.

// periodic predicts ring or hier on c from a cluster of small hosts
// (at least 2) with the same blocks.
func (c cluster) periodic(algo string, bytes, small int) (float64, error) {
	if c.hosts <= small {
		return c.predict(algo, bytes)
	}
	count := bytes / 4
	if count*small%c.hosts != 0 {
		return 0, fmt.Errorf("%s: %d elements over %d hosts do not scale to %d hosts", algo, count, c.hosts, small)
	}
	sm := cluster{hosts: small, perHost: c.perHost, f: c.f}
	smallBytes := count * small / c.hosts * 4
	switch algo {
	case "ring":
		t, err := sm.predict("ring", smallBytes)
		if err != nil {
			return 0, err
		}
		call := c.f.Rates.Call
		n, ns := float64(c.ranks()), float64(sm.ranks())
		return call + (t-call)*(n-1)/(ns-1), nil
	case "hier":
		one := cluster{hosts: 1, perHost: c.perHost, f: c.f}
		intra, err := one.predict("hier", bytes)
		if err != nil {
			return 0, err
		}
		t, err := sm.predict("hier", smallBytes)
		if err != nil {
			return 0, err
		}
		t1, err := one.predict("hier", smallBytes)
		if err != nil {
			return 0, err
		}
		x := (t - t1) / float64(2*(small-1))
		return intra + float64(2*(c.hosts-1))*x, nil
	}
	return 0, fmt.Errorf("%s: no periodic form (only ring and hier)", algo)
}

// busBW is nccl-tests' bus bandwidth of an allreduce (doc/PERFORMANCE.md
// there): bytes/time · 2(N−1)/N.
func busBW(bytes, n int, seconds float64) float64 {
	return float64(bytes) / seconds * 2 * float64(n-1) / float64(n)
}
