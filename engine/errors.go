package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// Sentinel errors; test with errors.Is. The C ABI maps each to a result code.
var (
	// ErrInvalidArgument: a bad pointer, count, type, op, root or peer.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrInvalidUsage: the call is valid alone but not now (communicator
	// destroyed or aborted, ranks running different collectives).
	ErrInvalidUsage = errors.New("invalid usage")
	// ErrTimeout: a wait passed its deadline (GOCOLL_TIMEOUT).
	ErrTimeout = recovery.ErrTimeout
	// ErrMismatch: ranks called different collectives (op, type, count,
	// root or sequence differ). It is also an ErrInvalidUsage.
	ErrMismatch = transport.ErrMismatch
	// ErrAborted: the communicator was aborted on this rank.
	ErrAborted = transport.ErrAborted
	// ErrPeerLost: a peer process went away.
	ErrPeerLost = transport.ErrPeerLost
	// ErrRemoteAbort: a peer aborted (its reason is in the message).
	ErrRemoteAbort = transport.ErrRemoteAbort
	// ErrDestroyed: the communicator was destroyed.
	ErrDestroyed = errors.New("communicator destroyed")

	// Why a job could not be set up. The rendezvous root sends the cause
	// with its verdict, so every rank it told reports the same one.

	// ErrRankMissing: ranks did not join within the timeout (also an
	// ErrTimeout for the C ABI: gocollTimeout).
	ErrRankMissing = bootstrap.ErrRankMissing
	// ErrSizeMismatch: ranks disagree on the job's size (gocollInvalidUsage).
	ErrSizeMismatch = bootstrap.ErrSizeMismatch
	// ErrRankConflict: a rank joined twice, after the job was complete, or
	// out of range (gocollInvalidUsage).
	ErrRankConflict = bootstrap.ErrRankConflict
	// ErrRankLeft: a rank left while the others were setting up
	// (gocollRemoteError).
	ErrRankLeft = bootstrap.ErrRankLeft
	// ErrAuth: a connection failed authentication: this rank's secret (or
	// unique id) differs from the root's or a peer's, or a rank missing
	// from the job was refused for that reason (gocollInvalidUsage).
	ErrAuth = tcp.ErrAuth
)

// OpError says which operation failed, where, and waiting on whom.
type OpError struct {
	Op   string // "allreduce", "send", …
	Seq  uint64 // the collective's sequence number on this communicator
	Rank int    // this rank
	Peer int    // the peer that failed, else the one being waited on; -1 if none
	Err  error
}

func (e *OpError) Error() string {
	peer := ""
	if e.Peer >= 0 {
		peer = fmt.Sprintf(" (peer rank %d)", e.Peer)
	}
	return fmt.Sprintf("gocoll: %s #%d on rank %d%s: %v", e.Op, e.Seq&^p2pSeqBit, e.Rank, peer, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }

// Is lets a mismatch also count as invalid usage.
func (e *OpError) Is(target error) bool {
	return target == ErrInvalidUsage && errors.Is(e.Err, ErrMismatch)
}

// peerError attaches the peer a transport call was talking to and turns a
// deadline into ErrTimeout.
type peerError struct {
	peer int
	err  error
}

func (e *peerError) Error() string { return e.err.Error() }
func (e *peerError) Unwrap() error { return e.err }

func wrapPeer(peer int, err error, timeout time.Duration) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w after %v waiting for rank %d", ErrTimeout, timeout, peer)
	}
	return &peerError{peer: peer, err: err}
}

// setupTimeout turns a setup's context deadline into ErrTimeout, saying
// what took longer than timeout: a caller that recovers from peer
// failures (an elastic loop shrinking again) takes it for one, as it
// does a collective's.
func setupTimeout(err error, what string, timeout time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrTimeout) {
		return fmt.Errorf("%w: %s took longer than %v: %w", ErrTimeout, what, timeout, err)
	}
	return err
}

// failedRank is the rank err says failed (went away, or where an abort
// started), or -1.
func failedRank(err error) int {
	var lost *transport.PeerLostError
	if errors.As(err, &lost) {
		return lost.Peer
	}
	var rae *transport.RemoteAbortError
	if errors.As(err, &rae) {
		return rae.Peer
	}
	return -1
}
