//go:build linux

package shm

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

// hotOf is hotPeers' hot set of rank among the local ranks (all ranks of
// size when local is nil).
func hotOf(rank, size int, local []int) []int {
	if local == nil {
		local = transporttest.AllRanks(size)
	}
	peers := slices.DeleteFunc(slices.Clone(local), func(q int) bool { return q == rank })
	hot, cold := hotPeers(rank, size, peers)
	if len(hot)+len(cold) != len(peers) || !slices.Equal(slices.Sorted(slices.Values(append(slices.Clone(hot), cold...))), slices.Sorted(slices.Values(peers))) {
		panic(fmt.Sprintf("rank %d: hot %v and cold %v do not split %v", rank, hot, cold, peers))
	}
	return hot
}

func TestHotPeers(t *testing.T) {
	spread := func(size, step int) []int { // every step-th rank of size
		var out []int
		for q := 0; q < size; q += step {
			out = append(out, q)
		}
		return out
	}
	cases := []struct {
		size  int
		local []int
	}{
		{2, nil}, {3, nil}, {8, nil}, {9, nil}, {12, nil}, {16, nil}, {64, nil}, {128, nil}, {1024, nil},
		{64, spread(64, 3)}, {256, spread(256, 4)}, {100, []int{1, 2, 3, 50, 51, 52, 97, 98, 99}},
	}
	for _, tc := range cases {
		local := tc.local
		if local == nil {
			local = transporttest.AllRanks(tc.size)
		}
		name := fmt.Sprintf("size=%d/local=%d", tc.size, len(local))
		hot := map[int][]int{}
		for _, r := range local {
			hot[r] = hotOf(r, tc.size, local)
		}
		for _, r := range local {
			h := hot[r]
			switch {
			case len(local) <= allHotPeers+1 && len(h) != len(local)-1:
				t.Errorf("%s: rank %d: %d hot peers of %d; a small job keeps every ring hot", name, r, len(h), len(local)-1)
			case len(local) > allHotPeers+1 && len(h) > 4+bits.Len(uint(tc.size)):
				t.Errorf("%s: rank %d: %d hot peers %v, more than the neighbours and log2(size) partners", name, r, len(h), h)
			case len(local) > 2 && len(h) < 2:
				t.Errorf("%s: rank %d: hot peers %v: every rank must be watched by two others", name, r, h)
			}
			for _, q := range h {
				if !slices.Contains(hot[q], r) {
					t.Errorf("%s: rank %d is hot for rank %d, but not the other way", name, q, r)
				}
			}
		}
	}
}

func TestAutoRingBytes(t *testing.T) {
	for peers := 0; peers <= 4096; peers++ {
		r := autoRingBytes(peers)
		switch {
		case peers <= allHotPeers && r != DefaultRingBytes:
			t.Fatalf("%d peers: ring %d, want the default %d as small jobs always had", peers, r, DefaultRingBytes)
		case r&(r-1) != 0 || r < minAutoRing || r > DefaultRingBytes:
			t.Fatalf("%d peers: ring %d", peers, r)
		case peers*r > ringBudget && r != minAutoRing:
			t.Fatalf("%d peers: rings of %d take %d bytes, over the budget %d", peers, r, peers*r, ringBudget)
		case r < DefaultRingBytes && peers*r*2 <= ringBudget:
			t.Fatalf("%d peers: ring %d, twice as large would fit the budget", peers, r)
		}
	}
}

