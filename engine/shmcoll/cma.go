//go:build linux

package shmcoll

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/transport"
)

// Cross-memory attach (process_vm_readv, "CMA"): a rank whose buffer is not
// registered memory can still spare the copy into its slot by publishing
// the buffer's address; peers then copy straight out of its process into
// theirs, one copy instead of two, as Open MPI's vader BTL does for large
// messages. The kernel allows it between processes of one user unless a
// seccomp profile (Docker's default) or Yama forbids it, so every rank
// probes every peer at Connect and the arena uses it only when all ranks
// could (see Arena.decideCMA).

// cmaMin is the least data per peer and piece for which a rank publishes
// its buffer's address rather than copying into its slot: below, the
// system call per peer costs more than the copy it saves. Measured on the
// 2-vCPU VM (C ABI, processes, p50): 2 ranks, an 8 KiB block per peer
// (16 KiB allgather) 2.0 µs with CMA vs 2.4 µs through the slot, 32 KiB
// 3.6 vs 6.7 µs; 4 ranks sharing the 2 cores, 4 KiB blocks 12-17 µs vs
// 7.5 µs and 16 KiB about even, 256 KiB 130-180 µs vs 160-260 µs.
func cmaMin(ranks int) int {
	if ranks <= runtime.NumCPU() {
		return 8 << 10
	}
	return 64 << 10
}

// Values of a segment's offCMA word (0 until its owner probed).
const (
	cmaOK uint64 = 1 // this rank could read every peer
	cmaNo uint64 = 2 // it could not, or it does not want to (Config.NoCMA)
)

// remoteIovec is struct iovec for the remote side: the address is in the
// other process, so it is a number here, not a pointer.
type remoteIovec struct {
	base uintptr
	len  uint64
}

// readRemote copies len(dst) bytes at addr in process pid into dst.
func readRemote(pid int, dst []byte, addr uint64) error {
	for len(dst) > 0 {
		local := syscall.Iovec{Base: &dst[0], Len: uint64(len(dst))}
		remote := remoteIovec{base: uintptr(addr), len: uint64(len(dst))}
		n, _, errno := syscall.Syscall6(unix.SYS_PROCESS_VM_READV, uintptr(pid),
			uintptr(unsafe.Pointer(&local)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
		if errno != 0 {
			return errno
		}
		if n == 0 || n > uintptr(len(dst)) {
			return fmt.Errorf("process_vm_readv returned %d of %d bytes", n, len(dst))
		}
		dst = dst[n:]
		addr += uint64(n)
	}
	return nil
}

// probeCMA says whether this process can read peer s's memory: it reads
// the magic word of s's header through s's own mapping of it.
func probeCMA(s *segment) bool {
	base := shmseg.Word(s.m, offBase).Load()
	if base == 0 {
		return false
	}
	var got [8]byte
	if readRemote(s.proc.Pid, got[:], base+shmseg.OffMagic) != nil {
		return false
	}
	return *(*uint64)(unsafe.Pointer(&got[0])) == segMagic
}

// addrOf is the address of b's first byte, as peers pass it to
// process_vm_readv.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// fetch copies bytes [lo, hi) of peer j's data for the piece that just
// passed its barrier into dst: from its registered buffer or, when its
// record carries an address, out of its process; else from its slot of set
// at slotOff+lo. need is as for source.
func (a *Arena) fetch(dst []byte, j, set, slotOff, lo, hi int, need uint64) error {
	rec := a.segs[j].recs[a.phase&1]
	if rec.addr == 0 {
		src, err := a.source(j, set, slotOff, lo, hi, need)
		if err != nil {
			return err
		}
		copy(dst, src)
		return nil
	}
	a.cmaReads++
	if err := readRemote(a.segs[j].proc.Pid, dst[:hi-lo], rec.addr+uint64(lo)); err != nil {
		var cause error = &transport.PeerLostError{Peer: j, Reason: fmt.Sprintf("process %d: process_vm_readv: %v", a.segs[j].proc.Pid, err)}
		if err != syscall.ESRCH {
			cause = fmt.Errorf("%w: rank %d: reading %d bytes of rank %d's buffer at %#x: process_vm_readv: %v",
				transport.ErrProtocol, a.rank, hi-lo, j, rec.addr+uint64(lo), err)
		}
		return a.fail(fmt.Errorf("shmcoll: rank %d: %w", a.rank, cause))
	}
	return nil
}
