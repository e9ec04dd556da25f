package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// launcherEnv names the launcher whose variables describe this process's
// rank, or "" when the program was started by hand. The engine's
// NewCommFromEnv reads the same variables.
func launcherEnv(getenv func(string) string) string {
	switch {
	case getenv("GOCOLL_RANK") != "":
		return "gocoll"
	case getenv("OMPI_COMM_WORLD_RANK") != "":
		return "open-mpi"
	case getenv("RANK") != "" && getenv("WORLD_SIZE") != "":
		return "torchrun"
	case getenv("SLURM_PROCID") != "" && getenv("SLURM_NTASKS") != "" && getenv("SLURM_STEP_ID") != "":
		return "slurm"
	}
	return ""
}

// launcherVars are the variables that make a process a rank of some job; the
// children of -np get fresh GOCOLL_* ones and none of the others.
var launcherVars = []string{
	"GOCOLL_RANK", "GOCOLL_SIZE", "GOCOLL_ROOT_ADDR", "GOCOLL_LOCAL_RANK",
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
	"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID",
}

// spawnRanks runs n copies of this executable with args, as fresh processes
// (exec, never fork: a Go runtime does not survive fork), each told its rank
// by GOCOLL_RANK, GOCOLL_SIZE and GOCOLL_ROOT_ADDR=127.0.0.1:<free port>.
// Rank 0's standard output goes to stdout as is, every other line gets a
// "[rank r]" prefix. It waits for all of them and fails if any fails; once
// one has failed the others get grace to notice, then are killed.
//
// With elastic, a rank killed by a signal is reported and the others go on
// (they shrink the job among themselves): the run succeeds if every rank
// that was not killed succeeds.
func spawnRanks(n int, args, extraEnv []string, stdout, stderr io.Writer, grace time.Duration, elastic bool) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("-np: cannot find this program's executable: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return fmt.Errorf("-np: no free port for the rendezvous: %w", err)
	}
	base := cleanEnv(os.Environ())
	base = append(base, extraEnv...)
	base = append(base, "GOCOLL_SIZE="+strconv.Itoa(n), "GOCOLL_ROOT_ADDR=127.0.0.1:"+strconv.Itoa(port))

	var outMu sync.Mutex // one line at a time on the shared outputs
	cmds := make([]*exec.Cmd, n)
	writers := []*prefixWriter{}
	for r := 0; r < n; r++ {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(append([]string(nil), base...), "GOCOLL_RANK="+strconv.Itoa(r), "GOCOLL_LOCAL_RANK="+strconv.Itoa(r))
		prefix := fmt.Sprintf("[rank %d] ", r)
		if r == 0 {
			prefix = ""
		}
		ow := &prefixWriter{mu: &outMu, w: stdout, prefix: prefix}
		ew := &prefixWriter{mu: &outMu, w: stderr, prefix: fmt.Sprintf("[rank %d] ", r)}
		writers = append(writers, ow, ew)
		cmd.Stdout, cmd.Stderr = ow, ew
		cmds[r] = cmd
	}
	started := 0
	for r, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			for _, c := range cmds[:started] {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
			return fmt.Errorf("-np: starting rank %d: %w", r, err)
		}
		started++
		if elastic {
			// Whoever wants to try the elastic run kills one of these.
			outMu.Lock()
			fmt.Fprintf(stderr, "sgd: rank %d is pid %d\n", r, cmd.Process.Pid)
			outMu.Unlock()
		}
	}
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, n)
	for r, cmd := range cmds {
		go func() { exits <- exit{r, cmd.Wait()} }()
	}
	var failed []string
	dead := 0
	var kill <-chan time.Time
	done := make([]bool, n)
	for left := n; left > 0; {
		select {
		case e := <-exits:
			left--
			done[e.rank] = true
			if e.err != nil && elastic && killed(e.err) {
				dead++
				outMu.Lock()
				fmt.Fprintf(stderr, "sgd: rank %d died (%v); the job goes on without it\n", e.rank, e.err)
				outMu.Unlock()
				if dead == n {
					failed = append(failed, "every rank died")
				}
			} else if e.err != nil {
				failed = append(failed, fmt.Sprintf("rank %d: %v", e.rank, e.err))
				if kill == nil {
					kill = time.After(grace)
				}
			}
		case <-kill:
			for r, cmd := range cmds {
				if !done[r] {
					_ = cmd.Process.Kill() // our own child, by its pid
				}
			}
		}
	}
	for _, w := range writers {
		w.Flush()
	}
	if len(failed) > 0 {
		return fmt.Errorf("-np %d: %s", n, strings.Join(failed, "; "))
	}
	return nil
}

// killed says whether a child's exit error is a death by a signal.
func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// cleanEnv drops the variables of any launcher we may run under.
func cleanEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, v := range launcherVars {
			drop = drop || name == v
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}

// freePort asks the kernel for a port nobody listens on. Rank 0 binds it a
// moment later; another program could take it in between, which then shows
// as a clear start-up error.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// prefixWriter writes whole lines to w, each after prefix.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		if _, err := fmt.Fprintf(p.w, "%s%s", p.prefix, p.buf[:i+1]); err != nil {
			return len(b), err
		}
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

// Flush writes a last line that had no newline.
func (p *prefixWriter) Flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) > 0 {
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf)
		p.buf = nil
	}
}
