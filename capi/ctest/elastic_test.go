package ctest

import (
	"context"
	"fmt"
	"os"
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
			procs := make([]*harness.Proc, 4)
			for r := range procs {
				env := harness.Env(append(harness.TorchrunEnv(r, 4, port), common...)...)
				if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["elastic"], "shrink"); err != nil {
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

// TestShrinkAtScale: as many C ranks as a job that outgrows one machine
// (GOCOLL_TEST_SCALE, default 64 and 128; processes over TCP, every rank
// its own on this host's few cores) allreduce, one SIGKILLs itself — a
// middle rank, then rank 0, the coordinator — and every survivor must
// land in one communicator of n-1 with right sums: no healthy rank
// excluded by load, and no split into several communicators.
func TestShrinkAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("many processes")
	}
	cases := []struct{ n, victim int }{{128, 64}, {64, 0}}
	if v := os.Getenv("GOCOLL_TEST_SCALE"); v != "" {
		cases = nil
		for _, f := range strings.Split(v, ",") {
			var n, victim int
			if _, err := fmt.Sscanf(f, "%d:%d", &n, &victim); err != nil {
				t.Fatalf("GOCOLL_TEST_SCALE=%q: want n:victim,...", v)
			}
			cases = append(cases, struct{ n, victim int }{n, victim})
		}
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("n=%d/victim=%d", c.n, c.victim), func(t *testing.T) {
			shrinkAtScale(t, c.n, c.victim)
		})
	}
}

func shrinkAtScale(t *testing.T, n, victim int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	common := []string{"GOCOLL_TIMEOUT=60s", "GOCOLL_SECRET=ctest-scale", "GOCOLL_TRANSPORT=tcp",
		fmt.Sprintf("GOCOLL_TEST_VICTIM=%d", victim)}
	procs := make([]*harness.Proc, n)
	for r := range procs {
		env := harness.Env(append(harness.TorchrunEnv(r, n, port), common...)...)
		if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["elastic"], "scale"); err != nil {
			cancel()
			harness.WaitAll(t, procs[:r])
			t.Fatal(err)
		}
	}
	start := time.Now()
	var bad []string
	slowest := 0.0
	for r, p := range procs {
		err := p.Wait()
		if r == victim {
			continue
		}
		out := p.Stdout()
		var size, rank int
		var ms float64
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "SHRUNK ") {
				fmt.Sscanf(l, "SHRUNK size=%d rank=%d ms=%g", &size, &rank, &ms)
			}
		}
		slowest = max(slowest, ms)
		if err != nil || size != n-1 || !strings.Contains(out, "SUMS OK") {
			bad = append(bad, fmt.Sprintf("rank %d: %v, shrunk to size %d:\n%s", r, err, size, lastLines(p.Output(), 8)))
		}
	}
	t.Logf("%d ranks, rank %d killed: the job took %v, the slowest shrink %.0f ms", n, victim, time.Since(start).Round(time.Millisecond), slowest)
	if len(bad) > 0 {
		t.Errorf("%d of %d survivors not in one communicator of %d with right sums; first ones:\n%s", len(bad), n-1, n-1, strings.Join(bad[:min(len(bad), 5)], "\n"))
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
