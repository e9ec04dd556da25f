package tcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

var testSecret = []byte("test secret: 0123456789abcdef")
var testTag = [8]byte{'t', 'e', 's', 't', 0, 0, 0, 1}

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

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

func allRanks(n int) []int {
	rs := make([]int, n)
	for i := range rs {
		rs[i] = i
	}
	return rs
}

// mesh builds n connected transports over loopback; peers(r) selects
// each rank's peers (nil: everyone).
func newMesh(t *testing.T, n int, peers func(r int) []int, logger *slog.Logger) []*Transport {
	t.Helper()
	lns, addrs := listeners(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts := make([]*Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		ps := allRanks(n)
		if peers != nil {
			ps = peers(r)
		}
		wg.Go(func() {
			ts[r], errs[r] = New(ctx, Config{Rank: r, Size: n, Listener: lns[r], Addrs: addrs, Peers: ps, Secret: testSecret, Tag: testTag, Logger: logger})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			tr.Close()
		}
	})
	return ts
}

func hdr(seq uint64, n int) transport.Header {
	return transport.Header{Kind: transport.KindData, Seq: seq, Sig: 0xfeed, Step: uint32(seq), Len: uint64(n)}
}

var pattern = func() []byte {
	b := make([]byte, 1<<20)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(b)
	return b
}()

// payload is deterministic per (from, to, size): a shared random block with
// the routing stamped in front.
func payload(from, to, size int) []byte {
	b := make([]byte, size)
	copy(b, pattern)
	var stamp [12]byte
	binary.LittleEndian.PutUint32(stamp[0:], uint32(from))
	binary.LittleEndian.PutUint32(stamp[4:], uint32(to))
	binary.LittleEndian.PutUint32(stamp[8:], uint32(size))
	copy(b, stamp[:])
	return b
}

func TestMeshExchange(t *testing.T) {
	sizes := []int{0, 1, 1 << 20}
	for n := 1; n <= 6; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ts := newMesh(t, n, nil, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errc := make(chan error, 2*n*n)
			for r, tr := range ts {
				if tr.Rank() != r || tr.Size() != n {
					t.Fatalf("rank %d: Rank()=%d Size()=%d", r, tr.Rank(), tr.Size())
				}
				for p := range n {
					if p == r {
						if tr.Connected(p) {
							t.Errorf("rank %d connected to itself", r)
						}
						continue
					}
					wg.Go(func() {
						for i, sz := range sizes {
							if err := tr.Send(ctx, p, hdr(uint64(i), sz), payload(r, p, sz)); err != nil {
								errc <- fmt.Errorf("send %d->%d %dB: %w", r, p, sz, err)
								return
							}
						}
					})
					wg.Go(func() {
						for i, sz := range sizes {
							buf := make([]byte, sz)
							if err := tr.Recv(ctx, p, hdr(uint64(i), sz), buf); err != nil {
								errc <- fmt.Errorf("recv %d<-%d %dB: %w", r, p, sz, err)
								return
							}
							if !bytes.Equal(buf, payload(p, r, sz)) {
								errc <- fmt.Errorf("recv %d<-%d %dB: wrong content", r, p, sz)
								return
							}
						}
					})
				}
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
		})
	}
}

func TestPartialPeers(t *testing.T) {
	// Ranks of the same parity are connected; the rest would go through
	// another transport.
	ts := newMesh(t, 5, func(r int) []int {
		var ps []int
		for p := r % 2; p < 5; p += 2 {
			ps = append(ps, p) // includes r itself, which is ignored
		}
		return ps
	}, nil)
	for r, tr := range ts {
		for p := range 5 {
			if want := p != r && p%2 == r%2; tr.Connected(p) != want {
				t.Errorf("rank %d connected to %d: %v, want %v", r, p, tr.Connected(p), want)
			}
		}
	}
	err := ts[0].Send(context.Background(), 1, hdr(0, 0), nil)
	if err == nil || !strings.Contains(err.Error(), "no TCP connection to rank 1") {
		t.Errorf("send to unconnected rank: %v", err)
	}
}

