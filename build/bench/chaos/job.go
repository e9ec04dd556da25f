package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Proc is one process of a job, as the harness knows it.
type Proc struct {
	Name    string // "rank 3", or "new 0" for the first replacement
	Pid     int
	Joiner  bool
	Host    int // emulated host (a replacement's is its dead rank's); -1 on loopback
	Started time.Duration
	Exit    string // "" unknown (sgd -np: reported only when not 0), "0", "exit status N", "signal: killed"
	Ended   time.Duration
	Killed  bool          // SIGKILLed by the harness
	Stopped time.Duration // the longest pause the harness gave it
	Flooded bool
	// Admitted: a replacement that connected into the job.
	Admitted bool

	rank       int // its rank in the job's communicator, as last logged
	gone       bool
	stoppedNow bool
}

// Fired is what one fault of the schedule did.
type Fired struct {
	Index  int
	At     time.Duration
	Proc   string // the target process ("" when none qualified)
	Pid    int
	Detail string
}

// Record is everything a run leaves for the checks: a pure function of
// it decides the verdict (check.go).
type Record struct {
	Schedule Schedule
	Timeout  time.Duration
	Lines    []Line
	Procs    []*Proc
	Fired    []Fired
	Elapsed  time.Duration
	Bound    time.Duration
	Hung     bool
	Launcher string // sgd -np: how its launcher exited ("0", "exit status 1")
	WantHash string // the uninterrupted run's (sgd)
	// ShmLeft lists what the job left in its private /dev/shm; ShmChecked
	// is false when there was none (no root).
	ShmLeft    []string
	ShmChecked bool
	Leftover   []string // processes of the job alive after it ended
	Dir        string   // where its log is kept
}

// job is one run in progress. Everything below is touched only by the
// goroutine running loop, except what the launcher sends on lines.
type job struct {
	cfg   *Config
	rec   *Record
	dir   string
	start time.Time
	lines chan Line
	fire  chan func() // timers and background faults come back here
	quit  chan struct{}
	log   *os.File
	l     launcher
	byPid map[int]*Proc
	byNm  map[string]*Proc

	lastT    time.Duration // the time of the line being handled
	progress int
	next     int  // the fault waiting for its trigger
	armed    bool // its trigger was seen (its delay is running)
	stopAll  []context.CancelFunc
	hosts    *hosts
	mounts   []string // the job's /dev/shm tmpfs mounts
}

func newJob(cfg *Config, s Schedule, dir string) (*job, error) {
	f, err := os.Create(filepath.Join(dir, "run.log"))
	if err != nil {
		return nil, err
	}
	j := &job{cfg: cfg, dir: dir, log: f, lines: make(chan Line, 4096), fire: make(chan func(), 64), quit: make(chan struct{}),
		byPid: map[int]*Proc{}, byNm: map[string]*Proc{}, hosts: cfg.Hosts,
		rec: &Record{Schedule: s, Timeout: cfg.Timeout, Dir: dir}}
	return j, nil
}

func (j *job) since() time.Duration { return time.Since(j.start) }

// say puts a line of the harness's own into the record (one line).
func (j *job) say(format string, a ...any) {
	text := strings.ReplaceAll(strings.TrimSpace(fmt.Sprintf(format, a...)), "\n", "; ")
	j.handle(Line{T: j.since(), Src: "harness", Text: text})
}

// loop runs the job until its launcher is done or the bound passes.
func (j *job) loop(bound time.Duration, done <-chan struct{}) {
	j.rec.Bound = bound
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	j.armNext()
	for {
		select {
		case l := <-j.lines:
			j.handle(l)
		case f := <-j.fire:
			f()
		case <-poll.C:
			j.pollAlive()
		case <-deadline.C:
			j.rec.Hung = true
			j.say("chaos: the job did not end within %v: dumping stacks and killing it", bound)
			j.dumpStacks()
			time.Sleep(2 * time.Second)
			j.l.kill()
			deadline.Reset(time.Hour)
		case <-done:
			j.drain()
			j.pollAlive()
			j.rec.Elapsed = j.since()
			for _, c := range j.stopAll {
				c()
			}
			j.contAll()
			return
		}
	}
}

// drain takes the lines still in flight after the launcher ended, until
// none came for a moment (leftover processes may hold the pipes open).
func (j *job) drain() {
	for {
		select {
		case l := <-j.lines:
			j.handle(l)
		case f := <-j.fire:
			f()
		case <-time.After(300 * time.Millisecond):
			return
		}
	}
}

// handle records a line, follows the processes it names and the job's
// progress, and fires the next fault when it is its trigger.
func (j *job) handle(l Line) {
	j.rec.Lines = append(j.rec.Lines, l)
	j.lastT = l.T
	if j.log != nil {
		fmt.Fprintf(j.log, "%9.3f [%s] %s\n", l.T.Seconds(), l.Src, l.Text)
	}
	text := l.Text
	if l.Src == "harness" {
		j.harnessLine(text)
		return
	}
	if l.Src == "launcher" {
		var src string
		src, text = splitPrefix(text)
		if src == "" {
			j.launcherLine(text)
		}
	}
	p := j.procOf(l, text)
	if m := reStep.FindStringSubmatch(text); m != nil {
		j.progress = max(j.progress, atoi(m[1]))
	} else if m := reCall.FindStringSubmatch(text); m != nil {
		j.progress = max(j.progress, atoi(m[1]))
	}
	ph := j.phaseOf(p, text)
	if j.armed || j.next >= len(j.rec.Schedule.Faults) {
		return
	}
	w := j.rec.Schedule.Faults[j.next].When
	if (w.Phase == AtStep && j.progress >= w.N) || (w.Phase != AtStep && slices.Contains(ph, w.Phase)) {
		j.trigger()
	}
}

