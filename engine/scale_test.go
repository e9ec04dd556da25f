package engine

import (
	"os"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// TestTCPAtScale: 256 goroutine ranks over real TCP (every connection a
// loopback socket, both of its ends in this process) set up, barrier and
// allreduce with a checked result, and hold descriptors for the peers
// their collectives use, not for every rank: under 24 per rank, where a
// full mesh would hold 2·255 (the limit the lazy connections exist for).
// Then one rank dies and every other rank's next call fails within the
// timeout instead of hanging.
func TestTCPAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("256 ranks")
	}
	const n = 256
	before := openFiles(t)
	if lim := tcp.FileLimit(); lim > 0 && lim < uint64(before+24*n+64) {
		t.Skipf("RLIMIT_NOFILE %d is too low for %d ranks in one process", lim, n)
	}
	comms := newJoined(t, n, Options{Transport: "tcp", Timeout: time.Minute, Tune: "off"})
	mustRanks(t, comms, func(c *Comm) error { return c.Barrier() })
	checkSum(t, comms)
	if per := float64(openFiles(t)-before) / n; per > 24 {
		t.Errorf("%.1f descriptors per rank after setup, a barrier and an allreduce; want at most 24", per)
	} else {
		t.Logf("%.1f descriptors per rank", per)
	}
	crash(comms[n/2])
	start := time.Now()
	errs := make([]error, n)
	mustRanksErr(comms, errs, n/2, func(c *Comm) error { return c.Barrier() })
	for r, err := range errs {
		if r != n/2 && err == nil {
			t.Fatalf("rank %d's barrier succeeded without rank %d", r, n/2)
		}
	}
	t.Logf("every rank's barrier failed %v after rank %d died", time.Since(start).Round(time.Millisecond), n/2)
}

// openFiles is this process's number of open descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(fds)
}

// mustRanksErr runs f on every rank but skip, concurrently, into errs.
func mustRanksErr(comms []*Comm, errs []error, skip int, f func(*Comm) error) {
	done := make(chan struct{}, len(comms))
	for r, c := range comms {
		if r == skip {
			done <- struct{}{}
			continue
		}
		go func() {
			errs[r] = f(c)
			done <- struct{}{}
		}()
	}
	for range comms {
		<-done
	}
}