// TestManyLocalRanksMemory: 64 ranks on one host, each with a ring for
// every other, at the default ring size. What a rank's segment holds
// (allocated pages), what its mappings of the peers' rings hold in its
// page tables and what it maps at all must not grow with the square of the
// ranks: the first rank is checked before the others are made, since with
// every ring allocated the job would take 64 × 63 default rings.
func TestManyLocalRanksMemory(t *testing.T) {
	const n = 64
	const (
		maxSegment   = 40 << 20 // bytes of a rank's segment: its rings within ringBudget
		maxAllocated = 8 << 20  // of which allocated: the hot rings and the control blocks
		maxPeerRSS   = 8 << 20  // bytes of the peers' rings in a rank's page tables
	)
	tag := newTag(t)
	ts := make([]*Transport, n)
	t.Cleanup(func() {
		for _, tr := range ts {
			if tr != nil {
				tr.Close()
			}
		}
		checkNoLeftovers(t, tag)
	})
	all := transporttest.AllRanks(n)
	for r := range n {
		tr, err := Create(Config{Rank: r, Size: n, Peers: all, Tag: tag})
		if err != nil {
			t.Fatal(err)
		}
		ts[r] = tr
		if r == 0 {
			alloc, err := shmtest.Allocated(tr.own)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("rank 0 of %d: segment of %d bytes (rings of %d), %d allocated", n, len(tr.own), tr.ringBytes, alloc)
			if len(tr.own) > maxSegment || alloc > maxAllocated {
				t.Fatalf("rank 0 of %d: segment of %d bytes, %d allocated: want at most %d and %d", n, len(tr.own), alloc, maxSegment, maxAllocated)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for r, tr := range ts {
		peers := map[int]PeerInfo{}
		for q, o := range ts {
			if q != r {
				peers[q] = o.Ref()
			}
		}
		if err := tr.Connect(ctx, peers); err != nil {
			t.Fatal(err)
		}
	}
	peerRSS := func(tr *Transport) int {
		var rings [][]byte
		for _, c := range tr.conns {
			if c != nil {
				rings = append(rings, c.seg.data)
			}
		}
		rss, err := shmtest.Resident(rings...)
		if err != nil {
			t.Fatal(err)
		}
		return rss
	}
	if rss := peerRSS(ts[0]); rss > maxPeerRSS {
		t.Errorf("rank 0 maps %d bytes of its peers' rings into its page tables after Connect, want at most %d", rss, maxPeerRSS)
	}
	// Every rank sends to the rank 3 after it, never a hot peer (not ±1,
	// and r XOR (r+3) is no power of two): the cold rings work, and only
	// what the message touched is allocated.
	const msg = 100 << 10
	for r, tr := range ts {
		if err := tr.Send(ctx, (r+3)%n, transporttest.Hdr(1, msg), transporttest.Payload(r, (r+3)%n, 1, msg)); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	buf := make([]byte, msg)
	for r, tr := range ts {
		from := (r - 3 + n) % n
		if err := tr.Recv(ctx, from, transporttest.Hdr(1, msg), buf); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if want := transporttest.Payload(from, r, 1, msg); string(buf) != string(want) {
			t.Fatalf("rank %d: wrong payload from rank %d", r, from)
		}
	}
	total := 0
	for _, tr := range ts {
		alloc, err := shmtest.Allocated(tr.own)
		if err != nil {
			t.Fatal(err)
		}
		total += alloc
	}
	t.Logf("%d ranks: %d bytes allocated in all segments, rank 0 maps %d bytes of its peers' rings", n, total, peerRSS(ts[0]))
	if total > n*(maxAllocated+msg) {
		t.Errorf("%d ranks hold %d bytes of segments, want at most %d per rank", n, total, maxAllocated+msg)
	}
}

// TestColdPeerKilled: with more ranks than allHotPeers a rank watches only
// its hot peers' processes (a descriptor each); when a rank it does not
// watch dies, it learns it from those that watch it, named as lost, while
// waiting on another peer.
func TestColdPeerKilled(t *testing.T) {
	const n, dead = 12, 6
	roles := make([]string, n)
	roles[dead] = "idle"
	ts, kids := transporttest.StartMesh(t, maker{}, roles)
	kids[dead].Expect(t, "IDLE")
	watchers := hotOf(dead, n, nil)
	for r, tr := range ts {
		if tr == nil {
			continue
		}
		c := tr.(*Transport).conns[dead]
		if watches := slices.Contains(watchers, r); c.watched != watches || (c.pidfd >= 0) != watches {
			t.Errorf("rank %d watches rank %d: %v (pidfd %d); it is hot for: %v", r, dead, c.watched, c.pidfd, watchers)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), transporttest.Hang)
	defer cancel()
	res := make([]chan error, n)
	for r, tr := range ts {
		if tr == nil {
			continue
		}
		from := (r + 1) % n
		if from == dead {
			from = (r + 2) % n
		}
		res[r] = make(chan error, 1)
		go func() { res[r] <- tr.Recv(ctx, from, transporttest.Hdr(0, 1), make([]byte, 1)) }()
	}
	kids[dead].Kill(t)
	for r, ch := range res {
		if ch != nil {
			transporttest.WantLost(t, fmt.Sprintf("rank %d", r), transporttest.Within(t, ch, fmt.Sprintf("rank %d's Recv", r)), dead)
		}
	}
}
