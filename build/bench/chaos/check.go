package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// Violation is an invariant a run broke, with the lines that show it.
type Violation struct {
	Invariant string
	What      string
	Evidence  []string
}

// The invariants, as the report names them.
const (
	InvOneView  = "one view"
	InvHealthy  = "no healthy rank excluded"
	InvBounded  = "ends within the bound"
	InvHash     = "weights hash"
	InvExit     = "job exits 0"
	InvData     = "checked sums"
	InvShm      = "nothing left in /dev/shm"
	InvLeftover = "no process left behind"
)

// check decides a run's verdict from its record alone.
func check(r *Record) []Violation {
	var vs []Violation
	for _, c := range []func(*Record) []Violation{checkBounded, checkShrinks, checkFinalView, checkHealthy, checkHash, checkExits, checkLeft} {
		vs = append(vs, c(r)...)
	}
	return vs
}

func evid(l Line) string {
	t := l.Text
	if len(t) > 400 {
		t = t[:400] + "…"
	}
	return fmt.Sprintf("%8.3fs [%s] %s", l.T.Seconds(), l.Src, t)
}

// pidOf is the process a line is from: slog's pid=, else its source.
func (r *Record) pidOf(l Line) int {
	if f := fields(l.Text); f != nil {
		return atoi(f["pid"])
	}
	src, _ := splitPrefix(l.Text)
	if src == "" {
		src = l.Src
	}
	for _, p := range r.Procs {
		if p.Name == src {
			return p.Pid
		}
	}
	return 0
}

func (r *Record) proc(pid int) *Proc {
	for _, p := range r.Procs {
		if p.Pid == pid {
			return p
		}
	}
	return nil
}

// tail is the last n lines process p printed.
func (r *Record) tail(p *Proc, n int) []string {
	var out []string
	for _, l := range slices.Backward(r.Lines) {
		if len(out) == n {
			break
		}
		if r.pidOf(l) == p.Pid {
			out = append(out, evid(l))
		}
	}
	slices.Reverse(out)
	return out
}

func (r *Record) firedEvidence() []string {
	var out []string
	for _, l := range r.Lines {
		if l.Src == "harness" {
			out = append(out, evid(l))
		}
	}
	return out
}

func checkBounded(r *Record) []Violation {
	if !r.Hung {
		return nil
	}
	ev := r.firedEvidence()
	for _, p := range r.Procs {
		if p.Exit == "" && !p.Killed {
			ev = append(ev, r.tail(p, 3)...)
		}
	}
	return []Violation{{InvBounded, fmt.Sprintf("the job was still running after %v: killed (stack dumps of the Go processes in the run's log)", r.Bound), ev}}
}

// checkShrinks: the survivors of one communicator agree on what it
// shrank to, and each shrinks it once.
func checkShrinks(r *Record) []Violation {
	type outcome struct{ size, left string }
	byComm := map[string]map[outcome][]Line{}
	seen := map[string]int{} // comm/pid → shrinks
	var vs []Violation
	for _, l := range r.Lines {
		f := fields(l.Text)
		if f == nil || f["msg"] != "shrunk" {
			continue
		}
		c := f["comm"]
		if byComm[c] == nil {
			byComm[c] = map[outcome][]Line{}
		}
		o := outcome{f["new_size"], fmt.Sprint(ints(f["left_out"]))}
		byComm[c][o] = append(byComm[c][o], l)
		if k := c + "/" + f["pid"]; seen[k] > 0 {
			vs = append(vs, Violation{InvOneView, fmt.Sprintf("pid %s shrank communicator %s twice", f["pid"], c), []string{evid(l)}})
		} else {
			seen[k]++
		}
	}
	for _, c := range slices.Sorted(maps.Keys(byComm)) {
		outs := byComm[c]
		if len(outs) < 2 {
			continue
		}
		var what []string
		var ev []string
		for o, ls := range outs {
			what = append(what, fmt.Sprintf("%d rank(s) went on as %s ranks leaving out %s", len(ls), o.size, o.left))
			for _, l := range ls {
				ev = append(ev, evid(l))
			}
		}
		sort.Strings(what)
		sort.Strings(ev)
		vs = append(vs, Violation{InvOneView, fmt.Sprintf("the survivors of communicator %s split: %s", c, strings.Join(what, "; ")), ev})
	}
	return vs
}

// finished is whether p ran to the end: exit 0 (sgd -np reports only
// failures, so a process that is gone without one did) and not killed.
func (r *Record) finished(p *Proc) bool {
	return !p.Killed && !r.Hung && (p.Exit == "0" || (p.Exit == "" && p.gone))
}

// view is where a process ended: its members and size.
type view struct {
	size    int
	members []int // pids, sorted
	line    Line  // the line that shows it
}

