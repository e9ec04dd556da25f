// Package mem is an in-process transport: ranks are goroutines of one
// process. Sends are buffered (the payload is copied, as a socket or a shared
// ring would hold it), so a rank may finish a collective before its peers
// consumed what it sent, exactly as with the real transports. An abort on any
// rank fails every rank's pending and later calls, as the real transports'
// failure propagation does.
package mem

import (
	"context"
	"fmt"
	"sync"

	"github.com/gocoll/gocoll/engine/transport"
)

// depth is how many messages a directed link buffers before Send blocks.
const depth = 64

type message struct {
	h    transport.Header
	data []byte
}

// World is the shared state of one in-process job.
type World struct {
	size  int
	links [][]chan message // links[from][to]
	eps   []*Endpoint

	abortOnce   sync.Once
	aborted     chan struct{} // closed when any endpoint aborts
	abortRank   int
	abortReason error
	failure     transport.Failure // what the other endpoints report

	// Hook, when set, runs before every Send; a non-nil error fails it. Tests
	// use it to cut links or stall ranks deterministically.
	Hook func(from, to int, h transport.Header) error
}

// NewWorld makes n connected endpoints.
func NewWorld(n int) *World {
	w := &World{size: n, links: make([][]chan message, n), eps: make([]*Endpoint, n), aborted: make(chan struct{})}
	for i := range w.links {
		w.links[i] = make([]chan message, n)
		for j := range w.links[i] {
			w.links[i][j] = make(chan message, depth)
		}
	}
	for r := range w.eps {
		w.eps[r] = &Endpoint{w: w, rank: r, closed: make(chan struct{})}
	}
	return w
}

// Size is the number of ranks.
func (w *World) Size() int { return w.size }

// Endpoint returns rank r's transport.
func (w *World) Endpoint(r int) *Endpoint { return w.eps[r] }

// Endpoint is one rank's view of a World; it implements transport.Transport.
type Endpoint struct {
	w      *World
	rank   int
	once   sync.Once
	closed chan struct{} // closed on Abort or Close of this endpoint

	// A channel cannot be looked into: Peek takes the next message from
	// peer out of it and keeps it here, where next finds it first.
	aheadMu sync.Mutex
	ahead   map[int]message
}

var (
	_ transport.Transport   = (*Endpoint)(nil)
	_ transport.VarReceiver = (*Endpoint)(nil)
	_ transport.Peeker      = (*Endpoint)(nil)
)

func (e *Endpoint) Rank() int { return e.rank }
func (e *Endpoint) Size() int { return e.w.size }

// abortErr describes a world abort from this endpoint's point of view.
func (e *Endpoint) abortErr() error {
	if e.w.abortRank == e.rank {
		return fmt.Errorf("%w: %v", transport.ErrAborted, e.w.abortReason)
	}
	return e.w.failure.Err()
}

// check refuses a call to peer that a caller got wrong (n is the length
// the header says, have the buffer's).
func (e *Endpoint) check(op string, peer int, n uint64, have int) error {
	if peer < 0 || peer >= e.w.size || peer == e.rank {
		return fmt.Errorf("mem: rank %d: %s rank %d: no such peer (size %d)", e.rank, op, peer, e.w.size)
	}
	if n != uint64(have) {
		return fmt.Errorf("mem: rank %d: %s rank %d: header says %d bytes, buffer has %d", e.rank, op, peer, n, have)
	}
	return nil
}

func (e *Endpoint) Send(ctx context.Context, peer int, h transport.Header, data []byte) error {
	if err := e.check("send to", peer, h.Len, len(data)); err != nil {
		return err
	}
	if hook := e.w.Hook; hook != nil {
		if err := hook(e.rank, peer, h); err != nil {
			return err
		}
	}
	if err := e.stopErr(); err != nil {
		return err
	}
	// A closed peer reads nothing more: the message would be lost.
	if isClosed(e.w.eps[peer].closed) {
		return e.closedErr("send to", peer)
	}
	m := message{h: h, data: append([]byte(nil), data...)}
	select {
	case e.w.links[e.rank][peer] <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.w.aborted:
	case <-e.closed:
	case <-e.w.eps[peer].closed:
	}
	if err := e.stopErr(); err != nil {
		return err
	}
	return e.closedErr("send to", peer)
}

