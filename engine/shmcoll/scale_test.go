//go:build linux

package shmcoll

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/kernel"
)

// TestManyRanksMapOnDemand: with 64 ranks a rank does not put every peer's
// segment in its page tables at Connect (64 × 63 segments over the host),
// only what its collectives read: at Connect the headers, and after an
// AllReduce its chunk of each peer's slot and the chunks it copies out.
// Up to populateRanks ranks, every peer's segment is mapped populated.
func TestManyRanksMapOnDemand(t *testing.T) {
	const n, slot = 64, 1 << 20
	// Per peer: the header, and a few fault-around windows of the slots
	// (the kernel maps up to 64 KiB of present pages around a read fault).
	const maxPerPeer = 256 << 10
	w := newWorld(t, n, slot)
	peers := func(a *Arena) [][]byte {
		var ms [][]byte
		for _, s := range a.segs {
			if s != a.me {
				ms = append(ms, s.m)
			}
		}
		return ms
	}
	resident := func(what string) {
		t.Helper()
		ms := peers(w.arenas[0])
		rss, err := shmtest.Resident(ms...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: rank 0 has %d bytes of its %d peers' segments (%d bytes each) in its page tables", what, rss, len(ms), len(ms[0]))
		if rss > len(ms)*maxPerPeer {
			t.Errorf("%s: rank 0 has %d bytes of its peers' segments in its page tables, want at most %d per peer", what, rss, maxPerPeer)
		}
	}
	resident("after Connect")
	const count = 16 << 10 // float32s per rank: the two-barrier path, chunks of 1 KiB
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recvs := make([][]byte, n)
	errs := w.run(func(r int, a *Arena) error {
		send := make([]byte, 4*count)
		for i := range count {
			binary.NativeEndian.PutUint32(send[4*i:], math.Float32bits(float32(r+i%7)))
		}
		recvs[r] = make([]byte, 4*count)
		return a.AllReduce(ctx, Call{Seq: 1, Sig: 0x5ca1e}, send, recvs[r], kernel.Float32, kernel.Sum)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, recv := range recvs {
		for i := range count {
			if got, want := math.Float32frombits(binary.NativeEndian.Uint32(recv[4*i:])), float32(n*(n-1)/2+n*(i%7)); got != want {
				t.Fatalf("rank %d: element %d is %v, want %v", r, i, got, want)
			}
		}
	}
	resident("after an AllReduce")
}

// TestSmallJobsMapPopulated: up to populateRanks ranks, a rank's page
// tables hold all of every peer's segment from Connect on, so that no
// fault lands in a collective.
func TestSmallJobsMapPopulated(t *testing.T) {
	w := newWorld(t, populateRanks, 64<<10)
	a := w.arenas[0]
	for _, s := range a.segs {
		if s == a.me {
			continue
		}
		rss, err := shmtest.Resident(s.m)
		if err != nil {
			t.Fatal(err)
		}
		if rss != len(s.m) {
			t.Errorf("rank 0 has %d of the %d bytes of rank %d's segment in its page tables, want all", rss, len(s.m), s.rank)
		}
	}
}
