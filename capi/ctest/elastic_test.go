package ctest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

// TestShrinkAfterKill: 4 C ranks allreduce, one is SIGKILLed; the
// survivors gocollCommShrink(comm, NULL, 0, &newcomm, NULL,
// GOCOLL_SHRINK_ABORT) to 3 ranks with correct sums, then admit a
// replacement process (gocollCommJoin / gocollCommGrow) and allreduce
// correctly as 4 again (elastic.c). Over shared memory and TCP.
func TestShrinkAfterKill(t *testing.T) {
	for _, tr := range []string{"auto", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			const victim = 1
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			port, err := harness.FreePortPair()
			if err != nil {
				t.Fatal(err)
			}
			joinfile := filepath.Join(t.TempDir(), "join")
			common := []string{"GOCOLL_TIMEOUT=10s", "GOCOLL_SECRET=ctest-elastic", "GOCOLL_TRANSPORT=" + tr,
				"GOCOLL_TEST_JOINFILE=" + joinfile, fmt.Sprintf("GOCOLL_TEST_VICTIM=%d", victim)}
			procs := startReady(ctx, cancel, t, 4, port, common, "shrink")
			if err := procs[victim].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			joiner, err := harness.Start(ctx, "joiner", harness.Env(common...), nil, bin["elastic"], "join")
			if err != nil {
				t.Fatal(err)
			}
			all := append(procs, joiner)
			failed := false
			for r, p := range all {
				err := p.Wait()
				if r == victim {
					continue
				}
				if err != nil || !strings.Contains(p.Stdout(), "SUMS OK") {
					t.Errorf("%s: %v", []string{"rank 0", "rank 1", "rank 2", "rank 3", "joiner"}[r], err)
					failed = true
				}
			}
			for r, p := range all {
				if failed || testing.Verbose() {
					t.Logf("%d:\n%s", r, p.Output())
				}
			}
		})
	}
}

// TestVCommRecoverAfterKill: 8 virtual devices over 4 C ranks train a
// shared vector; one rank is SIGKILLed after step 10, the others shrink,
// are refused a recovery onto fewer than minRanks, gocollVCommRecover and
// finish: their final bytes equal a 2-rank uninterrupted run's.
func TestVCommRecoverAfterKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	run := func(n, victim int) []*harness.Proc {
		port, err := harness.FreePortPair()
		if err != nil {
			t.Fatal(err)
		}
		common := []string{"GOCOLL_TIMEOUT=10s"}
		if victim >= 0 {
			common = append(common, fmt.Sprintf("GOCOLL_TEST_VICTIM=%d", victim))
		}
		procs := make([]*harness.Proc, n)
		for r := range procs {
			env := harness.Env(append(harness.TorchrunEnv(r, n, port), common...)...)
			if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["elastic"], "vrecover"); err != nil {
				t.Fatal(err)
			}
		}
		if victim >= 0 {
			if _, err := procs[victim].WaitLine(ctx, "READY"); err != nil {
				t.Fatal(err)
			}
			if err := procs[victim].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		for r, p := range procs {
			if err := p.Wait(); err != nil && r != victim {
				t.Fatalf("rank %d: %v\n%s", r, err, p.Output())
			}
		}
		return procs
	}
	final := func(p *harness.Proc) string {
		for _, l := range strings.Split(p.Stdout(), "\n") {
			if strings.HasPrefix(l, "W ") {
				return l
			}
		}
		return ""
	}
	want := final(run(2, -1)[0])
	if want == "" {
		t.Fatal("the uninterrupted run printed no checksum")
	}
	for r, p := range run(4, 2) {
		if r == 2 {
			continue
		}
		if got := final(p); got != want || !strings.Contains(p.Stdout(), "RECOVERED size=3") {
			t.Errorf("rank %d: %q, want %q\n%s", r, got, want, p.Output())
		}
	}
}

// TestShrinkNoQuorum: 4 C ranks under GOCOLL_SHRINK_QUORUM=majority, two
// SIGKILLed: the two left get gocollNoQuorum from gocollCommShrink, a code
// of its own (before, gocollRemoteError, which callers retry as a peer
// failure), and *newcomm stays untouched.
func TestShrinkNoQuorum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	procs := startReady(ctx, cancel, t, 4, port, []string{"GOCOLL_TIMEOUT=10s", "GOCOLL_SHRINK_QUORUM=majority"}, "noquorum")
	for _, victim := range []int{1, 2} {
		if err := procs[victim].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for r, p := range procs {
		err := p.Wait()
		if r == 1 || r == 2 {
			continue
		}
		if err != nil || !strings.Contains(p.Stdout(), "NOQUORUM") {
			t.Errorf("rank %d: %v\n%s", r, err, p.Output())
		}
	}
}

// startReady starts n ranks of elastic.c's mode with the common
// variables and waits until each printed READY.
func startReady(ctx context.Context, cancel func(), t *testing.T, n, port int, common []string, mode string) []*harness.Proc {
	t.Helper()
	procs := make([]*harness.Proc, n)
	for r := range procs {
		env := harness.Env(append(harness.TorchrunEnv(r, n, port), common...)...)
		var err error
		if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["elastic"], mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range procs {
		if _, err := p.WaitLine(ctx, "READY"); err != nil {
			cancel()
			harness.WaitAll(t, procs)
			t.Fatal(err)
		}
	}
	return procs
}
