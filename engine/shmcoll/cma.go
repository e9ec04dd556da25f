//go:build linux

package shmcoll

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"syscall"
	"time"
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
// system call per peer costs more than the copy it saves, whether the
// cores are close or far (above it a 2-rank call's ranks measure which is
// faster, pathChooser). With more ranks than cores, never: there the slots
// were faster at every size measured, about twice from 64 KiB per peer. A
// rank in the kernel's copy, pinning a peer's pages, holds one of the few
// cores the peer it reads from needs.
func cmaMin(ranks int) int {
	if ranks <= runtime.NumCPU() {
		return 8 << 10
	}
	return math.MaxInt
}

// cmaMax is the data per peer over a call from which a rank copies into its
// slot again: at these sizes the kernel's pinning of the buffer's pages, 16
// at a time, costs more than the second copy. Measured with 2 ranks (C
// ABI, processes), the slots were as fast or faster from 8 MiB per peer,
// with the cores close and far, for allgather, alltoall and (since the
// slots are filled with cached stores, copyIn) broadcast; a 4 MiB
// broadcast still favours the root writing half into the peer (one piece:
// the peer's copy out waits for the whole copy in). Below 8 MiB per peer the answer for allgather and
// alltoall depends on the cores' distance so much that they measure it
// (pathChooser). With more ranks the runs were too noisy to tell, so
// there is no upper end.
func cmaMax(ranks int) int {
	if ranks == 2 {
		return 8 << 20
	}
	return math.MaxInt
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
	return remoteCopy(unix.SYS_PROCESS_VM_READV, "process_vm_readv", pid, dst, addr)
}

// writeRemote copies src into process pid at addr.
func writeRemote(pid int, src []byte, addr uint64) error {
	return remoteCopy(unix.SYS_PROCESS_VM_WRITEV, "process_vm_writev", pid, src, addr)
}

