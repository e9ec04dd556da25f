package shmsync

import (
	"os"
	"os/exec"
	"runtime"
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
}
