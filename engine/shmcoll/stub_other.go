//go:build !linux

package shmcoll

import (
	"context"
	"errors"
	"fmt"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
)

// Arena is unavailable on this platform: Create fails.
type Arena struct{}

var errUnsupported = fmt.Errorf("shmcoll: %w on this platform", errors.ErrUnsupported)

// Create fails: shared-memory collectives need Linux.
func Create(cfg Config) (*Arena, error) { return nil, errUnsupported }

func (a *Arena) Ref() PeerInfo                                             { return PeerInfo{} }
func (a *Arena) Rank() int                                                 { return 0 }
func (a *Arena) Size() int                                                 { return 0 }
func (a *Arena) SlotBytes() int                                            { return 0 }
func (a *Arena) Connect(ctx context.Context, peers map[int]PeerInfo) error { return errUnsupported }
func (a *Arena) Release()                                                  {}
func (a *Arena) Abort(reason error)                                        {}
func (a *Arena) Close() error                                              { return nil }
func (a *Arena) Alloc(size int) ([]byte, error)                            { return nil, errUnsupported }
func (a *Arena) Free(b []byte) error                                       { return errUnsupported }
func (a *Arena) AllReduce(ctx context.Context, c Call, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	return errUnsupported
}
func (a *Arena) Reduce(ctx context.Context, c Call, send, recv []byte, dt kernel.DataType, op kernel.RedOp, root int) error {
	return errUnsupported
}
func (a *Arena) Broadcast(ctx context.Context, c Call, buf []byte, root int) error {
	return errUnsupported
}
func (a *Arena) FitsAllToAllv() bool { return false }
func (a *Arena) AllToAllv(ctx context.Context, c Call, send []byte, sb []sched.Block, recv []byte, rb []sched.Block) error {
	return errUnsupported
}
func (a *Arena) ChainAllReduce(ctx context.Context, c Call, in []byte, local int, recv []byte, order []int, dt kernel.DataType, op kernel.RedOp, div int) error {
	return errUnsupported
}
func (a *Arena) AllGather(ctx context.Context, c Call, send, recv []byte) error {
	return errUnsupported
}
func (a *Arena) ReduceScatter(ctx context.Context, c Call, send, recv []byte, dt kernel.DataType, op kernel.RedOp) error {
	return errUnsupported
}
func (a *Arena) AllToAll(ctx context.Context, c Call, send, recv []byte) error {
	return errUnsupported
}
func (a *Arena) Barrier(ctx context.Context, c Call) error { return errUnsupported }
