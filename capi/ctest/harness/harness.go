// Package harness builds libgocoll with build/build.sh and runs C and C++
// programs against it as separate processes (one per rank, started with
// exec: a process that loaded the library must never fork). It serves the
// tests in capi/ctest and examples/cpp; Go itself never loads the library.
package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/proctest"
)

// Lib is a built library laid out as an install prefix.
type Lib struct {
	Prefix string
}

func (l *Lib) LibDir() string        { return filepath.Join(l.Prefix, "lib") }
func (l *Lib) IncludeDir() string    { return filepath.Join(l.Prefix, "include") }
func (l *Lib) PkgConfigPath() string { return filepath.Join(l.Prefix, "lib", "pkgconfig") }

// RepoRoot is the module root: the closest directory upwards from the
// working directory whose go.mod declares github.com/gocoll/gocoll.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/gocoll/gocoll\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("harness: no go.mod of github.com/gocoll/gocoll above the working directory")
		}
		dir = parent
	}
}

// Build runs build/build.sh into dir. When GOCOLL_TEST_PREFIX names a
// prefix that already holds a build (from build/build.sh), that one is used
// as is, so that CI can build once and test many times.
func Build(dir string) (*Lib, error) {
	if p := os.Getenv("GOCOLL_TEST_PREFIX"); p != "" {
		l := &Lib{Prefix: p}
		if _, err := os.Stat(filepath.Join(l.LibDir(), "libgocoll.so")); err != nil {
			return nil, fmt.Errorf("harness: GOCOLL_TEST_PREFIX=%s: %w", p, err)
		}
		return l, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("sh", filepath.Join(root, "build", "build.sh"), dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("harness: build/build.sh %s: %v\n%s", dir, err, out)
	}
	return &Lib{Prefix: dir}, nil
}

// Compile builds srcs into the executable out with compiler ("gcc", "g++",
// …) against the library: its header, -lgocoll and an rpath to its lib
// directory, with warnings as errors.
func (l *Lib) Compile(compiler, out string, srcs []string, extra ...string) error {
	args := []string{"-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-I", l.IncludeDir(), "-o", out}
	args = append(args, srcs...)
	args = append(args, extra...)
	args = append(args, "-L", l.LibDir(), "-Wl,-rpath,"+l.LibDir(), "-lgocoll", "-lm")
	cmd := exec.Command(compiler, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: %s %s: %v\n%s", compiler, strings.Join(args, " "), err, b)
	}
	return nil
}

// FreePortPair returns a port p such that p and p+1 are both free right
// now: torchrun's store owns MASTER_PORT, gocoll's rendezvous takes
// MASTER_PORT+1. The ports are drawn below the kernel's ephemeral range, so
// that the listeners and connections of ranks running meanwhile (which get
// ephemeral ports) cannot take them before the rank that needs them binds.
func FreePortPair() (int, error) { return FreePorts(2) }

// FreePorts returns a port p such that p … p+n-1 are all free right now,
// drawn like FreePortPair's (GOCOLL_METRICS_ADDR gives each local rank the
// next port).
func FreePorts(n int) (int, error) {
	lo, hi := 20000, 32000
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if eph, err := strconv.Atoi(f[0]); err == nil && eph-2 > 1024 {
				hi = eph - 2
				lo = max(1024, min(lo, hi-1000))
			}
		}
	}
	free := func(p int) bool {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
	for range 200 {
		p := lo + rand.IntN(hi-lo-n)
		ok := true
		for i := 0; i < n && ok; i++ {
			ok = free(p + i)
		}
		if ok {
			return p, nil
		}
	}
	return 0, fmt.Errorf("harness: no %d consecutive free ports", n)
}

// launcherPrefixes are variables a launcher may have left in the test's own
// environment; ranks must see only the ones the test sets.
var launcherPrefixes = []string{"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=",
	"MASTER_", "TORCHELASTIC_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "GOCOLL_"}

// Env is this process's environment without launcher and GOCOLL_
// variables, with GODEBUG=cgocheck=1 (the library's pointer rules are
// checked) and a GOCOLL_TIMEOUT that keeps a broken test short, then extra.
func Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		skip := strings.HasPrefix(kv, "GODEBUG=")
		for _, p := range launcherPrefixes {
			skip = skip || strings.HasPrefix(kv, p)
		}
		if !skip {
			env = append(env, kv)
		}
	}
	env = append(env, "GODEBUG=cgocheck=1", "GOCOLL_TIMEOUT=30s")
	return append(env, extra...)
}

