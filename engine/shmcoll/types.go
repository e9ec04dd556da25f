package shmcoll

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

// Slot sizes (bytes per rank and buffer set). SlotBytes is rounded up to a
// multiple of the page size and to at least MinSlotBytes and 64 bytes per
// rank.
const (
	DefaultSlotBytes = 4 << 20
	MinSlotBytes     = 4 << 10
	MaxSlotBytes     = 1 << 30
	// MaxRanks bounds Config.Size.
	MaxRanks = 1024
)

// Config describes one rank's arena.
type Config struct {
	Rank, Size int
	// Tag identifies the communicator; it is verified on Connect (and
	// names the memory files in /proc/<pid>/fd, for debugging).
	Tag [8]byte
	// SlotBytes is the data slot per rank and buffer set; 0 means
	// DefaultSlotBytes. Every rank must use the same value (Connect checks).
	SlotBytes int
	// Logger receives lifecycle and failure messages; nil discards them.
	Logger *slog.Logger
	// NoCMA keeps every rank's data going through the slots even where
	// peers could read it out of this process with process_vm_readv. One
	// rank setting it turns cross-memory reads off for all.
	NoCMA bool
	// Open opens a peer's memory file (its segment, its registered
	// allocations) through /proc/<pid>/fd; nil means
	// shmsync.OpenProcFd. Tests inject failures here.
	Open shmsync.Opener
}

// PeerInfo is what a rank learns about a peer out of band: the peer's
// Ref(), which names its process and the descriptor of its segment.
type PeerInfo = shmsync.FileRef

// Call identifies one collective call: the engine's sequence number and the
// signature (fingerprint of collective, type, count, op, root and
// algorithm). All ranks must pass equal values for the same call; any
// difference is reported as transport.ErrMismatch.
type Call struct {
	Seq, Sig uint64
	// Locked says the caller's goroutine is locked to its thread (a C
	// thread calling through cgo): its waits yield the core but not the
	// goroutine (shmsync.Policy.Goroutines off). Not compared between
	// ranks.
	Locked bool
}

var (
	// ErrClosed is returned by calls made on (or pending during) a closed
	// Arena.
	ErrClosed = errors.New("shmcoll: arena closed")
	// ErrInvalid marks bad arguments: lengths, types, ops, roots,
	// partially overlapping buffers, concurrent calls.
	ErrInvalid = errors.New("shmcoll: invalid argument")
)

// CountsError is an AllToAllv in which rank From sends Sent bytes to rank
// To, which expects Expected. Both ranks of the pair report it.
type CountsError struct {
	Rank, From, To, Sent, Expected int
}

func (e *CountsError) Error() string {
	return fmt.Sprintf("shmcoll: rank %d: %v: counts differ between ranks: rank %d sends %d bytes to rank %d, which expects %d bytes from it",
		e.Rank, transport.ErrMismatch, e.From, e.Sent, e.To, e.Expected)
}

func (e *CountsError) Unwrap() error { return transport.ErrMismatch }

// Peer is the other rank of the pair.
func (e *CountsError) Peer() int {
	if e.From == e.Rank {
		return e.To
	}
	return e.From
}
