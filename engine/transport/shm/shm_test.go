//go:build linux

package shm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/transport"
)

// TestChild is the body of the child processes the other tests start; run
// directly it does nothing.
func TestChild(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("only run as a child process")
	}
	in := bufio.NewScanner(os.Stdin)
	tr := childSetup(t, in)
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ring, _ := strconv.Atoi(os.Getenv("GOCOLL_SHM_TEST_RING"))
	switch role {
	case "mesh":
		if err := runMesh(ctx, tr, ring, 2); err != nil {
			fmt.Printf("@@ERR %v\n", err)
			return
		}
		fmt.Println("@@OK")
	case "sleep": // wait to be killed
		fmt.Println("@@SLEEPING")
		time.Sleep(time.Minute)
	case "abort": // abort with the reason the parent sends
		if !in.Scan() {
			return
		}
		tr.Abort(errors.New(in.Text()))
		fmt.Println("@@ABORTED")
		for in.Scan() { // until the parent is done
		}
	case "close": // send "last!" to rank 1, close and exit at once
		h := transport.Header{Kind: transport.KindData, Len: 5}
		if err := tr.Send(ctx, 1, h, []byte("last!")); err != nil {
			fmt.Printf("@@ERR %v\n", err)
			return
		}
		tr.Close()
		fmt.Println("@@CLOSED")
	case "echo": // benchmark peer: "PING n size" or "SINK n size"
		for in.Scan() {
			f := strings.Fields(in.Text())
			n, _ := strconv.Atoi(f[1])
			size, _ := strconv.Atoi(f[2])
			buf := make([]byte, size)
			h := transport.Header{Kind: transport.KindData, Len: uint64(size)}
			var err error
			for i := 0; i < n && err == nil; i++ {
				h.Seq = uint64(i)
				if err = tr.Recv(ctx, 0, h, buf); err == nil && f[0] == "PING" {
					err = tr.Send(ctx, 0, h, buf)
				}
			}
			if err == nil && f[0] == "SINK" {
				err = tr.Send(ctx, 0, transport.Header{Kind: transport.KindData}, nil)
			}
			if err != nil {
				fmt.Printf("@@ERR %v\n", err)
				return
			}
			fmt.Println("@@DONE")
		}
	default:
		t.Fatalf("unknown role %q", role)
	}
}

func TestMeshInProcess(t *testing.T) {
	for n := 2; n <= 6; n++ {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			ts, tag := newGroup(t, n, testRing)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errs := make(chan error, n)
			for _, tr := range ts {
				go func() { errs <- runMesh(ctx, tr, testRing, 3) }()
			}
			for range ts {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			for _, tr := range ts {
				if err := tr.Close(); err != nil {
					t.Error(err)
				}
			}
			checkNoLeftovers(t, tag)
		})
	}
}

func TestMeshProcesses(t *testing.T) {
	for _, n := range []int{2, 3, 4, 6} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			tag := newTag(t)
			ring := 2 * testRing
			children := make([]*child, n)
			for i := range children {
				children[i] = startChild(t, "mesh", i, n, tag, ring)
			}
			connectChildren(t, children, nil)
			for _, c := range children {
				c.expect(t, "OK")
			}
			for _, c := range children {
				c.stdin.Close()
				if err := c.cmd.Wait(); err != nil {
					t.Errorf("child %d: %v\n%s", c.rank, err, c.output())
				}
			}
			checkNoLeftovers(t, tag)
		})
	}
}

// A parent rank 0 in this process and a mixed group: children 1..2, so that
// in-process and cross-process pairs run at once.
func TestMeshMixed(t *testing.T) {
	tag := newTag(t)
	const n = 3
	tr, err := Create(Config{Rank: 0, Size: n, Peers: allRanks(n), Tag: tag, RingBytes: testRing})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	children := []*child{startChild(t, "mesh", 1, n, tag, testRing), startChild(t, "mesh", 2, n, tag, testRing)}
	connectChildren(t, children, []*Transport{tr})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := runMesh(ctx, tr, testRing, 2); err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		c.expect(t, "OK")
	}
}

