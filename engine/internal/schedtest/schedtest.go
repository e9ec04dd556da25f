// Package schedtest (test support) holds the shapes the schedule tests
// share: the rank counts every builder is simulated over and the hosts of
// a placement. It imports nothing of the engine, so that package sched's
// own tests can use it as well as the registry's (engine/internal/choose).
package schedtest

import "testing"

// RankCounts are the rank counts a schedule is simulated over: 1 to 17,
// every power of two and its neighbours up to 16, and 32 unless the tests
// run with -short.
func RankCounts() []int {
	ns := []int{}
	for n := 1; n <= 17; n++ {
		ns = append(ns, n)
	}
	if !testing.Short() {
		ns = append(ns, 32)
	}
	return ns
}

// HostsOf places h hosts of r ranks each: host i holds ranks i·r to
// i·r+r-1, or, strided, ranks i, i+h, i+2h, ….
func HostsOf(h, r int, strided bool) [][]int {
	out := make([][]int, h)
	for i := range out {
		for l := 0; l < r; l++ {
			if strided {
				out[i] = append(out[i], l*h+i)
			} else {
				out[i] = append(out[i], i*r+l)
			}
		}
	}
	return out
}
