package ctest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

// usageLine is one "USAGE" line of the hygiene program.
type usageLine struct {
	cycle, threads, fds, shm, memfds int
	rssKiB                           int
	seconds                          float64
}

func parseUsage(t *testing.T, p *harness.Proc, when string) usageLine {
	t.Helper()
	for _, line := range strings.Split(p.Stdout(), "\n") {
		rest, ok := strings.CutPrefix(line, "USAGE "+when+" ")
		if !ok {
			continue
		}
		var u usageLine
		if _, err := fmt.Sscanf(rest, "cycle=%d threads=%d fds=%d rss_kib=%d shm=%d memfds=%d seconds=%g",
			&u.cycle, &u.threads, &u.fds, &u.rssKiB, &u.shm, &u.memfds, &u.seconds); err != nil {
			t.Fatalf("%s: %q: %v", p.Name, line, err)
		}
		return u
	}
	t.Fatalf("%s printed no USAGE %s line:\n%s", p.Name, when, p.Output())
	return usageLine{}
}

// What may differ between the warm-up and the end without a leak: the Go
// heap of the library breathes by a few MiB, and the Go runtime never
// ends an idle thread, so its count is the most threads ever needed at
// once (in system calls at the same moment), which creeps up by one or
// two over thousands of cycles, and by four (9 → 13 over 900 cycles) when
// other test packages load the cores meanwhile, as `go test ./...` does.
// A leak grows with every cycle: hundreds over 900.
const (
	rssSlackKiB  = 6 << 10
	threadsSlack = 8
)

// checkUsage compares a rank's counts after the warm-up and at the end:
// descriptors and (in a private /dev/shm) its entries exactly, threads
// within threadsSlack and resident memory within rssSlackKiB; and no
// memory file of gocoll open or mapped at either point.
func checkUsage(t *testing.T, p *harness.Proc, privateShm bool) {
	t.Helper()
	warm, end := parseUsage(t, p, "warm"), parseUsage(t, p, "end")
	t.Logf("%s: after %d cycles: %+v; after %d (%.1f s): %+v", p.Name, warm.cycle, warm, end.cycle, end.seconds, end)
	if end.threads > warm.threads+threadsSlack || end.fds != warm.fds {
		t.Errorf("%s: threads %d → %d, descriptors %d → %d", p.Name, warm.threads, end.threads, warm.fds, end.fds)
	}
	if warm.memfds != 0 || end.memfds != 0 {
		t.Errorf("%s: memory files open or mapped after destroy: %d, %d", p.Name, warm.memfds, end.memfds)
	}
	if privateShm && (warm.shm != 0 || end.shm != 0) {
		t.Errorf("%s: /dev/shm entries: %d after the warm-up, %d at the end", p.Name, warm.shm, end.shm)
	}
	if end.rssKiB > warm.rssKiB+rssSlackKiB {
		t.Errorf("%s: resident memory %d → %d KiB", p.Name, warm.rssKiB, end.rssKiB)
	}
}

// cycles is GOCOLL_TEST_CYCLES, or def.
func cycles(def int) int {
	if n, err := strconv.Atoi(os.Getenv("GOCOLL_TEST_CYCLES")); err == nil && n > 1 {
		return n
	}
	return def
}

// TestCreateDestroyCycles: 1,000 one-rank communicators, and 4 processes
// joining a fresh 4-rank communicator every cycle (GOCOLL_TEST_CYCLES
// cycles, 1000 in the long run; 50 by default: each takes 0.1-0.4 s on 2 cores,
// most of it setting up and tearing down ~100 MiB of shared-memory
// mappings per rank), each used for an allreduce in plain and
// gocollMemAlloc memory and a split with an allreduce on the child, leave
// descriptors and /dev/shm as they were after the warm-up, and threads and
// resident memory within a small bound (checkUsage).
func TestCreateDestroyCycles(t *testing.T) {
	wrap, _, private := harness.PrivateShm(t)
	if !private {
		t.Log("no private /dev/shm (needs root and unshare): its entries are not compared")
	}
	start := func(ctx context.Context, name string, args ...string) *harness.Proc {
		bin, argv := bin["hygiene"], args
		if private {
			bin, argv = wrap(bin, args...)
		}
		p, err := harness.Start(ctx, name, harness.Env(), nil, bin, argv...)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("one", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		p := start(ctx, "rank 0", "one", strconv.Itoa(cycles(1000)))
		harness.WaitAll(t, []*harness.Proc{p})
		checkUsage(t, p, private)
	})
	t.Run("multi", func(t *testing.T) {
		const n = 4
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		dir := t.TempDir()
		procs := make([]*harness.Proc, n)
		for r := range procs {
			procs[r] = start(ctx, fmt.Sprintf("rank %d", r), "multi", strconv.Itoa(r), strconv.Itoa(n), strconv.Itoa(cycles(50)), dir)
		}
		harness.WaitAll(t, procs)
		for _, p := range procs {
			checkUsage(t, p, private)
		}
	})
}
