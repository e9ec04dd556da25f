package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/gocoll/gocoll/engine"
)

// The C behaviour is tested from C in ./ctest; these check the pieces that
// need no library build.

func TestResultCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, resSuccess},
		{argErr("x"), resInvalidArgument},
		{fmt.Errorf("wrapped: %w", engine.ErrInvalidArgument), resInvalidArgument},
		{engine.ErrInvalidUsage, resInvalidUsage},
		{engine.ErrMismatch, resInvalidUsage},
		{&engine.OpError{Op: "allreduce", Peer: 1, Err: engine.ErrMismatch}, resInvalidUsage},
		{engine.ErrDestroyed, resInvalidUsage},
		{fmt.Errorf("%w: by rank 0", engine.ErrAborted), resInvalidUsage},
		{&engine.OpError{Op: "allreduce", Peer: 2, Err: engine.ErrPeerLost}, resRemoteError},
		{fmt.Errorf("x: %w", engine.ErrRemoteAbort), resRemoteError},
		{&engine.OpError{Op: "barrier", Peer: 3, Err: fmt.Errorf("%w after 1s", engine.ErrTimeout)}, resTimeout},
		{fmt.Errorf("rendezvous: %w", context.DeadlineExceeded), resTimeout},
		{fmt.Errorf("listen: %w", syscall.EADDRINUSE), resSystemError},
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, resSystemError},
		{&os.PathError{Op: "open", Path: "/dev/shm/x", Err: syscall.ENOSPC}, resSystemError},
		{errors.New("something else"), resInternalError},
	} {
		if got := resultCode(tc.err); got != tc.want {
			t.Errorf("resultCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestHandles(t *testing.T) {
	tab := &handleTable{comms: map[uintptr]*commState{}, reqs: map[uintptr]*reqState{}, allocs: map[uintptr]alloc{}}
	comms, err := engine.NewLocalComms(1, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer comms[0].Destroy()
	s := tab.addComm(comms[0])
	if s.h == 0 || s.h&kindMask != kindComm {
		t.Fatalf("comm handle %#x", s.h)
	}
	if got, err := tab.comm(s.h); err != nil || got != s {
		t.Fatalf("lookup: %v, %v", got, err)
	}
	r, err := comms[0].IBarrier()
	if err != nil {
		t.Fatal(err)
	}
	rh := tab.addRequest(r, s, "gocollIBarrier")
	if rh == s.h || rh&kindMask != kindRequest {
		t.Fatalf("request handle %#x (comm %#x)", rh, s.h)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"NULL comm", second(tab.comm(0)), engine.ErrInvalidArgument},
		{"request as comm", second(tab.comm(rh)), engine.ErrInvalidArgument},
		{"comm as request", second(tab.request(s.h)), engine.ErrInvalidArgument},
		{"never created", second(tab.comm(s.h + 100<<kindBits)), engine.ErrInvalidArgument},
		{"odd value", second(tab.comm(0xdeadbeef)), engine.ErrInvalidArgument},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if _, err := tab.takeComm(s.h); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.comm(s.h); !errors.Is(err, engine.ErrDestroyed) || resultCode(err) != resInvalidUsage {
		t.Errorf("destroyed comm: %v", err)
	}
	if _, err := tab.takeRequest(rh); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.request(rh); !errors.Is(err, engine.ErrInvalidUsage) {
		t.Errorf("freed request: %v", err)
	}
	s.close()
	s.setErr("ignored after close")
	if s.lastErr != nil {
		t.Error("setErr after close stored a string")
	}
}

func second[T any](_ T, err error) error { return err }

// GOCOLL_METRICS_ADDR serves the library's registry; the port moves up by
// the local rank so ranks on one host do not collide.
func TestMetricsEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	env := map[string]string{
		"GOCOLL_METRICS_ADDR": fmt.Sprintf("127.0.0.1:%d", base-1),
		"GOCOLL_RANK":         "1", "GOCOLL_SIZE": "2", "GOCOLL_LOCAL_RANK": "1", "GOCOLL_LOCAL_SIZE": "2",
		"GOCOLL_ROOT_ADDR": "127.0.0.1:1",
	}
	opts, err := withMetrics(engine.Options{}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if opts.Metrics == nil {
		t.Fatal("no metrics attached")
	}
	comms, err := engine.NewLocalComms(1, opts)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8)
	if err := comms[0].AllReduce(b, b, 2, engine.Float32, engine.Sum); err != nil {
		t.Fatal(err)
	}
	comms[0].Destroy()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", base))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `gocoll_operations_total{algo="rd",op="allreduce"} 1`) {
		t.Fatalf("metrics page lacks the allreduce:\n%s", body)
	}
}

// TestOptionsLockedCallers: communicators made through the C ABI wait
// without runtime.Gosched, which costs ~5 µs a round on C threads.
func TestOptionsLockedCallers(t *testing.T) {
	opts, err := options()
	if err != nil {
		t.Fatal(err)
	}
	if !opts.LockedCallers {
		t.Fatal("C ABI options do not mark callers as locked to their threads")
	}
}
