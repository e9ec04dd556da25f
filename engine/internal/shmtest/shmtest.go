// Package shmtest (test support) finds what of the engine's shared-memory
// segments is left: names in /dev/shm, and the memory files (memfd) this
// process still holds open or mapped. Segments and registered allocations
// are memory files named "gocoll-..." (the name shows only in
// /proc/<pid>/fd links and /proc/<pid>/maps); the tests of the transports
// and of the engine check that none stays once a communicator closed, and
// that nothing ever appears in /dev/shm.
package shmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
)

// ShmDir is where named shared memory would appear.
const ShmDir = "/dev/shm"

// Files lists the entries of ShmDir whose names start with prefix.
func Files(prefix string) []string {
	m, _ := filepath.Glob(filepath.Join(ShmDir, prefix+"*"))
	return m
}

// Fds lists this process's descriptors of memory files whose names start
// with prefix, as "fd N -> /memfd:name (deleted)".
func Fds(prefix string) []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(link, "/memfd:"+prefix) {
			out = append(out, "fd "+e.Name()+" -> "+link)
		}
	}
	return out
}

// Maps lists this process's mappings of memory files whose names start
// with prefix (lines of /proc/self/maps).
func Maps(prefix string) []string {
	b, _ := os.ReadFile("/proc/self/maps")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "/memfd:"+prefix) {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return out
}

// Leftovers is Files, Fds and Maps together.
func Leftovers(prefix string) []string {
	return append(append(Files(prefix), Fds(prefix)...), Maps(prefix)...)
}

// RefAddr writes where peers find a segment as one line of text (the
// transport test kit's address, or what a child process prints).
func RefAddr(r shmsync.FileRef) string {
	return fmt.Sprintf("%d %d %d %d", r.Pid, r.Fd, r.Dev, r.Ino)
}

// ParseRefAddr reads RefAddr's text back.
func ParseRefAddr(addr string) (shmsync.FileRef, error) {
	var r shmsync.FileRef
	if _, err := fmt.Sscanf(addr, "%d %d %d %d", &r.Pid, &r.Fd, &r.Dev, &r.Ino); err != nil {
		return r, fmt.Errorf("segment reference %q: %w", addr, err)
	}
	return r, nil
}
