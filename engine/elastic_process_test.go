package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// elasticRole allreduces (checked) until a peer fails, shrinks, and
// allreduces (checked) 20 more times on the new communicator. It prints
// when the failure was seen and the shrink done (Unix µs), and the
// shrink's agreement time. Then it keeps its communicators (and so its
// answers to late ranks) until the file named by GOCOLL_TEST_GATE exists,
// when set. A rank left out prints EXCLUDED and exits with 6.
func elasticRole(c *Comm) int {
	_, err := checkedLoop(c, 1024, func(int) bool { return false })
	failed := time.Now()
	fmt.Printf("FAILED at=%d err=%v\n", failed.UnixMicro(), err)
	child, err := c.Shrink(nil)
	if errors.Is(err, ErrExcluded) {
		fmt.Printf("EXCLUDED: %v\n", err)
		return 6
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "shrink: %v\n", err)
		return 1
	}
	took := c.elastic.shrinkTook
	fmt.Printf("SHRUNK size=%d rank=%d at=%d agree_us=%d total_us=%d failed=%v\n", child.Size(), child.Rank(), time.Now().UnixMicro(),
		took[0].Microseconds(), took[1].Microseconds(), c.Failed())
	iters, err := checkedLoop(child, 1024, func(i int) bool { return i >= 20 })
	if err != nil {
		fmt.Fprintf(os.Stderr, "after shrink: %v\n", err)
		return 1
	}
	fmt.Printf("SUMS OK iterations=%d\n", iters)
	if err := waitGate(gateVar); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := child.Destroy(); err != nil {
		fmt.Fprintln(os.Stderr, "destroy:", err)
		return 1
	}
	c.Destroy()
	return 0
}

var shrunkLine = regexp.MustCompile(`SHRUNK size=(\d+) rank=(\d+) at=(\d+) agree_us=(\d+) total_us=(\d+)`)

// TestElasticKilledProcess SIGKILLs one of 4 rank processes (rank 0, the
// first coordinator, or rank 2) in the middle of allreducing: the
// survivors shrink to 3 and their checked allreduces are right.
func TestElasticKilledProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tr := range []string{"tcp", "auto"} {
		for _, victim := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s/kill=%d", tr, victim), func(t *testing.T) {
				env := []string{"GOCOLL_TRANSPORT=" + tr, "GOCOLL_TIMEOUT=10s"}
				kids := startRanks(t, "elastic", 4, env, nil)
				for _, k := range kids {
					waitOutput(t, k, "READY", time.Minute)
				}
				killed := time.Now()
				kids[victim].Cmd.Process.Signal(syscall.SIGKILL)
				waitRanks(t, kids, time.Minute)
				for r, k := range kids {
					out := k.Out.String()
					if r == victim {
						continue
					}
					if k.Err != nil || !strings.Contains(out, "SUMS OK") {
						t.Fatalf("rank %d: %v\n%s", r, k.Err, out)
					}
					m := shrunkLine.FindStringSubmatch(out)
					if m == nil || m[1] != "3" || m[2] != strconv.Itoa(r-btoi(r > victim)) {
						t.Fatalf("rank %d: shrunk to %v\n%s", r, m, out)
					}
					logShrinkTimes(t, r, killed, out)
				}
			})
		}
	}
}

// logShrinkTimes logs kill → failure seen → agreed → new communicator, in
// ms (for docs/elastic.md; not asserted).
func logShrinkTimes(t *testing.T, r int, killed time.Time, out string) {
	fm := regexp.MustCompile(`FAILED at=(\d+)`).FindStringSubmatch(out)
	m := shrunkLine.FindStringSubmatch(out)
	if fm == nil || m == nil {
		return
	}
	at, _ := strconv.ParseInt(fm[1], 10, 64)
	agree, _ := strconv.ParseInt(m[4], 10, 64)
	total, _ := strconv.ParseInt(m[5], 10, 64)
	t.Logf("rank %d: detection %.1f ms, agreement %.1f ms, new communicator %.1f ms", r,
		float64(at-killed.UnixMicro())/1e3, float64(agree)/1e3, float64(total)/1e3)
}

// TestElasticStoppedProcess SIGSTOPs one of 4 ranks past the timeout: the
// others shrink without it; resumed, it gets ErrExcluded.
func TestElasticStoppedProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tr := range []string{"tcp", "auto"} {
		t.Run(tr, func(t *testing.T) {
			gate := t.TempDir() + "/gate"
			env := []string{"GOCOLL_TRANSPORT=" + tr, "GOCOLL_TIMEOUT=1s", gateVar + "=" + gate}
			kids := startRanks(t, "elastic", 4, env, nil)
			for _, k := range kids {
				waitOutput(t, k, "READY", time.Minute)
			}
			kids[2].Cmd.Process.Signal(syscall.SIGSTOP)
			for r, k := range kids {
				if r != 2 {
					waitOutput(t, k, "SUMS OK", time.Minute)
				}
			}
			kids[2].Cmd.Process.Signal(syscall.SIGCONT)
			waitOutput(t, kids[2], "EXCLUDED", time.Minute)
			os.WriteFile(gate, nil, 0o600)
			waitRanks(t, kids, time.Minute)
			for r, k := range kids {
				want := 0
				if r == 2 {
					want = 6
				}
				if code := exitCode(k.Err); code != want {
					t.Fatalf("rank %d exited %d, want %d\n%s", r, code, want, k.Out.String())
				}
			}
		})
	}
}

// TestElasticTwoHosts: 2 emulated hosts × 2 ranks (shared memory inside a
// host, TCP between them; netns_test.go): a rank SIGKILLed on either host,
// or SIGSTOPped past the timeout, and the others shrink to 3 and go on; a
// stopped one gets ErrExcluded when resumed. Logs the times for
// docs/elastic.md.
func TestElasticTwoHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, sc := range []struct {
		name   string
		victim int
		stop   bool
	}{
		{"SIGKILL remote rank", 3, false},
		{"SIGKILL rank 0", 0, false},
		{"SIGSTOP past timeout", 2, true},
	} {
		t.Run(sc.name, func(t *testing.T) {
			h := newHosts(t, 2)
			gate := filepath.Join(t.TempDir(), "gate")
			timeout := "10s"
			if sc.stop {
				timeout = "1s"
			}
			kids := h.startRanks("elastic", 2, "GOCOLL_TIMEOUT="+timeout, gateVar+"="+gate)
			for _, k := range kids {
				waitOutput(t, k, "READY", time.Minute)
			}
			struck := time.Now()
			sig := syscall.SIGKILL
			if sc.stop {
				sig = syscall.SIGSTOP
			}
			kids[sc.victim].Cmd.Process.Signal(sig)
			for r, k := range kids {
				if r != sc.victim {
					waitOutput(t, k, "SUMS OK", time.Minute)
				}
			}
			if sc.stop {
				kids[sc.victim].Cmd.Process.Signal(syscall.SIGCONT)
				waitOutput(t, kids[sc.victim], "EXCLUDED", time.Minute)
			}
			os.WriteFile(gate, nil, 0o600)
			waitRanks(t, kids, time.Minute)
			for r, k := range kids {
				out := k.Out.String()
				if r == sc.victim {
					continue
				}
				m := shrunkLine.FindStringSubmatch(out)
				if k.Err != nil || m == nil || m[1] != "3" || m[2] != strconv.Itoa(r-btoi(r > sc.victim)) {
					t.Fatalf("rank %d: %v\n%s", r, k.Err, lastLines(out, 20))
				}
				logShrinkTimes(t, r, struck, out)
			}
			h.checkShm()
		})
	}
}
