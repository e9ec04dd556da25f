//go:build linux

package shmtest

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// Resident is how many bytes of the mappings ms this process has in its
// page tables (the Rss of those mappings in /proc/self/smaps, read once):
// what mapping a peer's memory costs this process, as opposed to what the
// memory itself costs (Allocated). Each of ms must cover whole mappings.
func Resident(ms ...[]byte) (int, error) {
	type span struct{ lo, hi uint64 }
	var spans []span
	for _, m := range ms {
		if len(m) > 0 {
			lo := uint64(uintptr(unsafe.Pointer(&m[0])))
			spans = append(spans, span{lo, lo + uint64(len(m))})
		}
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	total, in := 0, false
	for sc.Scan() {
		line := sc.Text()
		if start, end, ok := vmaRange(line); ok {
			in = false
			for _, s := range spans {
				if start < s.hi && end > s.lo && (start < s.lo || end > s.hi) {
					return 0, fmt.Errorf("mapping %x-%x straddles %x-%x", start, end, s.lo, s.hi)
				}
				in = in || start >= s.lo && end <= s.hi
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Rss:"); in && ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				return 0, fmt.Errorf("smaps: %q: %w", line, err)
			}
			total += kb << 10
		}
	}
	return total, sc.Err()
}

// vmaRange parses the "start-end perms ..." line that opens a mapping in
// smaps.
func vmaRange(line string) (start, end uint64, ok bool) {
	f, _, _ := strings.Cut(line, " ")
	a, b, found := strings.Cut(f, "-")
	if !found {
		return 0, 0, false
	}
	start, err1 := strconv.ParseUint(a, 16, 64)
	end, err2 := strconv.ParseUint(b, 16, 64)
	return start, end, err1 == nil && err2 == nil
}

// Allocated is how many bytes of the memory file behind the shared mapping
// m hold pages (mincore): a file's holes cost no memory until touched.
func Allocated(m []byte) (int, error) {
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if len(m) == 0 {
		return 0, nil
	}
	_, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return 0, &os.SyscallError{Syscall: "mincore", Err: errno}
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n * page, nil
}
