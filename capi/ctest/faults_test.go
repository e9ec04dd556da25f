package ctest

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

// startFaults starts n ranks of the faults program in mode, joined through
// torchrun-style variables.
func startFaults(t *testing.T, ctx context.Context, n int, mode string, extra ...string) []*harness.Proc {
	t.Helper()
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	procs := make([]*harness.Proc, n)
	for r := range procs {
		env := harness.Env(append(harness.TorchrunEnv(r, n, port), extra...)...)
		if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["faults"], mode); err != nil {
			t.Fatal(err)
		}
	}
	return procs
}

// TestKilledRank SIGKILLs one of 4 ranks in the middle of a loop of
// allreduces: the others must fail with gocollRemoteError (or, at worst,
// gocollTimeout) well before the test's deadline, and clean up.
func TestKilledRank(t *testing.T) {
	const victim = 2
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	procs := startFaults(t, ctx, 4, "kill", "GOCOLL_TIMEOUT=20s")
	if _, err := procs[victim].WaitLine(ctx, "READY"); err != nil {
		cancel()
		harness.WaitAll(t, procs)
		t.Fatal(err)
	}
	killed := time.Now()
	if err := procs[victim].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var failed bool
	for r, p := range procs {
		err := p.Wait()
		if r == victim {
			continue
		}
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
			failed = true
		}
		if !strings.Contains(p.Stdout(), "DESTROYED") {
			t.Errorf("rank %d did not clean up", r)
			failed = true
		}
	}
	t.Logf("survivors finished %v after the kill", time.Since(killed).Round(time.Millisecond))
	if failed || testing.Verbose() {
		for _, p := range procs {
			t.Log(p.Output())
		}
	}
}

// TestAbortUnblocks checks that gocollCommAbort returns a pending
// gocollIAllReduce and a blocked gocollBarrier at once, and that the peer
// then sees gocollRemoteError.
func TestAbortUnblocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	procs := startFaults(t, ctx, 2, "abort", "GOCOLL_TIMEOUT=60s")
	harness.WaitAll(t, procs)
}

// TestMismatch: two ranks call allreduce with different counts; both must
// fail (gocollInvalidUsage where the mismatch is seen) instead of mixing data.
func TestMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	procs := startFaults(t, ctx, 2, "mismatch")
	harness.WaitAll(t, procs)
	invalidUsage := 0
	for _, p := range procs {
		if strings.Contains(p.Stdout(), "allreduce=5") {
			invalidUsage++
		}
	}
	if invalidUsage == 0 {
		t.Errorf("no rank reported gocollInvalidUsage for the mismatch")
	}
}

// TestAllToAllvMismatch: two C processes on one host (so through the
// shared-memory slots) whose alltoallv counts disagree both fail with
// gocollInvalidUsage naming the pair, and neither writes the block from the
// other.
func TestAllToAllvMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	procs := startFaults(t, ctx, 2, "vmismatch")
	harness.WaitAll(t, procs)
	for r, p := range procs {
		out := p.Stdout()
		if !strings.Contains(out, "alltoallv=5 untouched=1") || !strings.Contains(out, "counts differ between ranks: rank 0 sends 8 bytes to rank 1, which expects 4") {
			t.Errorf("rank %d: %s", r, out)
		}
	}
}

// TestRendezvousCodes: a failed setup gives every rank the result code of
// its cause, never gocollInternalError: a rank missing gives gocollTimeout,
// sizes that disagree or a wrong secret gocollInvalidUsage.
func TestRendezvousCodes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ranks  []int // which of 3 ranks run
		extra  func(rank int) []string
		want   int
		within time.Duration
	}{
		{"rank missing", []int{0, 1}, func(int) []string { return nil }, 8, 20 * time.Second},
		{"sizes disagree", []int{0, 1, 2}, func(r int) []string {
			if r == 2 {
				return []string{"WORLD_SIZE=4", "LOCAL_WORLD_SIZE=4"}
			}
			return nil
		}, 5, 20 * time.Second},
		{"wrong secret", []int{0, 1, 2}, func(r int) []string {
			if r == 1 {
				return []string{"GOCOLL_SECRET=not-the-jobs"}
			}
			return []string{"GOCOLL_SECRET=the-jobs"}
		}, 5, 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			port, err := harness.FreePortPair()
			if err != nil {
				t.Fatal(err)
			}
			var procs []*harness.Proc
			for _, r := range tc.ranks {
				env := harness.Env(append(append(harness.TorchrunEnv(r, 3, port), "GOCOLL_TIMEOUT=2s"), tc.extra(r)...)...)
				p, err := harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["faults"], "init")
				if err != nil {
					t.Fatal(err)
				}
				procs = append(procs, p)
			}
			harness.WaitAll(t, procs)
			for i, p := range procs {
				want := fmt.Sprintf("RESULT init=%d ", tc.want)
				if !strings.Contains(p.Stdout(), want) {
					t.Errorf("rank %d: want %q, got:\n%s", tc.ranks[i], want, p.Stdout())
				}
			}
		})
	}
}