// procOf is the process a line came from (nil for the launcher's own),
// updating what the line says about it: its rank, its admission.
func (j *job) procOf(l Line, text string) *Proc {
	var p *Proc
	f := fields(text)
	if f != nil {
		p = j.byPid[atoi(f["pid"])]
	} else if src, _ := splitPrefix(l.Text); src != "" {
		p = j.byNm[src]
	} else {
		p = j.byNm[l.Src]
	}
	if p == nil {
		return nil
	}
	switch {
	case f != nil && f["msg"] == "shrunk":
		p.rank = atoi(f["new_rank"])
	case f != nil && (f["msg"] == "connected" || f["msg"] == "algorithm chosen"):
		p.rank = atoi(f["rank"])
		if p.Joiner && f["msg"] == "connected" {
			p.Admitted = true
		}
	default:
		if v, ok := parseView(text); ok {
			p.rank = v.rank
			p.Admitted = true
		}
	}
	return p
}

// phaseOf lists the trigger phases a line is.
func (j *job) phaseOf(p *Proc, text string) []Phase {
	var out []Phase
	if f := fields(text); f != nil {
		for ph, re := range phaseMsgs {
			if re.MatchString(f["msg"]) {
				out = append(out, ph)
			}
		}
		if p != nil && p.Joiner && f["msg"] == "connected" {
			out = append(out, OnJoinerConnected)
		}
		return out
	}
	switch {
	case reLost.MatchString(text):
		out = append(out, OnRecovered)
	case reAdmitted.MatchString(text):
		out = append(out, OnAdmitted)
	case reReplPid.MatchString(text):
		out = append(out, OnJoinerStarted)
	}
	if v, ok := parseView(text); ok && !v.done && v.gen > 0 && p != nil {
		if p.Joiner {
			out = append(out, OnAdmitted)
		} else {
			out = append(out, OnRecovered)
		}
	}
	return out
}

// launcherLine follows the processes sgd's launcher (or the harness's
// own) names: started, died, failed.
func (j *job) launcherLine(text string) {
	if m := reRankPid.FindStringSubmatch(text); m != nil {
		j.addProc(&Proc{Name: "rank " + m[1], Pid: atoi(m[2]), rank: atoi(m[1]), Host: j.hosts.of(atoi(m[1]))})
	} else if m := reReplPid.FindStringSubmatch(text); m != nil {
		j.addProc(&Proc{Name: "new " + m[1], Pid: atoi(m[3]), Joiner: true, rank: -1, Host: j.hosts.of(atoi(m[2]))})
	} else if m := reDied.FindStringSubmatch(text); m != nil {
		j.exited("rank "+m[1], m[2])
	} else if m := reReplFailed.FindStringSubmatch(text); m != nil {
		j.exited("new "+m[1], m[2])
	} else if m := reExited.FindStringSubmatch(text); m != nil {
		j.exited(m[1]+" "+m[2], m[4])
	} else if after, ok := strings.CutPrefix(text, "chaos: launcher exited: "); ok {
		j.rec.Launcher = after
	} else if strings.HasPrefix(text, "sgd: -np ") {
		for _, m := range reNPFailed.FindAllStringSubmatch(text, -1) {
			j.exited("rank "+m[1], m[2])
		}
	}
}

func (j *job) addProc(p *Proc) {
	if old := j.byNm[p.Name]; old != nil {
		old.Pid, old.Host = p.Pid, p.Host
		j.byPid[p.Pid] = old
		return
	}
	p.Started = j.lastT
	j.rec.Procs = append(j.rec.Procs, p)
	j.byPid[p.Pid] = p
	j.byNm[p.Name] = p
}

func (j *job) exited(name, how string) {
	if p := j.byNm[name]; p != nil && p.Exit == "" {
		p.Exit, p.Ended, p.gone = how, j.lastT, true
	}
}

// pollAlive notices processes that are gone (sgd's launcher reaps its
// children; it reports only those that failed).
func (j *job) pollAlive() {
	for _, p := range j.rec.Procs {
		if !p.gone && syscall.Kill(p.Pid, 0) == syscall.ESRCH {
			p.gone = true
			if p.Ended == 0 {
				p.Ended = j.since()
			}
		}
	}
}

// dumpStacks asks sgd's processes for their goroutines (SIGQUIT: the Go
// runtime prints them and exits); the C client's runtime does not.
func (j *job) dumpStacks() {
	if j.rec.Schedule.Workload != "sgd" {
		return
	}
	j.contAll()
	for _, p := range j.rec.Procs {
		if !p.gone {
			syscall.Kill(p.Pid, syscall.SIGQUIT)
		}
	}
}

// contAll resumes anything still paused (the job is over or killed).
func (j *job) contAll() {
	for _, p := range j.rec.Procs {
		if p.stoppedNow {
			syscall.Kill(p.Pid, syscall.SIGCONT)
			p.stoppedNow = false
		}
	}
}
