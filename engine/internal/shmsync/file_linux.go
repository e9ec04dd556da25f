package shmsync

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// CreateMapped creates the file path (it must not exist), sizes it to n
// bytes, allocates its pages and maps it shared, read-write, every page
// touched. Allocating up front makes a full /dev/shm fail here instead of
// raising SIGBUS on first touch; touching faults the pages in now, since
// /dev/shm has no huge pages and first-touch faults would land in the hot
// path. On error nothing is left behind.
func CreateMapped(path string, n int) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	m, err := sizeAndMap(fd, n, path)
	if err != nil {
		syscall.Unlink(path)
	}
	return m, err
}

// CreateMemfd is CreateMapped for an anonymous memory file (memfd_create):
// it has no name anywhere, so nothing of it outlives the processes that
// hold it open or mapped, whatever way they end. Others on the host open it
// through /proc/<pid>/fd/<fd> while the returned descriptor stays open.
func CreateMemfd(name string, n int) (mem []byte, fd int, err error) {
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, -1, &os.PathError{Op: "memfd_create", Path: name, Err: err}
	}
	m, err := sizeAndMap(fd, n, name)
	if err != nil {
		syscall.Close(fd)
		return nil, -1, err
	}
	return m, fd, nil
}

// sizeAndMap sizes the file fd to n bytes, allocates its pages, maps it
// shared and read-write and touches every page.
func sizeAndMap(fd, n int, name string) ([]byte, error) {
	fail := func(op string, err error) ([]byte, error) {
		return nil, &os.PathError{Op: op, Path: name, Err: err}
	}
	if err := syscall.Ftruncate(fd, int64(n)); err != nil {
		return fail("truncate", err)
	}
	if err := syscall.Fallocate(fd, 0, 0, int64(n)); err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
		return fail("fallocate", err)
	}
	m, err := syscall.Mmap(fd, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return fail("mmap", err)
	}
	page := os.Getpagesize()
	for i := 0; i < len(m); i += page {
		m[i] = 0
	}
	return m, nil
}
