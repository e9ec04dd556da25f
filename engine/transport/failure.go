package transport

import (
	"errors"
	"fmt"
	"io"
	"syscall"
)

// PeerLostError reports that a rank went away: its process died, its
// connection broke, or it closed its communicator. It wraps ErrPeerLost.
type PeerLostError struct {
	Peer   int
	Reason string // what happened, e.g. "process died (connection closed without goodbye)"
	// Dead: the peer's process ended, as its connection's end of stream
	// or reset, or its exit, shows; not a connection that only went
	// silent (a partition looks like that). A shrink's quorum counts the
	// dead out (agree.Node.SetMajority).
	Dead bool
}

func (e *PeerLostError) Error() string {
	return fmt.Sprintf("%v: rank %d: %s", ErrPeerLost, e.Peer, e.Reason)
}
func (e *PeerLostError) Is(target error) bool { return target == ErrPeerLost }

// Failure is what a rank announces to its peers when it stops because of an
// error: the rank where the failure started (Origin), and whether that rank
// aborted with Reason or was lost (Lost: its process died or its connection
// broke). A rank that learns of a failure from a peer announces it again
// with the same origin, so that every rank of a partly connected job reports
// the rank where it started.
type Failure struct {
	Origin int
	Lost   bool
	Dead   bool // Lost, and its process ended (PeerLostError.Dead)
	Reason string
}

// FailureOf classifies the reason given to Abort on rank self: a reason that
// wraps a RemoteAbortError or a PeerLostError relays that failure, anything
// else starts one on self.
func FailureOf(self int, reason error) Failure {
	var rae *RemoteAbortError
	if errors.As(reason, &rae) {
		return Failure{Origin: rae.Peer, Reason: rae.Reason}
	}
	var ple *PeerLostError
	if errors.As(reason, &ple) {
		return Failure{Origin: ple.Peer, Lost: true, Dead: ple.Dead, Reason: ple.Reason}
	}
	if reason == nil {
		reason = ErrAborted
	}
	return Failure{Origin: self, Reason: reason.Error()}
}

// Err is the error a peer reports for f: a *RemoteAbortError or a
// *PeerLostError naming the origin.
func (f Failure) Err() error {
	if f.Lost {
		return &PeerLostError{Peer: f.Origin, Reason: f.Reason, Dead: f.Dead}
	}
	return &RemoteAbortError{Peer: f.Origin, Reason: f.Reason}
}

// The fields of a KindAbort header that carry a relayed failure: Step holds
// origin+1 (0: the sender itself, as older senders wrote) and Sig the cause.
const (
	abortCauseAborted = 0
	abortCauseLost    = 1
	abortCauseDead    = 2 // lost, its process ended
)

// AbortHeader is the header of the KindAbort message announcing f, followed
// by n bytes of reason text.
func (f Failure) AbortHeader(n int) Header {
	h := Header{Kind: KindAbort, Step: uint32(f.Origin + 1), Len: uint64(n)}
	if f.Lost {
		h.Sig = abortCauseLost
	}
	if f.Lost && f.Dead {
		h.Sig = abortCauseDead
	}
	return h
}

// FailureFrom decodes the KindAbort message h with reason text received
// from rank sender.
func FailureFrom(sender int, h Header, reason string) Failure {
	f := Failure{Origin: sender, Reason: reason}
	if h.Step > 0 {
		f.Origin = int(h.Step - 1)
	}
	f.Lost = h.Sig == abortCauseLost || h.Sig == abortCauseDead
	f.Dead = h.Sig == abortCauseDead
	return f
}

// PeerDied says whether err reports that a peer's process ended (a
// PeerLostError with Dead set), and which.
func PeerDied(err error) (int, bool) {
	var ple *PeerLostError
	if errors.As(err, &ple) && ple.Dead {
		return ple.Peer, true
	}
	return -1, false
}

// Died says whether err, a connection's failure, shows that the process
// at its other end ended: the stream's end without a goodbye, or a reset
// or broken pipe (its socket closed with data unread). A timeout does not.
func Died(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNREFUSED)
}
