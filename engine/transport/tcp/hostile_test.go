package tcp

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/hostiletest"
	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

// TestHostileClients: while a 3-rank mesh sets up, every hostile client of
// hostiletest (garbage, a huge length field, silent connections held across
// the end of setup, a wrong secret, half a hello, a hang-up after the
// hello, a replayed recording of a valid rank's handshake) and a flood of
// garbage connections hit the listeners of ranks 0 and 1. Nobody is let in,
// the mesh forms and carries data correctly, every connection is closed by
// the end of setup, refusals are logged (the first few in full, the rest
// counted), and nothing listens or runs afterwards.
func TestHostileClients(t *testing.T) {
	before := runtime.NumGoroutine()
	const n, flood = 3, 60
	lns, addrs := listeners(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// What an eavesdropper saw of rank 2's handshake with a rank of this
	// job (a decoy holding the same secret and tag).
	decoy, err := Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := decoy.Accept()
		if err == nil {
			ServerHandshake(c, testSecret, testTag, 0, time.Now().Add(5*time.Second), nil)
			c.Close()
		}
	}()
	recorded, err := hostiletest.Record(ctx, decoy.Addr().String(), func(addr string) error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = ClientHandshake(c, testSecret, testTag, 2, time.Now().Add(5*time.Second))
		return err
	})
	decoy.Close()
	if err != nil {
		t.Fatal(err)
	}

	logs := make([]*proctest.Buffer, n)
	ts := make([]*Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := func(r int) {
		logs[r] = &proctest.Buffer{}
		logger := slog.New(slog.NewTextHandler(logs[r], &slog.HandlerOptions{Level: slog.LevelWarn}))
		wg.Go(func() {
			ts[r], errs[r] = New(ctx, Config{Rank: r, Size: n, Listener: lns[r], Addrs: addrs, Peers: transporttest.AllRanks(n), Secret: testSecret, Tag: testTag, Logger: logger})
		})
	}
	start(0)
	start(1)
	// Rank 2 has not come: ranks 0 and 1 wait for it on their listeners.
	targets := []hostiletest.Target{
		{Addr: addrs[0], Tag: testTag, Rank: 2, Replay: recorded},
		{Addr: addrs[1], Tag: testTag, Rank: 2, Replay: recorded},
	}
	held := hostiletest.Hold(ctx, targets...)
	outcomes := hostiletest.All(ctx, targets...)
	flooded := hostiletest.Flood(ctx, targets[0], flood)
	start(2)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer ts[r].Close()
	}
	outcomes = append(outcomes, held.Wait()...)
	t.Logf("during setup:\n%s", hostiletest.Summary(append(outcomes, flooded...)))
	refused := map[string]int{}
	for _, o := range append(outcomes, flooded...) {
		if o.Accepted || !o.Closed || o.Err != nil {
			t.Errorf("%v (err %v)", o, o.Err)
		}
		refused[o.Target.Addr]++
	}
	// Every peer's data arrives intact.
	for from := range n {
		for to := range n {
			if from == to {
				continue
			}
			data := transporttest.Payload(from, to, 0, 1000+from)
			wg.Go(func() {
				if err := ts[from].Send(ctx, to, transporttest.Hdr(1, len(data)), data); err != nil {
					t.Errorf("send %d→%d: %v", from, to, err)
				}
			})
			got := make([]byte, len(data))
			if err := ts[to].Recv(ctx, from, transporttest.Hdr(1, len(got)), got); err != nil || string(got) != string(data) {
				t.Errorf("recv %d→%d: %v", from, to, err)
			}
		}
	}
	wg.Wait()
	// Setup is over: nobody listens any more.
	for _, o := range hostiletest.All(ctx, targets...) {
		if !o.Refused {
			t.Errorf("after setup: %v (err %v)", o, o.Err)
		}
	}
	// A silent connection cut by the end of setup is no refusal: its
	// handshake never started. Every other one is accounted for.
	for r, addr := range addrs[:2] {
		full, counted := hostiletest.Logged(logs[r].String(), "refused connections", "tcp: refused connection")
		if want := refused[addr] - 1; full > 5 || full+counted != want {
			t.Errorf("rank %d: %d refusals logged in full and %d counted, want at most 5 in full and %d in all:\n%s", r, full, counted, want, logs[r].String())
		}
	}
	for _, tr := range ts {
		tr.Close()
	}
	hostiletest.WaitGoroutines(t, before)
}
