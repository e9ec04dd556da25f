package main

import (
	"reflect"
	"testing"
	"time"
)

func testPlan(netns bool) planConfig {
	return planConfig{Workload: "any", Transport: "any", Timeout: 5 * time.Second, Steps: map[string]int{"sgd": 384, "c": 800}, Netns: netns}
}

// A seed is its schedule: the same seed gives the same schedule, another
// seed (almost always) another.
func TestPlanReplays(t *testing.T) {
	p := testPlan(false)
	differ := 0
	for seed := uint64(0); seed < 200; seed++ {
		a, b := plan(seed, p), plan(seed, p)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: %v, then %v", seed, a, b)
		}
		if !reflect.DeepEqual(a, plan(seed+1, p)) {
			differ++
		}
	}
	if differ < 190 {
		t.Errorf("only %d of 200 seeds differ from the next", differ)
	}
}

// The run's length maps the first trigger, and nothing else: the same
// seed with a longer run draws the same faults.
func TestPlanLengthOnlyMovesTheStart(t *testing.T) {
	short, long := testPlan(false), testPlan(false)
	long.Steps = map[string]int{"sgd": 3840, "c": 8000}
	for seed := uint64(0); seed < 100; seed++ {
		a, b := plan(seed, short), plan(seed, long)
		a.Faults[0].When.N, b.Faults[0].When.N = 0, 0
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: %v against %v", seed, a, b)
		}
	}
}

// Every scenario is drawn within a few hundred seeds, on both workloads;
// floods only on loopback, slow links only between emulated hosts; the
// first fault lands between a tenth and half of the run; pauses past the
// timeout are past it.
func TestPlanCoversScenarios(t *testing.T) {
	for _, netns := range []bool{false, true} {
		p := testPlan(netns)
		seen := map[string]map[string]bool{}
		for seed := uint64(0); seed < 500; seed++ {
			s := plan(seed, p)
			if seen[s.Scenario] == nil {
				seen[s.Scenario] = map[string]bool{}
			}
			seen[s.Scenario][s.Workload] = true
			checkSchedule(t, p, s)
		}
		for _, sc := range scenarios {
			want := sc.netns == 0 || (sc.netns == 1) == netns
			if got := len(seen[sc.name]) == 2; got != want {
				t.Errorf("netns %v: scenario %s drawn on both workloads: %v, want %v", netns, sc.name, got, want)
			}
		}
	}
}

func checkSchedule(t *testing.T, p planConfig, s Schedule) {
	t.Helper()
	if len(s.Faults) == 0 {
		t.Fatalf("seed %d: no fault", s.Seed)
	}
	f0 := s.Faults[0]
	steps := p.Steps[s.Workload]
	if f0.When.Phase != AtStep || f0.When.N < steps/10 || f0.When.N > steps/2 {
		t.Errorf("seed %d: first fault %v: want a step in [%d, %d]", s.Seed, f0, steps/10, steps/2)
	}
	for _, f := range s.Faults {
		switch {
		case f.Kind == Flood && p.Netns, f.Kind == Slow && !p.Netns:
			t.Errorf("seed %d: %v with netns %v", s.Seed, f, p.Netns)
		case f.Kind == Stop && f.Dur >= p.Timeout/2 && f.Dur < 3*p.Timeout/2:
			t.Errorf("seed %d: %v: a pause neither well short of the timeout nor past it", s.Seed, f)
		case f.Kind == Flood && (f.Conns < 20 || f.Dur < p.Timeout):
			t.Errorf("seed %d: %v: too small a flood", s.Seed, f)
		}
	}
}

func TestScheduleString(t *testing.T) {
	s := Schedule{Scenario: "kill-then-pause-coordinator", Faults: []Fault{
		kill(Target{Role: NonCoord, Pick: 3}, Trigger{Phase: AtStep, N: 45, Delay: 11 * time.Millisecond}),
		stop(Target{Role: Coordinator}, Trigger{Phase: OnFailed, Delay: 8 * time.Millisecond}, 7500*time.Millisecond),
	}}
	want := "kill-then-pause-coordinator: kill non-coordinator#3 at step 45 +11ms; stop coordinator on failed +8ms for 7.5s"
	if got := s.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// -workload and -transport choose the job, never the faults; both
// transports are drawn.
func TestPlanJobDoesNotMoveFaults(t *testing.T) {
	any, fixed := testPlan(false), testPlan(false)
	fixed.Workload, fixed.Transport = "c", "tcp"
	transports := map[string]bool{}
	for seed := uint64(0); seed < 100; seed++ {
		a, b := plan(seed, any), plan(seed, fixed)
		transports[a.Transport] = true
		if b.Workload != "c" || b.Transport != "tcp" {
			t.Fatalf("seed %d: asked for c over tcp, got %s", seed, b.Job())
		}
		a.Faults[0].When.N, b.Faults[0].When.N = 0, 0
		if !reflect.DeepEqual(a.Faults, b.Faults) || a.Scenario != b.Scenario {
			t.Fatalf("seed %d: %v against %v", seed, a, b)
		}
	}
	if len(transports) != 2 {
		t.Errorf("transports drawn: %v", transports)
	}
}
