//go:build linux

package shmseg

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

var testFormat = Format{Magic: 0x5453_45544753, Version: 7}

var testID = ID{Tag: [8]byte{1, 2, 3, 4, 5, 6, 7, 8}, Rank: 1, Size: 3}

// create makes a published segment of n bytes for id.
func create(t testing.TB, id ID, n int) (shmsync.FileRef, []byte) {
	t.Helper()
	m, fd, err := testFormat.Create("seg", id, n)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := shmsync.RefOf(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(m); syscall.Close(fd) })
	Word(m, OffLayout).Store(42)
	if Word(m, OffMagic).Load() != 0 || Header(m).State().Load() != 0 {
		t.Fatal("header published before Publish")
	}
	testFormat.Publish(m)
	return ref, m
}

// open opens and maps the header page of the segment ref as rank id
// would see it, and checks it.
func open(t *testing.T, f Format, ref shmsync.FileRef, id ID, pid int) (Header, error) {
	t.Helper()
	s, err := f.Open(nil, ref, id, 0)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	m, err := s.Map(0, PageSize, syscall.PROT_READ, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(m) })
	return m, s.Check(m, pid)
}

func TestCreateOpen(t *testing.T) {
	ref, _ := create(t, testID, 2*PageSize)
	h, err := open(t, testFormat, ref, testID, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Creator(); got != shmsync.Self() {
		t.Errorf("creator %+v, want %+v", got, shmsync.Self())
	}
	if got := h.State().Load(); got != StateReady {
		t.Errorf("state %d, want %d", got, StateReady)
	}
	if got := Word(h, OffLayout).Load(); got != 42 {
		t.Errorf("layout word %d, want 42", got)
	}
}

func TestCheck(t *testing.T) {
	ref, _ := create(t, testID, PageSize)
	other := testID
	other.Tag[0]++
	for _, tc := range []struct {
		name string
		f    Format
		id   ID
		pid  int
		want string
	}{
		{"magic", Format{Magic: 1, Version: testFormat.Version}, testID, 0, "bad magic"},
		{"version", Format{Magic: testFormat.Magic, Version: 8}, testID, 0, "version 7, want 8"},
		{"tag", testFormat, other, 0, "communicator tag"},
		{"rank", testFormat, ID{Tag: testID.Tag, Rank: 2, Size: 3}, 0, "created by rank 1"},
		{"size", testFormat, ID{Tag: testID.Tag, Rank: 1, Size: 4}, 0, "communicator size 3, want 4"},
		{"pid", testFormat, testID, os.Getpid() + 1, "peer reports pid"},
	} {
		_, err := open(t, tc.f, ref, tc.id, tc.pid)
		where := fmt.Sprintf("rank %d segment %s", tc.id.Rank, ref)
		if !errors.Is(err, transport.ErrProtocol) || !strings.Contains(err.Error(), where) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrProtocol naming the rank, the path and %q", tc.name, err, tc.want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	ref, _ := create(t, testID, PageSize)
	// A descriptor the process closed (or a process that exited): the
	// peer is gone.
	gone := shmsync.FileRef{Pid: os.Getpid(), Fd: 1 << 20, Dev: ref.Dev, Ino: ref.Ino}
	_, err := testFormat.Open(nil, gone, testID, 0)
	var lost *transport.PeerLostError
	if !errors.As(err, &lost) || lost.Peer != testID.Rank || !strings.Contains(err.Error(), gone.String()) {
		t.Errorf("closed descriptor: %v, want a PeerLostError for rank %d naming the path", err, testID.Rank)
	}
	custom := testFormat
	sentinel := errors.New("gone")
	custom.Lost = func(peer int, path string, err error) error { return sentinel }
	if _, err := custom.Open(nil, gone, testID, 0); err != sentinel {
		t.Errorf("closed descriptor with Format.Lost: %v", err)
	}
	// Another file behind the descriptor number (a recycled pid or
	// descriptor): refused by its inode, not taken for the segment.
	other := ref
	other.Ino++
	if _, err := testFormat.Open(nil, other, testID, 0); !errors.Is(err, shmsync.ErrOtherFile) || errors.As(err, &lost) {
		t.Errorf("other inode: %v, want ErrOtherFile", err)
	}
	// A process whose descriptors this one may not open.
	denied := func(pid, fd, flags int) (int, error) {
		return -1, &os.PathError{Op: "open", Path: shmsync.FileRef{Pid: pid, Fd: fd}.String(), Err: syscall.EACCES}
	}
	if _, err := testFormat.Open(denied, ref, testID, 0); !errors.Is(err, syscall.EACCES) || errors.As(err, &lost) {
		t.Errorf("permission denied: %v", err)
	}
	if _, err := testFormat.Open(nil, ref, testID, 2*PageSize); !errors.Is(err, transport.ErrProtocol) ||
		!strings.Contains(err.Error(), "too small") {
		t.Errorf("short file: %v", err)
	}
}

func TestFailure(t *testing.T) {
	_, m := create(t, testID, PageSize)
	h := Header(m)
	long := strings.Repeat("x", MaxReason+10)
	for _, tc := range []struct {
		f        transport.Failure
		mismatch bool
	}{
		{transport.Failure{Origin: 0, Reason: "boom"}, false},
		{transport.Failure{Origin: 2, Reason: "call mismatch"}, true},
		{transport.Failure{Origin: 1, Lost: true, Reason: long}, true}, // lost wins
	} {
		h.Fail(tc.f, tc.mismatch)
		if got := h.State().Load(); got != StateAborted {
			t.Errorf("state %d after Fail", got)
		}
		f, mismatch := h.Failure()
		want := tc.f
		want.Reason = want.Reason[:min(len(want.Reason), MaxReason)]
		if f != want || mismatch != (tc.mismatch && !tc.f.Lost) {
			t.Errorf("Failure() = %+v, %v; want %+v, %v", f, mismatch, want, tc.mismatch && !tc.f.Lost)
		}
	}
}
