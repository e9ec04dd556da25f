// Command chaos runs seeded, replayable random fault schedules against
// real elastic jobs and checks invariants after each run (build/chaos
// builds what it needs and runs it; docs/elastic.md, "Chaos harness").
//
//	chaos -sgd BIN -client BIN [-seed S] [-runs N] [-ci] [-workload any|sgd|c]
//	    [-np 8] [-timeout 3s] [-netns] [-report FILE] [-out DIR] [-keep]
//
// A seed draws the workload (sgd -np N -virtual 8 -elastic -respawn, or
// the C client of c/client.c), a scenario and its faults with their
// triggers: SIGKILL, SIGSTOP past the timeout or short of it (then
// SIGCONT), idle connections flooding a rank's listening ports, the
// replacement process killed while it joins, a second death in a phase of
// the recovery (triggered by the engine's log lines), a slow link between
// emulated hosts (-netns). After each run: exactly one live view, no
// healthy rank excluded, the run ended within its bound, the weights hash
// of an uninterrupted run (sgd) or every sum right (C), the job exited 0,
// nothing left in its /dev/shm, no process left behind. -seed S replays
// run S; the report names the seed, the invariant and the log lines.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// ciSeeds are the CI mode's runs: together they cover a kill inside a
// recovery, a flood then a death, a paused coordinator and a killed
// replacement, on both workloads (their scenarios are in the report).
var ciSeeds = []uint64{15, 16, 20, 37}

type result struct {
	rec *Record
	vs  []Violation
}

func main() {
	var cfg Config
	seed := flag.Uint64("seed", 1, "the first seed (with -runs 1: replay exactly this run)")
	runs := flag.Int("runs", 1, "how many seeds to run: seed, seed+1, ...")
	ci := flag.Bool("ci", false, "the CI mode: the fixed seeds "+fmt.Sprint(ciSeeds)+" (overrides -seed and -runs)")
	workload := flag.String("workload", "any", "sgd, c, or any (drawn from the seed)")
	transport := flag.String("transport", "any", "GOCOLL_TRANSPORT of the jobs: auto, tcp, or any (drawn from the seed)")
	flag.StringVar(&cfg.SGD, "sgd", "", "the sgd binary (go build ./examples/sgd)")
	flag.StringVar(&cfg.Client, "client", "", "the C client (build/bench/chaos/c/client.c against libgocoll)")
	flag.IntVar(&cfg.NP, "np", 8, "ranks per job")
	flag.DurationVar(&cfg.Timeout, "timeout", 5*time.Second, "GOCOLL_TIMEOUT of the jobs (pauses are drawn relative to it)")
	flag.DurationVar(&cfg.Bound, "bound", 0, "kill a run after this long and report a hang (0: from the uninterrupted run and the schedule)")
	flag.StringVar(&cfg.Out, "out", "build/out/chaos", "run directories (logs) go here; a failing run's is kept")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep every run's directory")
	flag.IntVar(&cfg.Epochs, "epochs", 8, "sgd epochs of 128 steps")
	flag.IntVar(&cfg.Calls, "calls", 800, "C client allreduces per run")
	netns := flag.Bool("netns", false, "run the jobs on 2 emulated hosts (root): slow links can be drawn, floods cannot")
	rate := flag.String("rate", "1gbit", "with -netns: the hosts' link rate")
	report := flag.String("report", "", "write the Markdown report here")
	list := flag.Bool("list", false, "print the seeds' schedules and run nothing")
	repeat := flag.Int("repeat", 1, "run each seed this many times (the same schedule; whether a race is hit may vary)")
	recheck := flag.String("check", "", "check the run whose log (run.log) is here again, and run nothing")
	flag.Parse()
	if *recheck != "" {
		os.Exit(checkLog(*recheck))
	}
	seeds := make([]uint64, *runs)
	for i := range seeds {
		seeds[i] = *seed + uint64(i)
	}
	if *ci {
		seeds = ciSeeds
	}
	if *repeat > 1 {
		var rep []uint64
		for _, s := range seeds {
			for range *repeat {
				rep = append(rep, s)
			}
		}
		seeds = rep
	}
	if *list {
		pc := planConfig{Workload: *workload, Transport: *transport, Timeout: cfg.Timeout, Steps: cfg.steps(), Netns: *netns}
		for _, s := range seeds {
			fmt.Printf("seed %d %s, %s\n", s, plan(s, pc).Job(), plan(s, pc))
		}
		return
	}
	os.Exit(run(&cfg, seeds, planConfig{Workload: *workload, Transport: *transport, Netns: *netns}, *rate, *report))
}

