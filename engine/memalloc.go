package engine

import (
	"fmt"
	"syscall"
)

// MemAlloc returns size bytes of page-aligned memory outside the Go heap,
// so C callers may hold the pointer (like ncclMemAlloc). Free it with
// MemFree on the same communicator (also after Destroy, which leaves it
// mapped because C or Python code may still hold it).
func (c *Comm) MemAlloc(size int) ([]byte, error) {
	if size <= 0 {
		return nil, invalidArg("allocation size %d", size)
	}
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("gocoll: memalloc %d bytes on rank %d: %w", size, c.rank, err)
	}
	c.mu.Lock()
	if c.allocs == nil {
		c.allocs = map[uintptr][]byte{}
	}
	c.allocs[addr(b)] = b
	c.mu.Unlock()
	return b, nil
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
	return syscall.Munmap(m)
}
