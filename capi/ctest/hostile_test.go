package ctest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
	"github.com/gocoll/gocoll/engine/hostiletest"
)

// TestHostilePorts aims hostile clients (engine/hostiletest) at every port
// a 4-rank job of the C library listens on, found in /proc: while ranks 0-2
// wait for rank 3, the rendezvous root, their TCP listeners and their
// metrics endpoints (GOCOLL_METRICS_ADDR); while the job runs allreduces
// (every result checked by every rank), the metrics endpoints, the only
// ports still open, with every kind, silent connections and floods beyond
// the endpoint's connection cap; and the ranks' control listeners, open
// too. Nobody is let in, every hostile
// connection is closed by the job, each rank's descriptors come back to
// what they were and its memory stays within 32 MiB of it, the root's
// refusals are logged without flooding, and the endpoints still serve the
// job's metrics.
func TestHostilePorts(t *testing.T) {
	const n, flood = 4, 40
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	metricsPort, err := harness.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	stop := filepath.Join(t.TempDir(), "stop")
	procs := make([]*harness.Proc, n)
	start := func(r int) {
		env := harness.Env(append(harness.TorchrunEnv(r, n, port), "GOCOLL_TIMEOUT=60s", "GOCOLL_TEST_STOP="+stop,
			fmt.Sprintf("GOCOLL_METRICS_ADDR=127.0.0.1:%d", metricsPort))...)
		if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["faults"], "loop"); err != nil {
			t.Fatal(err)
		}
	}
	for r := range n - 1 {
		start(r)
	}
	rootAddr := fmt.Sprintf("127.0.0.1:%d", port+1)
	metrics := func(r int) hostiletest.Target {
		return hostiletest.Target{Addr: fmt.Sprintf("127.0.0.1:%d", metricsPort+r), Proto: hostiletest.HTTP}
	}

	// Setup: ranks 0-2 wait for rank 3 with the root, their listeners and
	// their metrics endpoints open.
	var setup []netip.AddrPort
	deadline := time.Now().Add(time.Minute)
	for len(setup) < 1+2*(n-1) {
		if time.Now().After(deadline) {
			t.Fatalf("ranks 0-2 listen on %v, want the root, 3 listeners and 3 metrics endpoints", setup)
		}
		setup = setup[:0]
		for _, p := range procs[:n-1] {
			ports, _ := hostiletest.ListeningPorts(p.Cmd.Process.Pid)
			setup = append(setup, ports...)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var early []hostiletest.Target // the root and the metrics endpoints
	var listeners []hostiletest.Target
	for _, ap := range setup {
		a := hostiletest.Dialable(ap)
		switch {
		case a == rootAddr:
			early = append(early, hostiletest.Target{Addr: a, Rank: n - 1})
		case ap.Port() >= uint16(metricsPort) && ap.Port() < uint16(metricsPort+n):
			early = append(early, metrics(int(ap.Port())-metricsPort))
		default:
			listeners = append(listeners, hostiletest.Target{Addr: a, Rank: n - 1})
		}
	}
	held := hostiletest.Hold(ctx, early...)
	outcomes := hostiletest.All(ctx, early...)
	for _, tg := range early {
		outcomes = append(outcomes, hostiletest.Flood(ctx, tg, flood)...)
	}
	// The ranks' TCP listeners accept nothing before every rank has
	// joined (on one host they then close unused): hostile clients wait
	// in their backlogs and are refused or reset.
	lateDone := make(chan []hostiletest.Outcome, 1)
	go func() { lateDone <- hostiletest.All(ctx, listeners...) }()
	start(n - 1)

	// The job runs: only the metrics endpoints listen, and each rank's
	// control listener (what a shrink or a grow talks over: it must stay
	// open, and let nobody in without the secret).
	for _, p := range procs {
		if _, err := p.WaitLine(ctx, "READY"); err != nil {
			t.Fatal(err)
		}
	}
	fds, rss := make([]int, n), make([]int, n)
	var running []hostiletest.Target
	for r, p := range procs {
		pid := p.Cmd.Process.Pid
		ports, _ := hostiletest.ListeningPorts(pid)
		var other []hostiletest.Target
		seen := false
		for _, ap := range ports {
			if a := hostiletest.Dialable(ap); a == metrics(r).Addr {
				seen = true
			} else {
				other = append(other, hostiletest.Target{Addr: a, Rank: (r + 1) % n})
			}
		}
		if !seen || len(other) != 1 {
			t.Errorf("rank %d listens on %v while the job runs, want its metrics endpoint %s and its control listener", r, ports, metrics(r).Addr)
		}
		running = append(running, metrics(r))
		running = append(running, other...)
		fds[r], _ = hostiletest.Descriptors(pid)
		rss[r] = residentKiB(pid)
	}
	held2 := hostiletest.Hold(ctx, running...)
	outcomes = append(outcomes, hostiletest.All(ctx, running...)...)
	for _, tg := range running {
		outcomes = append(outcomes, hostiletest.Flood(ctx, tg, flood)...)
	}
	outcomes = append(outcomes, held.Wait()...)
	outcomes = append(outcomes, held2.Wait()...)
	for _, o := range outcomes {
		if o.Accepted || !o.Closed || o.Err != nil {
			t.Errorf("%v (err %v)", o, o.Err)
		}
	}
	for _, o := range <-lateDone {
		if o.Accepted || !o.Refused && !o.Closed {
			t.Errorf("%v (err %v)", o, o.Err)
		}
	}
	// Nothing stays behind in the ranks, and they still serve metrics.
	for r, p := range procs {
		pid := p.Cmd.Process.Pid
		deadline := time.Now().Add(30 * time.Second)
		for now, _ := hostiletest.Descriptors(pid); now > fds[r]; now, _ = hostiletest.Descriptors(pid) {
			if time.Now().After(deadline) {
				t.Errorf("rank %d holds %d descriptors after the attacks, %d before", r, now, fds[r])
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if grown := residentKiB(pid) - rss[r]; grown > 32<<10 {
			t.Errorf("rank %d grew by %d KiB during the attacks", r, grown)
		}
		page := scrape(t, metrics(r).Addr)
		if !strings.Contains(page, `gocoll_operations_total{algo="shm",op="allreduce"}`) {
			t.Errorf("rank %d's metrics lack the allreduces:\n%s", r, page)
		}
		if r == 0 {
			t.Logf("rank 0's metrics after the attacks:\n%s", metricsSample(page))
		}
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for r, p := range procs {
		if err := p.Wait(); err != nil || !strings.Contains(p.Stdout(), "DONE") {
			t.Errorf("rank %d: %v\n%s", r, err, p.Output())
		}
	}
	stderr0 := procs[0].Output()
	full, counted := hostiletest.Logged(stderr0, "refused connections to the rendezvous root", "bootstrap: refused connection")
	if full == 0 || full > 5 || counted == 0 {
		t.Errorf("rank 0 logged %d of the root's refusals in full and counted %d more, want 1 to 5 in full and the flood counted:\n%s", full, counted, stderr0)
	}
	t.Logf("hostile connections:\n%s", hostiletest.Summary(outcomes))
}

// residentKiB is process pid's resident memory (VmRSS), 0 if unknown.
func residentKiB(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kib
		}
	}
	return 0
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Errorf("metrics at %s: %v", addr, err)
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricsSample is the gocoll_ lines of a metrics page, without the
// histogram's buckets.
func metricsSample(page string) string {
	var keep []string
	for _, line := range strings.Split(page, "\n") {
		if strings.Contains(line, "gocoll_") && !strings.Contains(line, "_bucket{") {
			keep = append(keep, line)
		}
	}
	return strings.Join(slices.Compact(keep), "\n")
}
