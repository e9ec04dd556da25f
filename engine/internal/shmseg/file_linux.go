//go:build linux

package shmseg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

// Create makes the segment of id in a memory file of n bytes with no name
// (shmsync.CreateMemfd: nothing of it outlives the processes that use it,
// however they end), maps and pre-touches it, and writes the common header
// with this process as its creator. The caller then writes its layout
// words and whatever else peers read once they saw the magic, and calls
// Publish. Peers open the file through its FileRef while fd stays open;
// close fd once they all did.
func (f Format) Create(name string, id ID, n int) (m []byte, fd int, err error) {
	return f.CreateHot(name, id, n, n)
}

// CreateHot is Create allocating and touching only the first hot bytes of
// the segment (shmsync.CreateMemfdHot), at least the header page: the rest
// costs memory once touched.
func (f Format) CreateHot(name string, id ID, n, hot int) (m []byte, fd int, err error) {
	m, fd, err = shmsync.CreateMemfdHot(name, n, max(hot, PageSize))
	if err != nil {
		return nil, -1, err
	}
	me := shmsync.Self()
	ne := binary.NativeEndian
	ne.PutUint64(m[offVersion:], f.Version)
	copy(m[offTag:offTag+8], id.Tag[:])
	ne.PutUint64(m[offPid:], uint64(me.Pid))
	ne.PutUint64(m[offStart:], me.Start)
	ne.PutUint64(m[offRank:], uint64(id.Rank))
	ne.PutUint64(m[offSize:], uint64(id.Size))
	return m, fd, nil
}

// Publish marks the segment m ready, then publishes its magic: a peer that
// sees the magic sees everything written before.
func (f Format) Publish(m []byte) {
	Header(m).State().Store(StateReady)
	Word(m, OffMagic).Store(f.Magic) // publish
}

// OwnFile is the memory file of a rank's own segment (Create's fd), through
// which its peers open the segment while they connect.
type OwnFile struct {
	mu sync.Mutex
	fd int // -1 once released
}

// NewOwnFile holds fd, open until Release.
func NewOwnFile(fd int) *OwnFile { return &OwnFile{fd: fd} }

// Release closes the file; the mappings stay valid. Call it once every
// peer connected. Idempotent, and nothing on a nil OwnFile.
func (f *OwnFile) Release() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd >= 0 {
		syscall.Close(f.fd)
		f.fd = -1
	}
}

// File is a peer's segment file, open while its header is checked and
// its parts mapped.
type File struct {
	Path   string // where it was opened from, for messages
	ID     ID     // whose segment it must be
	Size   int64  // of the file
	format Format
	fd     int
}

// Open opens the segment that id.Rank created and published as ref, for
// Check and Map, with open (nil: shmsync.OpenProcFd); it must have at least
// min bytes, and has at least the header page. Close it once mapped:
// mappings outlive it.
func (f Format) Open(open shmsync.Opener, ref shmsync.FileRef, id ID, min int64) (*File, error) {
	min = max(min, PageSize)
	path := ref.String()
	fd, err := ref.Open(open, syscall.O_RDWR)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESRCH):
			return nil, f.lost(id.Rank, path, err)
		case errors.Is(err, shmsync.ErrOtherFile):
			return nil, fmt.Errorf("%w: rank %d segment: %w", transport.ErrProtocol, id.Rank, err)
		}
		return nil, fmt.Errorf("rank %d segment: %w", id.Rank, err)
	}
	s := &File{Path: path, ID: id, format: f, fd: fd}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		s.Close()
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	s.Size = st.Size
	if st.Size < min {
		s.Close()
		return nil, s.Errorf("file too small (%d bytes)", st.Size)
	}
	return s, nil
}

func (f Format) lost(peer int, path string, err error) error {
	if f.Lost != nil {
		return f.Lost(peer, path, err)
	}
	return &transport.PeerLostError{Peer: peer, Reason: fmt.Sprintf("segment %s: %v", path, err)}
}

// Close closes the file.
func (s *File) Close() { syscall.Close(s.fd) }

// Map maps n bytes of the file from off, shared, with protection prot and
// the further flags (e.g. syscall.MAP_POPULATE).
func (s *File) Map(off int64, n, prot, flags int) ([]byte, error) {
	m, err := syscall.Mmap(s.fd, off, n, prot, syscall.MAP_SHARED|flags)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: s.Path, Err: err}
	}
	return m, nil
}

// Errorf reports a file that is not the segment it should be: the error
// wraps transport.ErrProtocol and names the rank and the path.
func (s *File) Errorf(format string, a ...any) error {
	return fmt.Errorf("%w: rank %d segment %s: %s", transport.ErrProtocol, s.ID.Rank, s.Path, fmt.Sprintf(format, a...))
}

// Check verifies the common header h, mapped from the file: the format's
// magic and version, the tag, rank and size of s.ID, and, unless pid is 0,
// that the process pid created it (the pid the peer reported).
func (s *File) Check(h Header, pid int) error {
	ne := binary.NativeEndian
	magic := Word(h, OffMagic).Load()
	version := ne.Uint64(h[offVersion:])
	var tag [8]byte
	copy(tag[:], h[offTag:offTag+8])
	rank := int(ne.Uint64(h[offRank:]))
	size := int(ne.Uint64(h[offSize:]))
	creator := h.Creator().Pid
	switch {
	case magic != s.format.Magic:
		return s.Errorf("bad magic %#x", magic)
	case version != s.format.Version:
		return s.Errorf("version %d, want %d", version, s.format.Version)
	case tag != s.ID.Tag:
		return s.Errorf("communicator tag %x, want %x", tag, s.ID.Tag)
	case rank != s.ID.Rank:
		return s.Errorf("created by rank %d", rank)
	case size != s.ID.Size:
		return s.Errorf("communicator size %d, want %d", size, s.ID.Size)
	case pid != 0 && creator != pid:
		return s.Errorf("created by pid %d, peer reports pid %d", creator, pid)
	}
	return nil
}
