package main

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// summary is a run's line on the console.
func summary(r *Record, vs []Violation) string {
	verdict := "ok"
	if len(vs) > 0 {
		var names []string
		for _, v := range vs {
			names = append(names, v.Invariant)
		}
		verdict = fmt.Sprintf("VIOLATED %s (log %s)", strings.Join(dedup(names), ", "), rel(filepath.Join(r.Dir, "run.log")))
	}
	what := r.Schedule.String()
	if len(r.Schedule.Faults) == 0 { // rebuilt from a log: its schedule line says it
		what = r.Schedule.Scenario
	}
	return fmt.Sprintf("seed %d %s, %s [%.1f s]: %s", r.Schedule.Seed, r.Schedule.Job(), what, r.Elapsed.Seconds(), verdict)
}

// rel is path relative to the working directory (the repository's root
// under build/chaos), when it is below it.
func rel(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if r, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}

func dedup(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// fired says what each fault of a run did, in one cell.
func fired(r *Record) string {
	var parts []string
	for i := range r.Schedule.Faults {
		what := "never fired (its trigger was not seen)"
		for _, f := range r.Fired {
			if f.Index == i {
				what = fmt.Sprintf("%.2f s: %s", f.At.Seconds(), f.Detail)
			}
		}
		parts = append(parts, fmt.Sprintf("%d. %s", i+1, what))
	}
	return strings.Join(parts, "<br>")
}

// neverFired counts the faults whose trigger never came.
func neverFired(results []result) int {
	n := 0
	for _, r := range results {
		n += len(r.rec.Schedule.Faults) - len(r.rec.Fired)
	}
	return n
}

// scenarioTable: runs and runs with violations per scenario and job.
func scenarioTable(results []result) string {
	type cell struct{ runs, bad int }
	cells := map[[2]string]*cell{}
	jobs := map[string]bool{}
	for _, r := range results {
		k := [2]string{r.rec.Schedule.Scenario, r.rec.Schedule.Job()}
		jobs[k[1]] = true
		if cells[k] == nil {
			cells[k] = &cell{}
		}
		cells[k].runs++
		if len(r.vs) > 0 {
			cells[k].bad++
		}
	}
	cols := slices.Sorted(maps.Keys(jobs))
	var b strings.Builder
	b.WriteString("| scenario | " + strings.Join(cols, " | ") + " |\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, sc := range scenarios {
		var row []string
		seen := false
		for _, j := range cols {
			c := cells[[2]string{sc.name, j}]
			if c == nil {
				row = append(row, "")
				continue
			}
			seen = true
			row = append(row, fmt.Sprintf("%d run%s, %d violated", c.runs, map[bool]string{true: "s"}[c.runs != 1], c.bad))
		}
		if seen {
			fmt.Fprintf(&b, "| %s | %s |\n", sc.name, strings.Join(row, " | "))
		}
	}
	return b.String()
}

type runMeta struct {
	began     time.Time
	wall      time.Duration
	load      [2]string
	cfg       *Config
	workload  string
	transport string
	netns     bool
	rate      string
}

// replay is the command that runs the same schedule again.
func replay(m runMeta, seed uint64) string {
	s := fmt.Sprintf("build/chaos -seed %d -np %d -timeout %v", seed, m.cfg.NP, m.cfg.Timeout)
	if m.workload != "any" {
		s += " -workload " + m.workload
	}
	if m.transport != "any" {
		s += " -transport " + m.transport
	}
	if m.netns {
		s += " -netns -rate " + m.rate
	}
	if m.cfg.Epochs != 8 || m.cfg.Calls != 800 { // the flags' defaults: the run's length moves the first trigger
		s += fmt.Sprintf(" -epochs %d -calls %d", m.cfg.Epochs, m.cfg.Calls)
	}
	return s
}

func writeReport(path string, m runMeta, refs map[string]*Record, results []result) error {
	var b strings.Builder
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	failed := 0
	for _, r := range results {
		if len(r.vs) > 0 {
			failed++
		}
	}
	fmt.Fprintf(&b, "# Chaos runs, %s\n\n", m.began.Format("2006-01-02 15:04"))
	fmt.Fprintf(&b, "`build/chaos` (build/bench/chaos; docs/elastic.md, \"Chaos harness\") at commit %s: **%d runs, %d with violations**, %.0f s of wall time.\n\n",
		strings.TrimSpace(string(commit)), len(results), failed, m.wall.Seconds())
	where := "one host, loopback (TCP control mesh, shared memory between ranks)"
	sgd := fmt.Sprintf("`sgd -np %d %s`", m.cfg.NP, strings.Join(m.cfg.sgdArgs(), " "))
	if m.netns {
		where = fmt.Sprintf("2 emulated hosts (network namespaces, links at %s)", m.rate)
		sgd = fmt.Sprintf("`sgd %s`, one process per rank started by the harness (which respawns as -np would)", strings.Join(m.cfg.sgdArgs(), " "))
	}
	fmt.Fprintf(&b, "- Jobs: %d ranks on %s, GOCOLL_TIMEOUT=%v; sgd: %s; C: build/bench/chaos/c/client.c, %d checked allreduces.\n",
		m.cfg.NP, where, m.cfg.Timeout, sgd, m.cfg.Calls)
	fmt.Fprintf(&b, "- Machine: %d CPUs (%s), load average %s at the start, %s at the end (shared with other work: times are not performance figures).\n",
		runtime.NumCPU(), runtime.GOARCH, strings.TrimSpace(m.load[0]), strings.TrimSpace(m.load[1]))
	for _, w := range slices.Sorted(maps.Keys(refs)) {
		if r := refs[w]; r != nil {
			fmt.Fprintf(&b, "- Uninterrupted %s run: %.1f s", r.Schedule.Job(), r.Elapsed.Seconds())
			if r.WantHash != "" {
				fmt.Fprintf(&b, ", weights sha256 %s", r.WantHash)
			}
			b.WriteString(".\n")
		}
	}
	fmt.Fprintf(&b, "- Replay a run: the command in its row's section below (the seed draws the workload, the scenario, the faults and their triggers).\n")
	if n := neverFired(results); n > 0 {
		fmt.Fprintf(&b, "- %d fault(s) never fired: their trigger's log line did not come (the engine logs no \"shrink\" or \"agreed\" line at INFO yet; a joiner's phase needs a joiner).\n", n)
	}
	b.WriteString("\n" + scenarioTable(results) + "\n")
	b.WriteString("| seed | job | scenario | what fired | s | verdict |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		v := "ok"
		if len(r.vs) > 0 {
			var names []string
			for _, x := range r.vs {
				names = append(names, x.Invariant)
			}
			v = "**" + strings.Join(dedup(names), ", ") + "**"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %.1f | %s |\n", r.rec.Schedule.Seed, r.rec.Schedule.Job(), r.rec.Schedule.Scenario,
			strings.ReplaceAll(fired(r.rec), "|", "\\|"), r.rec.Elapsed.Seconds(), v)
	}
	if failed > 0 {
		b.WriteString("\n## Violations\n")
	}
	for _, r := range results {
		if len(r.vs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n### Seed %d: %s, %s\n\n", r.rec.Schedule.Seed, r.rec.Schedule.Job(), r.rec.Schedule.Scenario)
		fmt.Fprintf(&b, "Replay: `%s`. Schedule: %s. Log: `%s`.\n\n", replay(m, r.rec.Schedule.Seed), r.rec.Schedule, rel(filepath.Join(r.rec.Dir, "run.log")))
		for _, v := range r.vs {
			fmt.Fprintf(&b, "- **%s**: %s\n", v.Invariant, v.What)
			if len(v.Evidence) > 0 {
				b.WriteString("\n  ```\n")
				for _, e := range v.Evidence[:min(len(v.Evidence), 14)] {
					fmt.Fprintf(&b, "  %s\n", e)
				}
				b.WriteString("  ```\n")
			}
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
