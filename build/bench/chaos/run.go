package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
)

// Config is how every run of an invocation is made.
type Config struct {
	SGD, Client string // the binaries
	NP          int
	Timeout     time.Duration
	Bound       time.Duration // 0: from the uninterrupted run's time and the schedule
	Out         string        // run directories go here
	Keep        bool          // keep every run's directory, not only failing ones
	Hosts       *hosts        // emulated hosts; nil: loopback
	PrivateShm  bool          // root: each job gets a tmpfs of its own as /dev/shm
	Epochs      int           // sgd
	Calls       int           // C client
	// abort kills the job running now and unmounts its /dev/shm (on
	// Ctrl-C); nil between jobs.
	abort atomic.Pointer[func()]
}

// sgdArgs are the flags of every sgd run: a small model on synthetic data,
// so that 8 ranks train for a few seconds on two cores.
func (c *Config) sgdArgs() []string {
	return []string{"-virtual", strconv.Itoa(max(8, c.NP)), "-elastic", "-respawn", "-synthetic", "-hidden", "32",
		"-epochs", strconv.Itoa(c.Epochs), "-train-limit", "8192", "-test-limit", "256", "-batch", "64",
		"-log-every", "4", "-report="}
}

// steps is a run's length in progress units, per workload.
func (c *Config) steps() map[string]int {
	return map[string]int{"sgd": c.Epochs * 8192 / 64, "c": c.Calls}
}

// shmDir is the private /dev/shm of host h's processes (-1: loopback),
// "" when the job has none.
func (j *job) shmDir(h int) string {
	if !j.cfg.PrivateShm {
		return ""
	}
	if h < 0 {
		return filepath.Join(j.dir, "shm")
	}
	return filepath.Join(j.dir, fmt.Sprintf("shm%d", h))
}

// privateShm mounts the job's /dev/shm tmpfs (one per host); the returned
// function lists what is left in them and unmounts them.
func (j *job) privateShm() (func() []string, error) {
	var dirs []string
	if j.cfg.PrivateShm {
		if j.hosts == nil {
			dirs = []string{j.shmDir(-1)}
		}
		for h := range j.hostsN() {
			dirs = append(dirs, j.shmDir(h))
		}
	}
	for i, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := sh("mount", "-t", "tmpfs", "-o", "size=512m,mode=1777", "tmpfs", d); err != nil {
			for _, m := range dirs[:i] {
				exec.Command("umount", m).Run()
			}
			return nil, err
		}
	}
	j.rec.ShmChecked = len(dirs) > 0
	j.mounts = dirs
	return func() []string {
		var left []string
		for _, d := range dirs {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				info, _ := e.Info()
				size := int64(0)
				if info != nil {
					size = info.Size()
				}
				left = append(left, fmt.Sprintf("%s (%d bytes)", filepath.Join(d, e.Name()), size))
			}
			exec.Command("umount", d).Run()
		}
		return left
	}, nil
}

func (j *job) hostsN() int {
	if j.hosts == nil {
		return 0
	}
	return j.hosts.n
}

