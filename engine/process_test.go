package engine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine/hostiletest"
	"github.com/gocoll/gocoll/engine/proctest"
)

// Child processes: the test binary re-executed with GOCOLL_TEST_ROLE set.
// Each joins through the launcher environment, like a real job.
func TestMain(m *testing.M) {
	if role := os.Getenv("GOCOLL_TEST_ROLE"); role != "" {
		os.Exit(childMain(role))
	}
	os.Exit(proctest.RunInTempDir(m))
}

func childMain(role string) int {
	opts, err := OptionsFromEnv(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child options:", err)
		return 2
	}
	opts.hooks = childHooks()
	// A rank told to wait joins only once the test opens the gate, and
	// connects over TCP (each time: the communicator, then every Split)
	// only once it opens gate 1, 2, ….
	if err := waitGate(joinGateVar); err != nil {
		fmt.Fprintln(os.Stderr, "child join:", err)
		return 3
	}
	if prefix := os.Getenv(tcpGateVar); prefix != "" {
		n := 0
		if opts.hooks == nil {
			opts.hooks = &testHooks{}
		}
		opts.hooks.beforeTCP = func() {
			n++
			if err := waitFile(fmt.Sprint(prefix, n)); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
	c, err := NewCommFromEnv(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child join:", err)
		return 3
	}
	switch role {
	case "conformance":
		s := suite{dtypes: []DataType{Float32, Float16, Bfloat16, Int8, Uint64, Float64, Int16, Bool}, ops: []RedOp{Sum, Max, Avg, Prod, Band, Bxor}, counts: []int{0, 1, 13, 1000}}
		if err := conformance(c, s); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", c.Rank(), err)
			return 1
		}
		big := suite{dtypes: []DataType{Float32}, ops: []RedOp{Sum}, counts: []int{1 << 20}, colls: map[string]bool{"allreduce": true, "broadcast": true, "alltoall": true, "allgather": true}}
		if err := conformance(c, big); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", c.Rank(), err)
			return 1
		}
		sub, err := c.Split(c.Rank()%2, c.Rank())
		if err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: split: %v\n", c.Rank(), err)
			return 1
		}
		if err := conformance(sub, suite{dtypes: []DataType{Int32}, ops: []RedOp{Sum}, counts: []int{7}}); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: sub: %v\n", c.Rank(), err)
			return 1
		}
		sub.Destroy()
	case "tags":
		if err := tagExchange(c); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", c.Rank(), err)
			return 1
		}
	case "anysource":
		if err := anySourceExchange(c); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", c.Rank(), err)
			return 1
		}
	case "loop":
		// Allreduce until something fails; report the error on stderr.
		b := make([]byte, 4<<10)
		for i := 0; ; i++ {
			if err := c.AllReduce(b, b, len(b)/4, Float32, Sum); err != nil {
				fmt.Fprintf(os.Stderr, "FAILED: %v\n", err)
				return 4
			}
			if i == 10 {
				fmt.Println("READY")
			}
		}
	case "setupkill": // the job lost a rank during setup: any call must fail
		err := c.Barrier()
		if err == nil {
			err = c.AllReduce(make([]byte, 64), make([]byte, 64), 16, Float32, Sum)
		}
		fmt.Fprintf(os.Stderr, "RESULT: %v\n", err)
		if err != nil {
			return 4
		}
	case "soak":
		if err := soak(c, soakConfigFromEnv()); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: soak: %v\n", c.Rank(), err)
			return 1
		}
	case "checked":
		// Allreduce with every result checked until the test says stop.
		iters, err := checkedLoop(c, 4<<10, stopFile())
		if err != nil {
			reportFailure(err)
			return 4
		}
		fmt.Printf("DONE iterations=%d\n", iters)
	case "abort":
		if code := abortRole(c); code != 0 {
			return code
		}
	case "hostile":
		if code := hostileRole(c); code != 0 {
			return code
		}
	case "elastic":
		return elasticRole(c)
	case "mismatch":
		b := make([]byte, 400)
		err := c.AllReduce(b, b, 10+c.Rank()%2, Float32, Sum)
		fmt.Fprintf(os.Stderr, "RESULT: %v\n", err)
		if errors.Is(err, ErrMismatch) || errors.Is(err, ErrRemoteAbort) {
			return 5
		}
		return 1
	}
	if err := c.Destroy(); err != nil {
		fmt.Fprintln(os.Stderr, "child destroy:", err)
		return 1
	}
	return 0
}

