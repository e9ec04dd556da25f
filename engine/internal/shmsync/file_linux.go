package shmsync

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// CreateMemfd creates an anonymous memory file (memfd_create) of n bytes,
// allocates its pages and maps it shared, read-write, every page touched.
// It has no name anywhere, so nothing of it outlives the processes that
// hold it open or mapped, whatever way they end. Others on the host open it
// through /proc/<pid>/fd/<fd> (FileRef) while the returned descriptor stays
// open. Allocating up front makes a memory limit fail here instead of
// raising SIGBUS on first touch; touching faults the pages in now, since
// first-touch faults would otherwise land in the hot path. name shows only
// in /proc/<pid>/fd links, for debugging.
func CreateMemfd(name string, n int) (mem []byte, fd int, err error) {
	return CreateMemfdHot(name, n, n)
}

// CreateMemfdHot is CreateMemfd allocating and touching only the first hot
// bytes (rounded up to a page): the rest of the file is a hole, which
// costs no memory until someone touches it. A segment with a part per
// peer makes only the parts of the peers it will surely use hot, so that
// many ranks on one host do not allocate, zero and map memory for every
// pair of them at setup. hot >= n is CreateMemfd.
func CreateMemfdHot(name string, n, hot int) (mem []byte, fd int, err error) {
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, -1, &os.PathError{Op: "memfd_create", Path: name, Err: err}
	}
	m, err := sizeAndMap(fd, n, hot, name)
	if err != nil {
		syscall.Close(fd)
		return nil, -1, err
	}
	return m, fd, nil
}

// sizeAndMap sizes the file fd to n bytes, allocates its first hot bytes,
// maps it shared and read-write and touches every page of them.
func sizeAndMap(fd, n, hot int, name string) ([]byte, error) {
	fail := func(op string, err error) ([]byte, error) {
		return nil, &os.PathError{Op: op, Path: name, Err: err}
	}
	page := os.Getpagesize()
	hot = min(roundUpTo(max(hot, 0), page), n)
	if err := syscall.Ftruncate(fd, int64(n)); err != nil {
		return fail("truncate", err)
	}
	if hot > 0 {
		if err := syscall.Fallocate(fd, 0, 0, int64(hot)); err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
			return fail("fallocate", err)
		}
	}
	flags := syscall.MAP_SHARED
	if hot == n {
		flags |= syscall.MAP_POPULATE
	}
	m, err := syscall.Mmap(fd, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, flags)
	if err != nil {
		return fail("mmap", err)
	}
	for i := 0; i < hot; i += page {
		m[i] = 0
	}
	return m, nil
}

func roundUpTo(n, a int) int { return (n + a - 1) / a * a }

// RefOf is the reference peers use to open this process's descriptor fd.
func RefOf(fd int) (FileRef, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return FileRef{}, &os.PathError{Op: "stat", Path: FileRef{Pid: self.Pid, Fd: fd}.String(), Err: err}
	}
	return FileRef{Pid: self.Pid, Fd: fd, Dev: st.Dev, Ino: st.Ino}, nil
}

// OpenProcFd opens /proc/<pid>/fd/<fd>. The kernel allows it when this
// process may inspect pid (the same user and pid dumpable, or a privileged caller).
func OpenProcFd(pid, fd, flags int) (int, error) {
	path := FileRef{Pid: pid, Fd: fd}.String()
	nfd, err := syscall.Open(path, flags|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return nfd, nil
}

// ErrOtherFile marks a descriptor that is not the file its FileRef names.
var ErrOtherFile = errors.New("not the file the peer published")

// Open opens the file r names with open (nil: OpenProcFd) and flags, and
// checks that it is that file. An error wrapping syscall.ENOENT means the
// process or its descriptor is gone.
func (r FileRef) Open(open Opener, flags int) (int, error) {
	if open == nil {
		open = OpenProcFd
	}
	fd, err := open(r.Pid, r.Fd, flags)
	if err != nil {
		return -1, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return -1, &os.PathError{Op: "stat", Path: r.String(), Err: err}
	}
	if st.Dev != r.Dev || st.Ino != r.Ino {
		syscall.Close(fd)
		return -1, fmt.Errorf("%s: %w (inode %d:%d, want %d:%d)", r, ErrOtherFile, st.Dev, st.Ino, r.Dev, r.Ino)
	}
	return fd, nil
}

// NewProbe makes an empty memory file for peers to try opening (Open)
// before any segment depends on it: whether this process may open another's
// /proc/<pid>/fd depends on both processes' credentials. Close fd once
// every peer tried.
func NewProbe() (ref FileRef, fd int, err error) {
	fd, err = unix.MemfdCreate("gocoll-probe", unix.MFD_CLOEXEC)
	if err != nil {
		return FileRef{}, -1, &os.PathError{Op: "memfd_create", Path: "gocoll-probe", Err: err}
	}
	if ref, err = RefOf(fd); err != nil {
		syscall.Close(fd)
		return FileRef{}, -1, err
	}
	return ref, fd, nil
}
