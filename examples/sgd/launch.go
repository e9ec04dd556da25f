package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/vppu/elastic"
)

// spawnRanks runs n copies of this executable with args, as fresh processes
// (exec, never fork: a Go runtime does not survive fork), each told its rank
// by GOCOLL_RANK, GOCOLL_SIZE and GOCOLL_ROOT_ADDR=127.0.0.1:<free port>.
// Rank 0's standard output goes to stdout as is, every other line gets a
// "[rank r]" prefix. It waits for all of them and fails if any fails; once
// one has failed the others get grace to notice, then are killed.
//
// With el.On, a rank killed by a signal is reported and the others go on
// (they shrink the job among themselves): the run succeeds if every rank
// that was not killed succeeds. With el.Respawn a replacement process is
// started for it, which joins the job (joinJob) through el.JobFile; a
// replacement that fails is reported, and is not the job's failure.
func spawnRanks(n int, args, extraEnv []string, stdout, stderr io.Writer, grace time.Duration, el elasticLaunch) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("-np: cannot find this program's executable: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return fmt.Errorf("-np: no free port for the rendezvous: %w", err)
	}
	base := append(cleanEnv(os.Environ()), extraEnv...)
	if el.Respawn {
		// A joiner needs the job's secret: every rank derives it from
		// GOCOLL_SECRET, fresh for the job unless the user set one.
		if os.Getenv("GOCOLL_SECRET") == "" {
			var b [16]byte
			if _, err := rand.Read(b[:]); err != nil {
				return err
			}
			base = append(base, "GOCOLL_SECRET="+hex.EncodeToString(b[:]))
		}
		base = append(base, jobFileVar+"="+el.JobFile)
	}
	j := &rankProcs{n: n, exe: exe, args: args, stdout: stdout, stderr: stderr, el: el,
		joinerEnv: slices.Clone(base), // a joiner has no rank variables
		exits:     make(chan rankExit, n)}
	base = append(base, "GOCOLL_SIZE="+strconv.Itoa(n), "GOCOLL_ROOT_ADDR=127.0.0.1:"+strconv.Itoa(port))
	for r := 0; r < n; r++ {
		prefix := fmt.Sprintf("[rank %d] ", r)
		outPrefix := prefix
		if r == 0 {
			outPrefix = ""
		}
		env := append(slices.Clone(base), "GOCOLL_RANK="+strconv.Itoa(r), "GOCOLL_LOCAL_RANK="+strconv.Itoa(r))
		j.cmds = append(j.cmds, j.command(env, outPrefix, prefix))
	}
	if err := j.start(); err != nil {
		return err
	}
	failed := j.wait(grace)
	for _, w := range j.writers {
		w.Flush()
	}
	if len(failed) > 0 {
		return fmt.Errorf("-np %d: %s", n, strings.Join(failed, "; "))
	}
	return nil
}

// rankProcs are the processes of one -np job: the n ranks, then the
// replacements started for ranks that died (cmds[n+k] is replacement k).
type rankProcs struct {
	n              int
	exe            string
	args           []string
	stdout, stderr io.Writer
	el             elasticLaunch
	joinerEnv      []string   // a replacement's environment, less its own variables
	outMu          sync.Mutex // one line at a time on the shared outputs
	writers        []*prefixWriter
	cmds           []*exec.Cmd
	done           []bool // per cmds: it has exited
	exits          chan rankExit
	replacements   int
}

// rankExit is how process cmds[rank] ended.
type rankExit struct {
	rank int
	err  error
}

// command makes a process of the job with env, its standard output and
// error prefixed by outPrefix and errPrefix.
func (j *rankProcs) command(env []string, outPrefix, errPrefix string) *exec.Cmd {
	cmd := exec.Command(j.exe, j.args...)
	cmd.Env = env
	ow := &prefixWriter{mu: &j.outMu, w: j.stdout, prefix: outPrefix}
	ew := &prefixWriter{mu: &j.outMu, w: j.stderr, prefix: errPrefix}
	j.writers = append(j.writers, ow, ew)
	cmd.Stdout, cmd.Stderr = ow, ew
	return cmd
}