func TestMismatch(t *testing.T) {
	ts, _ := newGroup(t, 2, testRing)
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		sent, exp transport.Header
	}{
		{"seq", transport.Header{Kind: transport.KindData, Seq: 5, Len: 4}, transport.Header{Kind: transport.KindData, Seq: 6, Len: 4}},
		{"sig", transport.Header{Kind: transport.KindData, Sig: 1, Len: 4}, transport.Header{Kind: transport.KindData, Sig: 2, Len: 4}},
		{"len", transport.Header{Kind: transport.KindData, Len: 3}, transport.Header{Kind: transport.KindData, Len: 4}},
		{"step", transport.Header{Kind: transport.KindData, Step: 1, Len: 4}, transport.Header{Kind: transport.KindData, Step: 2, Len: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, _ := newGroup(t, 2, testRing)
			if err := ts[0].Send(ctx, 1, tc.sent, make([]byte, tc.sent.Len)); err != nil {
				t.Fatal(err)
			}
			err := ts[1].Recv(ctx, 0, tc.exp, make([]byte, tc.exp.Len))
			if !errors.Is(err, transport.ErrMismatch) {
				t.Fatalf("got %v, want ErrMismatch", err)
			}
			t.Log(err)
			// The stream is unusable afterwards.
			if err2 := ts[1].Recv(ctx, 0, tc.exp, make([]byte, tc.exp.Len)); !errors.Is(err2, transport.ErrMismatch) {
				t.Fatalf("second Recv: %v", err2)
			}
		})
	}
	// Bad arguments.
	if err := ts[0].Send(ctx, 1, transport.Header{Len: 3}, nil); err == nil {
		t.Error("Send with h.Len != len(data) succeeded")
	}
	if err := ts[0].Send(ctx, 0, transport.Header{}, nil); err == nil {
		t.Error("Send to self succeeded")
	}
	if err := ts[0].Recv(ctx, 7, transport.Header{}, nil); err == nil {
		t.Error("Recv from rank 7 succeeded")
	}
}

func TestAbort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	data := func(n int) transport.Header { return transport.Header{Kind: transport.KindData, Len: uint64(n)} }

	t.Run("waiting-recv", func(t *testing.T) {
		ts, tag := newGroup(t, 3, testRing)
		// Rank 0 has a pending Recv; rank 1 and 2 wait on rank 0.
		pending := make(chan error, 1)
		go func() { pending <- ts[0].Recv(ctx, 2, data(8), make([]byte, 8)) }()
		remote := make(chan error, 2)
		for _, r := range []int{1, 2} {
			go func() { remote <- ts[r].Recv(ctx, 0, data(8), make([]byte, 8)) }()
		}
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		ts[0].Abort(errors.New("out of memory on rank 0"))
		if err := <-pending; !errors.Is(err, transport.ErrAborted) {
			t.Errorf("pending Recv: %v, want ErrAborted", err)
		}
		for range 2 {
			err := <-remote
			var ra *transport.RemoteAbortError
			if !errors.As(err, &ra) || !errors.Is(err, transport.ErrRemoteAbort) || ra.Peer != 0 || ra.Reason != "out of memory on rank 0" {
				t.Errorf("peer Recv: %v (%T), want RemoteAbortError from 0 with the reason", err, err)
			}
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("abort took %v to propagate", d)
		}
		if err := ts[0].Send(ctx, 1, data(0), nil); !errors.Is(err, transport.ErrAborted) {
			t.Errorf("Send after Abort: %v", err)
		}
		if err := ts[0].Recv(ctx, 1, data(0), nil); !errors.Is(err, transport.ErrAborted) {
			t.Errorf("Recv after Abort: %v", err)
		}
		ts[0].Abort(errors.New("again")) // no-op
		ts[0].Close()
		checkNoLeftovers(t, tag)
	})

	t.Run("full-ring", func(t *testing.T) {
		// Rank 0 is blocked sending into a full ring when it aborts: no
		// abort message fits; rank 1 reads the reason from the segment.
		ts, _ := newGroup(t, 2, testRing)
		big := make([]byte, 3*testRing)
		pending := make(chan error, 1)
		go func() { pending <- ts[0].Send(ctx, 1, data(len(big)), big) }()
		time.Sleep(100 * time.Millisecond)
		ts[0].Abort(errors.New("reason in header"))
		if err := <-pending; !errors.Is(err, transport.ErrAborted) {
			t.Errorf("pending Send: %v", err)
		}
		err := ts[1].Recv(ctx, 0, data(len(big)), make([]byte, len(big)))
		var ra *transport.RemoteAbortError
		if !errors.As(err, &ra) || ra.Reason != "reason in header" {
			t.Errorf("Recv: %v, want RemoteAbortError", err)
		}
	})

	t.Run("after-data", func(t *testing.T) {
		// Messages sent before the abort are delivered first.
		ts, _ := newGroup(t, 2, testRing)
		if err := ts[0].Send(ctx, 1, data(3), []byte("abc")); err != nil {
			t.Fatal(err)
		}
		ts[0].Abort(errors.New("later"))
		b := make([]byte, 3)
		if err := ts[1].Recv(ctx, 0, data(3), b); err != nil || string(b) != "abc" {
			t.Fatalf("first Recv: %v %q", err, b)
		}
		err := ts[1].Recv(ctx, 0, data(3), b)
		var ra *transport.RemoteAbortError
		if !errors.As(err, &ra) || ra.Reason != "later" {
			t.Errorf("Recv: %v, want RemoteAbortError", err)
		}
	})

	t.Run("waiting-send", func(t *testing.T) {
		// Rank 0 waits for room in rank 1's ring when rank 1 aborts.
		ts, _ := newGroup(t, 2, testRing)
		big := make([]byte, 3*testRing)
		pending := make(chan error, 1)
		go func() { pending <- ts[0].Send(ctx, 1, data(len(big)), big) }()
		time.Sleep(100 * time.Millisecond)
		ts[1].Abort(errors.New("receiver gave up"))
		err := <-pending
		var ra *transport.RemoteAbortError
		if !errors.As(err, &ra) || ra.Reason != "receiver gave up" || ra.Peer != 1 {
			t.Errorf("Send: %v, want RemoteAbortError", err)
		}
	})

	t.Run("process", func(t *testing.T) {
		tag := newTag(t)
		tr, err := Create(Config{Rank: 0, Size: 2, Peers: []int{1}, Tag: tag, RingBytes: testRing})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		c := startChild(t, "abort", 1, 2, tag, testRing)
		connectChildren(t, []*child{c}, []*Transport{tr})
		res := make(chan error, 1)
		go func() { res <- tr.Recv(ctx, 1, data(8), make([]byte, 8)) }()
		time.Sleep(50 * time.Millisecond)
		c.say(t, "disk full on rank 1")
		c.expect(t, "ABORTED")
		err = <-res
		var ra *transport.RemoteAbortError
		if !errors.As(err, &ra) || ra.Reason != "disk full on rank 1" || ra.Peer != 1 {
			t.Errorf("Recv: %v, want RemoteAbortError", err)
		}
		c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child: %v\n%s", err, c.output())
		}
		tr.Close()
		checkNoLeftovers(t, tag)
	})
}