func run(cfg *Config, seeds []uint64, pc planConfig, rate, report string) int {
	netns := pc.Netns
	if cfg.SGD == "" || cfg.Client == "" {
		fmt.Fprintln(os.Stderr, "chaos: -sgd and -client are needed (build/chaos builds them)")
		return 2
	}
	if netns {
		if why := netnsUsable(); why != "" {
			fmt.Printf("chaos: emulated hosts %s; skipped\n", why)
			return 0
		}
		h, err := newHosts(2, cfg.NP, rate)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos: emulated hosts:", err)
			return 2
		}
		cfg.Hosts = h
		defer h.down()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		if a := cfg.abort.Load(); a != nil {
			(*a)()
		}
		cfg.Hosts.down()
		os.Exit(130)
	}()
	cfg.PrivateShm = canPrivateShm()
	pc.Timeout, pc.Steps = cfg.Timeout, cfg.steps()
	began := time.Now()
	load0 := loadAvg()
	refs := map[string]*Record{}
	var results []result
	tries := map[uint64]int{}
	for _, seed := range seeds {
		tries[seed]++
		s := plan(seed, pc)
		ref, err := reference(cfg, refs, s.Workload, s.Transport)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
		rec, err := runOne(cfg, s, tries[seed], refHash(ref), bound(cfg, ref, s))
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: seed %d: %v\n", seed, err)
			return 2
		}
		vs := check(rec)
		results = append(results, result{rec, vs})
		fmt.Println(summary(rec, vs))
		if len(vs) == 0 && !cfg.Keep {
			os.RemoveAll(rec.Dir)
		}
	}
	failed := 0
	for _, r := range results {
		if len(r.vs) > 0 {
			failed++
		}
	}
	fmt.Printf("chaos: %d runs, %d with violations, %.0f s\n", len(results), failed, time.Since(began).Seconds())
	if report != "" {
		meta := runMeta{began: began, wall: time.Since(began), load: [2]string{load0, loadAvg()}, cfg: cfg,
			workload: pc.Workload, transport: pc.Transport, netns: netns, rate: rate}
		if err := writeReport(report, meta, refs, results); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: report:", err)
			return 2
		}
		fmt.Println("chaos: report", report)
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// checkLog prints the verdict on a run's log.
func checkLog(path string) int {
	rec, err := recordFromLog(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	vs := check(rec)
	fmt.Println(summary(rec, vs))
	for _, v := range vs {
		fmt.Printf("- %s: %s\n", v.Invariant, v.What)
		for _, e := range v.Evidence {
			fmt.Printf("    %s\n", e)
		}
	}
	if len(vs) > 0 {
		return 1
	}
	return 0
}

// reference is the uninterrupted run of a workload (once per
// invocation): its hash is what every run must end with, its time sets
// the bound. It must itself pass every check.
func reference(cfg *Config, refs map[string]*Record, workload, transport string) (*Record, error) {
	key := workload + " over " + transport
	if r := refs[key]; r != nil {
		return r, nil
	}
	// A loaded machine can make even an uninterrupted start miss the
	// timeout: try three times before giving up.
	var rec *Record
	for try := 1; ; try++ {
		var err error
		if rec, err = runOne(cfg, Schedule{Workload: workload, Transport: transport, Scenario: "uninterrupted"}, 1, "", max(cfg.Bound, 10*time.Minute)); err != nil {
			return nil, err
		}
		rec.WantHash = refHash(rec)
		vs := check(rec)
		if len(vs) == 0 {
			break
		}
		msg := fmt.Sprintf("the uninterrupted %s run fails (%s: %s); its log: %s", key, vs[0].Invariant, vs[0].What, filepath.Join(rec.Dir, "run.log"))
		if try == 3 {
			return nil, errors.New(msg)
		}
		fmt.Println("chaos:", msg, "- again")
	}
	fmt.Printf("chaos: uninterrupted %s run: %.1f s %s\n", key, rec.Elapsed.Seconds(), rec.WantHash)
	refs[key] = rec
	return rec, nil
}

func refHash(rec *Record) string {
	for _, l := range rec.Lines {
		_, text := splitPrefix(l.Text)
		if m := reHash.FindStringSubmatch(text); m != nil {
			return m[1]
		}
	}
	return ""
}

// bound is how long run s may take: three uninterrupted runs, plus per
// fault its pause and ten timeouts (a shrink may take eight), plus a
// margin for a loaded machine.
func bound(cfg *Config, ref *Record, s Schedule) time.Duration {
	if cfg.Bound > 0 {
		return cfg.Bound
	}
	b := 3*ref.Elapsed + 30*time.Second
	for _, f := range s.Faults {
		b += f.Dur + 10*cfg.Timeout
	}
	return b
}

func canPrivateShm() bool {
	if os.Geteuid() != 0 {
		return false
	}
	for _, t := range []string{"unshare", "mount", "umount"} {
		if _, err := exec.LookPath(t); err != nil {
			return false
		}
	}
	return exec.Command("unshare", "--mount", "true").Run() == nil
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if len(b) > 14 {
		return string(b[:14])
	}
	return string(b)
}