// start starts the n ranks, or none: a rank that cannot start kills those
// started before it.
func (j *rankProcs) start() error {
	for r, cmd := range j.cmds {
		if err := cmd.Start(); err != nil {
			for _, c := range j.cmds[:r] {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
			return fmt.Errorf("-np: starting rank %d: %w", r, err)
		}
		if j.el.On {
			// Whoever wants to try the elastic run kills one of these.
			j.say("sgd: rank %d is pid %d\n", r, cmd.Process.Pid)
		}
	}
	j.done = make([]bool, j.n)
	for r, cmd := range j.cmds {
		go func() { j.exits <- rankExit{r, cmd.Wait()} }()
	}
	return nil
}

func (j *rankProcs) say(format string, a ...any) {
	j.outMu.Lock()
	fmt.Fprintf(j.stderr, format, a...)
	j.outMu.Unlock()
}

// wait waits for every process of the job and returns the failures. A
// failed rank gives the others grace to notice, then they are killed;
// with el.On a rank killed by a signal is not a failure (and with
// el.Respawn gets a replacement).
func (j *rankProcs) wait(grace time.Duration) (failed []string) {
	n, dead := j.n, 0
	var kill <-chan time.Time
	for left := n; left > 0; {
		select {
		case e := <-j.exits:
			left--
			j.done[e.rank] = true
			switch {
			case e.rank >= n && e.err != nil:
				j.say("sgd: replacement %d failed (%v); the job goes on without it\n", e.rank-n, e.err)
			case e.rank >= n:
			case e.err != nil && j.el.On && (killed(e.err) || leftOut(e.err)):
				dead++
				j.say("sgd: rank %d died or was left out (%v); the job goes on without it\n", e.rank, e.err)
				if dead == n {
					failed = append(failed, "every rank died")
				}
				if j.el.Respawn && kill == nil && dead < n {
					if !j.respawn(e.rank) {
						continue
					}
					left++
				}
			case e.err != nil:
				failed = append(failed, fmt.Sprintf("rank %d: %v", e.rank, e.err))
				if kill == nil {
					kill = time.After(grace)
				}
			}
			if left > 0 && left == j.replacements-finishedReplacements(j.done, n) && !anyRunning(j.done[:n]) {
				// Every member finished: a replacement still waiting to
				// join will not be admitted any more.
				kill = time.After(grace)
			}
		case <-kill:
			for r, cmd := range j.cmds {
				if !j.done[r] {
					_ = cmd.Process.Kill() // our own child, by its pid
				}
			}
		}
	}
	return failed
}

// respawn starts a replacement for the dead rank, which joins the job;
// false if it could not start.
func (j *rankProcs) respawn(rank int) bool {
	k := j.replacements
	prefix := fmt.Sprintf("[new %d] ", k)
	cmd := j.command(append(slices.Clone(j.joinerEnv), joinerVar+"=1", replacesVar+"="+strconv.Itoa(j.cmds[rank].Process.Pid)), prefix, prefix)
	if err := cmd.Start(); err != nil {
		j.say("sgd: starting a replacement for rank %d: %v\n", rank, err)
		return false
	}
	j.say("sgd: replacement %d for rank %d is pid %d\n", k, rank, cmd.Process.Pid)
	j.replacements++
	j.cmds = append(j.cmds, cmd)
	j.done = append(j.done, false)
	id := j.n + k
	go func() { j.exits <- rankExit{id, cmd.Wait()} }()
	return true
}

// elasticLaunch is how spawnRanks treats ranks that die.
type elasticLaunch struct {
	On, Respawn bool
	JobFile     string // with Respawn: where rank 0 keeps the join info
}

// The variables of a replacement process: it joins the job whose join
// info is in the job file.
const (
	joinerVar   = "SGD_JOINER"
	jobFileVar  = "SGD_JOB_FILE"
	replacesVar = "SGD_REPLACES_PID" // the dead process a joiner replaces
)

func finishedReplacements(done []bool, n int) int {
	k := 0
	for _, d := range done[n:] {
		if d {
			k++
		}
	}
	return k
}

func anyRunning(done []bool) bool { return slices.Contains(done, false) }

// joinJob is a replacement process joining the job through the job
// file (elastic.JoinJob: rank 0 rewrites it after every recovery, and the
// replacement waits for a file without the pid it replaces). It returns
// the communicator and the view it joined through.
func joinJob(jobFile string, opts engine.Options) (*engine.Comm, string, error) {
	secret, err := engine.JoinSecret(nil, os.Getenv)
	if err != nil {
		return nil, "", err
	}
	dead, _ := strconv.Atoi(os.Getenv(replacesVar))
	return elastic.JoinJob(jobFile, dead, secret, opts)
}

// killed says whether a child's exit error is a death by a signal.
// leftOut says whether a rank exited because the others went on without
// it (exitLeftOut).
func leftOut(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == exitLeftOut
}

func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// cleanEnv drops the variables of any launcher we may run under: the
// children of -np get fresh GOCOLL_* ones and none of the others.
func cleanEnv(env []string) []string {
	drop := bootstrap.LauncherVars()
	out := env[:0:0]
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); !slices.Contains(drop, name) {
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
