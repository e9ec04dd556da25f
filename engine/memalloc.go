package engine

import (
	"fmt"
	"syscall"
)

// MemAlloc returns size bytes of page-aligned memory outside the Go heap,
// so C callers may hold the pointer (like ncclMemAlloc). When every rank is
// on this host the memory is shared: used as the send buffer of AllReduce,
// Reduce or ReduceScatter it is read by the peers in place, saving a copy.
// Free it with MemFree on the same communicator (also after Destroy, which
// leaves it mapped because C or Python code may still hold it).
func (c *Comm) MemAlloc(size int) ([]byte, error) {
	if size <= 0 {
		return nil, invalidArg("allocation size %d", size)
	}
	var b []byte
	var err error
	shared := c.arena != nil
	if shared {
		b, err = c.arena.Alloc(size)
		if err != nil {
			// The arena holds a bounded number of allocations; plain memory
			// works with every call, only without the in-place read.
			c.log.Info("memalloc: shared allocation failed, using private memory", "err", err)
			shared = false
		}
	}
	if !shared {
		b, err = syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return nil, fmt.Errorf("gocoll: memalloc %d bytes on rank %d: %w", size, c.rank, err)
		}
	}
	c.mu.Lock()
	if c.allocs == nil {
		c.allocs = map[uintptr]allocation{}
	}
	c.allocs[addr(b)] = allocation{b, shared}
	c.mu.Unlock()
	return b, nil
}

type allocation struct {
	mem    []byte
	shared bool // from the arena
}

// MemFree releases memory from MemAlloc; b must start where MemAlloc's did.
func (c *Comm) MemFree(b []byte) error {
	c.mu.Lock()
	m, ok := c.allocs[addr(b)]
	if ok {
		delete(c.allocs, addr(b))
	}
	c.mu.Unlock()
	if !ok {
		return invalidArg("memfree: %#x was not returned by MemAlloc on this communicator", addr(b))
	}
	if m.shared {
		return c.arena.Free(m.mem)
	}
	return syscall.Munmap(m.mem)
}
