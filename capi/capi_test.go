package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/hostiletest"
	"github.com/gocoll/gocoll/engine/proctest"
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
		// A shrink without quorum may also carry the timeout that left
		// the ranks out; it is not a peer failure to retry.
		{fmt.Errorf("shrink: %w (%w)", engine.ErrNoQuorum, engine.ErrTimeout), resNoQuorum},
	} {
		if got := resultCode(tc.err); got != tc.want {
			t.Errorf("resultCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestHandles(t *testing.T) {
	tab := &handleTable{reqs: map[uintptr]*reqState{}, allocs: map[uintptr]alloc{}}
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
	// Looked up once, the handle is the table's cached last one: taking
	// it must drop that too.
	if got, err := tab.comm(s.h); err != nil || got != s {
		t.Fatalf("live comm: %v, %v", got, err)
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
	// The port this rank wants stays taken (another rank of a plain launch
	// got it): init must still succeed, on another port.
	defer ln.Close()
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
	if metricsState.addr == "" || metricsState.addr == ln.Addr().String() {
		t.Fatalf("metrics served at %q, want another port than the taken %s", metricsState.addr, ln.Addr())
	}
	resp, err := http.Get("http://" + metricsState.addr + "/metrics")
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

// A bad GOCOLL_METRICS_ADDR is a warning, never a failed init.
func TestMetricsBadAddr(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logged strings.Builder
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	if _, err := serveMetrics("no-port", 0, reg, logger, defaultMetricsLimits); err == nil {
		t.Fatal("serveMetrics accepted an address without a port")
	}
}

// Idle connections beyond the cap are closed at once, the rest when the
// header timeout passes; the descriptors come back and the endpoint still
// answers. Every connection refused over the cap is logged, the first few
// in full and the rest counted.
func TestMetricsConnectionCap(t *testing.T) {
	lim := defaultMetricsLimits
	lim.readHeader = 300 * time.Millisecond
	lim.maxConns = 16
	lim.refusalWindow = time.Second
	reg := prometheus.NewRegistry()
	fdsBefore := openFDs(t)
	logs := &proctest.Buffer{}
	addr, err := serveMetrics("127.0.0.1:0", 0, reg, slog.New(slog.NewTextHandler(logs, nil)), lim)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Every connection must be closed by the server: at once (over the cap)
	// or after the header timeout (idle under the cap). Read blocks until then.
	closed := make(chan time.Duration, n)
	start := time.Now()
	for _, c := range conns {
		go func() {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			var b [1]byte
			_, err := c.Read(b[:])
			if errors.Is(err, os.ErrDeadlineExceeded) {
				closed <- -1
				return
			}
			closed <- time.Since(start)
		}()
	}
	early := 0
	for range n {
		d := <-closed
		if d < 0 {
			t.Fatal("an idle connection was never closed by the server")
		}
		if d < lim.readHeader {
			early++
		}
	}
	if early < n-lim.maxConns {
		t.Errorf("%d connections closed before the header timeout, want at least %d (cap %d)", early, n-lim.maxConns, lim.maxConns)
	}
	// The connections refused over the cap (all but those holding a slot)
	// are logged: a few in full, the flood counted once its window ends.
	deadline := time.Now().Add(10 * time.Second)
	for {
		full, counted := hostiletest.Logged(logs.String(), "refused metrics connections", "metrics: refused connection, too many open")
		if full > 0 && counted > 0 && full+counted <= n-lim.maxConns {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals logged in full and %d counted, want the first few in full and the rest (at most %d) counted:\n%s", full, counted, n-lim.maxConns, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range conns {
		c.Close()
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	// The server's side of each connection is closed too: only the
	// listener (and at most the runtime's poller) remain.
	if after := openFDs(t); after > fdsBefore+3 {
		t.Errorf("%d descriptors open after the flood, %d before", after, fdsBefore)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestRendezvousResultCodes: setup failures reach C as the code of their
// cause, the same on every rank the root told, never gocollInternalError.
func TestRendezvousResultCodes(t *testing.T) {
	secret := []byte("job secret")
	start := func(t *testing.T, timeout time.Duration) *bootstrap.Root {
		r, err := bootstrap.StartRoot("127.0.0.1:0", secret, timeout, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	check := func(t *testing.T, what string, errs []error, want int) {
		t.Helper()
		for i, err := range errs {
			if got := resultCode(err); got != want {
				t.Errorf("%s: rank %d: code %d, want %d (%v)", what, i, got, want, err)
			}
		}
	}
	t.Run("sizes disagree", func(t *testing.T) {
		root := start(t, 10*time.Second)
		errc := make(chan error, 1)
		go func() { _, err := bootstrap.Exchange(ctx, root.Addr(), secret, 0, 3, nil); errc <- err }()
		_, err1 := bootstrap.Exchange(ctx, root.Addr(), secret, 1, 4, nil)
		check(t, "sizes", []error{<-errc, err1}, resInvalidUsage)
	})
	t.Run("rank missing", func(t *testing.T) {
		root := start(t, 300*time.Millisecond)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Go(func() { _, errs[r] = bootstrap.Exchange(ctx, root.Addr(), secret, r, 3, nil) })
		}
		wg.Wait()
		check(t, "missing", errs, resTimeout)
	})
	t.Run("duplicate rank", func(t *testing.T) {
		root := start(t, 300*time.Millisecond)
		errc := make(chan error, 2)
		for range 2 {
			go func() { _, err := bootstrap.Exchange(ctx, root.Addr(), secret, 0, 2, nil); errc <- err }()
		}
		check(t, "duplicate", []error{<-errc}, resInvalidUsage)
		<-errc // the first rank 0 waits for rank 1 until the root gives up
	})
	t.Run("rank left", func(t *testing.T) {
		root := start(t, 10*time.Second)
		clients := make([]*bootstrap.Client, 3)
		var wg sync.WaitGroup
		for r := range 3 {
			wg.Go(func() {
				c, _, err := bootstrap.Join(ctx, root.Addr(), secret, r, 3, nil)
				if err != nil {
					t.Error(err)
				}
				clients[r] = c
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		// Whether rank 2 leaves before or after rank 0 arrives, rank 0
		// hears that a rank left.
		clients[2].Close()
		_, err := clients[0].AllGather(ctx, []byte("x"))
		check(t, "left", []error{err}, resRemoteError)
		clients[0].Close()
		clients[1].Close()
	})
	t.Run("wrong secret", func(t *testing.T) {
		root := start(t, 500*time.Millisecond)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		wg.Go(func() { _, errs[0] = bootstrap.Exchange(ctx, root.Addr(), secret, 0, 2, nil) })
		wg.Go(func() { _, errs[1] = bootstrap.Exchange(ctx, root.Addr(), []byte("other"), 1, 2, nil) })
		wg.Wait()
		// Rank 1 is refused at once; rank 0 hears from the root why rank 1
		// never came.
		check(t, "secret", errs, resInvalidUsage)
	})
}
