//go:build linux

package shmcoll

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

// Registered buffers. Alloc puts each allocation in an anonymous memory
// file of its own (memfd), listed in the owner's table of registered
// allocations with the descriptor that holds it open. When a call's send
// buffer lies in one, the owner publishes (id, offset) in its call record
// instead of copying the data into its slot; at the barrier every peer
// opens the file through /proc/<owner pid>/fd/<fd> and maps it (once, kept
// until the owner frees it or the arena closes) and reads the data in
// place. A memory file has no name: nothing of an allocation outlives the
// processes that map it, however they end (a named file in /dev/shm stayed
// when a rank was killed before a large collective had used it).
//
// Only the paths that end with a barrier use it (the peers' reads must end
// before the owner returns and may change the buffer): AllReduce and Reduce
// above the small-message threshold, and ReduceScatter, AllGather, AllToAll
// (not in place) and Broadcast (the root's buf) from 64 KiB, which add a
// closing barrier.

// allocName names an allocation's memory file (seen only in
// /proc/<pid>/fd and /proc/<pid>/maps, for debugging).
func allocName(tag [8]byte, rank int, id uint64) string {
	return fmt.Sprintf("gocoll-alloc-%x-%d-%d", tag[:], rank, id)
}

// regAlloc is one of this rank's allocations.
type regAlloc struct {
	id    uint64
	mem   []byte
	fd    int // the memory file, open until Free
	entry int // index in the table
}

// A table entry's first word holds the allocation id (low 32 bits) and the
// owner's descriptor of its memory file (high 32 bits); the second its size.
func regWord(id uint64, fd int) uint64 { return id&0xffff_ffff | uint64(fd)<<32 }

func regEntry(m []byte, i int) (id, size *atomic.Uint64) {
	off := regTableOff + 16*i
	return shmseg.Word(m, off), shmseg.Word(m, off+8)
}

// Alloc returns size bytes of zeroed, page-aligned shared memory. Used as
// the send buffer of AllReduce, Reduce, ReduceScatter, AllGather or
// AllToAll, or as the root's buf of Broadcast (from 64 KiB on, every rank's
// own choice), it is read by the peers in place, which saves the copy into
// the slot. Free it with Free; Close leaves it mapped (C or Python code
// may still hold it), so Free also works after Close. At most 192 allocations live at once.
func (a *Arena) Alloc(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: alloc %d bytes", ErrInvalid, size)
	}
	a.allocMu.Lock()
	defer a.allocMu.Unlock()
	a.nextReg++
	r := &regAlloc{id: a.nextReg & 0xffff_ffff}
	if r.id == 0 { // ids wrap at 2^32; 0 marks a free entry
		a.nextReg++
		r.id = a.nextReg & 0xffff_ffff
	}
	n := roundUp(size, pageSize)
	m, fd, err := shmsync.CreateMemfd(allocName(a.tag, a.rank, r.id), n)
	if err != nil {
		return nil, fmt.Errorf("shmcoll: rank %d: alloc: %w", a.rank, err)
	}
	r.mem, r.fd = m, fd
	// Enter it in the table (the own segment is mapped until Close).
	a.shutMu.Lock()
	defer a.shutMu.Unlock()
	undo := func(err error) ([]byte, error) {
		syscall.Munmap(m)
		syscall.Close(fd)
		return nil, err
	}
	if a.closed.Load() {
		return undo(ErrClosed)
	}
	r.entry = -1
	for i := range regMax {
		if id, _ := regEntry(a.own, i); id.Load() == 0 {
			r.entry = i
			break
		}
	}
	if r.entry < 0 {
		return undo(fmt.Errorf("%w: rank %d: more than %d registered allocations", ErrInvalid, a.rank, regMax))
	}
	id, sz := regEntry(a.own, r.entry)
	sz.Store(uint64(n))
	id.Store(regWord(r.id, fd))
	regs := append(append([]*regAlloc(nil), a.regList()...), r)
	a.regs.Store(&regs)
	return m[:size:size], nil
}

