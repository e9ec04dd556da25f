//go:build linux

package shmsync

import (
	"math"
	"syscall"
	"time"
	"unsafe"
)

const (
	futexWaitOp = 0 // FUTEX_WAIT, process-shared (no FUTEX_PRIVATE_FLAG)
	futexWakeOp = 1 // FUTEX_WAKE, process-shared
)

// FutexWait sleeps while *addr == val, for at most timeout (no limit if
// timeout <= 0). It may return early (a wake, a signal, or *addr != val at
// entry); callers re-check their condition. addr must be 4-byte aligned and
// may live in memory shared with other processes.
func FutexWait(addr *uint32, val uint32, timeout time.Duration) {
	var tsp uintptr
	var ts syscall.Timespec
	if timeout > 0 {
		ts = syscall.NsecToTimespec(int64(timeout))
		tsp = uintptr(unsafe.Pointer(&ts))
	}
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val), tsp, 0, 0)
}

// FutexWake wakes every thread, in any process, sleeping in FutexWait on
// addr, and returns how many it woke.
func FutexWake(addr *uint32) int {
	n, _, errno := syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, math.MaxInt32, 0, 0, 0)
	if errno != 0 {
		return 0
	}
	return int(n)
}

// Yield gives the CPU to another runnable thread of any process
// (sched_yield). It does not let other goroutines of this process run; see
// Policy for the combination used while waiting.
func Yield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
