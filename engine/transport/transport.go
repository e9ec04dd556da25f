// Package transport defines how collectives move bytes between ranks: an
// ordered, reliable message stream per directed pair of ranks. Algorithms see
// only this interface; in-process, TCP and shared-memory implementations live
// in sub-packages.
package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// Kind says what a message carries.
type Kind uint8

const (
	KindData  Kind = 1 // payload of a collective step
	KindAbort Kind = 2 // the sender aborted; payload is the reason text
	KindClose Kind = 3 // orderly goodbye: the sender closed its communicator, nothing follows
)

// HeaderSize is the encoded size of a Header on byte-stream transports.
const HeaderSize = 32

// Header precedes every payload. The receiver states the header it expects;
// a difference means the two ranks are not running the same collective (other
// op, type, count, root or sequence) and is reported instead of corrupting data.
type Header struct {
	Kind Kind
	Seq  uint64 // collective sequence number on the communicator
	Sig  uint64 // fingerprint of (collective, datatype, count, op, root)
	Step uint32 // step inside the collective
	Len  uint64 // payload bytes
}

// Encode writes h into b[:HeaderSize].
func (h Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = byte(h.Kind)
	b[1], b[2], b[3] = 'G', 'C', 1 // magic + version: catches a stream that lost framing
	binary.LittleEndian.PutUint32(b[4:], h.Step)
	binary.LittleEndian.PutUint64(b[8:], h.Seq)
	binary.LittleEndian.PutUint64(b[16:], h.Sig)
	binary.LittleEndian.PutUint64(b[24:], h.Len)
}

// DecodeHeader parses b[:HeaderSize].
func DecodeHeader(b []byte) (Header, error) {
	_ = b[HeaderSize-1]
	if b[1] != 'G' || b[2] != 'C' || b[3] != 1 {
		return Header{}, fmt.Errorf("%w: bad frame magic %x", ErrProtocol, b[:4])
	}
	return Header{
		Kind: Kind(b[0]),
		Step: binary.LittleEndian.Uint32(b[4:]),
		Seq:  binary.LittleEndian.Uint64(b[8:]),
		Sig:  binary.LittleEndian.Uint64(b[16:]),
		Len:  binary.LittleEndian.Uint64(b[24:]),
	}, nil
}

var (
	// ErrMismatch: the peer sent a message for a different collective.
	ErrMismatch = errors.New("mismatched collective")
	// ErrProtocol: the stream is corrupt (framing lost, unknown kind).
	ErrProtocol = errors.New("protocol error")
	// ErrPeerLost: the connection to the peer closed or failed.
	ErrPeerLost = errors.New("peer connection lost")
	// ErrAborted: this endpoint was aborted locally.
	ErrAborted = errors.New("communicator aborted")
	// ErrRemoteAbort: the peer aborted and said why (see RemoteAbortError).
	ErrRemoteAbort = errors.New("peer aborted")
)

// RemoteAbortError carries the reason a peer gave when it aborted.
type RemoteAbortError struct {
	Peer   int
	Reason string
}

func (e *RemoteAbortError) Error() string {
	return fmt.Sprintf("rank %d aborted: %s", e.Peer, e.Reason)
}
func (e *RemoteAbortError) Is(target error) bool { return target == ErrRemoteAbort }

// PointToPoint marks the sequence numbers of point-to-point messages (sends
// and receives count per peer, apart from the collectives).
const PointToPoint = 1 << 63

