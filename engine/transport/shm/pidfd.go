//go:build linux

package shm

import (
	"syscall"
	"unsafe"
)

// A pidfd (pidfd_open, Linux 5.3) polls readable once its process exited,
// zombie included: the watcher learns of every local peer's death with one
// ppoll instead of reading /proc/<pid>/stat per peer. Where pidfd_open is
// missing (old kernels, seccomp, MIPS here) it falls back to processAlive.

// pidfdOpen returns a pidfd for pid (close-on-exec), or -1.
func pidfdOpen(pid int) int {
	if sysPidfdOpen == 0 {
		return -1
	}
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		return -1
	}
	return int(fd)
}

type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn = 0x1

// pollExited polls fds without waiting and sets each revents; it reports
// whether the poll worked.
func pollExited(fds []pollFd) bool {
	if len(fds) == 0 {
		return true
	}
	for i := range fds {
		fds[i].events, fds[i].revents = pollIn, 0
	}
	var ts syscall.Timespec // zero: do not wait
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)),
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		return errno == 0
	}
}
