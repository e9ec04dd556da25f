//go:build !linux

package shmsync

import (
	"runtime"
	"sync/atomic"
	"time"
)

// FutexWait emulates the Linux futex by polling: it sleeps in short steps
// while *addr == val, for at most timeout.
func FutexWait(addr *uint32, val uint32, timeout time.Duration) {
	if timeout <= 0 || timeout > time.Millisecond {
		timeout = time.Millisecond
	}
	end := time.Now().Add(timeout)
	for atomic.LoadUint32(addr) == val && time.Now().Before(end) {
		time.Sleep(50 * time.Microsecond)
	}
}

// FutexWake does nothing: FutexWait polls on this platform.
func FutexWake(addr *uint32) int { return 0 }

// Yield lets other goroutines run.
func Yield() { runtime.Gosched() }

// moveOff cannot move a thread here.
func moveOff() bool { return false }