// finalViews gives each process that finished the view it ended in: the
// C client's DONE line; for sgd, the last communicator it logged in
// (its members: every process that logged in that communicator).
func (r *Record) finalViews() map[int]view {
	out := map[int]view{}
	commMembers := map[string]map[int]bool{}
	last := map[int]Line{}
	for _, l := range r.Lines {
		if v, ok := parseView(l.Text); ok && v.done {
			out[r.pidOf(l)] = view{size: v.size, members: slices.Sorted(slices.Values(v.pids)), line: l}
			continue
		}
		f := fields(l.Text)
		if f == nil || f["comm"] == "" || f["nranks"] == "" {
			continue
		}
		pid := atoi(f["pid"])
		if commMembers[f["comm"]] == nil {
			commMembers[f["comm"]] = map[int]bool{}
		}
		commMembers[f["comm"]][pid] = true
		if f["msg"] != "shrunk" { // logged on the parent
			last[pid] = l
		}
	}
	for pid, l := range last {
		if _, ok := out[pid]; ok {
			continue
		}
		f := fields(l.Text)
		out[pid] = view{size: atoi(f["nranks"]), members: slices.Sorted(maps.Keys(commMembers[f["comm"]])), line: l}
	}
	return out
}

func checkFinalView(r *Record) []Violation {
	if r.Hung {
		return nil
	}
	views := r.finalViews()
	var fin []int
	groups := map[string][]int{}
	for _, p := range r.Procs {
		if !r.finished(p) {
			continue
		}
		fin = append(fin, p.Pid)
		v, ok := views[p.Pid]
		if !ok {
			continue
		}
		groups[fmt.Sprintf("size %d: pids %v", v.size, v.members)] = append(groups[fmt.Sprintf("size %d: pids %v", v.size, v.members)], p.Pid)
	}
	slices.Sort(fin)
	if len(groups) > 1 {
		var what, ev []string
		for _, k := range slices.Sorted(maps.Keys(groups)) {
			what = append(what, fmt.Sprintf("pids %v ended in a view of %s", groups[k], k))
			ev = append(ev, evid(views[groups[k][0]].line))
		}
		return []Violation{{InvOneView, fmt.Sprintf("%d live views at the end: %s", len(groups), strings.Join(what, "; ")), ev}}
	}
	// One view: every process that finished is in it. (A member of it
	// that did not finish is the healthy-rank check's business, or was
	// killed after its last collective.)
	for k, pids := range groups {
		v := views[pids[0]]
		var outside []int
		for _, pid := range fin {
			if !slices.Contains(v.members, pid) {
				outside = append(outside, pid)
			}
		}
		if len(outside) > 0 {
			return []Violation{{InvOneView, fmt.Sprintf("the processes that finished (%v) are not the final view (%s): %v finished outside it", fin, k, outside), []string{evid(v.line)}}}
		}
	}
	return nil
}

// healthy: the harness neither killed it nor paused it for the timeout
// or longer (a flood, a short pause or a slow link leave it healthy).
func (r *Record) healthy(p *Proc) bool { return !p.Killed && p.Stopped < r.Timeout }

func checkHealthy(r *Record) []Violation {
	if r.Hung {
		return nil
	}
	views := r.finalViews()
	// When the members were done (sgd's launcher does not say when a
	// rank exits 0: the run's end then).
	var end time.Duration
	for _, p := range r.Procs {
		switch {
		case p.Joiner:
		case p.Ended > 0:
			end = max(end, p.Ended)
		default:
			end = max(end, r.Elapsed)
		}
	}
	var out, unseen, leftOut []string
	var ev, leftEv []string
	for _, p := range r.Procs {
		if !r.healthy(p) {
			continue
		}
		switch {
		case p.Joiner && !p.Admitted && (strings.HasPrefix(p.Exit, "signal") || p.Ended >= end):
			// Still waiting when the members finished (its launcher
			// then kills it): not admitted in time, not a fault. One
			// that gave up while the job ran is.
		case !r.finished(p):
			out = append(out, fmt.Sprintf("%s (pid %d, exit: %s)", p.Name, p.Pid, orUnknown(p.Exit)))
			if len(out) <= 3 {
				ev = append(ev, r.leftOutLines(p)...)
				ev = append(ev, r.launcherSays(p)...)
				ev = append(ev, r.tail(p, 3)...)
			}
		case len(views) > 0:
			if _, ok := views[p.Pid]; !ok && !p.Joiner {
				unseen = append(unseen, fmt.Sprintf("%s (pid %d)", p.Name, p.Pid))
			}
			fallthrough
		default:
			if lo := r.leftOutLines(p); len(lo) > 0 {
				leftOut = append(leftOut, fmt.Sprintf("%s (pid %d)", p.Name, p.Pid))
				leftEv = append(leftEv, lo...)
			}
		}
	}
	var vs []Violation
	if len(out) > 0 {
		vs = append(vs, Violation{InvHealthy, fmt.Sprintf("%d healthy process(es) did not finish: %s", len(out), strings.Join(out, ", ")), sortedUnique(ev)})
	}
	if len(leftOut) > 0 {
		vs = append(vs, Violation{InvHealthy, fmt.Sprintf("healthy process(es) left out by a shrink, though they finished: %s", strings.Join(leftOut, ", ")), sortedUnique(leftEv)})
	}
	if len(unseen) > 0 {
		vs = append(vs, Violation{InvHealthy, "finished in no view the harness could see: " + strings.Join(unseen, ", "), nil})
	}
	return vs
}

