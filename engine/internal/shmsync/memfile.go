package shmsync

import "fmt"

// FileRef tells a peer where to find a memory file (memfd_create) that has
// no name anywhere: descriptor Fd of process Pid, which must be the file
// with inode Ino on device Dev. The check makes a recycled pid, a reused
// descriptor number, or a process seen under another pid namespace fail
// instead of mapping some other file.
type FileRef struct {
	Pid int    `json:"pid"`
	Fd  int    `json:"fd"`
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

func (r FileRef) String() string { return fmt.Sprintf("/proc/%d/fd/%d", r.Pid, r.Fd) }

// Opener opens descriptor fd of process pid with the open(2) flags and
// returns a descriptor of this process for the same file. OpenProcFd is
// the real one; tests inject failures (a peer whose /proc/<pid>/fd this
// process may not open: another user, a non-dumpable process, another pid
// namespace).
type Opener func(pid, fd, flags int) (int, error)
