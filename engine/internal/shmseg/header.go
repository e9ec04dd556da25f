// Package shmseg owns the header page that starts every shared-memory
// segment of the engine: the collective arenas of shmcoll and the ring
// segments of transport/shm. Both kinds say in it whose segment it is, so
// that a peer opening one checks it belongs to the rank and communicator it
// expects, made by the process that rank reported; and both record in it
// how their rank stopped, so that peers learn of a failure by reading it.
//
// Page 0 of a segment holds, at these byte offsets:
//
//	0    magic        the kind of segment (Format.Magic); stored last: publishes the header
//	8    version      of that kind's layout (Format.Version)
//	16   tag          the communicator's tag, 8 bytes
//	24   pid          the creator's process id
//	32   start        the creator's start time (/proc/<pid>/stat field 22)
//	40   rank         whose segment it is
//	48   size         ranks in the communicator
//	56   layout       the kind's own words (slot or ring sizes, where the data starts, ...), up to LayoutEnd
//	128  state        own cache line: 0 until published, then StateReady, StateClosed or StateAborted
//	192  cause        of a failure (aborted, lost, call mismatch)
//	200  origin       rank where the failure started
//	208  reason len   bytes of reason text
//	256  reason       text up to the end of the page
//
// Multi-byte fields are native-endian 64-bit words: both ends are processes
// of one build on one host. Immutable fields are written before the magic is
// published (atomic store) and read after it was seen; the words that
// change afterwards are accessed with sync/atomic (Word).
package shmseg

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

// PageSize is the size of the header page; segments lay out the rest in
// pages of this size too.
const PageSize = 4096

// Offsets in the header page. A kind of segment places its own layout
// words in [OffLayout, LayoutEnd).
const (
	OffMagic  = 0
	OffLayout = 56
	LayoutEnd = offState

	offVersion   = 8
	offTag       = 16
	offPid       = 24
	offStart     = 32
	offRank      = 40
	offSize      = 48
	offState     = 128
	offCause     = 192 // written before the state, like the words below
	offOrigin    = 200
	offReasonLen = 208
	offReason    = 256

	// MaxReason is the most reason text a header records.
	MaxReason = PageSize - offReason
)

// Values of the state word.
const (
	StateReady   uint64 = 1
	StateClosed  uint64 = 2
	StateAborted uint64 = 3
)

// Values of the cause word, once the state is StateAborted: the origin rank
// aborted with the reason, was lost (its process died), or found a call
// that did not match its peers'.
const (
	causeAborted  uint64 = 1
	causeLost     uint64 = 2
	causeMismatch uint64 = 3
)

// Format is one kind of segment: the magic number that tells it from any
// other file, and the version of its layout, to be bumped whenever the
// layout changes (both ends always run the same build, but a stale file
// must not pass for a segment).
type Format struct {
	Magic, Version uint64
	// Lost, if set, is the error Open returns for a segment that is gone
	// (its process exited, or closed the file's descriptor before this
	// rank opened it); err is the error of open(2). By default a
	// *transport.PeerLostError.
	Lost func(peer int, path string, err error) error
}

// ID says whose segment it is: rank Rank of the communicator with tag Tag
// and Size ranks.
type ID struct {
	Tag        [8]byte
	Rank, Size int
}

// Word returns the 64-bit word at off in m (off must be 8-aligned).
func Word(m []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m[off]))
}

// Header is a mapping of a segment from its start: the header page, or
// more.
type Header []byte

// State is the segment's state word.
func (h Header) State() *atomic.Uint64 { return Word(h, offState) }

// Creator is the process that created the segment.
func (h Header) Creator() shmsync.Proc {
	ne := binary.NativeEndian
	return shmsync.Proc{Pid: int(ne.Uint64(h[offPid:])), Start: ne.Uint64(h[offStart:])}
}

// Fail records f, and whether it started as a call mismatch (a failure
// wrapping transport.ErrMismatch), then sets the state to StateAborted: a
// peer that sees that state reads all of it (Failure).
func (h Header) Fail(f transport.Failure, mismatch bool) {
	cause := causeAborted
	switch {
	case f.Lost:
		cause = causeLost
	case mismatch:
		cause = causeMismatch
	}
	n := copy(h[offReason:offReason+MaxReason], f.Reason)
	Word(h, offReasonLen).Store(uint64(n))
	Word(h, offOrigin).Store(uint64(f.Origin))
	Word(h, offCause).Store(cause)
	h.State().Store(StateAborted)
}

// Failure reads the failure recorded by Fail; call after the state word
// read StateAborted.
func (h Header) Failure() (f transport.Failure, mismatch bool) {
	cause := Word(h, offCause).Load()
	n := min(Word(h, offReasonLen).Load(), MaxReason)
	f = transport.Failure{
		Origin: int(Word(h, offOrigin).Load()),
		Lost:   cause == causeLost,
		Reason: string(h[offReason : offReason+int(n)]),
	}
	return f, cause == causeMismatch
}
