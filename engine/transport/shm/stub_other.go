//go:build !linux

package shm

import (
	"context"
	"errors"
	"fmt"

	"github.com/gocoll/gocoll/engine/transport"
)

// Transport is unavailable on this platform: Create fails.
type Transport struct{}

var _ transport.Transport = (*Transport)(nil)

var errUnsupported = fmt.Errorf("shm transport: %w on this platform", errors.ErrUnsupported)

// Create fails: the shared-memory transport needs Linux.
func Create(cfg Config) (*Transport, error) { return nil, errUnsupported }

func (t *Transport) Ref() PeerInfo                                             { return PeerInfo{} }
func (t *Transport) Rank() int                                                 { return 0 }
func (t *Transport) Size() int                                                 { return 0 }
func (t *Transport) Connect(ctx context.Context, peers map[int]PeerInfo) error { return errUnsupported }
func (t *Transport) Release()                                                  {}
func (t *Transport) Send(ctx context.Context, peer int, h transport.Header, data []byte) error {
	return errUnsupported
}
func (t *Transport) Recv(ctx context.Context, peer int, want transport.Header, buf []byte) error {
	return errUnsupported
}
func (t *Transport) RecvVar(ctx context.Context, peer int, want transport.Header, alloc func(n int) ([]byte, error)) (transport.Header, []byte, error) {
	return transport.Header{}, nil, errUnsupported
}
func (t *Transport) Peek(peer int) (transport.Header, bool) { return transport.Header{}, false }
func (t *Transport) Abort(reason error)                     {}
func (t *Transport) Close() error                           { return nil }
