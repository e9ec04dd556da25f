package engine

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
	c, err := NewCommFromEnv(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child join:", err)
		return 3
	}
	switch role {
	case "conformance":
		s := suite{dtypes: []DataType{Float32, Float16, Bfloat16, Int8, Uint64, Float64}, ops: []RedOp{Sum, Max, Avg, Prod}, counts: []int{0, 1, 13, 1000}}
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

func freePort(t testing.TB) int {
	t.Helper()
	// The root binds port; rank listeners use kernel-chosen ports.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type child struct {
	cmd *exec.Cmd
	out syncBuffer
	err error
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRanks launches n ranks of role with the GOCOLL_RANK/SIZE/ROOT_ADDR
// launcher variables; extra adds variables (per rank).
func startRanks(t *testing.T, role string, n int, env []string, extra func(rank int) []string) []*child {
	t.Helper()
	port := freePort(t)
	kids := make([]*child, n)
	for r := 0; r < n; r++ {
		ch := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		ch.cmd.Env = append(os.Environ(), "GOCOLL_TEST_ROLE="+role,
			"GOCOLL_RANK="+strconv.Itoa(r), "GOCOLL_SIZE="+strconv.Itoa(n),
			fmt.Sprintf("GOCOLL_ROOT_ADDR=127.0.0.1:%d", port), "GOCOLL_SECRET=test-secret")
		ch.cmd.Env = append(ch.cmd.Env, env...)
		if extra != nil {
			ch.cmd.Env = append(ch.cmd.Env, extra(r)...)
		}
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.out, &ch.out
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		kids[r] = ch
	}
	t.Cleanup(func() {
		for _, k := range kids {
			k.cmd.Process.Kill()
		}
	})
	return kids
}

// waitRanks waits for every child, failing the test after limit.
func waitRanks(t *testing.T, kids []*child, limit time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	for _, k := range kids {
		wg.Add(1)
		go func() { defer wg.Done(); k.err = k.cmd.Wait() }()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		for _, k := range kids {
			k.cmd.Process.Kill()
		}
		<-done
		for r, k := range kids {
			t.Logf("rank %d output:\n%s", r, k.out.String())
		}
		t.Fatalf("ranks still running after %v", limit)
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// The conformance suite across real processes, over TCP and over shared memory.
func TestConformanceProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tr := range []string{"tcp", "auto"} {
		for _, n := range []int{2, 3, 4} {
			for _, algo := range []string{"", "allreduce=ring,reduce=tree,alltoall=bruck,broadcast=pipeline", "allreduce=hd,reducescatter=hd,alltoall=aggregate"} {
				t.Run(fmt.Sprintf("%s/n=%d/algo=%s", tr, n, algo), func(t *testing.T) {
					env := []string{"GOCOLL_TRANSPORT=" + tr, "GOCOLL_ALGO=" + algo, "GOCOLL_TIMEOUT=60s"}
					kids := startRanks(t, "conformance", n, env, nil)
					waitRanks(t, kids, 3*time.Minute)
					for r, k := range kids {
						if k.err != nil {
							t.Errorf("rank %d: %v\n%s", r, k.err, k.out.String())
						}
					}
				})
			}
		}
	}
	// Leftovers in /dev/shm are checked where each host's /dev/shm is
	// private (netns_test.go): here other packages' tests share it.
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
			deadline := time.Now().Add(60 * time.Second)
			for !strings.Contains(kids[0].out.String(), "READY") {
				if time.Now().After(deadline) {
					t.Fatalf("ranks never got going: %s", kids[0].out.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			killed := time.Now()
			kids[2].cmd.Process.Signal(syscall.SIGKILL)
			waitRanks(t, kids, 30*time.Second)
			if el := time.Since(killed); el > 20*time.Second {
				t.Errorf("survivors took %v to fail", el)
			}
			for r, k := range kids {
				if r == 2 {
					continue
				}
				if code := exitCode(k.err); code != 4 {
					t.Errorf("rank %d: exit %d, want 4 (collective error)\n%s", r, code, k.out.String())
				}
				if !strings.Contains(k.out.String(), "rank") {
					t.Errorf("rank %d: error does not name ranks: %s", r, k.out.String())
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
		if code := exitCode(k.err); code != 5 {
			t.Errorf("rank %d: exit %d, want 5 (mismatch reported)\n%s", r, code, k.out.String())
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
		ch := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		ch.cmd.Env = append(os.Environ(), "GOCOLL_TEST_ROLE=conformance", "GOCOLL_RANK="+strconv.Itoa(rank),
			"GOCOLL_SIZE=3", root, "GOCOLL_SECRET="+secret, "GOCOLL_TIMEOUT=20s", "GOCOLL_DEBUG=WARN")
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.out, &ch.out
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ch.cmd.Process.Kill() })
		return ch
	}
	r0 := launch(0, "right")
	time.Sleep(200 * time.Millisecond)
	imposter := launch(1, "wrong")
	waitRanks(t, []*child{imposter}, time.Minute)
	if imposter.err == nil {
		t.Fatalf("imposter joined: %s", imposter.out.String())
	}
	kids := []*child{r0, launch(1, "right"), launch(2, "right")}
	waitRanks(t, kids[1:], 2*time.Minute)
	waitRanks(t, kids[:1], time.Minute)
	for r, k := range kids {
		if k.err != nil {
			t.Errorf("rank %d: %v\n%s", r, k.err, k.out.String())
		}
	}
	if !strings.Contains(strings.ToLower(r0.out.String()), "secret") && !strings.Contains(strings.ToLower(r0.out.String()), "refused") {
		t.Errorf("root did not log the refused connection:\n%s", r0.out.String())
	}
}
