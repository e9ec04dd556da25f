package bootstrap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/hostiletest"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

func TestRelayTree(t *testing.T) {
	// Ranks 0-7 are the root's children, 8-71 their children, 72-79 rank
	// 8's: three levels.
	for _, n := range []int{Fanout + 1, 2*Fanout + 1, Fanout*(Fanout+1) + Fanout} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			root := startRoot(t, 10*time.Second, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			const rounds = 3
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Go(func() {
					c, table, err := Join(ctx, root.Addr(), secret, r, n, blobOf(r, 0))
					if err != nil {
						errs[r] = err
						return
					}
					defer c.Close()
					for round := 0; err == nil && round < rounds; round++ {
						if round > 0 {
							table, err = c.AllGather(ctx, blobOf(r, round))
						}
						if err == nil {
							err = checkTable(table, n, round)
						}
					}
					errs[r] = err
				})
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			if err := root.Wait(); err != nil {
				t.Fatalf("root: %v", err)
			}
			// The root wrote each table to its Fanout children only (and
			// the relay addresses once), not to every rank.
			var tables int64
			for round := range rounds {
				size := 4 + 5
				for r := range n {
					size += 4 + len(blobOf(r, round))
				}
				tables += int64(size)
			}
			if sent := root.sent.Load(); sent <= Fanout*tables || sent > Fanout*tables+Fanout*int64(9+n*(4+len("127.0.0.1:65535"))) {
				t.Errorf("the root wrote %d bytes; %d tables through %d relays are %d", sent, rounds, Fanout, Fanout*tables)
			}
		})
	}
}

// joinAll joins n ranks but skip, and returns their clients.
func joinAll(t *testing.T, ctx context.Context, addr string, n int, skip int) ([]*Client, []error) {
	clients := make([]*Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		if r == skip {
			continue
		}
		wg.Go(func() {
			clients[r], _, errs[r] = Join(ctx, addr, secret, r, n, blobOf(r, 0))
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	})
	return clients, errs
}

// TestRelayLeaves: a relay that leaves between rounds (rank 0, parent of
// ranks 8-15) fails the next round on every rank, at once, and the error
// of each of its children names it.
func TestRelayLeaves(t *testing.T) {
	const n = 2*Fanout + 4
	root := startRoot(t, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clients, errs := joinAll(t, ctx, root.Addr(), n, -1)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	clients[0].Close()
	start := time.Now()
	var wg sync.WaitGroup
	for r := 1; r < n; r++ {
		wg.Go(func() { _, errs[r] = clients[r].AllGather(ctx, blobOf(r, 1)) })
	}
	wg.Wait()
	for r := 1; r < n; r++ {
		err := errs[r]
		named := err != nil && (strings.Contains(err.Error(), "relay rank 0 ") || strings.Contains(err.Error(), "ranks [0] have left") || strings.Contains(err.Error(), "rank 0 left"))
		if !errors.Is(err, ErrRankLeft) || !named {
			t.Errorf("rank %d: %v", r, err)
		}
		if r == Fanout {
			t.Logf("rank %d: %v", r, err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

// fakeRelay joins as rank 0 of n over a connection of its own and reads
// the relays frame; link says whether it then dials its children (and
// sends them that frame). It never forwards a table: a relay that stalls.
func fakeRelay(t *testing.T, ctx context.Context, addr string, n int, link bool, before func(addrs []string)) {
	conn, err := dialRoot(ctx, addr, secret, 0)
	if err != nil {
		t.Error(err)
		return
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Time{})
	msg := binary.LittleEndian.AppendUint32([]byte{frameJoin}, uint32(n))
	if err := writeFrame(conn, msg); err != nil {
		t.Error(err)
		return
	}
	f, err := readFrame(conn, maxTable)
	if err != nil {
		t.Error(err)
		return
	}
	addrs, err := decodeRelays(f)
	if err != nil {
		t.Error(err)
		return
	}
	if before != nil {
		before(addrs)
	}
	if !link {
		return
	}
	for _, k := range relayChildren(0, n) {
		c, err := net.Dial("tcp", addrs[k])
		if err == nil {
			_, err = tcp.ClientHandshake(c, secret, bootstrapTag, 0, time.Now().Add(5*time.Second))
		}
		if err == nil {
			err = writeFrame(c, f)
		}
		if err != nil {
			t.Errorf("linking rank %d: %v", k, err)
			return
		}
		t.Cleanup(func() { c.Close() })
	}
}

// TestRelayStalls: a relay that stalls, before or after linking its
// children, holds them only until their own deadline, and their errors
// name it; the other ranks join.
func TestRelayStalls(t *testing.T) {
	for _, link := range []bool{false, true} {
		t.Run(fmt.Sprintf("linked=%v", link), func(t *testing.T) {
			const n = 2*Fanout + 4
			root := startRoot(t, 10*time.Second, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			go fakeRelay(t, ctx, root.Addr(), n, link, nil)
			jctx, jcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
			defer jcancel()
			start := time.Now()
			_, errs := joinAll(t, jctx, root.Addr(), n, 0)
			if d := time.Since(start); d > 4*time.Second {
				t.Errorf("took %v", d)
			}
			want := "(or a link from relay rank 0)"
			if link {
				want = "waiting for the table from relay rank 0"
			}
			for r := 1; r < n; r++ {
				err := errs[r]
				switch {
				case r < Fanout || r >= 2*Fanout:
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				case !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(fmt.Sprint(err), want):
					t.Errorf("rank %d: %v, want it to say %q", r, err, want)
				case r == Fanout:
					t.Logf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestHostileRelayClients: while rank 8 waits for its relay parent, the
// hostile clients of hostiletest (claiming to be the parent) are refused
// and closed, and the parent's own link is then taken: rank 8 waits for
// the table on it (which this parent never sends).
func TestHostileRelayClients(t *testing.T) {
	const n = Fanout + 1
	root := startRoot(t, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var outcomes []hostiletest.Outcome
	attacked := make(chan struct{})
	go fakeRelay(t, ctx, root.Addr(), n, true, func(addrs []string) {
		tg := hostiletest.Target{Addr: addrs[Fanout], Tag: bootstrapTag, Rank: 0}
		held := hostiletest.Hold(ctx, tg)
		go func() {
			defer close(attacked)
			outcomes = append(hostiletest.All(ctx, tg), held.Wait()...)
		}()
		// The parent links while the silent client still holds its
		// connection (closed once the parent has linked).
		time.Sleep(300 * time.Millisecond)
	})
	jctx, jcancel := context.WithTimeout(ctx, 3*time.Second)
	defer jcancel()
	_, errs := joinAll(t, jctx, root.Addr(), n, 0)
	<-attacked
	for r, err := range errs[1:Fanout] {
		if err != nil {
			t.Errorf("rank %d: %v", r+1, err)
		}
	}
	if err := errs[Fanout]; !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for the table from relay rank 0") {
		t.Errorf("rank %d: %v", Fanout, err)
	}
	t.Logf("at the relay listener:\n%s", hostiletest.Summary(outcomes))
	if len(outcomes) == 0 {
		t.Error("no hostile client ran")
	}
	for _, o := range outcomes {
		if o.Accepted || !o.Closed || o.Err != nil {
			t.Errorf("%v (err %v)", o, o.Err)
		}
	}
}