func TestDeadline(t *testing.T) {
	ts, _ := newGroup(t, 2, testRing)
	h := transport.Header{Kind: transport.KindData, Len: 8}

	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := ts[0].Recv(ctx, 1, h, make([]byte, 8))
	d := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("Recv: %v, want DeadlineExceeded naming rank 1", err)
	}
	if d < 140*time.Millisecond || d > time.Second {
		t.Errorf("Recv returned after %v, deadline was 150ms", d)
	}

	// Send into a full ring (in a group of its own: it leaves the stream
	// half-written).
	ts2, _ := newGroup(t, 2, testRing)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	big := make([]byte, 2*testRing)
	err = ts2[0].Send(ctx2, 1, transport.Header{Kind: transport.KindData, Len: uint64(len(big))}, big)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("Send: %v, want DeadlineExceeded naming rank 1", err)
	}

	// Cancellation returns ctx.Err() itself, promptly.
	ctx3, cancel3 := context.WithCancel(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel3() }()
	start = time.Now()
	err = ts[1].Recv(ctx3, 0, h, make([]byte, 8))
	if err != context.Canceled {
		t.Errorf("Recv: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("cancellation noticed after %v", d)
	}
	// A Recv that failed before any byte arrived leaves the stream usable.
	go ts[0].Send(context.Background(), 1, h, []byte("12345678"))
	b := make([]byte, 8)
	if err := ts[1].Recv(context.Background(), 0, h, b); err != nil || string(b) != "12345678" {
		t.Errorf("Recv after cancel: %v %q", err, b)
	}
}

func TestPeerKilled(t *testing.T) {
	for _, op := range []string{"recv", "send"} {
		t.Run(op, func(t *testing.T) {
			tag := newTag(t)
			tr, err := Create(Config{Rank: 0, Size: 2, Peers: []int{1}, Tag: tag, RingBytes: testRing})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			c := startChild(t, "sleep", 1, 2, tag, testRing)
			connectChildren(t, []*child{c}, []*Transport{tr})
			c.expect(t, "SLEEPING")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res := make(chan error, 1)
			go func() {
				big := make([]byte, 3*testRing)
				h := transport.Header{Kind: transport.KindData, Len: uint64(len(big))}
				if op == "recv" {
					res <- tr.Recv(ctx, 1, h, big)
				} else {
					res <- tr.Send(ctx, 1, h, big)
				}
			}()
			time.Sleep(200 * time.Millisecond)
			start := time.Now()
			if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			// Do not reap the child: the test also covers a zombie peer.
			err = <-res
			d := time.Since(start)
			if !errors.Is(err, transport.ErrPeerLost) {
				t.Errorf("got %v, want ErrPeerLost", err)
			}
			if d > 2*time.Second {
				t.Errorf("dead peer noticed after %v", d)
			}
			t.Logf("noticed after %v: %v", d, err)
			tr.Close()
			checkNoLeftovers(t, tag)
		})
	}
}

