package shm

import "slices"

// autoRingBytes is the default ring size for a rank with peers local
// peers (see allHotPeers).
func autoRingBytes(peers int) int {
	r := DefaultRingBytes
	for r > minAutoRing && peers*r > ringBudget {
		r /= 2
	}
	return r
}

// hotPeers splits peers (distinct, this rank excluded) into the hot ones,
// whose rings are allocated at Create and whose processes this rank
// watches, and the others, each in the order of peers. With at most
// allHotPeers peers all are hot. Beyond, a peer is hot when it is
// rank ± 1 (modulo size) or rank XOR 2^k, the partners of the ring and
// recursive-doubling schedules, or the previous or next local rank in rank
// order, so that every local rank is watched by two others even when the
// host's ranks are not consecutive. The relation is symmetric: both ends
// of a pair decide alike.
func hotPeers(rank, size int, peers []int) (hot, cold []int) {
	if len(peers) <= allHotPeers {
		return peers, nil
	}
	local := append(slices.Clone(peers), rank)
	slices.Sort(local)
	i, _ := slices.BinarySearch(local, rank)
	want := map[int]bool{
		local[(i+1)%len(local)]:            true,
		local[(i-1+len(local))%len(local)]: true,
		(rank + 1) % size:                  true,
		(rank - 1 + size) % size:           true,
	}
	for m := 1; m < size; m <<= 1 {
		want[rank^m] = true
	}
	for _, q := range peers {
		if want[q] {
			hot = append(hot, q)
		} else {
			cold = append(cold, q)
		}
	}
	return hot, cold
}
