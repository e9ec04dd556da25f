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
	"github.com/gocoll/gocoll/engine/hostiletest"
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

// TestShrinkNoQuorum: 4 C ranks under the majority quorum (the default),
// two stopped (SIGSTOP: silent, as the far side of a partition, not dead):
// the two left get gocollNoQuorum from gocollCommShrink, a code of its own
// (before, gocollRemoteError, which callers retry as a peer failure), and
// *newcomm stays untouched. (Two killed would be dead, not counted: the
// two left would go on, TestShrinkAtScale's case.)
func TestShrinkNoQuorum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	procs := startReady(ctx, cancel, t, 4, port, []string{"GOCOLL_TIMEOUT=3s"}, "noquorum")
	for _, victim := range []int{1, 2} {
		if err := procs[victim].Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []int{0, 3} {
		if err := procs[r].Wait(); err != nil || !strings.Contains(procs[r].Stdout(), "NOQUORUM") {
			t.Errorf("rank %d: %v\n%s", r, err, procs[r].Output())
		}
	}
	for _, victim := range []int{1, 2} {
		procs[victim].Cmd.Process.Signal(syscall.SIGKILL)
		procs[victim].Wait()
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
	start := time.Now()
	procs := startScale(t, ctx, n, victim, "GOCOLL_TIMEOUT=60s")
	ends := scaleEnds(procs)
	t.Logf("%d ranks, rank %d killed: the job took %v, the slowest shrink %.0f ms", n, victim, time.Since(start).Round(time.Millisecond), slowestShrink(ends))
	checkOneView(t, procs, ends, map[int]bool{victim: true}, nil, n-1)
}

// scaleEnd is how a rank of elastic.c's scale mode ended.
type scaleEnd struct {
	err  error
	size int     // the shrunk communicator's, 0 if none
	ms   float64 // how long its shrink took
	out  bool    // it printed OUT: the shrink left it out
	sums bool    // SUMS OK on the shrunk communicator
}

// startScale starts n ranks of elastic.c's scale mode over TCP, rank
// victim (-1: none) killing itself at its fifth call, and waits until
// every rank is READY.
func startScale(t *testing.T, ctx context.Context, n, victim int, env ...string) []*harness.Proc {
	t.Helper()
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	common := append([]string{"GOCOLL_SECRET=ctest-scale", "GOCOLL_TRANSPORT=tcp", fmt.Sprintf("GOCOLL_TEST_VICTIM=%d", victim)}, env...)
	procs := make([]*harness.Proc, n)
	for r := range procs {
		e := harness.Env(append(harness.TorchrunEnv(r, n, port), common...)...)
		if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), e, nil, bin["elastic"], "scale"); err != nil {
			harness.WaitAll(t, procs[:r])
			t.Fatal(err)
		}
	}
	for r, p := range procs {
		if _, err := p.WaitLine(ctx, "READY"); err != nil && r != victim {
			harness.WaitAll(t, procs)
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return procs
}

// scaleEnds waits for every rank and reads how it ended.
func scaleEnds(procs []*harness.Proc) []scaleEnd {
	ends := make([]scaleEnd, len(procs))
	for r, p := range procs {
		e := &ends[r]
		e.err = p.Wait()
		out := p.Stdout()
		for _, l := range strings.Split(out, "\n") {
			var rank int
			switch {
			case strings.HasPrefix(l, "SHRUNK "):
				fmt.Sscanf(l, "SHRUNK size=%d rank=%d ms=%g", &e.size, &rank, &e.ms)
			case strings.HasPrefix(l, "OUT "):
				e.out = true
			}
		}
		e.sums = strings.Contains(out, "SUMS OK")
	}
	return ends
}

func slowestShrink(ends []scaleEnd) float64 {
	slowest := 0.0
	for _, e := range ends {
		slowest = max(slowest, e.ms)
	}
	return slowest
}

// checkOneView: every rank but the dead ones and those that may be left
// out (mayOut: not required to be) ended in one communicator of size
// ranks with right sums; a rank left out exited cleanly.
func checkOneView(t *testing.T, procs []*harness.Proc, ends []scaleEnd, dead, mayOut map[int]bool, size int) {
	t.Helper()
	var bad []string
	in := 0
	for r, e := range ends {
		switch {
		case dead[r]:
		case e.out && mayOut[r] && e.err == nil:
		case e.err != nil || e.size != size || !e.sums:
			bad = append(bad, fmt.Sprintf("rank %d: %v, shrunk to size %d (out %v, sums %v):\n%s", r, e.err, e.size, e.out, e.sums, lastLines(procs[r].Output(), 12)))
		default:
			in++
		}
	}
	if in != size {
		bad = append(bad, fmt.Sprintf("%d ranks in the communicator of %d", in, size))
	}
	if len(bad) > 0 {
		// Who ended where, and the ranks in the smallest group first:
		// those a split or an exclusion left out.
		bySize := map[int][]int{}
		for r, e := range ends {
			if !dead[r] {
				bySize[e.size] = append(bySize[e.size], r)
			}
		}
		var few []int
		for _, rs := range bySize {
			if few == nil || len(rs) < len(few) {
				few = rs
			}
		}
		var first []string
		for _, r := range few[:min(len(few), 3)] {
			first = append(first, fmt.Sprintf("rank %d: %v, size %d:\n%s", r, ends[r].err, ends[r].size, lastLines(procs[r].Output(), 20)))
		}
		t.Errorf("not one communicator of %d with right sums: ranks by the size they ended in %v; %s\n%s", size, bySize,
			strings.Join(first, "\n"), strings.Join(bad[:min(len(bad), 3)], "\n"))
	}
}

// TestShrinkFloodedCoordinator: idle connections flood both listening
// ports of rank 0 (the agreement's coordinator) — 40 at a time, renewed
// as it closes them — when rank 3 of 8 is killed: the 7 others still end
// in one communicator of 7 (a flood once left rank 0 alone in a
// communicator of 1 beside one of 6).
func TestShrinkFloodedCoordinator(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	procs := startScale(t, ctx, 8, -1, "GOCOLL_TIMEOUT=10s")
	ports, err := hostiletest.ListeningPorts(procs[0].Cmd.Process.Pid)
	if err != nil || len(ports) == 0 {
		harness.WaitAll(t, procs)
		t.Fatalf("rank 0's ports: %v %v", ports, err)
	}
	var targets []hostiletest.Target
	for _, ap := range ports {
		for range 40 {
			targets = append(targets, hostiletest.Target{Addr: hostiletest.Dialable(ap), Rank: 1})
		}
	}
	fctx, stop := context.WithCancel(ctx)
	flooding := make(chan struct{})
	go func() {
		defer close(flooding)
		for fctx.Err() == nil {
			hostiletest.Hold(fctx, targets...).Wait()
		}
	}()
	time.Sleep(500 * time.Millisecond) // the flood is up
	procs[3].Cmd.Process.Signal(syscall.SIGKILL)
	ends := scaleEnds(procs)
	stop()
	<-flooding
	checkOneView(t, procs, ends, map[int]bool{3: true}, nil, 7)
}

// TestShrinkPausedCoordinator: rank 5 of 8 is killed while rank 0 (the
// agreement's coordinator) is stopped (SIGSTOP, as a VM pause). Stopped
// for 1.5 timeouts, it resumes within the others' patience with their
// answers queued, and all 7 go on together; stopped for 3, the others go
// on as 6 without it (and keep going) and it learns it was left out.
// Never two communicators (once rank 0 ended alone in one of 1 beside one
// of 6).
func TestShrinkPausedCoordinator(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	const timeout = 2 * time.Second
	for _, c := range []struct {
		pause time.Duration
		size  int
	}{{timeout * 3 / 2, 7}, {3 * timeout, 6}} {
		t.Run(fmt.Sprintf("pause=%v", c.pause), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			procs := startScale(t, ctx, 8, -1, fmt.Sprintf("GOCOLL_TIMEOUT=%dms", timeout.Milliseconds()),
				fmt.Sprintf("GOCOLL_TEST_LINGER_MS=%d", (c.pause+2*timeout).Milliseconds()), fmt.Sprintf("GOCOLL_TEST_EXPECT=%d", c.size))
			procs[0].Cmd.Process.Signal(syscall.SIGSTOP)
			procs[5].Cmd.Process.Signal(syscall.SIGKILL)
			time.Sleep(c.pause)
			procs[0].Cmd.Process.Signal(syscall.SIGCONT)
			ends := scaleEnds(procs)
			mayOut := map[int]bool{}
			if c.size == 6 {
				mayOut[0] = true
			}
			checkOneView(t, procs, ends, map[int]bool{5: true}, mayOut, c.size)
			if c.size == 6 && !ends[0].out {
				t.Errorf("rank 0, stopped past the timeout, did not learn it was left out:\n%s", lastLines(procs[0].Output(), 8))
			}
		})
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
