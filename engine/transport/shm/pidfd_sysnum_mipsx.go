//go:build linux && (mips || mipsle || mips64 || mips64le)

package shm

// sysPidfdOpen: not used on MIPS (own syscall numbering); liveness is read
// from /proc there.
const sysPidfdOpen = 0