// errKinds are the kinds of failure a rank reports, in the order they are
// tested (a timeout relayed as a peer's abort is a remote abort here).
var errKinds = []struct {
	name string
	err  error
}{
	{"timeout", ErrTimeout}, {"peer lost", ErrPeerLost}, {"remote abort", ErrRemoteAbort},
	{"aborted", ErrAborted}, {"mismatch", ErrMismatch}, {"invalid usage", ErrInvalidUsage},
}

func errKind(err error) string {
	for _, k := range errKinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

// reportFailure prints a rank's failure in the form failure() parses: when
// (Unix nanoseconds, so that the test can tell how long after its fault),
// the kind and the error.
func reportFailure(err error) {
	fmt.Fprintf(os.Stderr, "FAILED at=%d kind=%q err=%v\n", time.Now().UnixNano(), errKind(err), err)
}

// rankFailure is what a rank reported with reportFailure.
type rankFailure struct {
	at   time.Time
	kind string
	err  string
}

var failureLine = regexp.MustCompile(`FAILED at=(\d+) kind="([^"]*)" err=(.*)`)

// failure finds a rank's reported failure in its output.
func failure(out string) (rankFailure, bool) {
	m := failureLine.FindStringSubmatch(out)
	if m == nil {
		return rankFailure{}, false
	}
	ns, _ := strconv.ParseInt(m[1], 10, 64)
	return rankFailure{at: time.Unix(0, ns), kind: m[2], err: m[3]}, true
}

// stopVar names the file whose existence ends checkedLoop (stopFile).
const stopVar = "GOCOLL_TEST_STOP"

// stopFile stops a checkedLoop once the file GOCOLL_TEST_STOP names exists.
func stopFile() func(int) bool {
	path := os.Getenv(stopVar)
	return func(int) bool {
		_, err := os.Stat(path)
		return path != "" && err == nil
	}
}

// checkedLoop allreduces count float32s in a loop and checks every result,
// until stop(i) is true on rank 0 after call i: rank 0's decision travels
// in the allreduce itself (one more element), so every rank stops after the
// same call. It prints READY after 10 calls and "ITER n" at most every
// 50 ms, and returns how many calls it made.
func checkedLoop(c *Comm, count int, stop func(i int) bool) (int, error) {
	n := c.Size()
	buf := make([]float32, count+1)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 4*len(buf))
	last := time.Now()
	for i := 0; ; i++ {
		for j := range count {
			buf[j] = float32((c.Rank() + 1) * ((i+j)%7 + 1))
		}
		buf[count] = 0
		if c.Rank() == 0 && stop(i) {
			buf[count] = 1
		}
		if err := c.AllReduce(b, b, len(buf), Float32, Sum); err != nil {
			return i, err
		}
		for j := range count {
			if want := float32(n * (n + 1) / 2 * ((i+j)%7 + 1)); buf[j] != want {
				return i, fmt.Errorf("allreduce %d on rank %d: element %d is %v, want %v", i, c.Rank(), j, buf[j], want)
			}
		}
		if i == 10 {
			fmt.Println("READY")
		}
		if time.Since(last) >= 50*time.Millisecond {
			fmt.Printf("ITER %d\n", i)
			last = time.Now()
		}
		if buf[count] != 0 {
			return i + 1, nil
		}
	}
}

