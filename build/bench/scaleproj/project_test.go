package main

import (
	"math"
	"testing"

	"github.com/gocoll/gocoll/topology/cost"
)

// The periodic form of the ring and the hierarchical allreduce (see
// cluster.periodic) agrees with the cost model's walk of the whole
// schedule within 0.1 % (exactly where blocks are whole elements; 256 B
// over 512 ranks is not), on 32 hosts from 4 (8 from 2 under -short),
// for the sizes of the projection and a smaller one, on both link speeds.
func TestPeriodicMatchesDirect(t *testing.T) {
	hosts, small := 32, 4
	if testing.Short() {
		hosts, small = 8, 2
	}
	f := cost.DefaultFigures()
	for _, nic := range []float64{10e9 / 8, 100e9 / 8} {
		f.Links.NICBandwidth, f.Links.NICLatency = nic, 10e-6
		for _, perHost := range []int{8, 16} {
			c := cluster{hosts: hosts, perHost: perHost, f: f}
			for _, algo := range []string{"ring", "hier"} {
				for _, bytes := range []int{256, 4 << 10, 1 << 20, 64 << 20} {
					direct, err := c.predict(algo, bytes)
					if err != nil {
						t.Fatal(err)
					}
					per, err := c.periodic(algo, bytes, small)
					if err != nil {
						t.Fatal(err)
					}
					if e := per/direct - 1; math.Abs(e) > 0.001 {
						t.Errorf("%s, %d×%d, %d B, NIC %.0f GB/s: periodic %.6g s, direct %.6g s (%+.2f%%)", algo, hosts, perHost, bytes, nic/1e9, per, direct, 100*e)
					}
				}
			}
		}
	}
}

func TestPeriodicRefusesUnevenBlocks(t *testing.T) {
	c := cluster{hosts: 24, perHost: 8, f: cost.DefaultFigures()}
	if _, err := c.periodic("ring", 4<<10, 16); err == nil {
		t.Fatal("1,024 elements over 24 hosts scaled to 16 hosts: no error")
	}
	if _, err := c.periodic("dbtree", 4<<10, 8); err == nil {
		t.Fatal("a periodic dbtree: no error")
	}
}

func TestBusBW(t *testing.T) {
	// 1 GB in 1 s over 2 ranks: each sends half and receives half twice.
	if got := busBW(1e9, 2, 1); got != 1e9 {
		t.Fatalf("busbw %v", got)
	}
}
