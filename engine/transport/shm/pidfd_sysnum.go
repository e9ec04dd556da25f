//go:build linux && !(mips || mipsle || mips64 || mips64le)

package shm

// sysPidfdOpen is pidfd_open's number (the same on every architecture
// with the unified syscall table).
const sysPidfdOpen = 434
