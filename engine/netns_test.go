package engine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/proctest"
)

// TestTwoHosts runs 4 ranks as 2 hosts × 2 ranks: each host is a network
// namespace with its own host name and its own /dev/shm, joined by a veth
// pair. Ranks on one host must pick shared memory, ranks on different hosts
// TCP over the interface GOCOLL_SOCKET_IFNAME names, and the whole
// conformance suite must pass and leave nothing in any host's /dev/shm.
// Needs root and iproute2; skipped otherwise. The addresses are in
// 198.18.0.0/15 (reserved for benchmarks), inside namespaces this test makes
// and removes.
func TestTwoHosts(t *testing.T) {
	runHosts(t, 2, "shm_peers=1 tcp_peers=2 arena=false")
}

// TestTwoHostsTuned: two hosts of one rank, where the cost model predicts
// every allreduce schedule about even, so the ranks time them when the
// communicator is created (GOCOLL_TUNE, engine/tune.go): both must log the
// same table, rank 0 must cache it, and the next job on the same hosts
// must take it from the cache (and pass the conformance suite under it).
func TestTwoHostsTuned(t *testing.T) {
	h := newHosts(t, 2)
	for run, want := range []string{`msg="allreduce across hosts timed"`, `msg="allreduce table from the cache"`} {
		kids := h.startRanks("conformance", 1, "GOCOLL_DEBUG=INFO", "GOCOLL_TIMEOUT=60s")
		waitRanks(t, kids, 3*time.Minute)
		tables := map[string]bool{}
		for r, k := range kids {
			out := k.Out.String()
			_, line, ok := strings.Cut(out, want)
			line, _, _ = strings.Cut(line, "\n")
			if k.Err != nil || !ok {
				t.Fatalf("run %d, rank %d (%v): no %s in\n%s", run, r, k.Err, want, lastLines(out, 30))
			}
			if run == 0 {
				_, table, _ := strings.Cut(line, " table=")
				table, _, _ = strings.Cut(table, " seconds=")
				if table == "" || table == "map[]" {
					t.Errorf("rank %d timed nothing: %s", r, line)
				}
				tables[table] = true
				t.Logf("rank %d:%s", r, line)
			}
		}
		if len(tables) > 1 {
			t.Errorf("the ranks hold different tables: %v", tables)
		}
		if cached, _ := filepath.Glob(filepath.Join(os.Getenv("XDG_CACHE_HOME"), "gocoll", "tune-*.json")); len(cached) == 0 {
			t.Errorf("no table cached under %s", os.Getenv("XDG_CACHE_HOME"))
		}
	}
	h.checkShm()
}

// TestTwoHostsHierarchical forces the hierarchical algorithms at every
// size, and the all-to-all through one repacking rank per host:
// shared-memory rings inside each host, TCP between them.
func TestTwoHostsHierarchical(t *testing.T) {
	runHosts(t, 2, "algo=hier", "GOCOLL_ALGO=hier,alltoall=aggregate-leader")
}

// TestOneHostPrivateShm runs 3 ranks on one such host: shared-memory rings
// and collectives (the arena), and no file left in its private /dev/shm.
func TestOneHostPrivateShm(t *testing.T) {
	runHosts(t, 1, "shm_peers=2 tcp_peers=0 arena=true")
}

func runHosts(t *testing.T, nhosts int, wantLog string, env ...string) {
	h := newHosts(t, nhosts)
	perHost := 4 / nhosts
	if nhosts == 1 {
		perHost = 3
	}
	kids := h.startRanks("conformance", perHost, append([]string{"GOCOLL_DEBUG=DEBUG", "GOCOLL_TIMEOUT=60s"}, env...)...)
	waitRanks(t, kids, 3*time.Minute)
	for r, k := range kids {
		out := k.Out.String()
		if k.Err != nil {
			t.Errorf("rank %d: %v\n%s", r, k.Err, lastLines(out, 30))
			continue
		}
		if !strings.Contains(out, wantLog) {
			t.Errorf("rank %d did not connect as expected (%s):\n%s", r, wantLog, lastLines(out, 30))
		}
	}
	h.checkShm()
}

// emuHosts are emulated hosts (the recipe of build/lib/netns.sh): each a
// network namespace with its own host name and its own /dev/shm (a tmpfs
// mounted for it), two of them joined by a veth pair. They are removed when
// the test ends.
type emuHosts struct {
	t     *testing.T
	hosts []emuHost
}

type emuHost struct{ ns, veth, addr, shm string }

// hostsMade numbers the emulated hosts of this test process, so that every
// test gets namespaces and interfaces of its own.
var hostsMade atomic.Int32

