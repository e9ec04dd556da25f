package engine

import (
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/proctest"
)

// childHooks: a child process whose rank is GOCOLL_TEST_KILL_RANK kills
// itself with SIGKILL at setup point GOCOLL_TEST_KILL_AT (a setupPoint's
// number) of its communicator's setup.
func childHooks() *testHooks {
	at, err := strconv.Atoi(os.Getenv("GOCOLL_TEST_KILL_AT"))
	if err != nil || os.Getenv("GOCOLL_TEST_KILL_RANK") != os.Getenv("GOCOLL_RANK") {
		return nil
	}
	return &testHooks{setup: func(p setupPoint) {
		if p == setupPoint(at) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}}
}

func killedBySignal(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// childEnv is the value of key in a child's environment.
func childEnv(k *child, key string) string {
	for _, kv := range k.Cmd.Env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestKilledDuringSetup SIGKILLs a rank at every point of its setup (a
// hook, not a timer): the other ranks fail with an error, none hangs, and
// no shared memory of the job is left in /dev/shm. Segments used to be
// files there, unlinked only once every rank had connected: a rank killed
// in between left its segments for good.
func TestKilledDuringSetup(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	const n = 3
	type kill struct {
		victim int
		at     setupPoint
	}
	var cases []kill
	for p := range numSetupPoints {
		cases = append(cases, kill{1, p})
	}
	cases = append(cases, kill{0, setupCreated}) // the rank that runs the rendezvous root
	for _, tc := range cases {
		t.Run(fmt.Sprintf("rank%d/%v", tc.victim, tc.at), func(t *testing.T) {
			env := []string{"GOCOLL_TIMEOUT=5s", "GOCOLL_DEBUG=WARN",
				fmt.Sprintf("GOCOLL_TEST_KILL_AT=%d", int(tc.at)), fmt.Sprintf("GOCOLL_TEST_KILL_RANK=%d", tc.victim)}
			kids := startRanks(t, "setupkill", n, env, nil)
			job, err := bootstrap.FromEnv(func(k string) string { return childEnv(kids[0], k) })
			if err != nil {
				t.Fatal(err)
			}
			tag := commTag(job.Secret, job.RootAddr)
			start := time.Now()
			waitRanks(t, kids, time.Minute)
			for r, k := range kids {
				switch {
				case r == tc.victim:
					if !killedBySignal(k.Err, syscall.SIGKILL) {
						t.Errorf("rank %d was not killed at %v: %v\n%s", r, tc.at, k.Err, k.Out.String())
					}
				case exitCode(k.Err) != 3 && exitCode(k.Err) != 4:
					t.Errorf("rank %d: exit %d, want 3 (setup failed) or 4 (first call failed)\n%s", r, exitCode(k.Err), k.Out.String())
				}
			}
			t.Logf("survivors done %v after start", time.Since(start).Round(time.Millisecond))
			if left := shmtest.Files("gocoll-*" + hex.EncodeToString(tag[:])); len(left) > 0 {
				t.Errorf("left in /dev/shm: %v", left)
			}
		})
	}
}

// syncLog is a logger whose output the test reads while ranks write.
func syncLog() (*slog.Logger, *proctest.Buffer) {
	var b proctest.Buffer
	return slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo})), &b
}

// newJob joins n ranks in this process over the real transports, rank r
// with opts(r).
func newJob(t testing.TB, n int, opts func(rank int) Options) ([]*Comm, []error) {
	t.Helper()
	id, err := NewUniqueID(opts(0))
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, n)
	errs := runIndexed(n, func(r int) error {
		var err error
		comms[r], err = NewComm(id, n, r, opts(r))
		return err
	})
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Destroy()
			}
		}
	})
	return comms, errs
}

// denied is an opener for a process that may not open other processes'
// /proc/<pid>/fd (another user, a non-dumpable process).
func denied(pid, fd, flags int) (int, error) {
	return -1, &os.PathError{Op: "open", Path: shmsync.FileRef{Pid: pid, Fd: fd}.String(), Err: syscall.EACCES}
}