// lastIter is the last "ITER n" a checkedLoop rank printed (-1: none).
func lastIter(out string) int {
	i := strings.LastIndex(out, "ITER ")
	if i < 0 {
		return -1
	}
	n, _ := strconv.Atoi(strings.Fields(out[i+5:])[0])
	return n
}

// Gates: files a rank waits for before joining (joinGateVar), before it
// connects over TCP (tcpGateVar: a prefix, numbered from 1), or before its
// role's next step (gateVar), when the variable is set.
const (
	joinGateVar = "GOCOLL_TEST_JOIN_GATE"
	tcpGateVar  = "GOCOLL_TEST_TCP_GATE"
	gateVar     = "GOCOLL_TEST_GATE"
)

// waitGate waits for the file named by the variable v (waitFile); at once
// when v is unset.
func waitGate(v string) error {
	if path := os.Getenv(v); path != "" {
		return waitFile(path)
	}
	return nil
}

// waitFile waits until the file path exists, a minute at most.
func waitFile(path string) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
	}
	return fmt.Errorf("gate %s never opened", path)
}

// abortRole: rank 0 starts an allreduce that the others do not join and
// aborts it from another goroutine (abortBlocked); the others wait for the
// test's gate, then join that allreduce and call more: one must fail with
// the abort (or the loss of rank 0, if it has exited). The first may still
// succeed where it needs only what rank 0 sent before it aborted (a rank's
// abort does not take back its messages); the next needs rank 0 again, or
// a peer that learnt of the abort.
func abortRole(c *Comm) int {
	if c.Rank() != 0 {
		if err := waitGate(gateVar); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		b := make([]byte, abortBytes)
		var err error
		calls := 0
		for ; calls < 3 && err == nil; calls++ {
			err = c.AllReduce(b, b, len(b)/4, Float32, Sum)
		}
		fmt.Fprintf(os.Stderr, "PEER calls=%d kind=%q err=%v\n", calls, errKind(err), err)
		if !errors.Is(err, ErrRemoteAbort) && !errors.Is(err, ErrPeerLost) {
			return 1
		}
		return 0
	}
	took, err := abortBlocked(c)
	fmt.Fprintf(os.Stderr, "ABORTED after=%v kind=%q err=%v\n", took, errKind(err), err)
	if !errors.Is(err, ErrAborted) {
		return 1
	}
	return 0
}

// abortBytes is the size of abortRole's allreduce.
const abortBytes = 64 << 10

