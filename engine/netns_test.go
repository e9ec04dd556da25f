package engine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestTwoHostsHierarchical forces the hierarchical algorithms at every
// size: shared-memory rings inside each host, TCP between them.
func TestTwoHostsHierarchical(t *testing.T) {
	runHosts(t, 2, "algo=hier", "GOCOLL_ALGO=hier")
}

// TestOneHostPrivateShm runs 3 ranks on one such host: shared-memory rings
// and collectives (the arena), and no file left in its private /dev/shm.
func TestOneHostPrivateShm(t *testing.T) {
	runHosts(t, 1, "shm_peers=2 tcp_peers=0 arena=true")
}

func runHosts(t *testing.T, nhosts int, wantLog string, env ...string) {
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
	suffix := fmt.Sprintf("%d", os.Getpid()%100000)
	hosts := []struct{ ns, veth, addr, shm string }{
		{"gcA" + suffix, "gca" + suffix, "198.18.0.1", t.TempDir()},
		{"gcB" + suffix, "gcb" + suffix, "198.18.0.2", t.TempDir()},
	}[:nhosts]
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Skipf("network namespaces unavailable (%s: %v: %s)", strings.Join(args, " "), err, out)
		}
	}
	for _, h := range hosts {
		sh("ip", "netns", "add", h.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", h.ns).Run() })
		sh("mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", h.shm)
		t.Cleanup(func() { exec.Command("umount", h.shm).Run() })
	}
	if nhosts == 2 {
		sh("ip", "link", "add", hosts[0].veth, "type", "veth", "peer", "name", hosts[1].veth)
		for _, h := range hosts {
			sh("ip", "link", "set", h.veth, "netns", h.ns)
			sh("ip", "-n", h.ns, "addr", "add", h.addr+"/24", "dev", h.veth)
			sh("ip", "-n", h.ns, "link", "set", h.veth, "up")
		}
	} else {
		hosts[0].veth, hosts[0].addr = "lo", "127.0.0.1"
	}
	for _, h := range hosts {
		sh("ip", "-n", h.ns, "link", "set", "lo", "up")
	}
	const port = 29411
	perHost := 4 / nhosts
	if nhosts == 1 {
		perHost = 3
	}
	kids := make([]*child, perHost*nhosts)
	for r := range kids {
		h := hosts[r/perHost]
		// A fresh UTS and mount namespace per rank: the host's name, and the
		// host's /dev/shm bound over the real one.
		script := fmt.Sprintf("hostname host%d && mount --bind %s /dev/shm && exec %s -test.run=^$", r/perHost, h.shm, os.Args[0])
		cmd := exec.Command("ip", "netns", "exec", h.ns, "unshare", "--mount", "--uts", "sh", "-c", script)
		cmd.Env = append(os.Environ(), "GOCOLL_TEST_ROLE=conformance",
			fmt.Sprintf("GOCOLL_RANK=%d", r), fmt.Sprintf("GOCOLL_SIZE=%d", len(kids)), fmt.Sprintf("GOCOLL_ROOT_ADDR=%s:%d", hosts[0].addr, port),
			"GOCOLL_SECRET=two-hosts", "GOCOLL_SOCKET_IFNAME="+h.veth, "GOCOLL_DEBUG=DEBUG", "GOCOLL_TIMEOUT=60s")
		cmd.Env = append(cmd.Env, env...)
		k := &child{Cmd: cmd}
		cmd.Stdout, cmd.Stderr = &k.Out, &k.Out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill() })
		kids[r] = k
	}
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
	for _, h := range hosts {
		if left, _ := filepath.Glob(filepath.Join(h.shm, "gocoll-*")); len(left) > 0 {
			t.Errorf("left in %s's /dev/shm: %v", h.ns, left)
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
