package bootstrap

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
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// TestHostileClients: while a 3-rank job joins, every hostile client of
// hostiletest (garbage, a huge frame after a valid handshake, a silent
// connection, a wrong secret, half a hello, a hang-up after the hello, a
// replayed recording of a valid rank's connection) is refused and closed,
// none delays or disturbs the job, each refusal is counted in the log
// (the first few in full, the rest in one summary), and the root's
// goroutines are gone once it stops. Once the job has joined, nothing
// listens: the same clients are refused by the kernel while the rounds run.
func TestHostileClients(t *testing.T) {
	before := runtime.NumGoroutine()
	logs := &proctest.Buffer{}
	root := startRoot(t, 20*time.Second, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// What an eavesdropper saw of a valid rank's connection (against a
	// decoy root of the same job secret: the bytes are the same).
	decoy, err := StartRoot("127.0.0.1:0", secret, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := hostiletest.Record(ctx, decoy.Addr(), func(addr string) error {
		_, err := Exchange(ctx, addr, secret, 0, 1, blobOf(0, 0))
		return err
	})
	decoy.Close()
	if err != nil {
		t.Fatal(err)
	}
	tg := hostiletest.Target{Addr: root.Addr(), Tag: bootstrapTag, Rank: 1, Replay: recorded,
		Authenticate: func(c net.Conn) error {
			_, err := tcp.ClientHandshake(c, secret, bootstrapTag, 1, time.Now().Add(5*time.Second))
			return err
		}}

	const n = 3
	clients := make([]*Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	join := func(r int) {
		wg.Go(func() {
			var table [][]byte
			clients[r], table, errs[r] = Join(ctx, root.Addr(), secret, r, n, blobOf(r, 0))
			if errs[r] == nil {
				errs[r] = checkTable(table, n, 0)
			}
		})
	}
	join(0)
	join(1)
	// Rank 2 has not come: the root is waiting for the job.
	held := hostiletest.Hold(ctx, tg)
	outcomes := hostiletest.All(ctx, tg)
	join(2)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// The job has joined: the root no longer listens, while the rounds run.
	late := make(chan []hostiletest.Outcome, 1)
	go func() { late <- hostiletest.All(ctx, tg) }()
	for round := 1; round <= 3; round++ {
		for r, c := range clients {
			wg.Go(func() {
				table, err := c.AllGather(ctx, blobOf(r, round))
				if err == nil {
					err = checkTable(table, n, round)
				}
				errs[r] = err
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d, round %d: %v", r, round, err)
			}
		}
	}
	for _, c := range clients {
		c.Close()
	}
	if err := root.Wait(); err != nil {
		t.Errorf("root: %v", err)
	}
	outcomes = append(outcomes, held.Wait()...)
	t.Logf("during the join:\n%s", hostiletest.Summary(outcomes))
	for _, o := range outcomes {
		if o.Accepted || !o.Closed || o.Err != nil {
			t.Errorf("during the join: %v (err %v)", o, o.Err)
		}
	}
	for _, o := range <-late {
		if !o.Refused {
			t.Errorf("after the join: %v (err %v)", o, o.Err)
		}
	}
	checkRefusalLog(t, logs.String(), len(outcomes)-1)
	hostiletest.WaitGoroutines(t, before)
}

// checkRefusalLog checks that the refused connections were all accounted
// for by the root's limiter: at most its burst in full, the rest counted.
// want counts the hostile connections but one silent connection, which
// the root may not have accepted yet when the job joined (the kernel then
// resets it: no handshake, no refusal).
func checkRefusalLog(t *testing.T, out string, want int) {
	t.Helper()
	full, counted := hostiletest.Logged(out, "refused connections to the rendezvous root", "bootstrap: refused connection", "bootstrap: bad join message")
	if full > 5 || full+counted < want || full+counted > want+1 {
		t.Errorf("%d refusals logged in full and %d counted, want at most 5 in full and %d (or one more) in all:\n%s", full, counted, want, out)
	}
}
