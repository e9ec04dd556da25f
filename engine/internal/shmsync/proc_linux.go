//go:build linux

package shmsync

import (
	"os"
	"syscall"
	"unsafe"
)

var self = func() Proc {
	pid := os.Getpid()
	start, _ := ProcStart(pid)
	return Proc{Pid: pid, Start: start}
}()

// procMounted tells whether /proc can be read; without it liveness rests on
// kill(pid, 0) alone.
var procMounted = self.Start != 0

func procAlive(pid int, start uint64) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return false
	}
	if !procMounted {
		return true
	}
	s, alive := ProcStart(pid)
	return alive && (start == 0 || s == 0 || s == start)
}

// ProcStart returns the start time of process pid (field 22 of
// /proc/<pid>/stat, clock ticks after boot) and whether it is alive: it
// exists and is not a zombie. It allocates nothing. (0, false) when the
// file cannot be read.
func ProcStart(pid int) (start uint64, alive bool) {
	if pid <= 0 {
		return 0, false
	}
	var path [32]byte
	n := copy(path[:], "/proc/")
	n += putUint(path[n:], uint64(pid))
	n += copy(path[n:], "/stat")
	path[n] = 0
	fd, _, errno := syscall.Syscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(&path[0])),
		syscall.O_RDONLY|syscall.O_CLOEXEC, 0, 0, 0)
	if errno != 0 {
		return 0, false
	}
	// The fields up to the start time take well under 1 KiB (comm is at
	// most 16 bytes, the numbers at most 20 digits each).
	var buf [1024]byte
	// A raw read: syscall.Read's race-detector hooks would move buf to the
	// heap in -race builds.
	m, _, errno := syscall.Syscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	syscall.Close(int(fd))
	if errno != 0 || m == 0 || m > uintptr(len(buf)) {
		return 0, false
	}
	return parseStat(buf[:m])
}

// atFDCWD is AT_FDCWD (-100) as a system call argument.
var atFDCWD = ^uintptr(99)

// parseStat reads "pid (comm) S ppid ... starttime ..." : the state (field
// 3) and the start time (field 22). comm may hold spaces and parentheses,
// so fields count from the last ')'.
func parseStat(b []byte) (start uint64, alive bool) {
	i := len(b) - 1
	for i >= 0 && b[i] != ')' {
		i--
	}
	if i < 0 {
		return 0, false
	}
	b = b[i+1:]
	field := 2 // the field that ends at the ')'
	var state byte
	for len(b) > 0 {
		for len(b) > 0 && b[0] == ' ' {
			b = b[1:]
		}
		j := 0
		for j < len(b) && b[j] != ' ' && b[j] != '\n' {
			j++
		}
		if j == 0 {
			break
		}
		field++
		switch field {
		case 3:
			state = b[0]
		case 22:
			v, ok := parseUint(b[:j])
			if !ok {
				return 0, false
			}
			return v, state != 'Z' && state != 'X' && state != 'x'
		}
		b = b[j:]
	}
	return 0, false
}

func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// putUint writes v in decimal at the start of b and returns its length.
func putUint(b []byte, v uint64) int {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return copy(b, tmp[i:])
}
