package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
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
