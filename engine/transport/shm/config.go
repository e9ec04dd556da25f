// Package shm is a transport.Transport between processes on one host through
// shared memory.
//
// Each rank creates one segment, an anonymous memory file (memfd_create)
// that holds its inbound traffic: one single-producer/single-consumer byte ring per
// local peer that sends to it. A Send copies the frame header and the payload
// into the ring for this sender in the receiver's segment; a Recv copies out of
// the ring for that peer in its own segment. Messages larger than a ring stream
// through it in chunks, so any size works. With many ranks on a host the
// rings shrink and only some are allocated up front (see allHotPeers).
//
// Lifecycle: Create makes and maps the own segment; the caller exchanges
// Ref() (process id, descriptor, inode) with the other local ranks out of
// band; Connect opens the peers' segments through /proc/<pid>/fd/<fd>,
// checks their inodes, maps them and verifies their headers; after a
// barrier that tells that everyone connected the caller calls Release,
// which closes the descriptor. The file never has a name, so nothing of it
// outlives the processes that map it, even when one is killed during
// setup. Close and Abort unmap and release as well.
//
// Waiting (ring full or empty) follows shmsync.PolicyAmong the local ranks:
// poll, yield (not to goroutines for callers locked to their thread, see
// shmsync.WithLocked), then sleep on a process-shared futex with a short
// timeout; the other side issues FUTEX_WAKE only when a waiter registered,
// so the fast path makes no system call. While waiting, a rank
// watches its context, its own Abort/Close, the peer's segment state (closed or
// aborted, with the reason) and the liveness of the peer's process.
//
// Failure propagation: besides, a watcher goroutine looks at the state word of
// every peer's segment every 50 ms and at every watched peer's process (every
// peer's in small jobs; see allHotPeers) every 100 ms.
// When any peer aborted (or announces a failure it heard of) or its process
// died, this transport fails every pending and later call with a
// *transport.RemoteAbortError or *transport.PeerLostError naming the rank
// where the failure started, and announces it in its own segment in turn, so
// that a rank waiting on another peer, or in no call, stops too. Messages that
// the failed peer sent before are still delivered to a Recv that takes them
// (the watcher gives it unreadGrace). A peer's orderly Close is not a failure:
// only a later Recv from it (once its messages were taken) or Send to it fails,
// with transport.ErrPeerLost.
package shm

import (
	"errors"
	"log/slog"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
)

// Ring sizes (bytes per directed pair). RingBytes is rounded up to a power of
// two within [MinRingBytes, MaxRingBytes].
const (
	DefaultRingBytes = 4 << 20
	MinRingBytes     = 4 << 10
	MaxRingBytes     = 1 << 30
)

// Many ranks on one host. A rank has a ring for every local peer, so a
// host's rings grow with the square of its ranks: at the default size,
// 128 ranks would need 64 GiB, all of it allocated, zeroed and mapped at
// setup. So, beyond allHotPeers peers:
//
//   - the default ring shrinks to the largest power of two that keeps a
//     rank's inbound rings within ringBudget together, but not below
//     minAutoRing: what a host's rings may ever take grows with its ranks,
//     not their square;
//   - only the rings of the hot peers (hotPeers: the neighbours in rank
//     order and the recursive-doubling partners, which the message
//     schedules use) are allocated and touched at Create and mapped
//     populated by their producers; the others are holes of the memory
//     file until a message goes through them, when the kernel allocates
//     their pages;
//   - a rank watches the processes of its hot peers only (a pidfd each):
//     every rank is watched by its neighbours, who announce its death in
//     their own segments, whose state every rank reads.
//
// Up to allHotPeers peers (8 ranks on a host) nothing of this applies:
// every ring is DefaultRingBytes, hot, and watched, as the small jobs
// this transport is tuned for always had them.
const (
	allHotPeers = 7
	ringBudget  = 8 * DefaultRingBytes
	minAutoRing = 64 << 10
)

// Config describes one rank's endpoint.
type Config struct {
	Rank, Size int
	// Peers are the ranks on this host this transport serves (exchanges
	// messages with). Rank itself may be listed; it is ignored.
	Peers []int
	// Tag identifies the communicator (unique per communicator); it is
	// verified on Connect (and names the memory file in /proc/<pid>/fd,
	// for debugging).
	Tag [8]byte
	// RingBytes is the size of each inbound ring; 0 means DefaultRingBytes,
	// or less with more than allHotPeers peers (autoRingBytes).
	RingBytes int
	// Logger receives lifecycle and failure messages; nil discards them.
	Logger *slog.Logger
	// Open opens a peer's segment through /proc/<pid>/fd; nil means
	// shmsync.OpenProcFd. Tests inject failures here.
	Open shmsync.Opener
}

// PeerInfo is what a rank learns about a peer out of band: the peer's
// Ref(), which names its process and the descriptor of its segment.
type PeerInfo = shmsync.FileRef

// ErrClosed is returned by calls made on (or pending during) a closed
// Transport.
var ErrClosed = errors.New("shm: transport closed")
