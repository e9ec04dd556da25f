package engine

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/hostiletest"
	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// hostileRole: checked allreduces until the test's stop file, then a Split
// and checked allreduces on the child and on the parent again.
func hostileRole(c *Comm) int {
	if _, err := checkedLoop(c, 1024, stopFile()); err != nil {
		reportFailure(err)
		return 4
	}
	sub, err := c.Split(0, c.Rank())
	if err != nil {
		reportFailure(err)
		return 4
	}
	fmt.Println("SPLIT")
	for _, cc := range []*Comm{sub, c} {
		if _, err := checkedLoop(cc, 1024, func(i int) bool { return i >= 20 }); err != nil {
			reportFailure(err)
			return 4
		}
	}
	if err := sub.Destroy(); err != nil {
		fmt.Fprintln(os.Stderr, "destroy:", err)
		return 1
	}
	fmt.Println("DONE")
	return 0
}

// TestHostilePortsProcesses aims hostile clients (hostiletest) at every
// port a 4-rank job over TCP listens on, found in /proc as an operator
// would, at every stage of its life. Rank 3 is held back by gates: while
// ranks 0-2 wait for it to join, the rendezvous root gets every kind of
// hostile client, a replay of a recorded valid connection, a flood and a
// silent connection; while they wait for it to connect over TCP, so do
// their listeners (with a replay of a valid rank's handshake), the silent
// connections held across the end of setup; while collectives run,
// nothing listens but each rank's data listener (lazy connections) and
// control listener (Shrink, Grow), which get the same; while a Split
// connects the child communicator, its new listeners get the same again. A watcher meanwhile attacks every other
// port it sees open (rank 3's). The job's results (checked by every rank)
// stay right, nobody is let in, every connection is closed by the job, and
// the refusals are logged, the floods counted rather than printed.
func TestHostilePortsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	dir := t.TempDir()
	gate := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kids := startRanks(t, "hostile", 4, []string{"GOCOLL_TRANSPORT=tcp", "GOCOLL_TIMEOUT=60s", stopVar + "=" + filepath.Join(dir, "stop")}, func(r int) []string {
		if r == 3 {
			return []string{joinGateVar + "=" + filepath.Join(dir, "join"), tcpGateVar + "=" + filepath.Join(dir, "tcp")}
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rootAddr := envValue(kids[0].Cmd.Env, "GOCOLL_ROOT_ADDR")
	secret := []byte(envValue(kids[0].Cmd.Env, "GOCOLL_SECRET"))
	tag := commTag(secret, rootAddr)
	rootRec, commRec := recordHandshakes(t, ctx, secret, tag)
	pids := func(ks []*child) []int {
		var ps []int
		for _, k := range ks {
			ps = append(ps, k.Cmd.Process.Pid)
		}
		return ps
	}
	attack := func(targets []hostiletest.Target, flood int) (*hostiletest.Held, []hostiletest.Outcome) {
		held := hostiletest.Hold(ctx, targets...)
		outcomes := hostiletest.All(ctx, targets...)
		outcomes = append(outcomes, hostiletest.Flood(ctx, targets[0], flood)...)
		return held, outcomes
	}

	// Ranks 0-2 wait for rank 3 to join: the root (rank 0) serves them,
	// and their TCP listeners are open already.
	setup := waitListening(t, pids(kids[:3]), nil, 4)
	var listeners []hostiletest.Target
	root := []hostiletest.Target{{Addr: rootAddr, Rank: 3, Replay: rootRec}}
	for _, ap := range setup {
		if a := hostiletest.Dialable(ap); a != rootAddr {
			listeners = append(listeners, hostiletest.Target{Addr: a, Tag: tag, Rank: 3, Replay: commRec})
		}
	}
	if len(listeners) != 3 {
		t.Fatalf("the root %s is not among the ports listening: %v", rootAddr, setup)
	}
	watch := watchPorts(ctx, pids(kids), setup)
	heldRoot, outcomes := attack(root, 20)
	gate("join")
	// Ranks 0-2 accept TCP connections and wait for rank 3's.
	heldTCP, more := attack(listeners, 20)
	outcomes = append(outcomes, more...)
	gate("tcp1")

	// Collectives run: nothing listens but each rank's data listener
	// (peers not connected yet connect on first use) and its control
	// listener (what a shrink or a grow talks over); neither lets anyone
	// in, and the root is gone.
	for _, k := range kids {
		waitOutput(t, k, "READY", time.Minute)
	}
	var ctlPorts []netip.AddrPort
	var runTargets []hostiletest.Target
	for r, k := range kids {
		ports, _ := hostiletest.ListeningPorts(k.Cmd.Process.Pid)
		if len(ports) != 2 {
			t.Errorf("rank %d listens on %v while collectives run, want its data and control listeners", r, ports)
		}
		for _, ap := range ports {
			target := hostiletest.Target{Addr: hostiletest.Dialable(ap), Rank: (r + 1) % len(kids)}
			if slices.Contains(setup, ap) {
				target.Tag, target.Replay = tag, commRec
			} else {
				ctlPorts = append(ctlPorts, ap)
			}
			runTargets = append(runTargets, target)
		}
	}
	heldCtl, more := attack(runTargets, 20)
	outcomes = append(outcomes, more...)
	for _, o := range hostiletest.All(ctx, root...) {
		if !o.Refused {
			t.Errorf("while collectives run: %v (err %v)", o, o.Err)
		}
	}

	// A Split: ranks 0-2 listen again for the child communicator and
	// wait for rank 3 to connect.
	gate("stop")
	split := waitListening(t, pids(kids[:3]), append(slices.Clone(setup), ctlPorts...), 3)
	var splitTargets []hostiletest.Target
	for _, ap := range split {
		splitTargets = append(splitTargets, hostiletest.Target{Addr: hostiletest.Dialable(ap), Rank: 3})
	}
	heldSplit, more := attack(splitTargets, 20)
	outcomes = append(outcomes, more...)
	gate("tcp2")

	waitRanks(t, kids, 2*time.Minute)
	for _, h := range []*hostiletest.Held{heldRoot, heldTCP, heldCtl, heldSplit} {
		outcomes = append(outcomes, h.Wait()...)
	}
	watched := watch()
	cancel()
	for _, o := range outcomes {
		if o.Accepted || !o.Closed || o.Err != nil {
			t.Errorf("%v (err %v)", o, o.Err)
		}
	}
	for _, o := range watched {
		if o.Accepted || !o.Refused && !o.Closed {
			t.Errorf("watcher: %v (err %v)", o, o.Err)
		}
	}
	for r, k := range kids {
		out := k.Out.String()
		if k.Err != nil || !strings.Contains(out, "DONE") {
			t.Errorf("rank %d: %v\n%s", r, k.Err, lastLines(out, 30))
			continue
		}
		// Each communicator's listener logs 5 refusals in full in 10 s.
		full, counted := hostiletest.Logged(out, "refused connections", "tcp: refused connection")
		if r < 3 && (full == 0 || full > 10) || r == 0 && counted == 0 {
			t.Errorf("rank %d logged %d refusals of its listeners in full and counted %d more, want 1 to 10 in full (and rank 0's flood counted):\n%s", r, full, counted, lastLines(out, 40))
		}
		if r == 0 {
			full, counted := hostiletest.Logged(out, "refused connections to the rendezvous root", "bootstrap: refused connection", "bootstrap: bad join message")
			if full == 0 || full > 5 || counted == 0 {
				t.Errorf("rank 0 logged %d of the root's refusals in full and counted %d more, want 1 to 5 in full and the flood counted:\n%s", full, counted, lastLines(out, 40))
			}
		}
	}
	t.Logf("%d ports seen open during setup and the split; hostile connections:\n%s", len(setup)+len(split), hostiletest.Summary(append(outcomes, watched...)))
}

// envValue is the value of k in env (the last one set).
func envValue(env []string, k string) string {
	v := ""
	for _, kv := range env {
		if s, ok := strings.CutPrefix(kv, k+"="); ok {
			v = s
		}
	}
	return v
}

// recordHandshakes records what a valid rank 3 of the job (secret, tag)
// sends on its connection to the root and to a peer's listener, against
// decoys that hold the same secret: an eavesdropper's copy.
func recordHandshakes(t *testing.T, ctx context.Context, secret []byte, tag [8]byte) (root, comm []byte) {
	t.Helper()
	decoy, err := bootstrap.StartRoot("127.0.0.1:0", secret, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer decoy.Close()
	root, err = hostiletest.Record(ctx, decoy.Addr(), func(addr string) error {
		_, err := bootstrap.Exchange(ctx, addr, secret, 0, 1, []byte("{}"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tcp.Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			tcp.ServerHandshake(c, secret, tag, 0, time.Now().Add(10*time.Second), nil)
			c.Close()
		}
	}()
	comm, err = hostiletest.Record(ctx, ln.Addr().String(), func(addr string) error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = tcp.ClientHandshake(c, secret, tag, 3, time.Now().Add(10*time.Second))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return root, comm
}

// waitListening polls the processes pids until they listen on want ports
// beyond those in known, and returns the new ones.
func waitListening(t *testing.T, pids []int, known []netip.AddrPort, want int) []netip.AddrPort {
	t.Helper()
	var found []netip.AddrPort
	proctest.Until(t, time.Minute, fmt.Sprintf("%d new listening ports", want), func() bool {
		found = found[:0]
		for _, pid := range pids {
			ports, _ := hostiletest.ListeningPorts(pid)
			for _, ap := range ports {
				if !slices.Contains(known, ap) {
					found = append(found, ap)
				}
			}
		}
		return len(found) >= want
	})
	return found
}

// watchPorts attacks every port the processes pids open that is not in
// known, with every kind (held connections included), until the function
// it returns is called: that one stops watching, waits for the attacks
// (each bounded by ctx) and returns their outcomes.
func watchPorts(ctx context.Context, pids []int, known []netip.AddrPort) func() []hostiletest.Outcome {
	var mu sync.Mutex
	var out []hostiletest.Outcome
	var wg sync.WaitGroup
	seen := map[netip.AddrPort]bool{}
	for _, ap := range known {
		seen[ap] = true
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, pid := range pids {
				ports, _ := hostiletest.ListeningPorts(pid)
				for _, ap := range ports {
					if seen[ap] {
						continue
					}
					seen[ap] = true
					tg := hostiletest.Target{Addr: hostiletest.Dialable(ap)}
					wg.Go(func() {
						outs := append(hostiletest.All(ctx, tg), hostiletest.Hold(ctx, tg).Wait()...)
						mu.Lock()
						out = append(out, outs...)
						mu.Unlock()
					})
				}
			}
		}
	}()
	return func() []hostiletest.Outcome {
		close(stop)
		<-stopped
		wg.Wait()
		return out
	}
}