// remoteCopy runs process_vm_readv or process_vm_writev (sysno, named
// name) between local and the bytes at addr in process pid until all of
// them moved.
func remoteCopy(sysno uintptr, name string, pid int, local []byte, addr uint64) error {
	for len(local) > 0 {
		l := syscall.Iovec{Base: &local[0], Len: uint64(len(local))}
		remote := remoteIovec{base: uintptr(addr), len: uint64(len(local))}
		n, _, errno := syscall.Syscall6(sysno, uintptr(pid),
			uintptr(unsafe.Pointer(&l)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
		if errno != 0 {
			return errno
		}
		if n == 0 || n > uintptr(len(local)) {
			return fmt.Errorf("%s returned %d of %d bytes", name, n, len(local))
		}
		local = local[n:]
		addr += uint64(n)
	}
	return nil
}

// probeCMA says whether this process can read and write peer s's memory:
// it reads the magic word of s's header through s's own mapping of it and
// writes the same value back (the kernel allows both alike, but a seccomp
// profile could allow one only, and a 2-rank broadcast's root writes).
func probeCMA(s *segment) bool {
	base := shmseg.Word(s.m, offBase).Load()
	if base == 0 {
		return false
	}
	var got [8]byte
	if readRemote(s.proc.Pid, got[:], base+shmseg.OffMagic) != nil {
		return false
	}
	return *(*uint64)(unsafe.Pointer(&got[0])) == segMagic &&
		writeRemote(s.proc.Pid, got[:], base+shmseg.OffMagic) == nil
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

// store copies src into peer j's buffer at the address its record of the
// current phase carries, plus off: the 2-rank broadcast's root writing its
// half (see Arena.bcastSplit). It writes only while it holds j's store
// gate for the phase, and does nothing when j already left the call (the
// barrier after it then reports why).
func (a *Arena) store(j int, src []byte, off int) error {
	p := a.phase
	if !a.claimStore(j, p) {
		return nil
	}
	defer a.segs[j].gate.Store(p << 2)
	addr := a.segs[j].recs[p&1].addr + uint64(off)
	a.cmaWrites++
	if err := writeRemote(a.segs[j].proc.Pid, src, addr); err != nil {
		var cause error = &transport.PeerLostError{Peer: j, Reason: fmt.Sprintf("process %d: process_vm_writev: %v", a.segs[j].proc.Pid, err)}
		if err != syscall.ESRCH {
			cause = fmt.Errorf("%w: rank %d: writing %d bytes into rank %d's buffer at %#x: process_vm_writev: %v",
				transport.ErrProtocol, a.rank, len(src), j, addr, err)
		}
		return a.fail(fmt.Errorf("shmcoll: rank %d: %w", a.rank, cause))
	}
	return nil
}

// The store gate: a word in each rank's segment that makes a peer's write
// into the rank's buffer (store) and the rank's leaving a call with an
// error exclusive. Without it a rank that failed or was aborted could
// return, and its caller free or reuse the buffer, while the peer still
// wrote into it. Values for phase p: p<<2|gateWriting while a peer
// writes, p<<2|gateClosed once the rank gave up on p, p<<2 otherwise.
const (
	gateWriting = 1
	gateClosed  = 2
	// gateWait bounds how long a failing rank waits for a peer's write in
	// progress: the copy itself takes milliseconds, so only a peer stopped
	// (SIGSTOP, a debugger) between its copy and the release waits this
	// long, and then it no longer writes.
	gateWait = 10 * time.Second
)

// claimStore takes peer j's gate for phase p; false if j gave up on p.
func (a *Arena) claimStore(j int, p uint64) bool {
	g := a.segs[j].gate
	for {
		v := g.Load()
		if v == p<<2|gateClosed {
			return false
		}
		if g.CompareAndSwap(v, p<<2|gateWriting) {
			return true
		}
	}
}

// closeGate gives up on phase p: once it returns, no peer writes into this
// rank's buffer for p. It waits for a write in progress unless the writer
// (rank w) died, or for gateWait at most.
func (a *Arena) closeGate(p uint64, w int) {
	g := a.me.gate
	deadline := time.Now().Add(gateWait)
	for {
		v := g.Load()
		if v != p<<2|gateWriting {
			if g.CompareAndSwap(v, p<<2|gateClosed) {
				return
			}
			continue
		}
		if time.Now().After(deadline) || !a.segs[w].proc.Alive() {
			return
		}
		a.gateWaits.Add(1)
		time.Sleep(50 * time.Microsecond)
	}
}

// choosePath decides whether this rank's blocks of a 2-rank allgather or
// alltoall(v) of total bytes per peer may be read out of its process
// (a.useCMA), where that is possible at all, and returns the size class
// to record the call's time under (timed false: nothing to choose).
func (a *Arena) choosePath(total int) (k int, timed bool) {
	if a.size != 2 || !a.cma || total < a.cmaMin || total >= a.cmaMax {
		return 0, false
	}
	k, a.useCMA = a.paths.pick(total)
	return k, true
}

// pathStart begins timing a call whose path choosePath chose (timed), so
// that pathEnd can record it.
func (a *Arena) pathStart(timed bool) time.Time {
	if !timed {
		return time.Time{} // (the 4 KiB calls read no clock)
	}
	return time.Now()
}

// pathEnd records a timed call that succeeded under size class k.
func (a *Arena) pathEnd(k int, timed bool, start time.Time, err error) {
	if timed && err == nil {
		a.paths.record(k, a.useCMA, time.Since(start))
	}
}

// pathChooser learns, per size class, whether this rank's 2-rank
// allgathers and alltoall(v)s run faster with its blocks read out of its
// process or copied through its slot. Which wins depends on how far apart
// the two cores are, and a VM's vCPUs move between sibling hyperthreads
// and separate cores while a job runs (with them close the slots were
// faster from 16 KiB to 1 MiB, with them far the cross-memory copy from
// 256 KiB). So it is measured: each choice keeps an estimate of this rank's
// call time that falls at once to a faster call and rises by an eighth of
// the difference on a slower one (a call that waited for a late peer says
// little about the path), the faster is taken (the slots only if more
// than 10 % faster), and every exploreEvery-th call of a class tries the
// other. Both ranks count the calls of a class alike (they make the same
// calls), so they try it in the same call and time both ranks on it.
// Either rank's choice is safe alone: a peer reads whatever a rank's
// record offers.
type pathChooser struct {
	est   [64][2]int64 // ns; [k][0] the slots, [k][1] cross-memory; 0: no call yet
	calls [64]uint32
}

const exploreEvery = 8

// pick returns total's size class and whether its call uses cross-memory
// copies: first those, then the slots once, then the faster.
func (p *pathChooser) pick(total int) (k int, cma bool) {
	k = bits.Len(uint(total))
	c := p.calls[k]
	p.calls[k]++
	switch e := p.est[k]; {
	case e[1] == 0:
		return k, true
	case e[0] == 0:
		return k, false
	default:
		// The slots only when clearly faster: where the two are about
		// even, ranks whose estimates wobble across each other would
		// choose differently, and a call with one rank on each path
		// goes piece by piece, slower than either.
		cma := e[0]*10 > e[1]*9
		return k, cma != (c%exploreEvery == exploreEvery-1)
	}
}

// record takes a call of class k that took d.
func (p *pathChooser) record(k int, cma bool, d time.Duration) {
	i := 0
	if cma {
		i = 1
	}
	v, ns := &p.est[k][i], max(d.Nanoseconds(), 1)
	if *v == 0 || ns < *v {
		*v = ns
	} else {
		*v += (ns - *v) / 8
	}
}

// copyBlock is copyIn's piece size for ranks processes on this machine.
func copyBlock(ranks int) int {
	if ranks <= runtime.NumCPU() {
		return cachedBlock
	}
	return math.MaxInt
}

// cachedBlock is below memmove's non-temporal threshold (1 MiB).
const cachedBlock = 512 << 10
