package engine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
	opts.hooks = childHooks()
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
			for _, algo := range []string{"", "allreduce=ring,reduce=tree,alltoall=bruck,broadcast=pipeline", "allreduce=hd,reducescatter=hd,alltoall=aggregate"} {
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
			for !strings.Contains(kids[0].Out.String(), "READY") {
				if time.Now().After(deadline) {
					t.Fatalf("ranks never got going: %s", kids[0].Out.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
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
	time.Sleep(200 * time.Millisecond)
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