// Free releases memory from Alloc; b must start where Alloc's did.
func (a *Arena) Free(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: free of an empty slice", ErrInvalid)
	}
	a.allocMu.Lock()
	defer a.allocMu.Unlock()
	old := a.regList()
	for i, r := range old {
		if &r.mem[0] != &b[0] {
			continue
		}
		regs := append(append([]*regAlloc(nil), old[:i]...), old[i+1:]...)
		a.regs.Store(&regs)
		a.shutMu.Lock()
		if !a.unmapped {
			id, _ := regEntry(a.own, r.entry)
			id.Store(0)
		}
		a.shutMu.Unlock()
		syscall.Close(r.fd)
		if err := syscall.Munmap(r.mem); err != nil {
			return fmt.Errorf("shmcoll: rank %d: free: %w", a.rank, err)
		}
		return nil
	}
	return fmt.Errorf("%w: free: %p was not returned by Alloc on rank %d", ErrInvalid, &b[0], a.rank)
}

func (a *Arena) regList() []*regAlloc {
	if p := a.regs.Load(); p != nil {
		return *p
	}
	return nil
}

// lookupReg finds the allocation that holds all of b (non-empty).
func (a *Arena) lookupReg(b []byte) (*regAlloc, int) {
	if len(b) == 0 {
		return nil, 0
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	for _, r := range a.regList() {
		base := uintptr(unsafe.Pointer(&r.mem[0]))
		if p >= base && p+uintptr(len(b)) <= base+uintptr(len(r.mem)) {
			return r, int(p - base)
		}
	}
	return nil, 0
}

// peerReg returns peer j's allocation id mapped here, at least need bytes,
// mapping it on first use. Mappings of allocations the peer has freed
// since are released then.
func (a *Arena) peerReg(j int, id, need uint64) ([]byte, error) {
	if m, ok := a.peerRegs[j][id]; ok && uint64(len(m)) >= need {
		return m, nil
	}
	s := a.segs[j]
	type entry struct {
		size uint64
		fd   int
	}
	live := map[uint64]entry{}
	for i := range regMax {
		eid, esz := regEntry(s.m, i)
		if v := eid.Load(); v != 0 {
			live[v&0xffff_ffff] = entry{esz.Load(), int(v >> 32)}
		}
	}
	for old, m := range a.peerRegs[j] {
		if _, ok := live[old]; !ok {
			syscall.Munmap(m)
			delete(a.peerRegs[j], old)
		}
	}
	e, ok := live[id]
	if !ok || e.size < need {
		return nil, fmt.Errorf("%w: rank %d refers to registered buffer %d (%d bytes), not in its table (size %d)", transport.ErrProtocol, j, id, need, e.size)
	}
	// The owner is inside the call that references the buffer, so the
	// descriptor still holds it (Free comes after the closing barrier).
	open := a.open
	if open == nil {
		open = shmsync.OpenProcFd
	}
	path := shmsync.FileRef{Pid: s.proc.Pid, Fd: e.fd}.String()
	fd, err := open(s.proc.Pid, e.fd, syscall.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("%w: rank %d registered buffer: %w", transport.ErrProtocol, j, err)
	}
	mem, err := syscall.Mmap(fd, 0, int(e.size), syscall.PROT_READ, syscall.MAP_SHARED|populate(a.size))
	syscall.Close(fd)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	if a.peerRegs[j] == nil {
		a.peerRegs[j] = map[uint64][]byte{}
	}
	a.peerRegs[j][id] = mem
	a.log.Debug("shmcoll: mapped registered buffer", "rank", a.rank, "peer", j, "id", id, "bytes", e.size)
	return mem, nil
}

// unmapPeerRegs releases the mappings of the peers' allocations (Close).
func (a *Arena) unmapPeerRegs() {
	for j, ms := range a.peerRegs {
		for _, m := range ms {
			syscall.Munmap(m)
		}
		a.peerRegs[j] = nil
	}
}
