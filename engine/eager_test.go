package engine

import (
	"slices"
	"testing"
)

// TestEagerPeersSymmetric: the peers a rank connects at setup are those
// that connect it, for every size and split of the ranks into two hosts
// (the TCP peers being the other host's ranks), and a rank with no eager
// TCP peer gets an empty list, not nil: tcp.Config reads nil as "every
// peer", and rank 2 of 7 over 2 hosts (4 + 3) then waited for the other
// host's ranks, which did not dial it, until the timeout (chaos seed
// 5007, after a shrink from 8).
func TestEagerPeersSymmetric(t *testing.T) {
	for n := 2; n <= 40; n++ {
		for split := 1; split < n; split++ {
			peersOf := func(r int) []int {
				var p []int
				for q := range n {
					if (q < split) != (r < split) {
						p = append(p, q)
					}
				}
				return p
			}
			for r := range n {
				e := eagerPeers(r, n, peersOf(r))
				if e == nil {
					t.Fatalf("n=%d split=%d rank %d: nil eager list (read as every peer)", n, split, r)
				}
				for q := range n {
					if q == r {
						continue
					}
					if slices.Contains(e, q) != slices.Contains(eagerPeers(q, n, peersOf(q)), r) {
						t.Fatalf("n=%d split=%d: ranks %d and %d disagree on connecting each other", n, split, r, q)
					}
				}
			}
		}
	}
}