// abortBlocked starts an allreduce on c that no peer joins and, once the
// flight recorder shows it in flight, aborts c from another goroutine. It
// returns the allreduce's error and how long after Abort it returned.
func abortBlocked(c *Comm) (time.Duration, error) {
	aborted := make(chan time.Time, 1)
	returned := make(chan struct{})
	go func() {
		for {
			for _, r := range c.state("probe").InFlight {
				if r.Op == "allreduce" {
					aborted <- time.Now()
					c.Abort()
					return
				}
			}
			select {
			case <-returned:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	b := make([]byte, abortBytes)
	err := c.AllReduce(b, b, len(b)/4, Float32, Sum)
	close(returned)
	select {
	case at := <-aborted:
		return time.Since(at), err
	default:
		return 0, fmt.Errorf("the allreduce returned before it was aborted: %w", err)
	}
}

// The launching helpers are proctest's; these names keep the tests short.
var (
	freePort  = proctest.FreePort
	waitRanks = proctest.Wait
	exitCode  = proctest.ExitCode
)

type child = proctest.Child

func startRanks(t *testing.T, role string, n int, env []string, extra func(rank int) []string) []*child {
	t.Helper()
	return proctest.Start(t, role, n, env, extra)
}

// The conformance suite across real processes, over TCP and over shared memory.
func TestConformanceProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tr := range []string{"tcp", "auto"} {
		for _, n := range []int{2, 3, 4} {
			for _, algo := range []string{"", "allreduce=ring,reduce=tree,alltoall=bruck,broadcast=pipeline", "allreduce=hd,reducescatter=hd,alltoall=aggregate-leader,alltoallv=aggregate,alltoallw=aggregate",
				"alltoall=aggregate-tree,alltoallv=aggregate-tree,alltoallw=aggregate-tree"} {
				t.Run(fmt.Sprintf("%s/n=%d/algo=%s", tr, n, algo), func(t *testing.T) {
					env := []string{"GOCOLL_TRANSPORT=" + tr, "GOCOLL_ALGO=" + algo, "GOCOLL_TIMEOUT=60s"}
					kids := startRanks(t, "conformance", n, env, nil)
					waitRanks(t, kids, 3*time.Minute)
					for r, k := range kids {
						if k.Err != nil {
							t.Errorf("rank %d: %v\n%s", r, k.Err, k.Out.String())
						}
					}
				})
			}
		}
	}
	// Leftovers in /dev/shm are checked where each host's /dev/shm is
	// private (netns_test.go): here other packages' tests share it.
}

// Tagged sends and receives across processes (p2p_test.go's exchange),
// over TCP and over shared memory.
func TestTaggedProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	roleProcesses(t, "tags")
}

// roleProcesses runs a child role on 3 ranks, over TCP and over shared
// memory, and fails the test with the output of every rank that failed.
func roleProcesses(t *testing.T, role string) {
	for _, tr := range []string{"tcp", "auto"} {
		t.Run(tr, func(t *testing.T) {
			kids := startRanks(t, role, 3, []string{"GOCOLL_TRANSPORT=" + tr, "GOCOLL_TIMEOUT=60s"}, nil)
			waitRanks(t, kids, 2*time.Minute)
			for r, k := range kids {
				if k.Err != nil {
					t.Errorf("rank %d: %v\n%s", r, k.Err, k.Out.String())
				}
			}
		})
	}
}

// A killed rank makes every survivor fail with an error, within seconds.
func TestKilledPeerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tr := range []string{"tcp", "auto"} {
		t.Run(tr, func(t *testing.T) {
			env := []string{"GOCOLL_TRANSPORT=" + tr, "GOCOLL_TIMEOUT=120s"}
			kids := startRanks(t, "loop", 4, env, nil)
			waitOutput(t, kids[0], "READY", time.Minute)
			killed := time.Now()
			kids[2].Cmd.Process.Signal(syscall.SIGKILL)
			waitRanks(t, kids, 30*time.Second)
			if el := time.Since(killed); el > 20*time.Second {
				t.Errorf("survivors took %v to fail", el)
			}
			for r, k := range kids {
				if r == 2 {
					continue
				}
				if code := exitCode(k.Err); code != 4 {
					t.Errorf("rank %d: exit %d, want 4 (collective error)\n%s", r, code, k.Out.String())
				}
				if !strings.Contains(k.Out.String(), "rank") {
					t.Errorf("rank %d: error does not name ranks: %s", r, k.Out.String())
				}
			}
		})
	}
}

// Ranks that call mismatched collectives all get a clear error.
func TestMismatchProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	kids := startRanks(t, "mismatch", 3, []string{"GOCOLL_TIMEOUT=60s"}, nil)
	waitRanks(t, kids, time.Minute)
	for r, k := range kids {
		if code := exitCode(k.Err); code != 5 {
			t.Errorf("rank %d: exit %d, want 5 (mismatch reported)\n%s", r, code, k.Out.String())
		}
	}
}