// newHosts makes nhosts (1 or 2) emulated hosts. It skips the test under
// -short, without root, or where namespaces cannot be made.
func newHosts(t *testing.T, nhosts int) *emuHosts {
	t.Helper()
	if testing.Short() {
		t.Skip("multi-process")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	for _, tool := range []string{"ip", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	suffix := fmt.Sprintf("%d%c", os.Getpid()%100000, 'a'+hostsMade.Add(1)%26)
	h := &emuHosts{t: t, hosts: []emuHost{
		{"gcA" + suffix, "gca" + suffix, "198.18.0.1", t.TempDir()},
		{"gcB" + suffix, "gcb" + suffix, "198.18.0.2", t.TempDir()},
	}[:nhosts]}
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Skipf("network namespaces unavailable (%s: %v: %s)", strings.Join(args, " "), err, out)
		}
	}
	for _, e := range h.hosts {
		sh("ip", "netns", "add", e.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", e.ns).Run() })
		sh("mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", e.shm)
		t.Cleanup(func() { exec.Command("umount", e.shm).Run() })
	}
	if nhosts == 2 {
		sh("ip", "link", "add", h.hosts[0].veth, "type", "veth", "peer", "name", h.hosts[1].veth)
		for _, e := range h.hosts {
			sh("ip", "link", "set", e.veth, "netns", e.ns)
			sh("ip", "-n", e.ns, "addr", "add", e.addr+"/24", "dev", e.veth)
			sh("ip", "-n", e.ns, "link", "set", e.veth, "up")
		}
	} else {
		h.hosts[0].veth, h.hosts[0].addr = "lo", "127.0.0.1"
	}
	for _, e := range h.hosts {
		sh("ip", "-n", e.ns, "link", "set", "lo", "up")
	}
	return h
}

// startRanks starts perHost ranks of role on every host (ranks numbered
// host by host), joined through GOCOLL_* variables with the root on host
// 0, each told to use its host's interface; env is added to every rank's
// environment.
func (h *emuHosts) startRanks(role string, perHost int, env ...string) []*child {
	const port = 29411
	kids := make([]*child, perHost*len(h.hosts))
	for r := range kids {
		e := h.hosts[r/perHost]
		// A fresh UTS and mount namespace per rank: the host's name, and the
		// host's /dev/shm bound over the real one.
		script := fmt.Sprintf("hostname host%d && mount --bind %s /dev/shm && exec %s -test.run=^$", r/perHost, e.shm, os.Args[0])
		cmd := exec.Command("ip", "netns", "exec", e.ns, "unshare", "--mount", "--uts", "sh", "-c", script)
		cmd.Env = append(os.Environ(), "GOCOLL_TEST_ROLE="+role,
			fmt.Sprintf("GOCOLL_RANK=%d", r), fmt.Sprintf("GOCOLL_SIZE=%d", len(kids)), fmt.Sprintf("GOCOLL_ROOT_ADDR=%s:%d", h.hosts[0].addr, port),
			"GOCOLL_SECRET=two-hosts", "GOCOLL_SOCKET_IFNAME="+e.veth)
		cmd.Env = append(cmd.Env, env...)
		k := &child{Cmd: cmd}
		cmd.Stdout, cmd.Stderr = &k.Out, &k.Out
		if err := cmd.Start(); err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { cmd.Process.Kill() })
		kids[r] = k
	}
	return kids
}