func TestCloseWakesPending(t *testing.T) {
	ts, tag := newGroup(t, 2, testRing)
	h := transport.Header{Kind: transport.KindData, Len: 8}
	res := make(chan error, 1)
	peer := make(chan error, 1)
	go func() { res <- ts[0].Recv(context.Background(), 1, h, make([]byte, 8)) }()
	go func() { peer <- ts[1].Recv(context.Background(), 0, h, make([]byte, 8)) }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := ts[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-res; !errors.Is(err, ErrClosed) {
		t.Errorf("pending Recv: %v, want ErrClosed", err)
	}
	if err := <-peer; !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("peer Recv: %v, want ErrPeerLost", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %v", d)
	}
	if err := ts[0].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := ts[0].Send(context.Background(), 1, h, make([]byte, 8)); !errors.Is(err, ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	ts[1].Close()
	checkNoLeftovers(t, tag)
}

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

// ---- failure propagation: a rank hears of an abort or a death even when
// it waits on another rank, or is in no call at all ----

func within(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s still pending after %v", what, d)
		return nil
	}
}

func wantAbortFrom(t *testing.T, what string, err error, origin int, reason string) {
	t.Helper()
	var ra *transport.RemoteAbortError
	if !errors.Is(err, transport.ErrRemoteAbort) || !errors.As(err, &ra) || ra.Peer != origin || ra.Reason != reason {
		t.Errorf("%s: got %v, want a RemoteAbortError from rank %d with reason %q", what, err, origin, reason)
	}
}

func wantLost(t *testing.T, what string, err error, origin int) {
	t.Helper()
	var pl *transport.PeerLostError
	if !errors.Is(err, transport.ErrPeerLost) || !errors.As(err, &pl) || pl.Peer != origin {
		t.Errorf("%s: got %v, want ErrPeerLost naming rank %d", what, err, origin)
	}
}

func dataHdr(n int) transport.Header {
	return transport.Header{Kind: transport.KindData, Len: uint64(n)}
}

// blockOn starts rank 1's call that waits on rank 2: a Send larger than the
// ring (rank 2 never reads) or a Recv (rank 2 never sends).
func blockOn(ctx context.Context, tr1 *Transport, op string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		if op == "send" {
			big := make([]byte, 4*testRing)
			ch <- tr1.Send(ctx, 2, dataHdr(len(big)), big)
		} else {
			ch <- tr1.Recv(ctx, 2, dataHdr(8), make([]byte, 8))
		}
	}()
	return ch
}

// idleCall is rank 2's next call: a Send that fits into the ring, so it
// would succeed had rank 2 not heard.
func idleCall(ctx context.Context, tr2 *Transport) error {
	return tr2.Send(ctx, 1, dataHdr(8), make([]byte, 8))
}

// localRanks creates ranks 1 and 2 of three in this process, rank 0 being a
// child started with role.
func localRanks(t *testing.T, role string) (*child, []*Transport, [8]byte) {
	t.Helper()
	tag := newTag(t)
	ts := make([]*Transport, 3)
	for r := 1; r <= 2; r++ {
		tr, err := Create(Config{Rank: r, Size: 3, Peers: allRanks(3), Tag: tag, RingBytes: testRing})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		ts[r] = tr
	}
	c := startChild(t, role, 0, 3, tag, testRing)
	connectChildren(t, []*child{c}, ts[1:])
	return c, ts, tag
}

func TestAbortReachesEveryRank(t *testing.T) {
	const reason = "rank 0: loss is NaN"
	for _, where := range []string{"in-process", "processes"} {
		for _, op := range []string{"send", "recv"} {
			t.Run(where+"/"+op, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var ts []*Transport
				var c *child
				if where == "in-process" {
					ts, _ = newGroup(t, 3, testRing)
				} else {
					c, ts, _ = localRanks(t, "abort")
				}
				pending := blockOn(ctx, ts[1], op)
				time.Sleep(100 * time.Millisecond)
				start := time.Now()
				if c == nil {
					ts[0].Abort(errors.New(reason))
				} else {
					c.say(t, "%s", reason)
				}
				err := within(t, pending, time.Second, "rank 1's call waiting on rank 2")
				t.Logf("rank 1 failed after %v: %v", time.Since(start), err)
				wantAbortFrom(t, "rank 1", err, 0, reason)
				time.Sleep(time.Until(start.Add(time.Second)))
				wantAbortFrom(t, "rank 2's next call", idleCall(ctx, ts[2]), 0, reason)
				wantAbortFrom(t, "rank 1's next call", ts[1].Recv(ctx, 2, dataHdr(0), nil), 0, reason)
				if c != nil {
					c.expect(t, "ABORTED")
				}
			})
		}
	}
}