// Check compares a received header with the expected one. It turns abort
// messages into RemoteAbortError (the caller passes the reason payload).
func Check(peer int, want, got Header) error {
	if got.Kind == KindData && got.Seq == want.Seq && got.Sig == want.Sig && got.Step == want.Step && got.Len == want.Len {
		return nil
	}
	if got.Kind != KindData {
		return fmt.Errorf("%w: unexpected message kind %d from rank %d", ErrProtocol, got.Kind, peer)
	}
	what := "step"
	switch {
	case got.Seq&PointToPoint != want.Seq&PointToPoint && want.Seq&PointToPoint == 0:
		what = fmt.Sprintf("kind of message (this rank is in collective #%d, rank %d sent a point-to-point message that was not received before it)",
			want.Seq, peer)
	case got.Seq&PointToPoint != want.Seq&PointToPoint:
		what = fmt.Sprintf("kind of message (this rank waits for point-to-point message #%d, rank %d sent collective #%d: a receive with no matching send)",
			want.Seq&^PointToPoint, peer, got.Seq)
	case got.Seq != want.Seq:
		what = fmt.Sprintf("sequence (this rank at #%d, rank %d at #%d)", want.Seq&^PointToPoint, peer, got.Seq&^PointToPoint)
	case got.Sig != want.Sig:
		what = fmt.Sprintf("collective, datatype, count, op or root (signature %016x here, %016x from rank %d)", want.Sig, got.Sig, peer)
	case got.Len != want.Len:
		what = fmt.Sprintf("message length (%d bytes expected, rank %d sent %d)", want.Len, peer, got.Len)
	default:
		what = fmt.Sprintf("step (%d expected, rank %d sent %d)", want.Step, peer, got.Step)
	}
	return fmt.Errorf("%w: %s", ErrMismatch, what)
}

// CheckVar is Check for a receiver that takes whatever step and length the
// sender chose (VarReceiver): kind, sequence and signature must still agree.
func CheckVar(peer int, want, got Header) error {
	want.Step, want.Len = got.Step, got.Len
	return Check(peer, want, got)
}

// VarLen is a RecvVar message's length as an int, or an error if it does
// not fit one.
func VarLen(peer int, h Header) (int, error) {
	if h.Len > uint64(^uint(0)>>1) {
		return 0, fmt.Errorf("%w: rank %d announces a %d-byte message", ErrProtocol, peer, h.Len)
	}
	return int(h.Len), nil
}

// VarReceiver is a transport that can also receive a message whose step and
// length only its header says. The block-mode schedules need it (alltoallv
// and alltoallw through repacking ranks: the block sizes travel inside the
// messages, so a repacking rank cannot know how much its sources send), and
// so does the all-to-all's control tree, whose ranks match what arrives by
// step.
type VarReceiver interface {
	// RecvVar receives the next message from peer. Its kind, sequence and
	// signature must equal want's (else an error wrapping ErrMismatch);
	// its payload is read into the buffer alloc returns for its length,
	// and its header and that buffer are returned. An error from alloc (a
	// length the caller refuses) is returned as is. After either, the
	// stream to peer is unusable.
	RecvVar(ctx context.Context, peer int, want Header, alloc func(n int) ([]byte, error)) (Header, []byte, error)
}

// Peeker is a transport that can look at the next message from a peer
// without taking it and without waiting. A receive from any source needs
// it: it must read only the peers whose next message is a point-to-point
// one, never into a collective's messages, which a peer that already sent
// what it had may have queued next.
type Peeker interface {
	// Peek returns the header of the next message from peer when all of
	// it arrived (ok), without consuming it. ok is false when nothing, or
	// only part of a header, is there yet, or when the stream from peer
	// already failed (a Recv reports why). It must not run concurrently
	// with a Recv or RecvVar from the same peer.
	Peek(peer int) (h Header, ok bool)
}

// Transport is one rank's set of connections to the other ranks of a
// communicator. Messages from one peer arrive in the order they were sent.
//
// Send and Recv may be called concurrently for different peers, and a Send
// may run concurrently with a Recv for the same peer; two Sends (or two
// Recvs) for the same peer must not overlap. Both honour ctx: on deadline or
// cancellation they return ctx's error, and the stream to that peer is then
// unusable (the communicator aborts).
type Transport interface {
	Rank() int
	Size() int
	// Send transmits h (with h.Len == len(data)) and data; when it returns,
	// data may be reused.
	Send(ctx context.Context, peer int, h Header, data []byte) error
	// Recv receives the next message from peer into buf. It fails with an
	// error wrapping ErrMismatch if the header differs from want (want.Len
	// must equal len(buf)), ErrRemoteAbort if the peer aborted, ErrPeerLost
	// if the peer went away.
	Recv(ctx context.Context, peer int, want Header, buf []byte) error
	// Abort tells every peer (best effort) why this rank stops, then fails
	// all pending and later calls with an error wrapping ErrAborted.
	Abort(reason error)
	// Close releases connections and any shared resources. Idempotent.
	Close() error
}
