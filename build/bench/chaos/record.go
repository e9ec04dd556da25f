package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// A run's log (run.log) holds everything its record does: the job's
// lines, and the harness's own saying what it ran and did. The live run
// builds its record from those lines as they come; recordFromLog builds
// the same record from the file, so that a run can be checked again
// (chaos -check run.log) and the checks tested on real logs.
var (
	reRunHeader = regexp.MustCompile(`^chaos: run seed=(\d+) workload=(\S+) transport=(\S+) scenario=(\S+) timeout=(\S+) want=(\S*)$`)
	reFaultDone = regexp.MustCompile(`^chaos: fault (\d+) \(.*\): (SIGKILL|SIGSTOP|flood|link of host \d+) \(?([a-z]+ \d+) \(pid (\d+)`)
	reFor       = regexp.MustCompile(` for (\S+)$`)
	reHung      = regexp.MustCompile(`^chaos: the job did not end within (\S+):`)
	reEnded     = regexp.MustCompile(`^chaos: ended after (\S+)$`)
	reLogLine   = regexp.MustCompile(`^\s*([0-9.]+) \[([^\]]+)\] (.*)$`)
)

// harnessLine takes what the harness said into the record.
func (j *job) harnessLine(text string) {
	r := j.rec
	if m := reRunHeader.FindStringSubmatch(text); m != nil {
		seed, _ := strconv.ParseUint(m[1], 10, 64)
		r.Schedule.Seed, r.Schedule.Workload, r.Schedule.Transport, r.Schedule.Scenario = seed, m[2], m[3], m[4]
		r.Timeout, _ = time.ParseDuration(m[5])
		r.WantHash = m[6]
	} else if m := reFaultDone.FindStringSubmatch(text); m != nil {
		p := j.byNm[m[3]]
		if p == nil {
			return
		}
		r.Fired = append(r.Fired, Fired{Index: atoi(m[1]) - 1, At: j.lastT, Proc: p.Name, Pid: p.Pid, Detail: text[strings.Index(text, "): ")+3:]})
		switch {
		case m[2] == "SIGKILL":
			p.Killed = true
		case m[2] == "SIGSTOP":
			var d time.Duration
			if f := reFor.FindStringSubmatch(text); f != nil {
				d, _ = time.ParseDuration(f[1])
			}
			p.Stopped = max(p.Stopped, d)
		case m[2] == "flood":
			p.Flooded = true
		}
	} else if strings.HasPrefix(text, "chaos: fault ") {
		r.Fired = append(r.Fired, Fired{Index: atoi(strings.Fields(text)[2]) - 1, At: j.lastT, Detail: text[strings.Index(text, "): ")+3:]})
	} else if m := reHung.FindStringSubmatch(text); m != nil {
		r.Hung = true
		r.Bound, _ = time.ParseDuration(m[1])
	} else if m := reEnded.FindStringSubmatch(text); m != nil {
		r.Elapsed, _ = time.ParseDuration(m[1])
	} else if s, ok := strings.CutPrefix(text, "chaos: left in /dev/shm: "); ok {
		r.ShmLeft = append(r.ShmLeft, s)
	} else if text == "chaos: the job had a /dev/shm of its own" {
		r.ShmChecked = true
	} else if s, ok := strings.CutPrefix(text, "chaos: left behind: "); ok {
		r.Leftover = append(r.Leftover, s)
	}
}

// header and footer are the harness's lines around a run.
func (j *job) header() {
	s := j.rec.Schedule
	scen := s.Scenario
	if scen == "" {
		scen = "-"
	}
	j.say("chaos: run seed=%d workload=%s transport=%s scenario=%s timeout=%v want=%s", s.Seed, s.Workload, s.Transport, scen, j.cfg.Timeout, j.rec.WantHash)
	j.say("chaos: schedule %s", s)
}

func (j *job) footer(shmChecked bool, shmLeft, leftover []string) {
	if shmChecked {
		j.say("chaos: the job had a /dev/shm of its own")
	}
	for _, s := range shmLeft {
		j.say("chaos: left in /dev/shm: %s", s)
	}
	for _, s := range leftover {
		j.say("chaos: left behind: %s", s)
	}
	j.say("chaos: ended after %v", j.rec.Elapsed.Round(time.Millisecond))
}

// recordFromLog rebuilds the record of the run whose log is at path.
func recordFromLog(path string) (*Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	j := &job{cfg: &Config{}, byPid: map[int]*Proc{}, byNm: map[string]*Proc{}, rec: &Record{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		m := reLogLine.FindStringSubmatch(sc.Text())
		if m == nil {
			return nil, fmt.Errorf("%s: not a line of a run's log: %q", path, sc.Text())
		}
		secs, _ := strconv.ParseFloat(m[1], 64)
		j.lastT = time.Duration(secs * float64(time.Second))
		j.handle(Line{T: j.lastT, Src: m[2], Text: m[3]})
	}
	j.rec.Dir = filepath.Dir(path)
	for _, p := range j.rec.Procs {
		p.gone = true // the run is over
	}
	return j.rec, sc.Err()
}
