package shmsync

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// moveOff moves the calling thread off the CPU it runs on, leaving its
// affinity mask as it was: it narrows the mask to the other allowed CPUs,
// which makes the kernel migrate the thread at once, and restores it. It
// reports whether the thread moved; a thread allowed only its current CPU
// stays. The caller must be locked to its thread.
func moveOff() bool {
	cpu := currentCPU()
	if cpu < 0 {
		return false
	}
	var mask, others unix.CPUSet
	if unix.SchedGetaffinity(0, &mask) != nil {
		return false
	}
	others = mask
	others.Clear(cpu)
	if others.Count() == 0 {
		return false
	}
	if unix.SchedSetaffinity(0, &others) != nil {
		return false
	}
	// Restoring cannot fail where narrowing succeeded; if it did, the
	// thread would keep the narrower mask, which still lets it run.
	_ = unix.SchedSetaffinity(0, &mask)
	return true
}

// currentCPU is the CPU the calling thread runs on (-1 if unknown).
func currentCPU() int {
	var cpu uint32
	if _, _, errno := syscall.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); errno != 0 {
		return -1
	}
	return int(cpu)
}
