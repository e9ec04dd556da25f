package shmsync

import "fmt"

// Proc identifies a process: its pid and its start time in clock ticks since
// boot (0 when unknown), which tells it apart from a later process that
// reuses the pid.
type Proc struct {
	Pid   int
	Start uint64
}

// Self is the calling process.
func Self() Proc { return self }

// LookupProc returns the identity of the running process pid; ok is false
// if there is no such process (or it is a zombie).
func LookupProc(pid int) (p Proc, ok bool) {
	start, alive := ProcStart(pid)
	return Proc{Pid: pid, Start: start}, alive
}

// Alive reports whether p still runs: the pid exists, is not a zombie, and
// (if both start times are known) started when p did. It allocates nothing.
func (p Proc) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	return procAlive(p.Pid, p.Start)
}

func (p Proc) String() string { return fmt.Sprintf("pid %d", p.Pid) }
