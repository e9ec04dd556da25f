package transporttest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// RunFaults checks how a transport fails: an abort reaches every rank
// (relayed along a chain where not all ranks are connected), naming the
// rank where it started and its reason, whatever the ranks were doing; a
// rank that closes is no failure, but calls to it fail with ErrPeerLost
// naming it; a rank that dies (Killer, or a child process killed with
// SIGKILL) makes every rank fail with a *transport.PeerLostError naming
// it; closing leaks no goroutine. With Caps.Processes the scenarios also
// run with a rank in a child process.
func RunFaults(t *testing.T, mk Maker) {
	t.Run("Abort", func(t *testing.T) {
		for _, send := range sendRecv {
			t.Run(opName(send), func(t *testing.T) { testAbort(t, mk, send) })
		}
	})
	t.Run("AbortNamesOrigin", func(t *testing.T) { testAbortNamesOrigin(t, mk) })
	if mk.Caps().Partial {
		t.Run("AbortRelayedAlongChain", func(t *testing.T) { testAbortRelayed(t, mk) })
	}
	t.Run("AbortWhileSending", func(t *testing.T) { testAbortWhileSending(t, mk) })
	if mk.Caps().DeliversBeforeAbort {
		t.Run("AbortAfterData", func(t *testing.T) { testAbortAfterData(t, mk) })
	}
	t.Run("AbortWithUnreadMessages", func(t *testing.T) { testAbortUnread(t, mk) })
	t.Run("Close", func(t *testing.T) { testClose(t, mk) })
	t.Run("OrderlyCloseIsNotAFailure", func(t *testing.T) {
		ts := NewMesh(t, mk, 3, nil)
		ctx, cancel := context.WithTimeout(context.Background(), Hang)
		defer cancel()
		if err := ts[0].Send(ctx, 1, Hdr(0, 5), []byte("last!")); err != nil {
			t.Fatal(err)
		}
		ts[0].Close()
		checkAfterClose(t, mk, ts[1], ts[2])
	})
	if _, ok := mk.(Killer); ok {
		t.Run("Killed", func(t *testing.T) {
			for _, send := range sendRecv {
				t.Run(opName(send), func(t *testing.T) {
					ts := NewMesh(t, mk, 4, nil)
					c1, c3 := waiters(t, mk, ts, send)
					mk.(Killer).Kill(ts[0])
					checkFailed(t, ts, c1, c3, lost0)
				})
			}
		})
	}
	t.Run("NoGoroutineLeak", func(t *testing.T) { testNoLeak(t, mk) })
	if mk.Caps().Processes {
		t.Run("Processes", func(t *testing.T) { runProcessFaults(t, mk) })
	}
}

const reason = "rank 0: loss is NaN"

// The fault scenarios run on four ranks: rank 0 fails (aborts, closes or
// dies); rank 1 waits on rank 2 (a Send that blocks, or a Recv), so it
// must hear of the failure from elsewhere than the rank it waits on; rank
// 2 is in no call; rank 3 waits on rank 0 itself (a Send to a rank that
// reads nothing and aborts must report the abort, not a lost peer, though
// closing a socket with unread data resets the connection). Rank 3 never
// sends to rank 2: stopped probes rank 2 with receives from it.

// waiters starts rank 1's call on rank 2 and rank 3's on rank 0, both
// Sends that block or both Recvs.
func waiters(t *testing.T, mk Maker, ts []transport.Transport, send bool) (c1, c3 *call) {
	t.Helper()
	return blockOn(t, mk, ts[1], 2, send), blockOn(t, mk, ts[3], 0, send)
}