// A process with the wrong secret is refused and the job still forms.
func TestWrongSecretProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	port := freePort(t)
	root := fmt.Sprintf("GOCOLL_ROOT_ADDR=127.0.0.1:%d", port)
	launch := func(rank int, secret string) *child {
		ch := &child{Cmd: exec.Command(os.Args[0], "-test.run=^$")}
		ch.Cmd.Env = append(os.Environ(), "GOCOLL_TEST_ROLE=conformance", "GOCOLL_RANK="+strconv.Itoa(rank),
			"GOCOLL_SIZE=3", root, "GOCOLL_SECRET="+secret, "GOCOLL_TIMEOUT=20s", "GOCOLL_DEBUG=WARN")
		ch.Cmd.Stdout, ch.Cmd.Stderr = &ch.Out, &ch.Out
		if err := ch.Cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ch.Cmd.Process.Kill() })
		return ch
	}
	r0 := launch(0, "right")
	// The imposter must meet rank 0's root, not retry until it gives up.
	proctest.Until(t, time.Minute, "root listening in rank 0", func() bool {
		ports, _ := hostiletest.ListeningPorts(r0.Cmd.Process.Pid)
		return len(ports) > 0
	})
	imposter := launch(1, "wrong")
	waitRanks(t, []*child{imposter}, time.Minute)
	if imposter.Err == nil {
		t.Fatalf("imposter joined: %s", imposter.Out.String())
	}
	kids := []*child{r0, launch(1, "right"), launch(2, "right")}
	waitRanks(t, kids[1:], 2*time.Minute)
	waitRanks(t, kids[:1], time.Minute)
	for r, k := range kids {
		if k.Err != nil {
			t.Errorf("rank %d: %v\n%s", r, k.Err, k.Out.String())
		}
	}
	if !strings.Contains(strings.ToLower(r0.Out.String()), "secret") && !strings.Contains(strings.ToLower(r0.Out.String()), "refused") {
		t.Errorf("root did not log the refused connection:\n%s", r0.Out.String())
	}
}

// TestAbortBlocked: Abort from another goroutine returns an allreduce
// blocked on a peer that never comes, with ErrAborted (in-process
// transport).
func TestAbortBlocked(t *testing.T) {
	comms := newLocal(t, 2, Options{Timeout: time.Minute})
	took, err := abortBlocked(comms[0])
	if !errors.Is(err, ErrAborted) {
		t.Fatalf("blocked allreduce after Abort: %v", err)
	}
	t.Logf("returned %v after Abort: %v", took, err)
	b := make([]byte, abortBytes)
	if err := comms[1].AllReduce(b, b, len(b)/4, Float32, Sum); !errors.Is(err, ErrRemoteAbort) {
		t.Errorf("the peer's next call: %v, want the abort", err)
	}
}

// TestAbortBlockedProcesses: the same across processes, over every
// transport: TCP, the shared-memory rings (a message algorithm forced),
// the shared-memory collectives, and TCP and shared memory together across
// emulated hosts. The peers, released afterwards, fail their next call
// with the abort.
func TestAbortBlockedProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"tcp", []string{"GOCOLL_TRANSPORT=tcp"}},
		{"shm rings", []string{"GOCOLL_ALGO=ring"}},
		{"shm collectives", nil},
		{"2 hosts", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate := filepath.Join(t.TempDir(), "gate")
			env := append([]string{"GOCOLL_TIMEOUT=60s", gateVar + "=" + gate, "GOCOLL_DEBUG=INFO"}, tc.env...)
			var kids []*child
			if tc.name == "2 hosts" {
				kids = newHosts(t, 2).startRanks("abort", 2, env...)
			} else {
				kids = startRanks(t, "abort", 4, env, nil)
			}
			waitOutput(t, kids[0], "ABORTED", time.Minute)
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			waitRanks(t, kids, time.Minute)
			for r, k := range kids {
				out := k.Out.String()
				if k.Err != nil {
					t.Errorf("rank %d: %v\n%s", r, k.Err, lastLines(out, 20))
					continue
				}
				for _, line := range strings.Split(out, "\n") {
					if strings.HasPrefix(line, "ABORTED") || strings.HasPrefix(line, "PEER") || strings.Contains(line, `msg=connected`) {
						t.Logf("rank %d: %s", r, line)
					}
				}
			}
		})
	}
}