// TestNoProcFdAccess: a rank that may not open its peers' memory files
// (injected: the opener fails as for another user) makes every rank fall
// back alike: TCP between it and the others, shared memory among the
// others, no shared-memory collectives anywhere, MemAlloc private memory
// on every rank, every collective correct, and both sides say why.
func TestNoProcFdAccess(t *testing.T) {
	const n, blind = 4, 1
	logs := make([]*proctest.Buffer, n)
	comms, errs := newJob(t, n, func(r int) Options {
		o := Options{Timeout: time.Minute}
		o.Logger, logs[r] = syncLog()
		if r == blind {
			o.hooks = &testHooks{open: denied}
		}
		return o
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	mustRanks(t, comms, func(c *Comm) error {
		if c.arena != nil {
			return errors.New("shared-memory collectives on, though one rank cannot map its peers")
		}
		b, err := c.MemAlloc(1 << 20)
		if err != nil {
			return err
		}
		if c.allocs[addr(b)].shared {
			return errors.New("MemAlloc gave shared memory without an arena")
		}
		defer c.MemFree(b)
		s := suite{dtypes: []DataType{Float32, Int8}, ops: []RedOp{Sum, Max}, counts: []int{0, 7, 100000}}
		return conformance(c, s)
	})
	for r, l := range logs {
		out := l.String()
		want := "shm_peers=2 tcp_peers=1"
		if r == blind {
			want = "shm_peers=0 tcp_peers=3"
			if strings.Count(out, "cannot map the shared memory of a rank") != n-1 || !strings.Contains(out, "permission denied") {
				t.Errorf("rank %d does not say why it cannot map its peers:\n%s", r, out)
			}
		} else if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "cannot map this rank's shared memory") || !strings.Contains(out, fmt.Sprintf("peer=%d", blind)) {
			t.Errorf("rank %d does not say that rank %d uses TCP to it:\n%s", r, blind, out)
		}
		if !strings.Contains(out, want) {
			t.Errorf("rank %d did not connect with %s:\n%s", r, want, out)
		}
	}
}

// TestProcFdDeniedAfterProbe: when opening peers' memory files fails
// after the probe passed (segments at setup, or a registered buffer in a
// collective), every rank gets an error; none hangs.
func TestProcFdDeniedAfterProbe(t *testing.T) {
	const n = 3
	t.Run("setup", func(t *testing.T) {
		// Rank 2 may open the probes (read-only) but not the segments.
		rdonlyOnly := func(pid, fd, flags int) (int, error) {
			if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
				return denied(pid, fd, flags)
			}
			return shmsync.OpenProcFd(pid, fd, flags)
		}
		_, errs := newJob(t, n, func(r int) Options {
			o := Options{Timeout: 20 * time.Second}
			if r == 2 {
				o.hooks = &testHooks{open: rdonlyOnly}
			}
			return o
		})
		for r, err := range errs {
			if err == nil {
				t.Errorf("rank %d joined", r)
			} else if r == 2 && !errors.Is(err, syscall.EACCES) {
				t.Errorf("rank %d: %v, want permission denied", r, err)
			}
		}
	})
	t.Run("registered buffer", func(t *testing.T) {
		var deny atomic.Bool
		later := func(pid, fd, flags int) (int, error) {
			if deny.Load() {
				return denied(pid, fd, flags)
			}
			return shmsync.OpenProcFd(pid, fd, flags)
		}
		comms, errs := newJob(t, n, func(r int) Options {
			o := Options{Timeout: 20 * time.Second}
			if r == 1 {
				o.hooks = &testHooks{open: later}
			}
			return o
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		deny.Store(true)
		const count = 1 << 18 // past the size where peers read MemAlloc'd send buffers in place
		for r, err := range runRanks(comms, func(c *Comm) error {
			if c.arena == nil {
				return errors.New("no arena")
			}
			b, err := c.MemAlloc(4 * count)
			if err != nil {
				return err
			}
			defer c.MemFree(b)
			return c.AllReduce(b, make([]byte, 4*count), count, Float32, Sum)
		}) {
			if err == nil {
				t.Errorf("rank %d: no error", r)
			} else if r == 1 && !errors.Is(err, syscall.EACCES) {
				t.Errorf("rank %d: %v, want permission denied", r, err)
			}
		}
	})
}

// usage is what a process holds: goroutines, threads, descriptors,
// resident memory, and this process's memory files of gocoll (open or
// mapped: none may stay once every communicator is destroyed).
type usage struct {
	goroutines, threads, fds int
	rssKiB                   int
	memfds                   int
}

func measure(t testing.TB) usage {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	count := func(dir string) int {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	u := usage{goroutines: runtime.NumGoroutine(), threads: count("/proc/self/task"), fds: count("/proc/self/fd")}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			u.rssKiB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	u.memfds = len(shmtest.Fds("gocoll-")) + len(shmtest.Maps("gocoll-"))
	return u
}

// settled waits until the counts that must come back exactly (goroutines,
// descriptors, memory files) are at most base's, or the deadline passes,
// and returns the last measurement. Goroutines of a destroyed
// communicator (its root, its connections' readers) end shortly after
// Destroy returns.
func settled(t testing.TB, base usage) usage {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := measure(t)
		if u.goroutines <= base.goroutines && u.fds <= base.fds && u.memfds == 0 || time.Now().After(deadline) {
			return u
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// multiCycles is how many create/destroy cycles of multi-rank
// communicators TestCreateDestroyCycles runs: a fifth of GOCOLL_TEST_CYCLES
// (the long run sets 1000; the C and Python tests run that many, in processes of
// their own), else 40.
func multiCycles() int {
	if n, err := strconv.Atoi(os.Getenv("GOCOLL_TEST_CYCLES")); err == nil && n >= 10 {
		return n / 5
	}
	return 40
}

// warmCycles is the warm-up of a run of n cycles: the first tenth, at least
// 30 (half of short runs). The heap takes a few dozen cycles to reach its
// steady size.
func warmCycles(n int) int { return max(n/10, min(30, n/2)) }

// TestCreateDestroyCycles creates and destroys communicators over the real
// transports (TCP, shared-memory rings and collectives) many times in this
// process: 1,000 one-rank ones, and 3 ranks as goroutines (multiCycles),
// each used for a small allreduce, a MemAlloc/MemFree and a split with a
// collective on the child. Nothing is ever named in /dev/shm; after the
// warm-up (warmCycles), goroutines, descriptors and memory files must come
// back exactly, threads and resident memory stay within a small bound.
func TestCreateDestroyCycles(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n         int
		transport string
	}{
		{"n=1", 1, "auto"},
		{"n=3/auto", 3, "auto"},
		{"n=3/tcp", 3, "tcp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cycles := 1000
			if tc.n > 1 {
				cycles = multiCycles()
			}
			opts := Options{Transport: tc.transport, Timeout: time.Minute}
			cycle := func(i int) {
				id, err := NewUniqueID(opts)
				if err != nil {
					t.Fatal(err)
				}
				comms := make([]*Comm, tc.n)
				for r, err := range runIndexed(tc.n, func(r int) error {
					var err error
					comms[r], err = NewComm(id, tc.n, r, opts)
					return err
				}) {
					if err != nil {
						t.Fatalf("cycle %d: rank %d: %v", i, r, err)
					}
				}
				errs := runRanks(comms, func(c *Comm) error {
					b := make([]byte, 64)
					if err := c.AllReduce(b, b, 16, Float32, Sum); err != nil {
						return err
					}
					m, err := c.MemAlloc(4096)
					if err != nil {
						return err
					}
					if err := c.AllReduce(m[:64], m[:64], 16, Float32, Sum); err != nil {
						return err
					}
					if err := c.MemFree(m); err != nil {
						return err
					}
					sub, err := c.Split(c.Rank()%2, 0)
					if err != nil {
						return err
					}
					if err := sub.AllReduce(b, b, 16, Float32, Sum); err != nil {
						return err
					}
					if err := sub.Destroy(); err != nil {
						return err
					}
					return c.Destroy()
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("cycle %d: rank %d: %v", i, r, err)
					}
				}
				root, secret, err := id.Parse()
				if err != nil {
					t.Fatal(err)
				}
				tag := commTag(secret, root)
				if left := shmtest.Files("gocoll-*" + hex.EncodeToString(tag[:])); len(left) > 0 {
					t.Fatalf("cycle %d left in /dev/shm: %v", i, left)
				}
			}
			base, end := cycled(t, cycles, cycle)
			// The Go runtime keeps its idle threads: their count is the
			// most ever needed at once, which may creep up by one or two.
			if end.threads > base.threads+3 {
				t.Errorf("threads %d → %d", base.threads, end.threads)
			}
			if end.rssKiB > base.rssKiB+8<<10 && !raceEnabled {
				t.Errorf("resident memory %d → %d KiB", base.rssKiB, end.rssKiB)
			}
		})
	}
}

// cycled runs cycle(0), …, cycle(n-1), the first warmCycles(n) as a
// warm-up, and fails the test unless goroutines, descriptors and memory
// files come back to where they were after the warm-up. It returns the
// usage then and at the end.
func cycled(t testing.TB, n int, cycle func(i int)) (base, end usage) {
	t.Helper()
	warm := warmCycles(n)
	start := time.Now()
	for i := range warm {
		cycle(i)
	}
	base = settled(t, measure(t))
	for i := warm; i < n; i++ {
		cycle(i)
	}
	end = settled(t, base)
	t.Logf("%d cycles in %v; after %d: %+v; after %d: %+v", n, time.Since(start).Round(time.Millisecond), warm, base, n, end)
	if end.goroutines > base.goroutines || end.fds > base.fds || end.memfds != 0 {
		t.Errorf("grew: goroutines %d → %d, descriptors %d → %d, memory files open or mapped %d", base.goroutines, end.goroutines, base.fds, end.fds, end.memfds)
	}
	return base, end
}

// runIndexed runs f(0..n-1) each on its own goroutine and returns the
// errors by index.
func runIndexed(n int, f func(i int) error) []error {
	errs := make([]error, n)
	done := make(chan int)
	for i := range n {
		go func() { errs[i] = f(i); done <- i }()
	}
	for range n {
		<-done
	}
	return errs
}
