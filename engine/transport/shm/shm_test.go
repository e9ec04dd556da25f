//go:build linux

package shm

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/internal/shmtest"
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
		if got := len(shmtest.Fds(segPrefix(tag))); got != 2 {
			t.Fatalf("%d segment descriptors after Create, want 2", got)
		}
		if files := shmtest.Files(segPrefix(tag)); len(files) != 0 {
			t.Fatalf("named in /dev/shm: %v", files)
		}
		for i, tr := range ts {
			o := ts[1-i]
			if err := tr.Connect(context.Background(), map[int]PeerInfo{o.Rank(): o.Ref()}); err != nil {
				t.Fatal(err)
			}
		}
		return ts, tag
	}
	none := func(t *testing.T, tag [8]byte) {
		t.Helper()
		if m := shmtest.Leftovers(segPrefix(tag)); len(m) != 0 {
			t.Errorf("left: %v", m)
		}
	}
	t.Run("close", func(t *testing.T) {
		ts, tag := mk(t)
		ts[0].Close()
		ts[1].Close()
		none(t, tag)
	})
	t.Run("abort", func(t *testing.T) {
		ts, tag := mk(t)
		ts[0].Abort(errors.New("x"))
		ts[1].Abort(errors.New("y"))
		none(t, tag)
	})
	t.Run("release", func(t *testing.T) {
		ts, tag := mk(t)
		for _, tr := range ts {
			tr.Release()
			tr.Release()
		}
		if fds := shmtest.Fds(segPrefix(tag)); len(fds) != 0 {
			t.Fatalf("descriptors open after Release: %v", fds)
		}
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
		none(t, tag)
	})
	t.Run("create-only", func(t *testing.T) {
		tag := newTag(t)
		tr, err := Create(Config{Rank: 0, Size: 1, Tag: tag})
		if err != nil {
			t.Fatal(err)
		}
		tr.Close()
		none(t, tag)
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
	// A memory file that is not a segment.
	junk, junkFd, err := shmsync.CreateMemfd("junk", 3*pageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(junk)
	defer syscall.Close(junkFd)
	junkRef, err := shmsync.RefOf(junkFd)
	if err != nil {
		t.Fatal(err)
	}
	with := func(r PeerInfo, f func(*PeerInfo)) PeerInfo { f(&r); return r }
	denied := func(pid, fd, flags int) (int, error) { return -1, syscall.EACCES }
	cases := []struct {
		name  string
		open  shmsync.Opener
		peers map[int]PeerInfo
		want  error
	}{
		{"other-communicator", nil, map[int]PeerInfo{1: b.Ref()}, transport.ErrProtocol},
		{"wrong-rank", nil, map[int]PeerInfo{1: c.Ref()}, transport.ErrProtocol},
		{"recycled-descriptor", nil, map[int]PeerInfo{2: with(c.Ref(), func(r *PeerInfo) { r.Ino++ })}, shmsync.ErrOtherFile},
		{"no-slot-for-us", nil, map[int]PeerInfo{2: c.Ref()}, transport.ErrProtocol},
		{"missing", nil, map[int]PeerInfo{1: with(b.Ref(), func(r *PeerInfo) { r.Fd = 1 << 20 })}, transport.ErrPeerLost},
		{"not-a-segment", nil, map[int]PeerInfo{1: junkRef}, transport.ErrProtocol},
		{"not-allowed", denied, map[int]PeerInfo{2: c.Ref()}, syscall.EACCES},
	}
	for _, tc := range cases {
		a.open = tc.open
		err := a.Connect(ctx, tc.peers)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	a.open = nil
	// Not in Config.Peers.
	if err := c.Connect(ctx, map[int]PeerInfo{0: a.Ref()}); err == nil {
		t.Error("Connect to a rank outside Config.Peers succeeded")
	}
	// A failed Connect leaves the transport connectable.
	if err := c.Connect(ctx, map[int]PeerInfo{1: b.Ref()}); !errors.Is(err, transport.ErrProtocol) {
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
	if tr.ringBytes != 8192 || len(tr.slots) != 1 || tr.Rank() != 0 || tr.Size() != 2 || tr.Ref().Pid != os.Getpid() || tr.Ref().Fd < 0 {
		t.Errorf("ring %d slots %v rank %d size %d segment %+v", tr.ringBytes, tr.slots, tr.Rank(), tr.Size(), tr.Ref())
	}
}
