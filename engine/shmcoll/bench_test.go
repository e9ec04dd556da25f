//go:build linux

package shmcoll

import (
	"context"
	"fmt"
	"testing"

	"github.com/gocoll/gocoll/engine/kernel"
)

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkAllReduce: float32 sum, out of place, ranks as goroutines.
// busGB/s = algbw × 2(n-1)/n, as nccl-tests reports it.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			w := newWorld(b, n, 0)
			for _, size := range benchSizes {
				b.Run("bytes="+sizeName(size), func(b *testing.B) {
					benchWorld(b, w, size, func(ctx context.Context, a *Arena, c Call, send, recv []byte) error {
						return a.AllReduce(ctx, c, send, recv, kernel.Float32, kernel.Sum)
					})
					b.ReportMetric(busBW(b, size, 2*float64(n-1)/float64(n)), "busGB/s")
				})
			}
		})
	}
}

func busBW(b *testing.B, size int, factor float64) float64 {
	sec := b.Elapsed().Seconds() / float64(b.N)
	return float64(size) / sec / 1e9 * factor
}

// benchWorld runs op b.N times on every rank of w with size-byte buffers.
func benchWorld(b *testing.B, w *world, size int, op func(ctx context.Context, a *Arena, c Call, send, recv []byte) error) {
	n := len(w.arenas)
	sends, recvs := make([][]byte, n), make([][]byte, n)
	for r := range n {
		sends[r], recvs[r] = make([]byte, size), make([]byte, size)
		for i := range sends[r] {
			sends[r][i] = byte(i)
		}
	}
	ctx := context.Background()
	seq := uint64(0)
	run := func(iters int) {
		errs := w.run(func(r int, a *Arena) error {
			for i := range iters {
				if err := op(ctx, a, Call{Seq: seq + uint64(i), Sig: uint64(size)}, sends[r], recvs[r]); err != nil {
					return err
				}
			}
			return nil
		})
		seq += uint64(iters)
		for _, err := range errs {
			if err != nil {
				b.Fatal(errorsText(errs))
			}
		}
	}
	run(3) // warm up: fault in the buffers
	b.SetBytes(int64(size))
	b.ResetTimer()
	run(b.N)
}
