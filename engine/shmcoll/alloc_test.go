//go:build linux

package shmcoll

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
)

// TestZeroAllocs: no collective allocates per call, on any rank (AllocsPerRun
// counts the whole process, so every rank's calls are included).
func TestZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	type op func(ctx context.Context, a *Arena, c Call, send, recv []byte) error
	ops := []struct {
		name  string
		bytes int
		f     op
	}{
		{"allreduce-small", 4 << 10, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.AllReduce(ctx, c, s, r, kernel.Float32, kernel.Avg)
		}},
		{"allreduce-large", 3*testSlot + 64, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.AllReduce(ctx, c, s, r, kernel.Bfloat16, kernel.Sum)
		}},
		{"allreduce-inplace", 3*testSlot + 64, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.AllReduce(ctx, c, s, s, kernel.Float32, kernel.Max)
		}},
		{"reduce", 3*testSlot + 64, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.Reduce(ctx, c, s, r, kernel.Float64, kernel.Sum, 1)
		}},
		{"broadcast", 3*testSlot + 64, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.Broadcast(ctx, c, s, 0)
		}},
		{"allgather", 3*testSlot + 64, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.AllGather(ctx, c, s[:len(s)/a.Size()], r[:len(s)/a.Size()*a.Size()])
		}},
		{"reducescatter", 3*testSlot + 64, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			m := len(s) / a.Size() &^ 7
			return a.ReduceScatter(ctx, c, s[:m*a.Size()], r[:m], kernel.Int32, kernel.Sum)
		}},
		{"alltoall", 3*testSlot + 64, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			m := len(s) / a.Size() * a.Size()
			return a.AllToAll(ctx, c, s[:m], r[:m])
		}},
		{"barrier", 0, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.Barrier(ctx, c)
		}},
		// Rank 0 goes to sleep on the futex (and checks its peers, their
		// processes, its deadline) while the others dawdle.
		{"slow-peers", 4 << 10, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			if a.Rank() != 0 {
				time.Sleep(3 * time.Millisecond)
			}
			return a.AllReduce(ctx, c, s, r, kernel.Float32, kernel.Sum)
		}},
	}
	for _, n := range []int{2, 4} {
		w := newWorld(t, n, testSlot)
		for _, o := range ops {
			t.Run(fmt.Sprintf("n=%d/%s", n, o.name), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a deadline to watch
				defer cancel()
				sends, recvs := make([][]byte, n), make([][]byte, n)
				for r := range n {
					sends[r], recvs[r] = make([]byte, o.bytes), make([]byte, o.bytes)
				}
				allocs := allocsPerCall(t, w, 30, 1, func(r int, a *Arena, seq uint64) error {
					return o.f(ctx, a, Call{Seq: seq, Sig: 7}, sends[r], recvs[r])
				})
				if allocs != 0 {
					t.Errorf("%v allocations per call (all %d ranks)", allocs, n)
				}
			})
		}
	}
}