func (e *Endpoint) Recv(ctx context.Context, peer int, want transport.Header, buf []byte) error {
	if err := e.check("recv from", peer, want.Len, len(buf)); err != nil {
		return err
	}
	m, err := e.next(ctx, peer)
	if err != nil {
		return err
	}
	if err := transport.Check(peer, want, m.h); err != nil {
		return err
	}
	copy(buf, m.data)
	return nil
}

// RecvVar is Recv of a message whose step and length the receiver does
// not know (transport.VarReceiver).
func (e *Endpoint) RecvVar(ctx context.Context, peer int, want transport.Header, alloc func(n int) ([]byte, error)) (transport.Header, []byte, error) {
	if err := e.check("recv from", peer, 0, 0); err != nil {
		return transport.Header{}, nil, err
	}
	m, err := e.next(ctx, peer)
	if err != nil {
		return transport.Header{}, nil, err
	}
	if err := transport.CheckVar(peer, want, m.h); err != nil {
		return transport.Header{}, nil, err
	}
	buf, err := alloc(len(m.data))
	if err != nil {
		return transport.Header{}, nil, err
	}
	copy(buf, m.data)
	return m.h, buf, nil
}

// Peek returns the header of the next message from peer, if one is queued,
// without consuming it (transport.Peeker).
func (e *Endpoint) Peek(peer int) (transport.Header, bool) {
	if peer < 0 || peer >= e.w.size || peer == e.rank || e.stopErr() != nil {
		return transport.Header{}, false
	}
	e.aheadMu.Lock()
	defer e.aheadMu.Unlock()
	if m, ok := e.ahead[peer]; ok {
		return m.h, true
	}
	select {
	case m := <-e.w.links[peer][e.rank]:
		if e.ahead == nil {
			e.ahead = make(map[int]message)
		}
		e.ahead[peer] = m
		return m.h, true
	default:
		return transport.Header{}, false
	}
}

// next takes the next message from peer; once the world aborted or this
// endpoint closed, the abort (or the close) wins over a message in flight.
func (e *Endpoint) next(ctx context.Context, peer int) (message, error) {
	var m message
	if err := e.stopErr(); err != nil {
		return m, err
	}
	e.aheadMu.Lock()
	m, ok := e.ahead[peer]
	delete(e.ahead, peer)
	e.aheadMu.Unlock()
	if ok {
		return m, nil
	}
	select {
	case m = <-e.w.links[peer][e.rank]:
	case <-ctx.Done():
		return m, ctx.Err()
	case <-e.w.aborted:
		return m, e.stopErr()
	case <-e.closed:
		return m, e.stopErr()
	case <-e.w.eps[peer].closed:
		if err := e.stopErr(); err != nil {
			return m, err
		}
		// Deliver what the peer sent before it went away.
		select {
		case m = <-e.w.links[peer][e.rank]:
		default:
			return m, e.closedErr("recv from", peer)
		}
	}
	return m, nil
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// stopErr is the error calls fail with once the world aborted or this
// endpoint closed (nil before): the abort when both happened, since an
// aborting endpoint also closes and its abort is what happened.
func (e *Endpoint) stopErr() error {
	if isClosed(e.w.aborted) {
		return e.abortErr()
	}
	if isClosed(e.closed) {
		return fmt.Errorf("%w: transport closed", transport.ErrAborted)
	}
	return nil
}

// closedErr is the error of a call to peer, which closed its endpoint.
func (e *Endpoint) closedErr(op string, peer int) error {
	return fmt.Errorf("mem: rank %d: %s rank %d: %w", e.rank, op, peer, &transport.PeerLostError{Peer: peer, Reason: "closed its communicator"})
}

// Abort fails every endpoint of the world: this one with ErrAborted, the
// others with the failure reason announces (transport.FailureOf): a
// RemoteAbortError naming this rank, or, when reason relays a failure this
// rank heard of, the error naming the rank where it started.
func (e *Endpoint) Abort(reason error) {
	if reason == nil {
		reason = transport.ErrAborted
	}
	e.w.abortOnce.Do(func() {
		e.w.abortRank, e.w.abortReason = e.rank, reason
		e.w.failure = transport.FailureOf(e.rank, reason)
		close(e.w.aborted)
	})
	e.Close()
}

// Close ends this endpoint; peers waiting on it see a
// *transport.PeerLostError, after any messages it already sent.
func (e *Endpoint) Close() error {
	e.once.Do(func() { close(e.closed) })
	return nil
}
