//go:build linux

package shmseg

import (
	"syscall"
	"testing"
)

// A segment header page holding arbitrary bytes (a file another process
// wrote, or damaged): Check never panics and accepts only the page of the
// segment it expects; a failure record never reads past its page.
func FuzzCheckHeader(f *testing.F) {
	ref, good := create(f, testID, PageSize)
	f.Add(append([]byte(nil), good[:PageSize]...))
	f.Add(make([]byte, 64))
	s, err := testFormat.Open(nil, ref, testID, 0)
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	f.Fuzz(func(t *testing.T, in []byte) {
		// Headers are whole mapped pages: pad or cut the input to one.
		m, err := syscall.Mmap(-1, 0, PageSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Munmap(m)
		copy(m, in)
		h := Header(m)
		if s.Check(h, 0) == nil && !equalHeader(h, Header(good)) {
			t.Fatalf("accepted a header that is not the segment's")
		}
		if f, _ := h.Failure(); len(f.Reason) > MaxReason {
			t.Fatalf("failure reason of %d bytes", len(f.Reason))
		}
	})
}

// equalHeader compares what Check looks at (with pid 0): magic, version
// and tag, rank and size.
func equalHeader(a, b Header) bool {
	return string(a[OffMagic:offPid]) == string(b[OffMagic:offPid]) &&
		string(a[offRank:offSize+8]) == string(b[offRank:offSize+8])
}
