package engine

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
)

// The probe: who may map whose memory.
//
// Segments are memory files with no name (memfd), which peers open through
// /proc/<pid>/fd/<fd>: a rank killed at any point leaves nothing behind.
// The kernel lets a process open another's descriptors only when it may
// inspect that process (same user, not made non-dumpable, same pid
// namespace), so each rank first tries a small probe file of every rank
// of its host; a pair where either side cannot open the other's uses TCP,
// and says why at WARN. Both sides of a pair decide alike from the second
// round (Sees), and the arena exists only where every pair shares memory.

// makeProbe makes the probe file the first round announces, with the
// shared memory this rank can map; without one, this rank uses TCP only.
func (s *setup) makeProbe() {
	d, err := shmDomain()
	var probe shmsync.FileRef
	if err == nil {
		probe, s.probeFd, err = shmsync.NewProbe()
	}
	if err != nil {
		s.log.Info("no shared memory between processes (using TCP only)", "err", err)
		return
	}
	s.me.Shm, s.me.Probe = d, &probe
}

func (s *setup) closeProbe() {
	if s.probeFd >= 0 {
		syscall.Close(s.probeFd)
		s.probeFd = -1
	}
}

// mappable is the ranks of the same host name and /dev/shm whose memory
// files this process may open (their probes open).
func (s *setup) mappable() []int {
	var sees []int
	for q, in := range s.first {
		if q == s.rank || s.me.Shm == "" || in.Shm != s.me.Shm || in.Host != s.hostname {
			continue
		}
		if err := tryOpen(s.open, in.Probe); err != nil {
			s.log.Warn("cannot map the shared memory of a rank on this host (this process may not open its /proc/<pid>/fd: another user, a non-dumpable process, another pid namespace): TCP to it", "peer", q, "pid", in.Pid, "err", err)
			continue
		}
		sees = append(sees, q)
	}
	return sees
}

// tryOpen opens a peer's probe file and closes it again.
func tryOpen(open shmsync.Opener, probe *shmsync.FileRef) error {
	if probe == nil {
		return errors.New("it offers no shared memory")
	}
	fd, err := probe.Open(open, syscall.O_RDONLY)
	if err != nil {
		return err
	}
	syscall.Close(fd)
	return nil
}

// shmDomain names the shared memory this process can map: the kernel's
// boot id (one per machine and boot) and the device and inode of /dev/shm
// (one per tmpfs, so containers or namespaces with their own /dev/shm
// differ, and are placed as hosts of their own). Segments are memory
// files, not files in /dev/shm, so it need not be writable.
func shmDomain() (string, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/shm", &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s/%d:%d", strings.TrimSpace(string(boot)), st.Dev, st.Ino), nil
}
