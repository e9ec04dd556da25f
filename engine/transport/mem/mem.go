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
}

var (
	_ transport.Transport   = (*Endpoint)(nil)
	_ transport.VarReceiver = (*Endpoint)(nil)
)

func (e *Endpoint) Rank() int { return e.rank }
func (e *Endpoint) Size() int { return e.w.size }

// abortErr describes a world abort from this endpoint's point of view.
func (e *Endpoint) abortErr() error {
	if e.w.abortRank == e.rank {
		return fmt.Errorf("%w: %v", transport.ErrAborted, e.w.abortReason)
	}
	return &transport.RemoteAbortError{Peer: e.w.abortRank, Reason: e.w.abortReason.Error()}
}

func (e *Endpoint) Send(ctx context.Context, peer int, h transport.Header, data []byte) error {
	if hook := e.w.Hook; hook != nil {
		if err := hook(e.rank, peer, h); err != nil {
			return err
		}
	}
	m := message{h: h, data: append([]byte(nil), data...)}
	select {
	case <-e.w.aborted:
		return e.abortErr()
	case <-e.closed:
		return fmt.Errorf("%w: transport closed", transport.ErrAborted)
	default:
	}
	select {
	case e.w.links[e.rank][peer] <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.w.aborted:
		return e.abortErr()
	case <-e.closed:
		return fmt.Errorf("%w: transport closed", transport.ErrAborted)
	case <-e.w.eps[peer].closed:
		return fmt.Errorf("%w: rank %d closed", transport.ErrPeerLost, peer)
	}
}

func (e *Endpoint) Recv(ctx context.Context, peer int, want transport.Header, buf []byte) error {
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

// next takes the next message from peer.
func (e *Endpoint) next(ctx context.Context, peer int) (message, error) {
	var m message
	select {
	case <-e.w.aborted:
		return m, e.abortErr()
	case <-e.closed:
		return m, fmt.Errorf("%w: transport closed", transport.ErrAborted)
	default:
	}
	select {
	case m = <-e.w.links[peer][e.rank]:
	case <-ctx.Done():
		return m, ctx.Err()
	case <-e.w.aborted:
		return m, e.abortErr()
	case <-e.closed:
		return m, fmt.Errorf("%w: transport closed", transport.ErrAborted)
	case <-e.w.eps[peer].closed:
		// Deliver what the peer sent before it went away.
		select {
		case m = <-e.w.links[peer][e.rank]:
		default:
			return m, fmt.Errorf("%w: rank %d closed", transport.ErrPeerLost, peer)
		}
	}
	return m, nil
}

// Abort fails every endpoint of the world: this one with ErrAborted, the
// others with a RemoteAbortError carrying reason.
func (e *Endpoint) Abort(reason error) {
	if reason == nil {
		reason = transport.ErrAborted
	}
	e.w.abortOnce.Do(func() {
		e.w.abortRank, e.w.abortReason = e.rank, reason
		close(e.w.aborted)
	})
	e.Close()
}

// Close ends this endpoint; peers waiting on it see ErrPeerLost, after any
// messages it already sent.
func (e *Endpoint) Close() error {
	e.once.Do(func() { close(e.closed) })
	return nil
}
