package shmsync

import (
	"bytes"
	"os"
	"strconv"
)

// SchedGroup names the group the kernel's fair scheduler shares process
// pid's CPU time within: its cgroup and, when the kernel groups by session
// (sched_autogroup_enabled), its autogroup. Processes with different names
// are scheduled as separate groups: a sched_yield in one hands the core to
// nobody in another. It returns "" when that cannot be read (not Linux,
// pid gone).
func SchedGroup(pid int) string {
	dir := "/proc/" + strconv.Itoa(pid) + "/"
	cg, err := os.ReadFile(dir + "cgroup")
	if err != nil {
		return ""
	}
	name := string(bytes.TrimSpace(cg))
	if on, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled"); err == nil && bytes.Equal(bytes.TrimSpace(on), []byte("1")) {
		if ag, err := os.ReadFile(dir + "autogroup"); err == nil {
			// "/autogroup-123 nice 0": the nice value weighs the group
			// but does not make it another one.
			f := bytes.Fields(ag)
			if len(f) > 0 {
				name += "\n" + string(f[0])
			}
		}
	}
	return name
}

// PolicyAmong is PolicyFor(ranks) for ranks local ranks whose processes
// are pids (this one among them), except where yielding cannot help: when the ranks
// outnumber the cores and sit in different scheduler groups (SchedGroup;
// e.g. each launched in its own session, as setsid, ssh or some launchers
// do, with autogrouping on), a rank that yields keeps its core, since the
// peer it waits for is another group's task, and burns its time slice
// (16 ranks each in its own session on 2 cores: the fewer yields before
// the futex, the faster; none was fastest). Such ranks poll briefly and
// then sleep on the futex,
// whose wake hands the core over. Unreadable groups count as shared.
func PolicyAmong(ranks int, pids []int) Policy {
	p := PolicyFor(ranks)
	if p.Yields == 0 || len(pids) <= 1 || !oversubscribed(ranks) {
		return p
	}
	first := ""
	for _, pid := range pids {
		switch g := SchedGroup(pid); {
		case g == "":
		case first == "":
			first = g
		case g != first:
			p.Yields, p.Yield = 0, 0
			return p
		}
	}
	return p
}
