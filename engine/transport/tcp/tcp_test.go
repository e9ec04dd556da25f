package tcp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

var testSecret = []byte("test secret: 0123456789abcdef")
var testTag = [8]byte{'t', 'e', 's', 't', 0, 0, 0, 1}

func listeners(t testing.TB, n int) ([]net.Listener, []string) {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for r := range lns {
		ln, err := Listen("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		lns[r] = ln
		addrs[r] = ln.Addr().String()
	}
	return lns, addrs
}

func TestPartialPeers(t *testing.T) {
	// Ranks of the same parity are connected; the rest would go through
	// another transport.
	ts := kitMesh(t, 5, func(r int) []int {
		var ps []int
		for p := r % 2; p < 5; p += 2 {
			ps = append(ps, p) // includes r itself, which is ignored
		}
		return ps
	})
	for r, tr := range ts {
		for p := range 5 {
			if want := p != r && p%2 == r%2; tr.Connected(p) != want {
				t.Errorf("rank %d connected to %d: %v, want %v", r, p, tr.Connected(p), want)
			}
		}
	}
	err := ts[0].Send(context.Background(), 1, transporttest.Hdr(0, 0), nil)
	if err == nil || !strings.Contains(err.Error(), "no TCP connection to rank 1") {
		t.Errorf("send to unconnected rank: %v", err)
	}
}

func TestRefusedConnections(t *testing.T) {
	logs := &proctest.Buffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	const n = 3
	lns, addrs := listeners(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ts := make([]*Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := func(r int) {
		wg.Go(func() {
			ts[r], errs[r] = New(ctx, Config{Rank: r, Size: n, Listener: lns[r], Addrs: addrs, Peers: transporttest.AllRanks(n), Secret: testSecret, Tag: testTag, Logger: logger})
		})
	}
	start(0) // rank 0 waits for ranks 1 and 2

	rogue := func(secret []byte, tag [8]byte, rank int) error {
		c, err := net.Dial("tcp", addrs[0])
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = ClientHandshake(c, secret, tag, rank, time.Now().Add(5*time.Second))
		return err
	}
	if err := rogue([]byte("wrong"), testTag, 2); !errors.Is(err, ErrAuth) {
		t.Errorf("wrong secret: %v", err)
	}
	if err := rogue(testSecret, [8]byte{'o', 't', 'h', 'e', 'r'}, 2); !errors.Is(err, ErrAuth) {
		t.Errorf("wrong tag: %v", err)
	}
	if err := rogue(nil, testTag, 2); !errors.Is(err, ErrAuth) {
		t.Errorf("no secret: %v", err)
	}
	if err := rogue(testSecret, testTag, 0); !errors.Is(err, ErrRefused) {
		t.Errorf("rank that must not dial rank 0: %v", err)
	}
	// Not gocoll at all.
	if c, err := net.Dial("tcp", addrs[0]); err == nil {
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n" + strings.Repeat("x", 64)))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("a non-gocoll client got an answer")
		}
		c.Close()
	}

	// A refused client's handler logs on its own goroutine after the
	// client gave up: wait for the five lines while rank 0 is still in
	// setup (a handshake that setup's end cuts is no refusal, and is not
	// logged: on a loaded machine the last handlers ran only after it).
	proctest.Until(t, 10*time.Second, "five refusals logged", func() bool { return strings.Count(logs.String(), "level=WARN") >= 5 })
	start(1)
	start(2)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer ts[r].Close()
	}
	out := logs.String()
	if c := strings.Count(out, "level=WARN"); c != 5 {
		t.Errorf("want 5 warnings, got %d:\n%s", c, out)
	}
	if !strings.Contains(out, "remote=127.0.0.1:") {
		t.Errorf("warnings do not name the remote address:\n%s", out)
	}
	// The mesh works.
	if err := ts[2].Send(ctx, 0, transporttest.Hdr(0, 2), []byte("ok")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if err := ts[0].Recv(ctx, 2, transporttest.Hdr(0, 2), buf); err != nil || string(buf) != "ok" {
		t.Fatalf("%v %q", err, buf)
	}
}

func TestDialRetryAndTimeout(t *testing.T) {
	// Rank 0 starts listening only after rank 1 has started dialling.
	probe, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		tr  *Transport
		err error
	}
	c1 := make(chan res, 1)
	go func() {
		tr, err := New(ctx, Config{Rank: 1, Size: 2, Addrs: []string{addr, ""}, Peers: []int{0}, Secret: testSecret, Tag: testTag})
		c1 <- res{tr, err}
	}()
	time.Sleep(200 * time.Millisecond)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	t0, err := New(ctx, Config{Rank: 0, Size: 2, Listener: ln, Peers: []int{1}, Secret: testSecret, Tag: testTag})
	if err != nil {
		t.Fatal(err)
	}
	defer t0.Close()
	r1 := <-c1
	if r1.err != nil {
		t.Fatal(r1.err)
	}
	r1.tr.Close()

	// Nobody ever listens: a clear error when ctx ends.
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	_, err = New(short, Config{Rank: 2, Size: 3, Addrs: []string{addr, addr, ""}, Peers: []int{0, 2}, Secret: testSecret, Tag: testTag})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ranks [0]") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("got %v", err)
	}
}