// on runs a command in host i's network namespace.
func (h *emuHosts) on(i int, args ...string) {
	h.t.Helper()
	args = append([]string{"netns", "exec", h.hosts[i].ns}, args...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		h.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// checkShm fails the test if anything of gocoll's is left in a host's
// /dev/shm.
func (h *emuHosts) checkShm() {
	h.t.Helper()
	for _, e := range h.hosts {
		if left, _ := filepath.Glob(filepath.Join(e.shm, "gocoll-*")); len(left) > 0 {
			h.t.Errorf("left in %s's /dev/shm: %v", e.ns, left)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestHostFaults runs 2 emulated hosts × 2 ranks (shared memory inside a
// host, TCP between them) allreducing in a loop, every result checked
// (checkedLoop), and strikes one fault at them once every rank is going.
// Each rank prints how it failed; the test checks the kinds and that the
// errors name the collective and the rank at fault, and logs how long
// after the fault each rank failed (docs/troubleshooting.md's table; durations are not
// asserted).
func TestHostFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, sc := range []struct {
		name    string
		timeout string // GOCOLL_TIMEOUT
		fault   func(h *emuHosts, kids []*child) (victim int)
		// want checks the survivors' failures; nil: the job must complete.
		want func(t *testing.T, victim int, f rankFailure)
	}{
		{"SIGKILL remote rank", "30s", killRank(3), wantLost},
		{"SIGKILL local rank", "30s", killRank(1), wantLost},
		{"link down", "3s", linkDown, wantTimeout},
		{"slow link", "3s", slowLink, nil},
		{"SIGSTOP below timeout", "10s", stopRank(time.Second), nil},
		{"SIGSTOP past timeout", "3s", stopRank(0), wantTimeout},
	} {
		t.Run(sc.name, func(t *testing.T) {
			h := newHosts(t, 2)
			stop := filepath.Join(t.TempDir(), "stop")
			kids := h.startRanks("checked", 2, "GOCOLL_TIMEOUT="+sc.timeout, stopVar+"="+stop)
			for _, k := range kids {
				waitOutput(t, k, "READY", time.Minute)
			}
			struck := time.Now()
			victim := sc.fault(h, kids)
			if sc.want == nil {
				if err := os.WriteFile(stop, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			waitRanks(t, kids, time.Minute)
			for r, k := range kids {
				out := k.Out.String()
				f, failed := failure(out)
				if r == victim && sc.want != nil {
					if failed {
						t.Logf("rank %d (struck): %s after %v: %s", r, f.kind, f.at.Sub(struck).Round(time.Millisecond), f.err)
					}
					continue
				}
				switch {
				case sc.want == nil && (k.Err != nil || failed):
					t.Errorf("rank %d: %v\n%s", r, k.Err, lastLines(out, 20))
				case sc.want == nil:
					t.Logf("rank %d: completed (%s)", r, lastLines(out, 1))
				case !failed:
					t.Errorf("rank %d did not fail (%v):\n%s", r, k.Err, lastLines(out, 20))
				default:
					t.Logf("rank %d: %s after %v: %s", r, f.kind, f.at.Sub(struck).Round(time.Millisecond), f.err)
					sc.want(t, victim, f)
				}
			}
			h.checkShm()
		})
	}
}

// killRank SIGKILLs rank victim.
func killRank(victim int) func(*emuHosts, []*child) int {
	return func(_ *emuHosts, kids []*child) int {
		kids[victim].Cmd.Process.Signal(syscall.SIGKILL)
		return victim
	}
}

// linkDown takes host B's end of the link down: no RST, no FIN, packets
// just stop arriving either way.
func linkDown(h *emuHosts, _ []*child) int {
	h.on(1, "ip", "link", "set", h.hosts[1].veth, "down")
	return -1
}

// slowLink limits the link to 1 Mbit/s each way (tbf; a queue long enough
// that nothing is dropped), well below what the loop moves (16 KiB each way
// per allreduce, over 130 ms at that rate), and lets the loop run 5 more
// allreduces over it.
func slowLink(h *emuHosts, kids []*child) int {
	for i := range h.hosts {
		h.on(i, "tc", "qdisc", "add", "dev", h.hosts[i].veth, "root", "tbf", "rate", "1mbit", "burst", "32kbit", "latency", "2s")
	}
	goesOn(h.t, kids[0], 5)
	return -1
}

// goesOn waits until rank k has made n more allreduces of checkedLoop
// (counted from the first progress line it prints from now on: the last
// one printed may be older than its current call), and logs how long they
// took.
func goesOn(t *testing.T, k *child, n int) {
	t.Helper()
	start, lines := time.Now(), strings.Count(k.Out.String(), "ITER ")
	proctest.Until(t, time.Minute, "a progress line", func() bool { return strings.Count(k.Out.String(), "ITER ") > lines })
	from := lastIter(k.Out.String())
	proctest.Until(t, time.Minute, fmt.Sprintf("%d more allreduces", n), func() bool { return lastIter(k.Out.String()) >= from+n })
	t.Logf("%d more allreduces in %v", n, time.Since(start).Round(time.Millisecond))
}

// stopRank SIGSTOPs rank 3 (on host B); for d, then SIGCONT, and lets the
// loop run 5 more allreduces; with d zero, until every other rank has
// failed, then SIGCONT.
func stopRank(d time.Duration) func(*emuHosts, []*child) int {
	return func(h *emuHosts, kids []*child) int {
		p := kids[3].Cmd.Process
		p.Signal(syscall.SIGSTOP)
		if d > 0 {
			time.Sleep(d) // the fault itself: a pause shorter than the timeout
			p.Signal(syscall.SIGCONT)
			goesOn(h.t, kids[0], 5)
			return 3
		}
		proctest.Until(h.t, time.Minute, "the other ranks to fail", func() bool {
			for _, k := range kids[:3] {
				if _, failed := failure(k.Out.String()); !failed {
					return false
				}
			}
			return true
		})
		p.Signal(syscall.SIGCONT)
		return 3
	}
}

// wantLost: a survivor of a killed rank learns that it is lost, naming it,
// from the loss itself or from a peer that relays it (never a timeout).
func wantLost(t *testing.T, victim int, f rankFailure) {
	t.Helper()
	if f.kind != "peer lost" && f.kind != "remote abort" || !strings.Contains(f.err, "allreduce #") || !strings.Contains(f.err, fmt.Sprintf("rank %d", victim)) {
		t.Errorf("%s: %s, want the loss of rank %d named in the allreduce's error", f.kind, f.err, victim)
	}
}

// wantTimeout: a rank cut off from its peers times out naming the rank it
// waited for, or hears of a peer's timeout.
func wantTimeout(t *testing.T, _ int, f rankFailure) {
	t.Helper()
	if f.kind != "timeout" && f.kind != "remote abort" || !strings.Contains(f.err, "timed out") || !strings.Contains(f.err, "allreduce #") || !strings.Contains(f.err, "waiting for rank") {
		t.Errorf("%s: %s, want a timeout naming the allreduce and the rank waited for", f.kind, f.err)
	}
}
