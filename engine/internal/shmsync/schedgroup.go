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
func SchedGroup(pid int) string { return schedGroup(pid, autogrouping()) }

// autogrouping says whether the kernel groups tasks by session.
func autogrouping() bool {
	on, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled")
	return err == nil && bytes.Equal(bytes.TrimSpace(on), []byte("1"))
}

func schedGroup(pid int, autogroup bool) string {
	dir := "/proc/" + strconv.Itoa(pid) + "/"
	cg, err := os.ReadFile(dir + "cgroup")
	if err != nil {
		return ""
	}
	name := string(bytes.TrimSpace(cg))
	if autogroup {
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
//
// Every rank of a host asks this about all of them, twice (transport and
// arena): with many ranks, reading every process's groups would be setup
// work growing with the square of the ranks. So beyond groupSample
// processes it compares this process's group with those of groupSample-1
// others spread over pids: ranks started alike by one launcher are all in
// one group or each in its own, which a sample tells as well as the lot.
func PolicyAmong(ranks int, pids []int) Policy {
	p := PolicyFor(ranks)
	if p.Yields == 0 || len(pids) <= 1 || !oversubscribed(ranks) {
		return p
	}
	autogroup := autogrouping()
	first := ""
	for _, pid := range samplePids(pids, self.Pid, groupSample) {
		switch g := schedGroup(pid, autogroup); {
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

// groupSample is the most processes whose groups PolicyAmong reads.
const groupSample = 8

// samplePids is the distinct pids, or, when there are more than k of
// them, me (if among them) and others evenly spread over pids, k in all.
func samplePids(pids []int, me, k int) []int {
	var out, others []int
	seen := make(map[int]bool, len(pids))
	for _, pid := range pids {
		if seen[pid] {
			continue
		}
		seen[pid] = true
		if pid == me {
			out = append(out, me)
		} else {
			others = append(others, pid)
		}
	}
	if len(out)+len(others) <= k {
		return append(out, others...)
	}
	m := k - len(out)
	for i := range m {
		out = append(out, others[i*len(others)/m])
	}
	return out
}
