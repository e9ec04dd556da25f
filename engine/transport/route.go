package transport

import (
	"context"
	"errors"
	"fmt"
)

// Routed sends each peer's traffic through the transport serving that peer
// (shared memory for ranks on this host, TCP for the rest).
type Routed struct {
	rank, size int
	byPeer     []Transport
	all        []Transport
}

// NewRouted builds a Routed; byPeer[p] serves peer p (nil for this rank).
func NewRouted(rank int, byPeer []Transport) *Routed {
	r := &Routed{rank: rank, size: len(byPeer), byPeer: byPeer}
	seen := map[Transport]bool{}
	for _, t := range byPeer {
		if t != nil && !seen[t] {
			seen[t] = true
			r.all = append(r.all, t)
		}
	}
	return r
}

func (r *Routed) Rank() int { return r.rank }
func (r *Routed) Size() int { return r.size }

func (r *Routed) route(peer int) (Transport, error) {
	if peer < 0 || peer >= r.size || r.byPeer[peer] == nil {
		return nil, fmt.Errorf("%w: no route to rank %d", ErrProtocol, peer)
	}
	return r.byPeer[peer], nil
}

func (r *Routed) Send(ctx context.Context, peer int, h Header, data []byte) error {
	t, err := r.route(peer)
	if err != nil {
		return err
	}
	return t.Send(ctx, peer, h, data)
}

func (r *Routed) Recv(ctx context.Context, peer int, want Header, buf []byte) error {
	t, err := r.route(peer)
	if err != nil {
		return err
	}
	return t.Recv(ctx, peer, want, buf)
}

// RecvVar receives through the peer's transport, which must be a
// VarReceiver.
func (r *Routed) RecvVar(ctx context.Context, peer int, want Header, alloc func(n int) ([]byte, error)) (Header, []byte, error) {
	t, err := r.route(peer)
	if err != nil {
		return Header{}, nil, err
	}
	v, ok := t.(VarReceiver)
	if !ok {
		return Header{}, nil, fmt.Errorf("%w: the transport to rank %d cannot receive messages of unknown length", ErrProtocol, peer)
	}
	return v.RecvVar(ctx, peer, want, alloc)
}

// Peek looks through the peer's transport, which must be a Peeker (else
// nothing is ever ready).
func (r *Routed) Peek(peer int) (Header, bool) {
	t, err := r.route(peer)
	if err != nil {
		return Header{}, false
	}
	p, ok := t.(Peeker)
	if !ok {
		return Header{}, false
	}
	return p.Peek(peer)
}

func (r *Routed) Abort(reason error) {
	for _, t := range r.all {
		t.Abort(reason)
	}
}

func (r *Routed) Close() error {
	var err error
	for _, t := range r.all {
		err = errors.Join(err, t.Close())
	}
	return err
}