func TestHeaderMismatch(t *testing.T) {
	ts := newMesh(t, 2, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ts[1].Send(ctx, 0, hdr(5, 3), []byte("abc")); err != nil {
		t.Fatal(err)
	}
	err := ts[0].Recv(ctx, 1, hdr(4, 3), make([]byte, 3))
	if !errors.Is(err, transport.ErrMismatch) || !strings.Contains(err.Error(), "sequence") {
		t.Fatalf("got %v, want a sequence mismatch", err)
	}
	// The stream is out of step now: the error sticks.
	if err2 := ts[0].Recv(ctx, 1, hdr(5, 3), make([]byte, 3)); !errors.Is(err2, transport.ErrMismatch) {
		t.Fatalf("second recv: %v", err2)
	}

	// Length mismatch on the other direction.
	if err := ts[0].Send(ctx, 1, hdr(0, 8), make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	err = ts[1].Recv(ctx, 0, hdr(0, 4), make([]byte, 4))
	if !errors.Is(err, transport.ErrMismatch) || !strings.Contains(err.Error(), "length") {
		t.Fatalf("got %v, want a length mismatch", err)
	}
	// Caller bugs are reported, not sent.
	if err := ts[0].Send(ctx, 1, hdr(1, 8), make([]byte, 4)); err == nil {
		t.Error("send with h.Len != len(data) succeeded")
	}
}

func TestAbortPropagates(t *testing.T) {
	ts := newMesh(t, 3, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make(chan error, 3)
	for _, r := range []int{0, 2} {
		go func() { errs <- ts[r].Recv(ctx, 1, hdr(0, 16), make([]byte, 16)) }()
	}
	// A call pending on the aborting rank itself.
	local := make(chan error, 1)
	go func() { local <- ts[1].Recv(ctx, 0, hdr(0, 16), make([]byte, 16)) }()
	time.Sleep(50 * time.Millisecond)

	ts[1].Abort(errors.New("rank 1 ran out of memory"))
	for range 2 {
		err := <-errs
		var rae *transport.RemoteAbortError
		if !errors.Is(err, transport.ErrRemoteAbort) || !errors.As(err, &rae) {
			t.Fatalf("peer got %v, want a RemoteAbortError", err)
		}
		if rae.Peer != 1 || rae.Reason != "rank 1 ran out of memory" {
			t.Errorf("got %+v", rae)
		}
	}
	if err := <-local; !errors.Is(err, transport.ErrAborted) || errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("pending recv on the aborted rank: %v", err)
	}
	err := ts[1].Send(ctx, 0, hdr(1, 0), nil)
	if !errors.Is(err, transport.ErrAborted) || !strings.Contains(err.Error(), "out of memory") {
		t.Errorf("send after abort: %v", err)
	}
	// The remote abort sticks on the peer.
	if err := ts[0].Recv(ctx, 1, hdr(1, 0), nil); !errors.Is(err, transport.ErrRemoteAbort) {
		t.Errorf("second recv on peer: %v", err)
	}
	ts[1].Abort(errors.New("again")) // no-op
	if err := ts[1].Close(); err != nil {
		t.Error(err)
	}
}

func TestAbortWhileSending(t *testing.T) {
	// A Send blocked on a full socket must be unblocked by Abort, and
	// Abort must not wait for it.
	ts := newMesh(t, 2, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	big := make([]byte, 64<<20) // more than both socket buffers
	sendErr := make(chan error, 1)
	go func() { sendErr <- ts[0].Send(ctx, 1, hdr(0, len(big)), big) }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	ts[0].Abort(errors.New("stop"))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Abort took %v", d)
	}
	if err := <-sendErr; !errors.Is(err, transport.ErrAborted) {
		t.Errorf("blocked send: %v", err)
	}
	err := ts[1].Recv(ctx, 0, hdr(0, len(big)), make([]byte, len(big)))
	if !errors.Is(err, transport.ErrPeerLost) {
		t.Errorf("receiver of a cut message: %v", err)
	}
}

func TestPeerClosed(t *testing.T) {
	ts := newMesh(t, 2, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recvErr := make(chan error, 1)
	go func() { recvErr <- ts[0].Recv(ctx, 1, hdr(0, 4), make([]byte, 4)) }()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	ts[1].Close()
	ts[1].Close() // idempotent
	select {
	case err := <-recvErr:
		if !errors.Is(err, transport.ErrPeerLost) || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("got %v, want ErrPeerLost naming rank 1", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("took %v", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("recv did not notice the closed peer")
	}
	// Sends notice too (the first ones may still land in the socket buffer).
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := ts[0].Send(ctx, 1, hdr(0, 1024), make([]byte, 1024))
		if err != nil {
			if !errors.Is(err, transport.ErrPeerLost) {
				t.Errorf("send: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sends to a closed peer keep succeeding")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Calls on the closed side fail as aborted.
	if err := ts[1].Recv(ctx, 0, hdr(0, 0), nil); !errors.Is(err, transport.ErrAborted) {
		t.Errorf("recv after close: %v", err)
	}
}

func TestRecvContext(t *testing.T) {
	ts := newMesh(t, 2, nil, nil)
	bg := context.Background()

	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := ts[0].Recv(ctx, 1, hdr(0, 4), make([]byte, 4))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("deadline honoured after %v", d)
	}

	ctx2, cancel2 := context.WithCancel(bg)
	time.AfterFunc(30*time.Millisecond, cancel2)
	if err := ts[0].Recv(ctx2, 1, hdr(0, 4), make([]byte, 4)); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want Canceled", err)
	}
	if err := ts[0].Recv(ctx2, 1, hdr(0, 4), make([]byte, 4)); !errors.Is(err, context.Canceled) {
		t.Fatalf("already cancelled: got %v", err)
	}

	// Nothing was read, so the stream is still usable, and a stale
	// cancellation does not leak into the next call.
	if err := ts[1].Send(bg, 0, hdr(0, 4), []byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	ctx3, cancel3 := context.WithTimeout(bg, 5*time.Second)
	defer cancel3()
	if err := ts[0].Recv(ctx3, 1, hdr(0, 4), buf); err != nil || string(buf) != "ping" {
		t.Fatalf("recv after timeouts: %v %q", err, buf)
	}

	// Send deadline: fill the pipe, nobody reads.
	big := make([]byte, 64<<20)
	ctx4, cancel4 := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel4()
	if err := ts[0].Send(ctx4, 1, hdr(1, len(big)), big); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked send: %v", err)
	}
	// Part of the message is on the wire: the stream is unusable.
	if err := ts[0].Send(bg, 1, hdr(2, 0), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send after a partial send: %v", err)
	}
}

func TestRefusedConnections(t *testing.T) {
	logs := &syncBuffer{}
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
			ts[r], errs[r] = New(ctx, Config{Rank: r, Size: n, Listener: lns[r], Addrs: addrs, Peers: allRanks(n), Secret: testSecret, Tag: testTag, Logger: logger})
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
	if c := strings.Count(out, "level=WARN"); c < 5 {
		t.Errorf("want 5 warnings, got %d:\n%s", c, out)
	}
	if !strings.Contains(out, "remote=127.0.0.1:") {
		t.Errorf("warnings do not name the remote address:\n%s", out)
	}
	// The mesh works.
	if err := ts[2].Send(ctx, 0, hdr(0, 2), []byte("ok")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if err := ts[0].Recv(ctx, 2, hdr(0, 2), buf); err != nil || string(buf) != "ok" {
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

const childEnv = "GOCOLL_TCP_TEST_CHILD_ADDR"

// TestKilledPeer runs rank 1 in a child process (this test binary again),
// SIGKILLs it, and expects rank 0's pending Recv to fail promptly.
func TestKilledPeer(t *testing.T) {
	if addr := os.Getenv(childEnv); addr != "" {
		killedPeerChild(addr)
		return
	}
	ln, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledPeer$")
	cmd.Env = append(os.Environ(), childEnv+"="+ln.Addr().String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := New(ctx, Config{Rank: 0, Size: 2, Listener: ln, Peers: []int{0, 1}, Secret: testSecret, Tag: testTag})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	// One message proves the child is live and sending.
	buf := make([]byte, 5)
	if err := tr.Recv(ctx, 1, hdr(0, 5), buf); err != nil || string(buf) != "hello" {
		t.Fatalf("%v %q", err, buf)
	}
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); !strings.HasPrefix(line, "child ready") {
		t.Fatalf("child said %q", line)
	}
	recvErr := make(chan error, 1)
	go func() { recvErr <- tr.Recv(ctx, 1, hdr(1, 8), make([]byte, 8)) }()
	time.Sleep(50 * time.Millisecond)
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-recvErr:
		if !errors.Is(err, transport.ErrPeerLost) {
			t.Fatalf("got %v, want ErrPeerLost", err)
		}
		t.Logf("after SIGKILL (%v): %v", time.Since(killed), err)
	case <-time.After(2 * time.Second):
		t.Fatal("recv still pending 2s after the peer was killed")
	}
}

func killedPeerChild(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := New(ctx, Config{Rank: 1, Size: 2, Addrs: []string{addr, ""}, Peers: []int{0}, Secret: testSecret, Tag: testTag})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	if err := tr.Send(ctx, 0, hdr(0, 5), []byte("hello")); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	fmt.Println("child ready")
	// Wait to be killed; exit on our own if the parent goes away.
	tr.Recv(ctx, 0, hdr(0, 0), nil)
	os.Exit(0)
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
	ts := newMesh(t, 2, nil, nil)
	ctx := context.Background()
	data := make([]byte, 4096)
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		if err := ts[0].Send(ctx, 1, hdr(0, len(data)), data); err != nil {
			t.Fatal(err)
		}
		if err := ts[1].Recv(ctx, 0, hdr(0, len(buf)), buf); err != nil {
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
					if err := ts[1].Recv(ctx, 0, hdr(0, size), buf); err != nil {
						panic(err)
					}
					if err := ts[1].Send(ctx, 0, hdr(0, size), buf); err != nil {
						panic(err)
					}
				}
			}()
			b.SetBytes(int64(2 * size))
			b.ResetTimer()
			for range b.N {
				if err := ts[0].Send(ctx, 1, hdr(0, size), data); err != nil {
					b.Fatal(err)
				}
				if err := ts[0].Recv(ctx, 1, hdr(0, size), data); err != nil {
					b.Fatal(err)
				}
			}
			<-done
		})
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		ts := newMesh(t, 3, nil, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := ts[2].Send(ctx, 0, hdr(0, 1), []byte{7}); err != nil {
			t.Fatal(err)
		}
		if err := ts[0].Recv(ctx, 2, hdr(0, 1), make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		// A Recv left pending is released by Close.
		done := make(chan error, 1)
		go func() { done <- ts[1].Recv(ctx, 0, hdr(0, 1), make([]byte, 1)) }()
		time.Sleep(10 * time.Millisecond)
		ts[1].Close()
		if err := <-done; !errors.Is(err, transport.ErrAborted) {
			t.Errorf("pending recv after close: %v", err)
		}
		for _, tr := range ts {
			tr.Close()
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ---- failure propagation: a rank hears of an abort or a death even when
// it is busy with (or waiting for) another rank, or in no call at all ----

// within waits up to d for the result of a pending call.
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

// wantAbortFrom checks that err is a RemoteAbortError naming rank origin
// with reason.
func wantAbortFrom(t *testing.T, what string, err error, origin int, reason string) {
	t.Helper()
	var rae *transport.RemoteAbortError
	if !errors.Is(err, transport.ErrRemoteAbort) || !errors.As(err, &rae) || rae.Peer != origin || rae.Reason != reason {
		t.Errorf("%s: got %v, want a RemoteAbortError from rank %d with reason %q", what, err, origin, reason)
	}
}

// wantLost checks that err wraps ErrPeerLost for rank origin.
func wantLost(t *testing.T, what string, err error, origin int) {
	t.Helper()
	var ple *transport.PeerLostError
	if !errors.Is(err, transport.ErrPeerLost) || !errors.As(err, &ple) || ple.Peer != origin {
		t.Errorf("%s: got %v, want ErrPeerLost naming rank %d", what, err, origin)
	}
}

// blockOn starts rank 1's call that waits on rank 2: a Send too large for
// the socket buffers (rank 2 never reads) or a Recv (rank 2 never sends).
func blockOn(ctx context.Context, tr1 *Transport, op string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		if op == "send" {
			big := make([]byte, 32<<20)
			ch <- tr1.Send(ctx, 2, hdr(0, len(big)), big)
		} else {
			ch <- tr1.Recv(ctx, 2, hdr(0, 8), make([]byte, 8))
		}
	}()
	return ch
}

// idleCall is rank 2's next call after the failure: one that would succeed
// (a small Send lands in the socket buffer) if rank 2 had not heard.
func idleCall(ctx context.Context, tr2 *Transport) error {
	return tr2.Send(ctx, 1, hdr(0, 8), make([]byte, 8))
}

func TestAbortReachesEveryRank(t *testing.T) {
	const reason = "rank 0: loss is NaN"
	for _, op := range []string{"send", "recv"} {
		t.Run(op, func(t *testing.T) {
			ts := newMesh(t, 3, nil, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pending := blockOn(ctx, ts[1], op)
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			ts[0].Abort(errors.New(reason))
			err := within(t, pending, time.Second, "rank 1's call blocked on rank 2")
			t.Logf("rank 1 failed after %v: %v", time.Since(start), err)
			wantAbortFrom(t, "rank 1", err, 0, reason)
			time.Sleep(time.Until(start.Add(time.Second)))
			wantAbortFrom(t, "rank 2's next call", idleCall(ctx, ts[2]), 0, reason)
			wantAbortFrom(t, "rank 1's next call", ts[1].Recv(ctx, 0, hdr(1, 0), nil), 0, reason)
		})
	}
}

func TestAbortRelayedAlongChain(t *testing.T) {
	// Ranks 0-1 and 1-2 are connected, 0 and 2 are not (they would talk
	// through another transport): rank 2 hears of rank 0's abort from rank
	// 1, which is in no call.
	const reason = "rank 0 gave up"
	ts := newMesh(t, 3, func(r int) []int { return [][]int{{1}, {0, 2}, {1}}[r] }, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pending := make(chan error, 1)
	go func() { pending <- ts[2].Recv(ctx, 1, hdr(0, 8), make([]byte, 8)) }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	ts[0].Abort(errors.New(reason))
	err := within(t, pending, time.Second, "rank 2's Recv from rank 1")
	t.Logf("rank 2 failed after %v: %v", time.Since(start), err)
	wantAbortFrom(t, "rank 2", err, 0, reason)
	wantAbortFrom(t, "rank 1's next call", ts[1].Send(ctx, 2, hdr(0, 0), nil), 0, reason)
}

func TestOrderlyCloseIsNotAFailure(t *testing.T) {
	ts := newMesh(t, 3, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ts[0].Send(ctx, 1, hdr(0, 5), []byte("last!")); err != nil {
		t.Fatal(err)
	}
	ts[0].Close()
	time.Sleep(200 * time.Millisecond) // the watchers look meanwhile
	checkAfterClose(t, ctx, ts[1], ts[2])
}

// checkAfterClose: rank 0 sent "last!" to rank 1 and closed. Rank 1 still
// receives it, then fails to talk to rank 0; ranks 1 and 2 go on.
func checkAfterClose(t *testing.T, ctx context.Context, tr1, tr2 *Transport) {
	t.Helper()
	buf := make([]byte, 5)
	if err := tr1.Recv(ctx, 0, hdr(0, 5), buf); err != nil || string(buf) != "last!" {
		t.Fatalf("message sent before the close: %v %q", err, buf)
	}
	err := tr1.Recv(ctx, 0, hdr(1, 5), buf)
	wantLost(t, "Recv from the closed rank", err, 0)
	if err != nil && !strings.Contains(err.Error(), "closed its communicator") {
		t.Errorf("Recv from the closed rank: %v, want it to say so", err)
	}
	wantLost(t, "Send to the closed rank", tr1.Send(ctx, 0, hdr(1, 1), []byte{1}), 0)
	for i := range 5 {
		var wg sync.WaitGroup
		var e1, e2 error
		b1, b2 := make([]byte, 64<<10), make([]byte, 64<<10)
		wg.Go(func() {
			if e1 = tr1.Send(ctx, 2, hdr(uint64(i), len(b1)), payload(1, 2, len(b1))); e1 == nil {
				e1 = tr1.Recv(ctx, 2, hdr(uint64(i), len(b1)), b1)
			}
		})
		wg.Go(func() {
			if e2 = tr2.Send(ctx, 1, hdr(uint64(i), len(b2)), payload(2, 1, len(b2))); e2 == nil {
				e2 = tr2.Recv(ctx, 1, hdr(uint64(i), len(b2)), b2)
			}
		})
		wg.Wait()
		if e1 != nil || e2 != nil {
			t.Fatalf("round %d between ranks 1 and 2 after rank 0 closed: %v, %v", i, e1, e2)
		}
		if !bytes.Equal(b1, payload(2, 1, len(b1))) || !bytes.Equal(b2, payload(1, 2, len(b2))) {
			t.Fatalf("round %d: wrong content", i)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// ---- the same with rank 0 in a child process ----

const rank0Env = "GOCOLL_TCP_TEST_RANK0" // role of the child: kill, abort or close

// TestRank0Child is the body of the child process that plays rank 0 of
// three; run directly it does nothing.
func TestRank0Child(t *testing.T) {
	role := os.Getenv(rank0Env)
	if role == "" {
		t.Skip("only run as a child process")
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	ln, err := Listen("127.0.0.1")
	if err != nil {
		fail(err)
	}
	fmt.Println("addr", ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := New(ctx, Config{Rank: 0, Size: 3, Listener: ln, Peers: []int{1, 2}, Secret: testSecret, Tag: testTag})
	if err != nil {
		fail(err)
	}
	in := bufio.NewScanner(os.Stdin)
	switch role {
	case "kill":
		fmt.Println("ready")
		in.Scan() // until killed, or the parent goes away
	case "abort":
		fmt.Println("ready")
		if in.Scan() {
			tr.Abort(errors.New(in.Text()))
			fmt.Println("aborted")
		}
		in.Scan()
	case "close":
		if err := tr.Send(ctx, 1, hdr(0, 5), []byte("last!")); err != nil {
			fail(err)
		}
		tr.Close()
		fmt.Println("closed") // and exit at once
	}
	os.Exit(0)
}

// rank0Child starts rank 0 in a child process and connects ranks 1 and 2
// here.
func rank0Child(t *testing.T, role string) (*exec.Cmd, io.Writer, *bufio.Reader, []*Transport) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRank0Child$", "-test.count=1")
	cmd.Env = append(os.Environ(), rank0Env+"="+role)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := bufio.NewReader(out)
	line, _ := lines.ReadString('\n')
	addr0, ok := strings.CutPrefix(strings.TrimSpace(line), "addr ")
	if !ok {
		t.Fatalf("child said %q", line)
	}
	lns, addrs := listeners(t, 3)
	lns[0].Close()
	lns[1].Close() // rank 1 only dials (rank 2 dials rank 1 on a listener of its own below)
	ln1, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addrs[0], addrs[1] = addr0, ln1.Addr().String()
	lsn := []net.Listener{nil, ln1, lns[2]}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]*Transport, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := 1; r <= 2; r++ {
		wg.Go(func() {
			ts[r], errs[r] = New(ctx, Config{Rank: r, Size: 3, Listener: lsn[r], Addrs: addrs, Peers: []int{0, 1, 2}, Secret: testSecret, Tag: testTag})
		})
	}
	wg.Wait()
	for r := 1; r <= 2; r++ {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		t.Cleanup(func() { ts[r].Close() })
	}
	return cmd, stdin, lines, ts
}

func expectLine(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	if line, _ := r.ReadString('\n'); strings.TrimSpace(line) != want {
		t.Fatalf("child said %q, want %q", line, want)
	}
}

func TestAbortReachesEveryRankAcrossProcesses(t *testing.T) {
	const reason = "rank 0 ran out of disk"
	for _, op := range []string{"send", "recv"} {
		t.Run(op, func(t *testing.T) {
			_, stdin, lines, ts := rank0Child(t, "abort")
			expectLine(t, lines, "ready")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pending := blockOn(ctx, ts[1], op)
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			fmt.Fprintln(stdin, reason)
			err := within(t, pending, 1500*time.Millisecond, "rank 1's call blocked on rank 2")
			t.Logf("rank 1 failed %v after the parent asked for the abort: %v", time.Since(start), err)
			wantAbortFrom(t, "rank 1", err, 0, reason)
			expectLine(t, lines, "aborted")
			time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
			wantAbortFrom(t, "rank 2's next call", idleCall(ctx, ts[2]), 0, reason)
		})
	}
}

func TestKilledRankReachesEveryRank(t *testing.T) {
	for _, op := range []string{"send", "recv"} {
		t.Run(op, func(t *testing.T) {
			cmd, _, lines, ts := rank0Child(t, "kill")
			expectLine(t, lines, "ready")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pending := blockOn(ctx, ts[1], op)
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			err := within(t, pending, 2*time.Second, "rank 1's call blocked on rank 2")
			t.Logf("rank 1 failed %v after SIGKILL: %v", time.Since(start), err)
			wantLost(t, "rank 1", err, 0)
			time.Sleep(time.Until(start.Add(time.Second)))
			wantLost(t, "rank 2's next call", idleCall(ctx, ts[2]), 0)
		})
	}
}

func TestOrderlyCloseAcrossProcesses(t *testing.T) {
	// Rank 0 sends, closes and exits before rank 1 reads.
	cmd, _, lines, ts := rank0Child(t, "close")
	expectLine(t, lines, "closed")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	checkAfterClose(t, ctx, ts[1], ts[2])
}

func TestSendToAbortingRank(t *testing.T) {
	// Rank 1 is blocked sending to rank 0, which never reads and aborts:
	// closing a socket with unread data resets the connection, yet rank 1
	// reports the abort message rank 0 sent before, not a lost peer.
	ts := newMesh(t, 3, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := make(chan error, 1)
	go func() {
		big := make([]byte, 32<<20)
		ch <- ts[1].Send(ctx, 0, hdr(0, len(big)), big)
	}()
	time.Sleep(100 * time.Millisecond)
	ts[0].Abort(errors.New("why"))
	wantAbortFrom(t, "rank 1", within(t, ch, time.Second, "rank 1's Send"), 0, "why")
	time.Sleep(300 * time.Millisecond)
	wantAbortFrom(t, "rank 2's next call", idleCall(ctx, ts[2]), 0, "why")
}

// RecvVar takes messages whose step and length only their headers say,
// in the order sent; a different sequence is still a mismatch, and a
// length the caller refuses fails the stream.
func TestRecvVar(t *testing.T) {
	ts := newMesh(t, 2, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, n := range []int{0, 3, 70000} {
		h := hdr(1, n)
		h.Step = uint32(10 + i)
		if err := ts[0].Send(ctx, 1, h, payload(0, 1, n)); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range []int{0, 3, 70000} {
		got, buf, err := ts[1].RecvVar(ctx, 0, hdr(1, 0), func(k int) ([]byte, error) { return make([]byte, k), nil })
		if err != nil {
			t.Fatal(err)
		}
		if got.Step != uint32(10+i) || got.Len != uint64(n) || !bytes.Equal(buf, payload(0, 1, n)) {
			t.Fatalf("message %d: step %d, %d bytes; want step %d, %d bytes", i, got.Step, len(buf), 10+i, n)
		}
	}
	if err := ts[0].Send(ctx, 1, hdr(2, 4), make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ts[1].RecvVar(ctx, 0, hdr(3, 0), func(k int) ([]byte, error) { return make([]byte, k), nil }); !errors.Is(err, transport.ErrMismatch) || !strings.Contains(err.Error(), "sequence") {
		t.Fatalf("got %v, want a sequence mismatch", err)
	}
	refused := errors.New("too long")
	if err := ts[1].Send(ctx, 0, hdr(4, 8), make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ts[0].RecvVar(ctx, 1, hdr(4, 0), func(int) ([]byte, error) { return nil, refused }); !errors.Is(err, refused) {
		t.Fatalf("got %v, want the allocator's error", err)
	}
	if err := ts[0].Recv(ctx, 1, hdr(4, 8), make([]byte, 8)); !errors.Is(err, refused) {
		t.Fatalf("after a refused message: %v, want the same error", err)
	}
}
