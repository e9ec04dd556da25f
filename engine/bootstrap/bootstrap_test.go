package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

var secret = []byte("job secret")

func startRoot(t *testing.T, timeout time.Duration, logger *slog.Logger) *Root {
	t.Helper()
	r, err := StartRoot("127.0.0.1:0", secret, timeout, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func blobOf(rank, round int) []byte {
	return []byte(fmt.Sprintf("rank %d round %d %s", rank, round, strings.Repeat("x", rank*10)))
}

func checkTable(table [][]byte, n, round int) error {
	if len(table) != n {
		return fmt.Errorf("%d entries for %d ranks", len(table), n)
	}
	for i, b := range table {
		if !bytes.Equal(b, blobOf(i, round)) {
			return fmt.Errorf("entry %d: %q", i, b)
		}
	}
	return nil
}

func TestExchangeAndRounds(t *testing.T) {
	for n := 1; n <= 9; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			root := startRoot(t, 10*time.Second, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errc := make(chan error, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Go(func() {
					c, table, err := Join(ctx, root.Addr(), secret, r, n, blobOf(r, 0))
					if err != nil {
						errc <- err
						return
					}
					defer c.Close()
					if err := checkTable(table, n, 0); err != nil {
						errc <- fmt.Errorf("rank %d join: %v", r, err)
						return
					}
					for round := 1; round <= 2; round++ {
						table, err := c.AllGather(ctx, blobOf(r, round))
						if err == nil {
							err = checkTable(table, n, round)
						}
						if err != nil {
							errc <- fmt.Errorf("rank %d round %d: %v", r, round, err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
			select {
			case <-root.Done():
				if err := root.Wait(); err != nil {
					t.Errorf("root: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("root did not stop after every rank left")
			}
		})
	}
}

func TestExchangeOneShotAndLateRoot(t *testing.T) {
	// The ranks start dialling before the root listens.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 3
	tables := make([][][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { tables[r], errs[r] = Exchange(ctx, addr, secret, r, n, blobOf(r, 0)) })
	}
	time.Sleep(200 * time.Millisecond)
	root, err := StartRoot(addr, secret, 10*time.Second, nil)
	if err != nil {
		t.Skipf("port taken meanwhile: %v", err)
	}
	defer root.Close()
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if err := checkTable(tables[r], n, 0); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if err := root.Wait(); err != nil {
		t.Errorf("root: %v", err)
	}
}

func TestWrongSecretRefused(t *testing.T) {
	logs := &proctest.Buffer{}
	root := startRoot(t, 10*time.Second, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 3
	// The intruder tries first, while the root waits for the job.
	start := time.Now()
	_, err := Exchange(ctx, root.Addr(), []byte("guessed"), 1, n, []byte("evil"))
	if !errors.Is(err, tcp.ErrAuth) || !strings.Contains(err.Error(), root.Addr()) {
		t.Errorf("wrong secret: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("refusal took %v", d)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			var table [][]byte
			table, errs[r] = Exchange(ctx, root.Addr(), secret, r, n, blobOf(r, 0))
			if errs[r] == nil {
				errs[r] = checkTable(table, n, 0)
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	root.Wait() // every goroutine of the root has finished
	if out := logs.String(); !strings.Contains(out, "refused connection") || !strings.Contains(out, "remote=127.0.0.1:") {
		t.Errorf("no warning for the refused client:\n%s", out)
	}
}

func TestRootTimeoutNamesMissingRanks(t *testing.T) {
	root := startRoot(t, 300*time.Millisecond, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, r := range []int{0, 2} {
		wg.Go(func() { _, errs[r] = Exchange(ctx, root.Addr(), secret, r, n, nil) })
	}
	wg.Wait()
	for _, r := range []int{0, 2} {
		if !errors.Is(errs[r], ErrRendezvous) || !strings.Contains(errs[r].Error(), "ranks [1 3] never joined") {
			t.Errorf("rank %d: %v", r, errs[r])
		}
	}
	if err := root.Wait(); !errors.Is(err, ErrRendezvous) {
		t.Errorf("root: %v", err)
	}
}

func TestSizeDisagreement(t *testing.T) {
	root := startRoot(t, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := Exchange(ctx, root.Addr(), secret, 0, 3, nil); errc <- err }()
	// Rank 0 may or may not have arrived first; either way both hear of it
	// once both are there.
	_, err1 := Exchange(ctx, root.Addr(), secret, 1, 4, nil)
	err0 := <-errc
	for _, err := range []error{err0, err1} {
		if !errors.Is(err, ErrRendezvous) || !strings.Contains(err.Error(), "disagree on the job size") {
			t.Errorf("got %v", err)
		}
	}
}

func TestDuplicateRank(t *testing.T) {
	root := startRoot(t, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			table, err := Exchange(ctx, root.Addr(), secret, 0, 2, blobOf(0, 0))
			if err == nil {
				err = checkTable(table, 2, 0)
			}
			errc <- err
		}()
	}
	// One of the two rank-0 processes is turned away at once.
	if err := <-errc; !errors.Is(err, ErrRendezvous) || !strings.Contains(err.Error(), "rank 0 already joined") {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := Exchange(ctx, root.Addr(), secret, 1, 2, blobOf(1, 0)); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("first rank 0: %v", err)
	}
}

func TestNoRoot(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = Exchange(ctx, addr, secret, 1, 2, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no root answered at "+addr+" after") {
		t.Fatalf("got %v", err)
	}
	t.Log(err)
}

func TestRankLeavesDuringRound(t *testing.T) {
	root := startRoot(t, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 3
	clients := make([]*Client, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			c, _, err := Join(ctx, root.Addr(), secret, r, n, nil)
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
	errc := make(chan error, 1)
	go func() { _, err := clients[0].AllGather(ctx, []byte("a")); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	clients[2].Close()
	if err := <-errc; !errors.Is(err, ErrRendezvous) || !strings.Contains(err.Error(), "rank 2 left") {
		t.Errorf("rank 0: %v", err)
	}
	clients[1].Close()
	clients[0].Close()
	if err := root.Wait(); !errors.Is(err, ErrRendezvous) {
		t.Errorf("root: %v", err)
	}
}

func TestRoundTimeout(t *testing.T) {
	root := startRoot(t, 300*time.Millisecond, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clients := make([]*Client, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			c, _, err := Join(ctx, root.Addr(), secret, r, 2, nil)
			if err != nil {
				t.Error(err)
				return
			}
			clients[r] = c
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	defer clients[0].Close()
	defer clients[1].Close()
	// Only rank 1 takes part in round 1, long after the join (the timer
	// counts from the round's first arrival, not from the join).
	time.Sleep(400 * time.Millisecond)
	_, err := clients[1].AllGather(ctx, nil)
	if !errors.Is(err, ErrRendezvous) || !strings.Contains(err.Error(), "round 1: ranks [0] did not take part") {
		t.Errorf("got %v", err)
	}
	// The client is unusable afterwards.
	if _, err2 := clients[1].AllGather(ctx, nil); err2 == nil {
		t.Error("AllGather after a failed round succeeded")
	}
}

func TestJoinContextCancel(t *testing.T) {
	root := startRoot(t, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	// Rank 1 of 2 never arrives: the join waits for the root until ctx ends.
	_, err := Exchange(ctx, root.Addr(), secret, 0, 2, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestFormatRanks(t *testing.T) {
	for want, in := range map[string][]int{
		"[]":           nil,
		"[3]":          {3},
		"[1 3]":        {3, 1},
		"[0 1]":        {0, 1},
		"[0 2 5-9 11]": {11, 5, 6, 7, 8, 9, 0, 2},
	} {
		if got := formatRanks(in); got != want {
			t.Errorf("formatRanks(%v) = %s, want %s", in, got, want)
		}
	}
}

// TestRefusalsThrottled: a burst of wrong-secret connections yields the
// first few WARN lines in full and one summary with the count of the rest,
// not one line each.
func TestRefusalsThrottled(t *testing.T) {
	logs := &proctest.Buffer{}
	root := startRoot(t, 10*time.Second, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const intruders = 40
	var wg sync.WaitGroup
	for i := range intruders {
		wg.Go(func() {
			if _, err := Exchange(ctx, root.Addr(), []byte("guessed"), i%2, 2, nil); !errors.Is(err, tcp.ErrAuth) {
				t.Errorf("intruder %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	root.Close() // waits for every handler, then logs the summary
	out := logs.String()
	if n := strings.Count(out, "msg=\"bootstrap: refused connection\""); n != 5 {
		t.Errorf("%d refusals logged in full, want 5:\n%s", n, out)
	}
	if !strings.Contains(out, fmt.Sprintf("count=%d", intruders-5)) {
		t.Errorf("no summary counting %d more refusals:\n%s", intruders-5, out)
	}
}