// launcherFor: sgd on loopback runs under its own launcher (-np, which
// respawns); the C client and sgd on emulated hosts under the harness's.
func (j *job) launcherFor() (launcher, error) {
	if j.rec.Schedule.Workload == "sgd" && j.hosts == nil {
		return &npLauncher{j: j}, nil
	}
	port, err := freePort(j.hosts)
	if err != nil {
		return nil, err
	}
	var sec [16]byte
	rand.Read(sec[:])
	root := "127.0.0.1"
	if j.hosts != nil {
		root = j.hosts.addr(0)
	}
	jobFile := filepath.Join(j.dir, "job")
	base := append(j.jobEnv(), "GOCOLL_SECRET="+hex.EncodeToString(sec[:]))
	ifname := func(rank int) []string {
		if h := j.hosts.of(rank); h >= 0 {
			return []string{"GOCOLL_SOCKET_IFNAME=" + fmt.Sprintf("v%d", h)}
		}
		return nil
	}
	l := &ownLauncher{j: j}
	local := func(rank int) (int, int) {
		if j.hosts == nil {
			return rank, j.cfg.NP
		}
		per := j.cfg.NP / j.hosts.n
		return rank % per, per
	}
	l.member = func(rank int) ([]string, []string) {
		lr, ls := local(rank)
		env := append(append([]string(nil), base...), "GOCOLL_RANK="+strconv.Itoa(rank), "GOCOLL_SIZE="+strconv.Itoa(j.cfg.NP),
			"GOCOLL_LOCAL_RANK="+strconv.Itoa(lr), "GOCOLL_LOCAL_SIZE="+strconv.Itoa(ls),
			"GOCOLL_ROOT_ADDR="+root+":"+strconv.Itoa(port))
		env = append(env, ifname(rank)...)
		if j.rec.Schedule.Workload == "sgd" {
			return append([]string{j.cfg.SGD}, j.cfg.sgdArgs()...), append(env, "SGD_JOB_FILE="+jobFile)
		}
		return []string{j.cfg.Client}, append(env, "CHAOS_JOINFILE="+jobFile, "CHAOS_CALLS="+strconv.Itoa(j.cfg.Calls))
	}
	l.joiner = func(rank, replaces int) ([]string, []string) {
		env := append(append([]string(nil), base...), ifname(rank)...)
		if j.rec.Schedule.Workload == "sgd" {
			return append([]string{j.cfg.SGD}, j.cfg.sgdArgs()...), append(env, "SGD_JOB_FILE="+jobFile, "SGD_JOINER=1", "SGD_REPLACES_PID="+strconv.Itoa(replaces))
		}
		return []string{j.cfg.Client, "join"}, append(env, "CHAOS_JOINFILE="+jobFile, "CHAOS_CALLS="+strconv.Itoa(j.cfg.Calls),
			"CHAOS_REPLACES="+strconv.Itoa(replaces))
	}
	return l, nil
}

// freePort is a port nobody listens on now (on loopback; on emulated
// hosts every namespace is empty, so any port does).
func freePort(h *hosts) (int, error) {
	if h != nil {
		return 29500, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// runOne runs schedule s (its try-th time) and returns its record;
// wantHash is the uninterrupted run's (sgd), bound the run's limit.
func runOne(cfg *Config, s Schedule, try int, wantHash string, bound time.Duration) (*Record, error) {
	dir := filepath.Join(cfg.Out, fmt.Sprintf("seed-%d", s.Seed))
	if try > 1 {
		dir += fmt.Sprintf(".%d", try)
	}
	if len(s.Faults) == 0 {
		dir = filepath.Join(cfg.Out, "uninterrupted-"+s.Workload+"-"+s.Transport)
	}
	os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return nil, err
	}
	j, err := newJob(cfg, s, dir)
	if err != nil {
		return nil, err
	}
	defer j.log.Close()
	j.rec.WantHash = wantHash
	shmLeft, err := j.privateShm()
	if err != nil {
		return nil, fmt.Errorf("private /dev/shm: %w", err)
	}
	if j.l, err = j.launcherFor(); err != nil {
		shmLeft()
		return nil, err
	}
	j.start = time.Now()
	j.header()
	if err := j.l.start(); err != nil {
		shmLeft()
		return nil, err
	}
	abort := func() {
		j.l.kill()
		time.Sleep(200 * time.Millisecond)
		for _, d := range j.mounts {
			exec.Command("umount", d).Run()
		}
	}
	cfg.abort.Store(&abort)
	defer cfg.abort.Store(nil)
	done := make(chan struct{})
	go func() { j.l.wait(); close(done) }()
	j.loop(bound, done)
	left := leftovers(j.l.group(), 0)
	j.footer(j.rec.ShmChecked, shmLeft(), left)
	close(j.quit)
	return j.rec, nil
}