// sortedUnique orders evidence lines by time (they start with it).
func sortedUnique(ev []string) []string {
	sort.Strings(ev)
	return slices.Compact(ev)
}

// launcherSays are the launcher's lines about p (its start, its end).
func (r *Record) launcherSays(p *Proc) []string {
	name := p.Name
	if k, ok := strings.CutPrefix(p.Name, "new "); ok {
		name = "replacement " + k
	}
	var out []string
	for _, l := range r.Lines {
		if _, text := splitPrefix(l.Text); l.Src == "launcher" && text == l.Text &&
			(strings.Contains(text, ": "+name+" ") || strings.Contains(text, ": "+p.Name+" ")) {
			out = append(out, evid(l))
		}
	}
	return out
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// leftOutLines are the shrunk lines of other processes that left p out
// (p's rank in their parent taken from p's own lines in that parent).
func (r *Record) leftOutLines(p *Proc) []string {
	rankIn := map[string]int{}
	for _, l := range r.Lines {
		if f := fields(l.Text); f != nil && atoi(f["pid"]) == p.Pid && f["comm"] != "" {
			rankIn[f["comm"]] = atoi(f["rank"])
		}
	}
	var out []string
	for _, l := range r.Lines {
		f := fields(l.Text)
		if f == nil || f["msg"] != "shrunk" {
			continue
		}
		if rk, ok := rankIn[f["comm"]]; ok && slices.Contains(ints(f["left_out"]), rk) {
			out = append(out, evid(l))
			if len(out) == 3 {
				break
			}
		}
	}
	return out
}

func checkHash(r *Record) []Violation {
	if r.Schedule.Workload != "sgd" || r.Hung {
		return nil
	}
	var got []Line
	for _, l := range r.Lines {
		_, text := splitPrefix(l.Text)
		if reHash.MatchString(text) {
			got = append(got, l)
		}
	}
	switch {
	case len(got) == 0:
		return []Violation{{InvHash, "no weights hash: the job did not finish (see " + InvExit + ")", nil}}
	case len(got) > 1:
		var ev []string
		for _, l := range got {
			ev = append(ev, evid(l))
		}
		return []Violation{{InvOneView, fmt.Sprintf("%d processes printed the final weights (each was rank 0 of a job)", len(got)), ev}}
	}
	if h := reHash.FindStringSubmatch(func() string { _, t := splitPrefix(got[0].Text); return t }())[1]; h != r.WantHash {
		return []Violation{{InvHash, fmt.Sprintf("weights %s, the uninterrupted run's %s", h[:16], r.WantHash[:min(16, len(r.WantHash))]), []string{evid(got[0])}}}
	}
	return nil
}

// failureLines are the first lines that say something failed.
func (r *Record) failureLines(n int) []string {
	var out []string
	for _, l := range r.Lines {
		t := l.Text
		if strings.Contains(t, "level=ERROR") || strings.HasPrefix(t, "sgd: -np") || strings.Contains(t, "] sgd: ") ||
			strings.Contains(t, "chaos client rank") || strings.Contains(t, "exited: exit status") || strings.Contains(t, "launcher exited") ||
			strings.Contains(t, "panic:") || strings.Contains(t, "fatal error:") {
			out = append(out, evid(l))
			if len(out) == n {
				break
			}
		}
	}
	return out
}

func checkExits(r *Record) []Violation {
	if r.Hung {
		return nil
	}
	var vs []Violation
	if r.Launcher != "" && r.Launcher != "0" {
		vs = append(vs, Violation{InvExit, "sgd's launcher exited: " + r.Launcher, r.failureLines(10)})
	}
	for _, l := range r.Lines {
		if strings.Contains(l.Text, "chaos client rank") && strings.Contains(l.Text, "want") {
			vs = append(vs, Violation{InvData, "a wrong sum", []string{evid(l)}})
		}
		if strings.HasPrefix(l.Text, "panic:") || strings.HasPrefix(l.Text, "fatal error:") || strings.Contains(l.Text, "] panic:") {
			vs = append(vs, Violation{InvExit, "a process crashed", []string{evid(l)}})
		}
	}
	return vs
}

func checkLeft(r *Record) []Violation {
	var vs []Violation
	if len(r.Leftover) > 0 {
		vs = append(vs, Violation{InvLeftover, fmt.Sprintf("%d process(es) of the job alive after it ended (killed)", len(r.Leftover)), r.Leftover})
	}
	if len(r.ShmLeft) > 0 {
		vs = append(vs, Violation{InvShm, fmt.Sprintf("%d file(s) left in the job's /dev/shm", len(r.ShmLeft)), r.ShmLeft})
	}
	return vs
}