// TorchrunEnv is the environment torchrun gives rank `rank` of `n` on one
// host whose store listens on port.
func TorchrunEnv(rank, n, port int) []string {
	return []string{
		"MASTER_ADDR=127.0.0.1",
		"MASTER_PORT=" + strconv.Itoa(port),
		"RANK=" + strconv.Itoa(rank),
		"WORLD_SIZE=" + strconv.Itoa(n),
		"LOCAL_RANK=" + strconv.Itoa(rank),
		"LOCAL_WORLD_SIZE=" + strconv.Itoa(n),
		"GROUP_RANK=0",
		"TORCHELASTIC_RUN_ID=gocoll-ctest-" + strconv.Itoa(port),
	}
}

// PrivateShm gives the programs started through the returned wrapper a
// /dev/shm of their own, all the same one: a tmpfs mounted on a temporary
// directory (dir), bound over /dev/shm in a mount namespace of each
// process (unshare). What a job leaves there is then exactly what the
// test made, whatever else runs on the machine. ok is false, and nothing
// is done, without root or unshare.
func PrivateShm(t testing.TB) (wrap func(bin string, args ...string) (string, []string), dir string, ok bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, "", false
	}
	for _, tool := range []string{"unshare", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, "", false
		}
	}
	dir = t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=512m,mode=1777", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Logf("no private /dev/shm (mount: %v: %s)", err, out)
		return nil, "", false
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	if out, err := exec.Command("unshare", "--mount", "sh", "-c", `mount --bind "$0" /dev/shm`, dir).CombinedOutput(); err != nil {
		t.Logf("no private /dev/shm (unshare: %v: %s)", err, out)
		return nil, "", false
	}
	wrap = func(bin string, args ...string) (string, []string) {
		return "unshare", append([]string{"--mount", "sh", "-c", `mount --bind "$0" /dev/shm && exec "$@"`, dir, bin}, args...)
	}
	return wrap, dir, true
}

// Proc is a started program (one rank).
type Proc struct {
	Name   string
	Cmd    *exec.Cmd
	stdout proctest.Buffer
	stderr proctest.Buffer
	done   chan struct{}
	err    error
}

// Start runs bin with args and env; stdin may be nil. The process is killed
// when ctx ends.
func Start(ctx context.Context, name string, env []string, stdin io.Reader, bin string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, done: make(chan struct{})}
	p.Cmd = exec.CommandContext(ctx, bin, args...)
	p.Cmd.Env = env
	p.Cmd.Stdin = stdin
	p.Cmd.Stdout = &p.stdout
	p.Cmd.Stderr = &p.stderr
	p.Cmd.WaitDelay = 5 * time.Second
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness: start %s: %w", name, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Wait waits for the process to exit and returns its exit error.
func (p *Proc) Wait() error {
	<-p.done
	return p.err
}

// Done is closed when the process exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stdout is what the process printed on stdout so far.
func (p *Proc) Stdout() string { return p.stdout.String() }

// Output is everything the process printed so far, for failure messages.
func (p *Proc) Output() string {
	return fmt.Sprintf("--- %s stdout:\n%s--- %s stderr:\n%s", p.Name, p.stdout.String(), p.Name, p.stderr.String())
}

// WaitLine waits until stdout holds a line starting with prefix and
// returns it, or fails when the process exits or ctx ends first.
func (p *Proc) WaitLine(ctx context.Context, prefix string) (string, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, line := range strings.Split(p.stdout.String(), "\n") {
			if strings.HasPrefix(line, prefix) {
				return line, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s: no %q line: %w", p.Name, prefix, ctx.Err())
		case <-p.done:
			// Check once more: the line may have come with the exit.
			for _, line := range strings.Split(p.stdout.String(), "\n") {
				if strings.HasPrefix(line, prefix) {
					return line, nil
				}
			}
			return "", fmt.Errorf("%s exited (%v) without a %q line", p.Name, p.err, prefix)
		case <-tick.C:
		}
	}
}

// WaitAll waits for every process and fails t, with everyone's output,
// when one exits non-zero (after all exited or ctx ended).
func WaitAll(t testing.TB, procs []*Proc) {
	t.Helper()
	failed := false
	for _, p := range procs {
		if err := p.Wait(); err != nil {
			t.Errorf("%s: %v", p.Name, err)
			failed = true
		}
	}
	if failed || testing.Verbose() {
		for _, p := range procs {
			t.Log(p.Output())
		}
	}
}

// RunRanks starts n ranks of bin (rank r gets env(r)) and waits for all of
// them, failing t if any fails or they take longer than timeout.
func RunRanks(t testing.TB, n int, timeout time.Duration, env func(rank int) []string, bin string, args ...string) []*Proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	procs := make([]*Proc, n)
	for r := range procs {
		p, err := Start(ctx, fmt.Sprintf("rank %d", r), env(r), nil, bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		procs[r] = p
	}
	WaitAll(t, procs)
	if ctx.Err() != nil {
		t.Errorf("ranks did not finish within %v (killed)", timeout)
	}
	return procs
}
