//go:build linux

package shm

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/gocoll/gocoll/engine/transport"
)

func TestNoLeftovers(t *testing.T) {
	mk := func(t *testing.T) ([]*Transport, [8]byte) {
		tag := newTag(t)
		ts := make([]*Transport, 2)
		for i := range ts {
			var err error
			if ts[i], err = Create(Config{Rank: i, Size: 2, Peers: []int{1 - i}, Tag: tag, RingBytes: testRing}); err != nil {
				t.Fatal(err)
			}
		}
		if got := len(leftovers(tag)); got != 2 {
			t.Fatalf("%d segment files after Create, want 2", got)
		}
		for i, tr := range ts {
			o := ts[1-i]
			if err := tr.Connect(context.Background(), map[int]PeerInfo{o.Rank(): {Path: o.Path(), Pid: os.Getpid()}}); err != nil {
				t.Fatal(err)
			}
		}
		return ts, tag
	}
	t.Run("close", func(t *testing.T) {
		ts, tag := mk(t)
		ts[0].Close()
		ts[1].Close()
		checkNoLeftovers(t, tag)
	})
	t.Run("abort", func(t *testing.T) {
		ts, tag := mk(t)
		ts[0].Abort(errors.New("x"))
		ts[1].Abort(errors.New("y"))
		checkNoLeftovers(t, tag)
	})
	t.Run("unlink", func(t *testing.T) {
		ts, tag := mk(t)
		for _, tr := range ts {
			if err := tr.Unlink(); err != nil {
				t.Fatal(err)
			}
			if err := tr.Unlink(); err != nil {
				t.Fatal(err)
			}
		}
		checkNoLeftovers(t, tag)
		// The mappings still work.
		h := transport.Header{Kind: transport.KindData, Len: 2}
		if err := ts[0].Send(context.Background(), 1, h, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 2)
		if err := ts[1].Recv(context.Background(), 0, h, b); err != nil || string(b) != "hi" {
			t.Fatal(err, b)
		}
		ts[0].Close()
		ts[1].Close()
	})
	t.Run("create-only", func(t *testing.T) {
		tag := newTag(t)
		tr, err := Create(Config{Rank: 0, Size: 1, Tag: tag})
		if err != nil {
			t.Fatal(err)
		}
		tr.Close()
		checkNoLeftovers(t, tag)
	})
}

func TestConnectVerifies(t *testing.T) {
	ctx := context.Background()
	tagA, tagB := newTag(t), newTag(t)
	a, err := Create(Config{Rank: 0, Size: 3, Peers: []int{1, 2}, Tag: tagA, RingBytes: testRing})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Create(Config{Rank: 1, Size: 3, Peers: []int{0, 2}, Tag: tagB, RingBytes: testRing})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := Create(Config{Rank: 2, Size: 3, Peers: []int{1}, Tag: tagA, RingBytes: testRing})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := Create(Config{Rank: 0, Size: 3, Tag: tagA}); !errors.Is(err, os.ErrExist) {
		t.Errorf("second Create of the same rank: %v", err)
	}
	cases := []struct {
		name  string
		peers map[int]PeerInfo
		want  error
	}{
		{"other-communicator", map[int]PeerInfo{1: {Path: b.Path()}}, transport.ErrProtocol},
		{"wrong-rank", map[int]PeerInfo{1: {Path: c.Path()}}, transport.ErrProtocol},
		{"wrong-pid", map[int]PeerInfo{2: {Path: c.Path(), Pid: 1}}, transport.ErrProtocol},
		{"no-slot-for-us", map[int]PeerInfo{2: {Path: c.Path(), Pid: os.Getpid()}}, transport.ErrProtocol},
		{"missing", map[int]PeerInfo{1: {Path: "/dev/shm/gocoll-nonexistent-1"}}, transport.ErrPeerLost},
	}
	for _, tc := range cases {
		err := a.Connect(ctx, tc.peers)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	// A file that is not a segment.
	junk := SegmentPath(tagA, 1)
	if err := os.WriteFile(junk, make([]byte, 3*pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(junk)
	if err := a.Connect(ctx, map[int]PeerInfo{1: {Path: junk}}); !errors.Is(err, transport.ErrProtocol) {
		t.Errorf("junk file: %v", err)
	}
	// Not in Config.Peers.
	if err := c.Connect(ctx, map[int]PeerInfo{0: {Path: a.Path()}}); err == nil {
		t.Error("Connect to a rank outside Config.Peers succeeded")
	}
	// A failed Connect leaves the transport connectable.
	os.Remove(junk)
	if err := c.Connect(ctx, map[int]PeerInfo{1: {Path: b.Path()}}); !errors.Is(err, transport.ErrProtocol) {
		t.Errorf("c to b: %v", err)
	}
}

func TestConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Rank: 2, Size: 2},
		{Rank: 0, Size: 0},
		{Rank: 0, Size: 2, Peers: []int{5}},
		{Rank: 0, Size: 2, RingBytes: -1},
	} {
		if tr, err := Create(cfg); err == nil {
			tr.Close()
			t.Errorf("Create(%+v) succeeded", cfg)
		}
	}
	tag := newTag(t)
	tr, err := Create(Config{Rank: 0, Size: 2, Peers: []int{0, 1, 1}, Tag: tag, RingBytes: 5000})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.ringBytes != 8192 || len(tr.slots) != 1 || tr.Rank() != 0 || tr.Size() != 2 || tr.Path() != SegmentPath(tag, 0) {
		t.Errorf("ring %d slots %v rank %d size %d path %s", tr.ringBytes, tr.slots, tr.Rank(), tr.Size(), tr.Path())
	}
}
