//go:build linux

package shmcoll

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
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

// BenchmarkAllReduce: float32 sum, out of place, ranks as goroutines of one
// process. busGB/s = algbw × 2(n-1)/n from the mean time (b2b, as
// nccl-tests); p50-µs and p99-µs are per-call times seen by rank 0.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			w := newWorld(b, n, 0)
			for _, size := range benchSizes {
				b.Run("bytes="+sizeName(size), func(b *testing.B) {
					benchWorld(b, w, size, false, 2*float64(n-1)/float64(n), func(ctx context.Context, a *Arena, c Call, send, recv []byte) error {
						return a.AllReduce(ctx, c, send, recv, kernel.Float32, kernel.Sum)
					})
				})
			}
		})
	}
}

// BenchmarkAllReduceRegistered: as BenchmarkAllReduce, with the send
// buffers in memory from Arena.Alloc, which the peers read in place.
func BenchmarkAllReduceRegistered(b *testing.B) {
	for _, n := range []int{2, 4} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			w := newWorld(b, n, 0)
			for _, size := range benchSizes[2:] {
				b.Run("bytes="+sizeName(size), func(b *testing.B) {
					benchWorld(b, w, size, true, 2*float64(n-1)/float64(n), func(ctx context.Context, a *Arena, c Call, send, recv []byte) error {
						return a.AllReduce(ctx, c, send, recv, kernel.Float32, kernel.Sum)
					})
				})
			}
		})
	}
}

// BenchmarkCollectives: the other collectives at 64 KiB, 1 MiB and 16 MiB
// (nccl-tests sizes: allgather output, reducescatter input, alltoall
// per-rank buffer).
func BenchmarkCollectives(b *testing.B) { benchCollectives(b, false) }

// BenchmarkCollectivesRegistered: as BenchmarkCollectives, with the send
// buffers (Broadcast: every rank's buf) in memory from Arena.Alloc, which
// the peers read in place where the collective supports it.
func BenchmarkCollectivesRegistered(b *testing.B) { benchCollectives(b, true) }

func benchCollectives(b *testing.B, reg bool) {
	type op struct {
		name   string
		factor func(n int) float64
		f      func(ctx context.Context, a *Arena, c Call, send, recv []byte) error
	}
	part := func(n int) float64 { return float64(n-1) / float64(n) }
	one := func(int) float64 { return 1 }
	ops := []op{
		{"broadcast", one, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			if reg {
				r = s
			}
			return a.Broadcast(ctx, c, r, 0)
		}},
		{"reduce", one, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.Reduce(ctx, c, s, r, kernel.Float32, kernel.Sum, 0)
		}},
		{"allgather", part, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.AllGather(ctx, c, s[:len(s)/a.Size()], r)
		}},
		{"reducescatter", part, func(ctx context.Context, a *Arena, c Call, s, r []byte) error {
			return a.ReduceScatter(ctx, c, s, r[:len(s)/a.Size()], kernel.Float32, kernel.Sum)
		}},
		{"alltoall", part, func(ctx context.Context, a *Arena, c Call, s, r []byte) error { return a.AllToAll(ctx, c, s, r) }},
	}
	for _, n := range []int{2, 4} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			w := newWorld(b, n, 0)
			for _, o := range ops {
				for _, size := range []int{64 << 10, 1 << 20, 16 << 20} {
					b.Run(o.name+"/bytes="+sizeName(size), func(b *testing.B) {
						benchWorld(b, w, size, reg, o.factor(n), o.f)
					})
				}
			}
		})
	}
}

// benchWorld runs op b.N times on every rank of w with size-byte buffers
// and reports busGB/s (mean time) and rank 0's per-call p50 and p99.
func benchWorld(b *testing.B, w *world, size int, reg bool, factor float64, op func(ctx context.Context, a *Arena, c Call, send, recv []byte) error) {
	n := len(w.arenas)
	sends, recvs := make([][]byte, n), make([][]byte, n)
	for r := range n {
		sends[r], recvs[r] = make([]byte, size), make([]byte, size)
		if reg {
			m, err := w.arenas[r].Alloc(size)
			if err != nil {
				b.Fatal(err)
			}
			defer w.arenas[r].Free(m)
			sends[r] = m
		}
		for i := range sends[r] {
			sends[r][i] = byte(i)
		}
	}
	ctx := context.Background()
	seq := uint64(0)
	var times []time.Duration
	run := func(iters int) {
		times = make([]time.Duration, iters)
		errs := w.run(func(r int, a *Arena) error {
			last := time.Now()
			for i := range iters {
				if err := op(ctx, a, Call{Seq: seq + uint64(i), Sig: uint64(size)}, sends[r], recvs[r]); err != nil {
					return err
				}
				if r == 0 {
					now := time.Now()
					times[i], last = now.Sub(last), now
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
	b.StopTimer()
	reportTimes(b, size, factor, b.Elapsed()/time.Duration(b.N), times)
}

func reportTimes(b *testing.B, size int, factor float64, mean time.Duration, times []time.Duration) {
	b.ReportMetric(float64(size)/mean.Seconds()/1e9*factor, "busGB/s")
	slices.Sort(times)
	us := func(q float64) float64 { return float64(times[int(q*float64(len(times)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(us(0.5), "p50-µs")
	b.ReportMetric(us(0.99), "p99-µs")
}

// BenchmarkAllReduceProcesses: as BenchmarkAllReduce with every rank in
// its own process. Each run starts fresh processes; the time is rank 0's,
// from a barrier to the end of b.N back-to-back calls.
func BenchmarkAllReduceProcesses(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("n=%d/bytes=%s", n, sizeName(size)), func(b *testing.B) {
				benchProcesses(b, n, size)
			})
		}
	}
}

func benchProcesses(b *testing.B, n, size int) {
	b.Setenv(slotVar, strconv.Itoa(DefaultSlotBytes))
	_, kids := transporttest.StartGroup(b, groupMaker{}, roles(n, "bench"))
	for _, c := range kids {
		c.Say(b, "%d %d", b.N, size)
	}
	l := "TIME " + kids[0].ExpectWithin(b, "TIME", 10*time.Minute)
	var total, p50, p99 int64
	if _, err := fmt.Sscanf(l, "TIME %d %d %d", &total, &p50, &p99); err != nil {
		b.Fatalf("rank 0: %s", l)
	}
	d := time.Duration(total) / time.Duration(b.N)
	b.ReportMetric(float64(d.Nanoseconds()), "ns/op")
	b.ReportMetric(float64(size)/d.Seconds()/1e9*2*float64(n-1)/float64(n), "busGB/s")
	b.ReportMetric(float64(p50)/1e3, "p50-µs")
	b.ReportMetric(float64(p99)/1e3, "p99-µs")
}
