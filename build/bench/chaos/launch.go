package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// launcher starts a job's processes and tells the job about them through
// its lines ("chaos: rank r is pid P", "... exited: ...").
type launcher interface {
	start() error
	wait()      // until every process of the job is gone
	kill()      // SIGKILL the whole job
	group() int // the process group every process of the job is in
}

// cleanEnv is this process's environment without gocoll's and the
// launchers' variables (a job sees only those the harness sets), then
// extra.
func cleanEnv(extra ...string) []string {
	drop := []string{"GOCOLL_", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=",
		"MASTER_", "TORCHELASTIC_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "SGD_", "CHAOS_", "TMPDIR=", "GOTRACEBACK="}
	var env []string
	for _, kv := range os.Environ() {
		keep := true
		for _, p := range drop {
			keep = keep && !strings.HasPrefix(kv, p)
		}
		if keep {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// jobEnv is what every process of a job gets.
func (j *job) jobEnv() []string {
	return cleanEnv("GOCOLL_TIMEOUT="+j.cfg.Timeout.String(), "GOCOLL_DEBUG=INFO", "GOCOLL_TRANSPORT="+j.rec.Schedule.Transport,
		"TMPDIR="+filepath.Join(j.dir, "tmp"), "GOTRACEBACK=all")
}

// wrap runs argv on emulated host h (-1: here) with the job's private
// /dev/shm (when there is one) and, on a host, the host's name.
func (j *job) wrap(h int, argv []string) []string {
	var pre []string
	if h >= 0 {
		pre = []string{"ip", "netns", "exec", j.hosts.ns(h), "unshare", "--mount", "--uts", "sh", "-c",
			`hostname "$0" && mount --bind "$1" /dev/shm && shift && exec "$@"`, j.hosts.ns(h), j.shmDir(h)}
	} else if d := j.shmDir(-1); d != "" {
		pre = []string{"unshare", "--mount", "sh", "-c", `mount --bind "$0" /dev/shm && exec "$@"`, d}
	}
	return append(pre, argv...)
}

// startPiped starts cmd with its output read line by line into the job's
// lines as src. The pipes are the harness's own, so that waiting for cmd
// never waits for a process it left behind.
func (j *job) startPiped(cmd *exec.Cmd, src string) error {
	var ws []*os.File
	for _, set := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		*set = w
		ws = append(ws, w)
		go j.pump(r, src)
	}
	err := cmd.Start()
	for _, w := range ws {
		w.Close()
	}
	return err
}

func (j *job) pump(r *os.File, src string) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<16)
	for {
		s, err := br.ReadString('\n')
		if s = strings.TrimRight(s, "\n"); s != "" {
			select {
			case j.lines <- Line{T: j.since(), Src: src, Text: s}:
			case <-j.quit: // the run is over; a process left behind still writes
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func exitString(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "0"
	case errors.As(err, &ee):
		return ee.String()
	}
	return err.Error()
}

// npLauncher is sgd's own launcher: sgd -np N -virtual V -elastic -respawn.
type npLauncher struct {
	j   *job
	cmd *exec.Cmd
}

func (l *npLauncher) start() error {
	j := l.j
	args := append([]string{j.cfg.SGD, "-np", strconv.Itoa(j.cfg.NP)}, j.cfg.sgdArgs()...)
	argv := j.wrap(-1, args)
	l.cmd = exec.Command(argv[0], argv[1:]...)
	l.cmd.Env = j.jobEnv()
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return j.startPiped(l.cmd, "launcher")
}

func (l *npLauncher) wait() {
	err := l.cmd.Wait()
	l.j.lines <- Line{T: l.j.since(), Src: "launcher", Text: "chaos: launcher exited: " + exitString(err)}
}

func (l *npLauncher) kill()      { syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL) }
func (l *npLauncher) group() int { return l.cmd.Process.Pid }

// ownLauncher starts the ranks itself (the C client; sgd on emulated
// hosts) and, like sgd -respawn, a replacement for each rank that dies
// by a signal. Once every original rank is gone, a replacement still
// waiting to be admitted gets a grace period, then is killed.
type ownLauncher struct {
	j      *job
	member func(rank int) (argv, env []string)
	joiner func(rank, replaces int) (argv, env []string)
	leader *exec.Cmd // holds the job's process group
	exits  chan procExit
}

type procExit struct {
	name   string
	rank   int
	pid    int
	joiner bool
	err    error
}

func (l *ownLauncher) start() error {
	l.exits = make(chan procExit, 64)
	l.leader = exec.Command("sleep", "1000000")
	l.leader.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := l.leader.Start(); err != nil {
		return err
	}
	for r := range l.j.cfg.NP {
		argv, env := l.member(r)
		pid, err := l.spawn(fmt.Sprintf("rank %d", r), r, false, argv, env)
		if err != nil {
			l.kill()
			return err
		}
		l.j.lines <- Line{T: l.j.since(), Src: "launcher", Text: fmt.Sprintf("chaos: rank %d is pid %d", r, pid)}
	}
	return nil
}

func (l *ownLauncher) spawn(name string, rank int, joiner bool, argv, env []string) (int, error) {
	j := l.j
	argv = j.wrap(j.hosts.of(rank), argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: l.leader.Process.Pid}
	if err := j.startPiped(cmd, name); err != nil {
		return 0, fmt.Errorf("starting %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	go func() { l.exits <- procExit{name: name, rank: rank, pid: pid, joiner: joiner, err: cmd.Wait()} }()
	return pid, nil
}

func (l *ownLauncher) wait() {
	j := l.j
	running, originals, replacements := j.cfg.NP, j.cfg.NP, 0
	var grace <-chan time.Time
	for running > 0 {
		select {
		case e := <-l.exits:
			running--
			j.lines <- Line{T: j.since(), Src: "launcher", Text: fmt.Sprintf("chaos: %s (pid %d) exited: %s", e.name, e.pid, exitString(e.err))}
			if !e.joiner {
				originals--
			}
			var ee *exec.ExitError
			if !e.joiner && errors.As(e.err, &ee) && !ee.Exited() && originals > 0 {
				argv, env := l.joiner(e.rank, e.pid)
				name := fmt.Sprintf("new %d", replacements)
				if pid, err := l.spawn(name, e.rank, true, argv, env); err == nil {
					j.lines <- Line{T: j.since(), Src: "launcher", Text: fmt.Sprintf("chaos: replacement %d for rank %d is pid %d", replacements, e.rank, pid)}
					replacements++
					running++
				}
			}
			if originals == 0 && running > 0 && grace == nil {
				grace = time.After(max(10*time.Second, 2*j.cfg.Timeout))
			}
		case <-grace:
			l.kill() // replacements never admitted; the leader goes too
		}
	}
	l.leader.Process.Kill()
	l.leader.Wait()
}

func (l *ownLauncher) kill()      { syscall.Kill(-l.leader.Process.Pid, syscall.SIGKILL) }
func (l *ownLauncher) group() int { return l.leader.Process.Pid }

// leftovers lists the processes still in process group g (but its
// leader, for the harness's own launcher), and kills them.
func leftovers(g, except int) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid := atoi(e.Name())
		if pid <= 0 || pid == except {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) > 2 && atoi(f[2]) == g {
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			out = append(out, fmt.Sprintf("pid %d (state %s): %s", pid, f[0], strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")))
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return out
}
