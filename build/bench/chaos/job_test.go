package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Pids above the kernel's largest (2^22): signals to them fail, so the
// test can fire faults without hitting anything.
const noPid = 999_999_900

func testJob(faults ...Fault) *job {
	return &job{cfg: &Config{Timeout: 5 * time.Second}, start: time.Now(), lines: make(chan Line, 16), fire: make(chan func(), 16),
		byPid: map[int]*Proc{}, byNm: map[string]*Proc{}, rec: &Record{Schedule: Schedule{Workload: "sgd", Faults: faults}}}
}

// feed hands the job lines as sgd's launcher would, then runs whatever
// fired within a moment; it returns how many faults fired so far.
func (j *job) feed(t *testing.T, lines ...string) int {
	t.Helper()
	for _, l := range lines {
		j.handle(Line{T: j.since(), Src: "launcher", Text: l})
	}
	for {
		select {
		case f := <-j.fire:
			f()
		case <-time.After(50 * time.Millisecond):
			return len(j.rec.Fired)
		}
	}
}

// Faults fire in order, each on the first event of its phase after the
// one before fired: a step, then the replacement's connection.
func TestTriggers(t *testing.T) {
	j := testJob(kill(Target{Role: NonCoord, Pick: 1}, Trigger{Phase: AtStep, N: 40}),
		kill(Target{Role: Joiner}, Trigger{Phase: OnJoinerConnected, Delay: time.Millisecond}),
		stop(Target{Role: Coordinator}, Trigger{Phase: OnShrunk}, time.Second))
	j.armNext()
	var ranks []string
	for r := range 4 {
		ranks = append(ranks, fmt.Sprintf("sgd: rank %d is pid %d", r, noPid+r))
	}
	joinerUp := "[new 0] " + slogLine(noPid+9, 3, 4, "c2", "connected", "")
	shrunk := "[rank 1] " + slogLine(noPid+1, 1, 4, "c0", "shrunk", "new_rank=1 new_size=3 left_out=[2]")
	steps := []struct {
		lines []string
		fired int
	}{
		{append(ranks, "step 36 loss 2.1", shrunk), 0},                  // a shrunk line before the first fault counts for nothing
		{[]string{"step 40 loss 2.0"}, 1},                               // kills non-coordinator #1: rank 2
		{[]string{joinerUp}, 1},                                         // no replacement known yet
		{[]string{"sgd: replacement 0 for rank 2 is pid 999999909"}, 1}, // started, not connected
		{[]string{joinerUp}, 2},                                         // its connection: killed
		{[]string{shrunk}, 3},                                           // the coordinator paused
	}
	for i, s := range steps {
		if got := j.feed(t, s.lines...); got != s.fired {
			t.Fatalf("step %d: %d faults fired, want %d: %+v", i, got, s.fired, j.rec.Fired)
		}
	}
	want := []string{"rank 2", "new 0", "rank 0"}
	for i, f := range j.rec.Fired {
		if f.Proc != want[i] {
			t.Errorf("fault %d hit %q, want %q (%s)", i+1, f.Proc, want[i], f.Detail)
		}
	}
	if p := j.byNm["rank 2"]; !p.Killed {
		t.Errorf("rank 2 not marked killed")
	}
	if d := j.rec.Fired[2].Detail; !strings.HasPrefix(d, "SIGSTOP rank 0 (pid 999999900") {
		t.Errorf("the pause: %s", d)
	}
}

// A target that names nobody is said so, and the schedule goes on.
func TestTriggerWithoutTarget(t *testing.T) {
	j := testJob(kill(Target{Role: Joiner}, Trigger{Phase: AtStep, N: 1}), kill(Target{Role: Member}, Trigger{Phase: AfterPrev}))
	j.armNext()
	if got := j.feed(t, fmt.Sprintf("sgd: rank 0 is pid %d", noPid), "step 4 loss 1.0"); got != 2 {
		t.Fatalf("%d fired: %+v", got, j.rec.Fired)
	}
	if !strings.HasPrefix(j.rec.Fired[0].Detail, "no process to kill") || j.rec.Fired[1].Proc != "rank 0" {
		t.Errorf("fired %+v", j.rec.Fired)
	}
}
