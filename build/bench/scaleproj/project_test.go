package main

import (
	"math"
	"testing"

	"github.com/gocoll/gocoll/topology/cost"
)

// scaleproj's projection is the engine's (cost.Projector): the same
// numbers as the walk of the whole schedule on a cluster beyond the small
// ones it walks (topology/cost's TestProjectMatchesDirect holds every
// schedule the engine compares to it).
func TestProjectionMatchesWalk(t *testing.T) {
	f := cost.DefaultFigures()
	f.Links.NICBandwidth, f.Links.NICLatency = 10e9/8, 10e-6
	c := cluster{cost.Cluster{Hosts: 24, PerHost: 2}, f}
	for _, algo := range []string{"ring", "hier", "rd", "hd", "dbtree"} {
		walked, err := c.predict(algo, 1<<20, false)
		if err != nil {
			t.Fatal(err)
		}
		projected, err := c.predict(algo, 1<<20, true)
		if err != nil {
			t.Fatal(err)
		}
		// 24 hosts are no power of two: the fitted forms are near.
		if e := projected/walked - 1; math.Abs(e) > 0.1 {
			t.Errorf("%s: projected %.6g s, walked %.6g s (%+.2f%%)", algo, projected, walked, 100*e)
		}
	}
}

func TestBusBW(t *testing.T) {
	// 1 GB in 1 s over 2 ranks: each sends half and receives half twice.
	if got := busBW(1e9, 2, 1); got != 1e9 {
		t.Fatalf("busbw %v", got)
	}
}