func TestKilledRankReachesEveryRank(t *testing.T) {
	for _, op := range []string{"send", "recv"} {
		t.Run(op, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, ts, _ := localRanks(t, "sleep")
			c.expect(t, "SLEEPING")
			pending := blockOn(ctx, ts[1], op)
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			err := within(t, pending, 2*time.Second, "rank 1's call waiting on rank 2")
			t.Logf("rank 1 failed %v after SIGKILL: %v", time.Since(start), err)
			wantLost(t, "rank 1", err, 0)
			time.Sleep(time.Until(start.Add(time.Second)))
			wantLost(t, "rank 2's next call", idleCall(ctx, ts[2]), 0)
		})
	}
}

func TestAbortWithUnreadMessages(t *testing.T) {
	// Rank 0 sent rank 1 a message, then aborts while rank 1 waits on
	// rank 2: the unread message does not keep rank 1 waiting for long.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts, _ := newGroup(t, 3, testRing)
	if err := ts[0].Send(ctx, 1, dataHdr(3), []byte("abc")); err != nil {
		t.Fatal(err)
	}
	pending := blockOn(ctx, ts[1], "recv")
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	ts[0].Abort(errors.New("stop"))
	err := within(t, pending, time.Second, "rank 1's Recv from rank 2")
	t.Logf("rank 1 failed after %v: %v", time.Since(start), err)
	wantAbortFrom(t, "rank 1", err, 0, "stop")
}

func TestOrderlyCloseIsNotAFailure(t *testing.T) {
	for _, where := range []string{"in-process", "processes"} {
		t.Run(where, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var ts []*Transport
			if where == "in-process" {
				ts, _ = newGroup(t, 3, testRing)
				if err := ts[0].Send(ctx, 1, dataHdr(5), []byte("last!")); err != nil {
					t.Fatal(err)
				}
				ts[0].Close()
			} else {
				var c *child
				c, ts, _ = localRanks(t, "close")
				c.expect(t, "CLOSED")
				if err := c.cmd.Wait(); err != nil { // and it exited
					t.Fatalf("child: %v\n%s", err, c.output())
				}
			}
			time.Sleep(200 * time.Millisecond) // the watchers look meanwhile
			buf := make([]byte, 5)
			if err := ts[1].Recv(ctx, 0, dataHdr(5), buf); err != nil || string(buf) != "last!" {
				t.Fatalf("message sent before the close: %v %q", err, buf)
			}
			err := ts[1].Recv(ctx, 0, dataHdr(5), buf)
			wantLost(t, "Recv from the closed rank", err, 0)
			if err != nil && !strings.Contains(err.Error(), "closed its communicator") {
				t.Errorf("Recv from the closed rank: %v, want it to say so", err)
			}
			wantLost(t, "Send to the closed rank", ts[1].Send(ctx, 0, dataHdr(1), []byte{1}), 0)
			for i := range 5 {
				n := 3 * testRing
				e := make(chan error, 2)
				for _, r := range []int{1, 2} {
					go func() {
						b := make([]byte, n)
						fill(b, r, 3-r, i)
						sent := make(chan error, 1)
						go func() { sent <- ts[r].Send(ctx, 3-r, hdr(r, 3-r, i, n), b) }()
						got := make([]byte, n)
						if err := ts[r].Recv(ctx, 3-r, hdr(3-r, r, i, n), got); err != nil {
							e <- err
							return
						}
						if err := <-sent; err != nil {
							e <- err
							return
						}
						b = make([]byte, n)
						fill(b, 3-r, r, i)
						if string(got) != string(b) {
							e <- fmt.Errorf("rank %d: wrong content", r)
							return
						}
						e <- nil
					}()
				}
				for range 2 {
					if err := <-e; err != nil {
						t.Fatalf("round %d between ranks 1 and 2 after rank 0 closed: %v", i, err)
					}
				}
				time.Sleep(30 * time.Millisecond)
			}
		})
	}
}