// checkFailed: rank 0 failed while waiters c1 and c3 waited; their calls,
// rank 2 (in no call) and the next calls of ranks 1 and 2 all fail with
// an error that want accepts.
func checkFailed(t *testing.T, ts []transport.Transport, c1, c3 *call, want func(t testing.TB, what string, err error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	start := time.Now()
	err := Within(t, c1.res, "rank 1's call waiting on rank 2")
	t.Logf("rank 1 failed after %v: %v", time.Since(start), err)
	want(t, "rank 1's call waiting on rank 2", err)
	want(t, "rank 3's call waiting on rank 0", Within(t, c3.res, "rank 3's call waiting on rank 0"))
	want(t, "rank 2, in no call", stopped(t, ts[2], 3))
	want(t, "rank 2's next call", ts[2].Send(ctx, 1, Hdr(0, 8), make([]byte, 8)))
	want(t, "rank 1's next call", ts[1].Recv(ctx, 0, Hdr(1, 0), nil))
}

func abortedBy0(t testing.TB, what string, err error) {
	t.Helper()
	WantAbortFrom(t, what, err, 0, reason)
}

func lost0(t testing.TB, what string, err error) {
	t.Helper()
	WantLost(t, what, err, 0)
}

func testAbort(t *testing.T, mk Maker, send bool) {
	ts := NewMesh(t, mk, 4, nil)
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	own := goCall(func() error { return ts[0].Recv(ctx, 2, Hdr(0, 16), make([]byte, 16)) })
	blockedOn(t, mk, own, ts[0], 2, false)
	c1, c3 := waiters(t, mk, ts, send)
	ts[0].Abort(errors.New(reason))
	if err := Within(t, own.res, "rank 0's own call"); !errors.Is(err, transport.ErrAborted) || errors.Is(err, transport.ErrPeerLost) || errors.Is(err, transport.ErrRemoteAbort) {
		t.Errorf("rank 0's own pending call: got %v, want ErrAborted", err)
	}
	checkFailed(t, ts, c1, c3, abortedBy0)
	err := ts[0].Send(ctx, 1, Hdr(1, 0), nil)
	if !errors.Is(err, transport.ErrAborted) || !strings.Contains(err.Error(), reason) {
		t.Errorf("rank 0's next call: got %v, want ErrAborted with the reason", err)
	}
	ts[0].Abort(errors.New("again")) // no effect
	if err := ts[0].Recv(ctx, 1, Hdr(1, 0), nil); !errors.Is(err, transport.ErrAborted) || !strings.Contains(err.Error(), reason) {
		t.Errorf("after a second Abort: got %v, want the first abort's error", err)
	}
	if err := ts[0].Close(); err != nil {
		t.Errorf("Close after Abort: %v", err)
	}
}

// testAbortNamesOrigin: a rank that aborts because of a failure it heard
// of elsewhere (a reason wrapping a RemoteAbortError or PeerLostError)
// announces that failure, naming the rank where it started.
func testAbortNamesOrigin(t *testing.T, mk Maker) {
	for _, tc := range []struct {
		name  string
		cause error
	}{
		{"aborted", &transport.RemoteAbortError{Peer: 2, Reason: "disk full"}},
		{"lost", &transport.PeerLostError{Peer: 2, Reason: "process died"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := NewMesh(t, mk, 3, nil)
			ctx, cancel := context.WithTimeout(context.Background(), Hang)
			defer cancel()
			c := goCall(func() error { return ts[1].Recv(ctx, 0, Hdr(0, 8), make([]byte, 8)) })
			blockedOn(t, mk, c, ts[1], 0, false)
			ts[0].Abort(fmt.Errorf("allreduce #3: %w", tc.cause))
			err := Within(t, c.res, "rank 1's call")
			var rae *transport.RemoteAbortError
			var ple *transport.PeerLostError
			if tc.name == "lost" {
				if !errors.As(err, &ple) || ple.Peer != 2 || ple.Reason != "process died" {
					t.Errorf("got %v, want a PeerLostError naming rank 2", err)
				}
			} else if !errors.As(err, &rae) || rae.Peer != 2 || rae.Reason != "disk full" {
				t.Errorf("got %v, want a RemoteAbortError naming rank 2", err)
			}
		})
	}
}

// testAbortRelayed: ranks 0-1 and 1-2 are connected, 0 and 2 are not (they
// would talk through another transport): rank 2 hears of rank 0's abort
// from rank 1, which is in no call.
func testAbortRelayed(t *testing.T, mk Maker) {
	ts := NewMesh(t, mk, 3, func(r int) []int { return [][]int{{1}, {0, 2}, {1}}[r] })
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	c := goCall(func() error { return ts[2].Recv(ctx, 1, Hdr(0, 8), make([]byte, 8)) })
	blockedOn(t, mk, c, ts[2], 1, false)
	ts[0].Abort(errors.New(reason))
	WantAbortFrom(t, "rank 2", Within(t, c.res, "rank 2's Recv from rank 1"), 0, reason)
	WantAbortFrom(t, "rank 1's next call", ts[1].Send(ctx, 2, Hdr(0, 0), nil), 0, reason)
}

// testAbortWhileSending: Abort does not wait for a Send it cuts short; the
// receiver of the cut message learns that the sender stopped.
func testAbortWhileSending(t *testing.T, mk Maker) {
	ts := NewMesh(t, mk, 2, nil)
	c := blockOn(t, mk, ts[0], 1, true)
	aborted := goCall(func() error { ts[0].Abort(errors.New(reason)); return nil })
	Within(t, aborted.res, "Abort with a Send in progress")
	if err := Within(t, c.res, "the Send cut short"); !errors.Is(err, transport.ErrAborted) {
		t.Errorf("the Send cut short: got %v, want ErrAborted", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	blk := mk.Caps().Block
	var err error
	buf := make([]byte, blk.Bytes)
	for k := range max(blk.Msgs, 1) {
		if err = ts[1].Recv(ctx, 0, Hdr(uint64(k), blk.Bytes), buf); err != nil {
			break
		}
	}
	if mk.Caps().ReasonSurvivesCut {
		WantAbortFrom(t, "the receiver of the cut message", err, 0, reason)
	} else {
		wantNamed(t, "the receiver of the cut message", err, 0)
	}
}

// testAbortAfterData: what a rank sent before it aborted is delivered
// before the abort is reported.
func testAbortAfterData(t *testing.T, mk Maker) {
	ts := NewMesh(t, mk, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	if err := ts[0].Send(ctx, 1, Hdr(0, 3), []byte("abc")); err != nil {
		t.Fatal(err)
	}
	ts[0].Abort(errors.New(reason))
	b := make([]byte, 3)
	if err := ts[1].Recv(ctx, 0, Hdr(0, 3), b); err != nil || string(b) != "abc" {
		t.Fatalf("the message sent before the abort: %v %q", err, b)
	}
	WantAbortFrom(t, "the next Recv", ts[1].Recv(ctx, 0, Hdr(1, 3), b), 0, reason)
}

// testAbortUnread: rank 0 sent rank 1 a message, then aborts while rank 1
// waits on rank 2: the unread message does not keep rank 1 waiting.
func testAbortUnread(t *testing.T, mk Maker) {
	ts := NewMesh(t, mk, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	if err := ts[0].Send(ctx, 1, Hdr(0, 3), []byte("abc")); err != nil {
		t.Fatal(err)
	}
	c := blockOn(t, mk, ts[1], 2, false)
	ts[0].Abort(errors.New(reason))
	WantAbortFrom(t, "rank 1's Recv from rank 2", Within(t, c.res, "rank 1's Recv from rank 2"), 0, reason)
}

// testClose: Close fails this rank's pending and later calls with
// Caps.Closed, and the peers' calls to it with a PeerLostError naming it.
func testClose(t *testing.T, mk Maker) {
	ts := NewMesh(t, mk, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	closed := mk.Caps().Closed
	own := goCall(func() error { return ts[0].Recv(ctx, 1, Hdr(0, 4), make([]byte, 4)) })
	peer := goCall(func() error { return ts[1].Recv(ctx, 0, Hdr(0, 4), make([]byte, 4)) })
	blockedOn(t, mk, own, ts[0], 1, false)
	blockedOn(t, mk, peer, ts[1], 0, false)
	if err := ts[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := Within(t, own.res, "the pending Recv of the closed rank"); !errors.Is(err, closed) {
		t.Errorf("pending Recv of the closed rank: got %v, want %v", err, closed)
	}
	err := Within(t, peer.res, "the peer's pending Recv")
	WantLost(t, "the peer's pending Recv", err, 0)
	if err != nil && !strings.Contains(err.Error(), "closed its communicator") {
		t.Errorf("the peer's pending Recv: %v, want it to say that rank 0 closed", err)
	}
	if err := ts[0].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := ts[0].Send(ctx, 1, Hdr(1, 1), []byte{1}); !errors.Is(err, closed) {
		t.Errorf("Send after Close: got %v, want %v", err, closed)
	}
	if err := ts[0].Recv(ctx, 1, Hdr(1, 0), nil); !errors.Is(err, closed) {
		t.Errorf("Recv after Close: got %v, want %v", err, closed)
	}
	WantLost(t, "the peer's Send to the closed rank", ts[1].Send(ctx, 0, Hdr(1, 1), []byte{1}), 0)
}

// checkAfterClose: rank 0 sent "last!" (message 0) to rank 1 and closed.
// Once the watchers looked, ranks 1 and 2 still run: rank 1 receives the
// message, then fails to talk to rank 0; ranks 1 and 2 go on together.
func checkAfterClose(t *testing.T, mk Maker, tr1, tr2 transport.Transport) {
	t.Helper()
	if w, ok := mk.(Watcher); ok {
		w.Watch(tr1)
		w.Watch(tr2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	buf := make([]byte, 5)
	if err := tr1.Recv(ctx, 0, Hdr(0, 5), buf); err != nil || string(buf) != "last!" {
		t.Fatalf("the message sent before the close: %v %q", err, buf)
	}
	err := tr1.Recv(ctx, 0, Hdr(1, 5), buf)
	WantLost(t, "Recv from the closed rank", err, 0)
	if err != nil && !strings.Contains(err.Error(), "closed its communicator") {
		t.Errorf("Recv from the closed rank: %v, want it to say so", err)
	}
	WantLost(t, "Send to the closed rank", tr1.Send(ctx, 0, Hdr(1, 1), []byte{1}), 0)
	if err := exchangeAll(ctx, []transport.Transport{nil, tr1, tr2}, []int{0, 7, 64 << 10}, 0); err != nil {
		t.Fatalf("ranks 1 and 2 after rank 0 closed: %v", err)
	}
}

// testNoLeak: a mesh that worked, with a call pending at Close, leaves no
// goroutine behind once closed.
func testNoLeak(t *testing.T, mk Maker) {
	before := runtime.NumGoroutine()
	func() {
		ts := NewMesh(t, mk, 3, nil)
		ctx, cancel := context.WithTimeout(context.Background(), Hang)
		defer cancel()
		if err := exchangeAll(ctx, ts, []int{1, 5000}, 0); err != nil {
			t.Fatal(err)
		}
		c := goCall(func() error { return ts[1].Recv(ctx, 0, Hdr(9, 1), make([]byte, 1)) })
		blockedOn(t, mk, c, ts[1], 0, false)
		ts[1].Close()
		if err := Within(t, c.res, "the pending Recv"); !errors.Is(err, mk.Caps().Closed) {
			t.Errorf("pending Recv at Close: %v", err)
		}
		for _, tr := range ts {
			tr.Close()
		}
	}()
	awaitGoroutines(t, before)
}

// ---- the same with rank 0 in a child process ----

func runProcessFaults(t *testing.T, mk Maker) {
	t.Run("Exchange", func(t *testing.T) {
		ts, kids := StartMesh(t, mk, []string{"", "exchange", "exchange"})
		ctx, cancel := context.WithTimeout(context.Background(), childWait)
		defer cancel()
		if err := exchange(ctx, ts[0], AllRanks(3), sizes(mk.Caps()), 0); err != nil {
			t.Fatal(err)
		}
		for _, c := range kids[1:] {
			c.Expect(t, "OK")
		}
	})
	t.Run("Killed", func(t *testing.T) {
		for _, send := range sendRecv {
			t.Run(opName(send), func(t *testing.T) {
				ts, kids := StartMesh(t, mk, []string{"idle", "", "", ""})
				kids[0].Expect(t, "IDLE")
				c1, c3 := waiters(t, mk, ts, send)
				kids[0].Kill(t)
				checkFailed(t, ts, c1, c3, lost0)
			})
		}
	})
	t.Run("Abort", func(t *testing.T) {
		for _, send := range sendRecv {
			t.Run(opName(send), func(t *testing.T) {
				ts, kids := StartMesh(t, mk, []string{"abort", "", "", ""})
				kids[0].Expect(t, "WAITING")
				c1, c3 := waiters(t, mk, ts, send)
				kids[0].Say(t, "%s", reason)
				kids[0].Expect(t, "ABORTED")
				checkFailed(t, ts, c1, c3, abortedBy0)
			})
		}
	})
	t.Run("OrderlyCloseIsNotAFailure", func(t *testing.T) {
		// Rank 0 sends, closes and exits before rank 1 reads.
		ts, kids := StartMesh(t, mk, []string{"close", "", ""})
		kids[0].Expect(t, "CLOSED")
		if err := kids[0].Wait(); err != nil {
			t.Fatalf("rank 0 (child): %v\n%s", err, kids[0].Output())
		}
		checkAfterClose(t, mk, ts[1], ts[2])
	})
}
