package shmsync

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// startSleeper runs sleep in its own session or in ours; it is killed when
// the test ends.
func startSleeper(t *testing.T, session bool) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: session}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

// Ranks in different sessions under autogrouping are different scheduler
// groups: oversubscribed, they must not spend their wait yielding (it hands
// the core to nobody); ranks of one session keep the yield phase, and so
// does any set of ranks that each have a core.
func TestPolicyAmongSchedGroups(t *testing.T) {
	on, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled")
	if err != nil || strings.TrimSpace(string(on)) != "1" {
		t.Skip("the kernel does not group by session here")
	}
	self := os.Getpid()
	same, other := startSleeper(t, false), startSleeper(t, true)
	if SchedGroup(self) == "" || SchedGroup(self) != SchedGroup(same) {
		t.Fatalf("a child in our session: groups %q and %q", SchedGroup(self), SchedGroup(same))
	}
	if SchedGroup(self) == SchedGroup(other) {
		t.Fatalf("a child in its own session shares our group %q", SchedGroup(self))
	}
	over := runtime.NumCPU() + 1
	if p := PolicyAmong(over, []int{self, same}); p != PolicyFor(over) {
		t.Errorf("one session, oversubscribed: %+v, want PolicyFor's %+v", p, PolicyFor(over))
	}
	if p := PolicyAmong(over, []int{self, same, other}); p.Yields != 0 || p.Yield != 0 || p.Polls == 0 {
		t.Errorf("separate sessions, oversubscribed: %+v, want polls and no yielding", p)
	}
	if p := PolicyAmong(1, []int{self, other}); p != PolicyFor(1) {
		t.Errorf("separate sessions, a core each: %+v, want PolicyFor's %+v", p, PolicyFor(1))
	}
	if p := PolicyAmong(over, []int{self, 1 << 30}); p != PolicyFor(over) {
		t.Errorf("an unreadable peer: %+v, want PolicyFor's %+v", p, PolicyFor(over))
	}
	// More processes than PolicyAmong reads the groups of (groupSample).
	shared, own := []int{self}, []int{self}
	for range 2 * groupSample {
		shared = append(shared, startSleeper(t, false))
		own = append(own, startSleeper(t, true))
	}
	if p := PolicyAmong(over, shared); p != PolicyFor(over) {
		t.Errorf("%d processes of one session, oversubscribed: %+v, want PolicyFor's %+v", len(shared), p, PolicyFor(over))
	}
	if p := PolicyAmong(over, own); p.Yields != 0 || p.Yield != 0 || p.Polls == 0 {
		t.Errorf("%d processes each in its own session, oversubscribed: %+v, want polls and no yielding", len(own), p)
	}
}

func TestSamplePids(t *testing.T) {
	seq := func(lo, hi int) []int {
		var out []int
		for p := lo; p < hi; p++ {
			out = append(out, p)
		}
		return out
	}
	cases := []struct {
		pids    []int
		me, k   int
		want    []int
		wantLen int
	}{
		{pids: []int{5, 5, 7, 5}, me: 5, k: 8, want: []int{5, 7}},
		{pids: seq(100, 108), me: 103, k: 8, want: []int{103, 100, 101, 102, 104, 105, 106, 107}},
		{pids: seq(100, 228), me: 150, k: 8, wantLen: 8},
		{pids: seq(100, 228), me: 1, k: 8, wantLen: 8},
	}
	for _, tc := range cases {
		got := samplePids(tc.pids, tc.me, tc.k)
		if tc.want != nil && !slices.Equal(got, tc.want) {
			t.Errorf("samplePids(%v, %d, %d) = %v, want %v", tc.pids, tc.me, tc.k, got, tc.want)
		}
		if tc.wantLen != 0 && len(got) != tc.wantLen {
			t.Errorf("samplePids(%d pids, %d, %d) = %v, want %d of them", len(tc.pids), tc.me, tc.k, got, tc.wantLen)
		}
		seen := map[int]bool{}
		for _, p := range got {
			if seen[p] || !slices.Contains(tc.pids, p) {
				t.Errorf("samplePids(%v, %d, %d) = %v: %d repeated or not among the pids", tc.pids, tc.me, tc.k, got, p)
			}
			seen[p] = true
		}
		if slices.Contains(tc.pids, tc.me) && (len(got) == 0 || got[0] != tc.me) {
			t.Errorf("samplePids(%v, %d, %d) = %v: this process first", tc.pids, tc.me, tc.k, got)
		}
	}
}