func TestHandshakeDirect(t *testing.T) {
	// The exported handshake over a pipe, as the bootstrap package uses it.
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	dl := time.Now().Add(5 * time.Second)
	type res struct {
		rank int
		err  error
	}
	sc := make(chan res, 1)
	go func() {
		r, err := ServerHandshake(a, testSecret, testTag, -1, dl, nil)
		sc <- res{r, err}
	}()
	got, err := ClientHandshake(b, testSecret, testTag, 41, dl)
	if err != nil || got != -1 {
		t.Fatalf("client: %d %v", got, err)
	}
	if s := <-sc; s.err != nil || s.rank != 41 {
		t.Fatalf("server: %+v", s)
	}
}

func TestInterfaceAddr(t *testing.T) {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Skip(err)
	}
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 {
			a, err := InterfaceAddr(ifi.Name)
			if err != nil {
				t.Fatal(err)
			}
			if ip := net.ParseIP(strings.Split(a, "%")[0]); ip == nil || !ip.IsLoopback() {
				t.Errorf("%s: got %q", ifi.Name, a)
			}
		}
	}
	_, err = InterfaceAddr("nosuchif0")
	if err == nil || !strings.Contains(err.Error(), "nosuchif0") || !strings.Contains(err.Error(), "this host has") {
		t.Errorf("missing interface: %v", err)
	}
	if a, err := RouteAddr("127.0.0.1:9"); err != nil || a != "127.0.0.1" {
		t.Errorf("RouteAddr: %q %v", a, err)
	}
	ln, err := Listen("")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := AdvertiseAddr(ln, ""); err == nil {
		t.Error("wildcard listener advertised without a host")
	}
	if a, err := AdvertiseAddr(ln, "10.1.2.3"); err != nil || !strings.HasPrefix(a, "10.1.2.3:") {
		t.Errorf("AdvertiseAddr: %q %v", a, err)
	}
}

func TestSendRecvNoAllocs(t *testing.T) {
	ts := kitMesh(t, 2, nil)
	ctx := context.Background()
	data := make([]byte, 4096)
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		if err := ts[0].Send(ctx, 1, transporttest.Hdr(0, len(data)), data); err != nil {
			t.Fatal(err)
		}
		if err := ts[1].Recv(ctx, 0, transporttest.Hdr(0, len(buf)), buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("%v allocations per Send+Recv", allocs)
	}
}

func BenchmarkPingPong(b *testing.B) {
	for _, c := range []struct {
		name string
		size int
		buf  int
	}{{"bytes=8", 8, 0}, {"bytes=64KiB", 64 << 10, 0}, {"bytes=4MiB", 4 << 20, 0}, {"bytes=4MiB/sockbuf=kernel", 4 << 20, -1}} {
		size := c.size
		b.Run(c.name, func(b *testing.B) {
			lns, addrs := listeners(b, 2)
			ctx := context.Background()
			var ts [2]*Transport
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Go(func() {
					var err error
					ts[r], err = New(ctx, Config{Rank: r, Size: 2, Listener: lns[r], Addrs: addrs, Peers: []int{0, 1}, Secret: testSecret, Tag: testTag, SocketBuffer: c.buf})
					if err != nil {
						panic(err)
					}
				})
			}
			wg.Wait()
			defer ts[0].Close()
			defer ts[1].Close()
			data := make([]byte, size)
			buf := make([]byte, size)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range b.N {
					if err := ts[1].Recv(ctx, 0, transporttest.Hdr(0, size), buf); err != nil {
						panic(err)
					}
					if err := ts[1].Send(ctx, 0, transporttest.Hdr(0, size), buf); err != nil {
						panic(err)
					}
				}
			}()
			b.SetBytes(int64(2 * size))
			b.ResetTimer()
			for range b.N {
				if err := ts[0].Send(ctx, 1, transporttest.Hdr(0, size), data); err != nil {
					b.Fatal(err)
				}
				if err := ts[0].Recv(ctx, 1, transporttest.Hdr(0, size), data); err != nil {
					b.Fatal(err)
				}
			}
			<-done
		})
	}
}

// TestKeepAliveCoversTimeout: the kernel gives a silent connection up no
// sooner than the communicator's timeout.
func TestKeepAliveCoversTimeout(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Second, 30 * time.Second, 5 * time.Minute, time.Hour} {
		k := keepAlive(timeout)
		want := max(timeout, time.Second)
		if timeout == 0 {
			want = 30 * time.Second
		}
		if got := k.Idle + time.Duration(k.Count)*k.Interval; got < want || k.Count > 127 || k.Count < 1 {
			t.Errorf("timeout %v: keepalive gives up after %v (idle %v, %d × %v), want at least %v", timeout, got, k.Idle, k.Count, k.Interval, want)
		}
	}
}
