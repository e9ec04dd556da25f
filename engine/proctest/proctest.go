// Package proctest (test support, like net/http/httptest) launches a test binary's ranks as real processes, the
// way a launcher would: each child is the test binary again, told its role
// by GOCOLL_TEST_ROLE and its place in the job by GOCOLL_RANK, GOCOLL_SIZE
// and GOCOLL_ROOT_ADDR. The package's TestMain dispatches on the role.
package proctest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// RoleVar names a child's role; empty in the parent test process.
const RoleVar = "GOCOLL_TEST_ROLE"

// Child is one rank's process and its combined output.
type Child struct {
	Cmd *exec.Cmd
	Out Buffer
	Err error // set by Wait
}

// Buffer collects a child's output while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreePort is a TCP port free on 127.0.0.1 for the job's root.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Start launches n ranks of role; env is added to every rank's
// environment and extra(rank), when not nil, to one rank's. The children
// are killed when the test ends.
func Start(t *testing.T, role string, n int, env []string, extra func(rank int) []string) []*Child {
	t.Helper()
	port := FreePort(t)
	kids := make([]*Child, n)
	for r := range n {
		ch := &Child{Cmd: exec.Command(os.Args[0], "-test.run=^$")}
		ch.Cmd.Env = append(os.Environ(), RoleVar+"="+role,
			"GOCOLL_RANK="+strconv.Itoa(r), "GOCOLL_SIZE="+strconv.Itoa(n),
			fmt.Sprintf("GOCOLL_ROOT_ADDR=127.0.0.1:%d", port), "GOCOLL_SECRET=test-secret")
		ch.Cmd.Env = append(ch.Cmd.Env, env...)
		if extra != nil {
			ch.Cmd.Env = append(ch.Cmd.Env, extra(r)...)
		}
		ch.Cmd.Stdout, ch.Cmd.Stderr = &ch.Out, &ch.Out
		if err := ch.Cmd.Start(); err != nil {
			t.Fatal(err)
		}
		kids[r] = ch
	}
	t.Cleanup(func() {
		for _, k := range kids {
			k.Cmd.Process.Kill()
		}
	})
	return kids
}

// Wait waits for every child, killing them and failing the test after
// limit.
func Wait(t *testing.T, kids []*Child, limit time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	for _, k := range kids {
		wg.Go(func() { k.Err = k.Cmd.Wait() })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		for _, k := range kids {
			k.Cmd.Process.Kill()
		}
		<-done
		for r, k := range kids {
			t.Logf("rank %d output:\n%s", r, k.Out.String())
		}
		t.Fatalf("ranks still running after %v", limit)
	}
}

// Until polls cond until it holds, failing the test after limit with "no
// <what> after <limit>". Tests wait with it for what they can observe (a
// child's output, a call pending, a file) instead of sleeping a fixed time
// and hoping it happened by then. It polls often at first and backs off to
// every 10 ms, so a condition met at once costs microseconds.
func Until(tb testing.TB, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for wait := 50 * time.Microsecond; !cond(); wait = min(2*wait, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("no %s after %v", what, limit)
		}
		time.Sleep(wait)
	}
}

// ExitCode is a finished child's exit status (-1 if it did not exit).
func ExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// RunInTempDir runs a package's tests (m.Run) with TMPDIR pointing at a
// directory of their own, removed afterwards, and returns the exit code.
// Communicators that fail or abort write flight-recorder dumps to the temp
// dir by default: a test binary that makes them fail on purpose, and the
// ranks it starts (they inherit TMPDIR), leave nothing behind this way.
func RunInTempDir(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "gocoll-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(tmp)
	os.Setenv("TMPDIR", tmp)
	// The tables that communicators across hosts cache (GOCOLL_TUNE) go
	// there too, not into the user's cache dir; but go build, which tests
	// run for their binaries, keeps the user's build cache (its default
	// follows XDG_CACHE_HOME; an empty one rebuilds every dependency).
	if os.Getenv("GOCACHE") == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			os.Setenv("GOCACHE", filepath.Join(dir, "go-build"))
		}
	}
	os.Setenv("XDG_CACHE_HOME", filepath.Join(tmp, "cache"))
	return m.Run()
}
