package engine

import (
	"fmt"
	"sync"
	"testing"
)

// benchComms joins n ranks of this process through the real rendezvous
// (unique id), so the benchmark runs the same code as a job of processes.
func benchComms(b testing.TB, n int, tr string) []*Comm {
	b.Helper()
	opts := Options{Transport: tr}
	id, err := NewUniqueID(opts)
	if err != nil {
		b.Fatal(err)
	}
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = NewComm(id, n, r, opts)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, c := range comms {
			c.Destroy()
		}
	})
	return comms
}

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

// runBench times b.N rounds of op on every rank; bytes is the nccl-tests
// size and factor the bus-bandwidth factor of the collective.
func runBench(b *testing.B, comms []*Comm, bytes int, factor float64, op func(c *Comm, send, recv []byte) error) {
	n := len(comms)
	send, recv := make([][]byte, n), make([][]byte, n)
	for r := range comms {
		send[r], recv[r] = make([]byte, bytes), make([]byte, bytes)
	}
	b.SetBytes(int64(bytes))
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < b.N && errs[r] == nil; i++ {
				errs[r] = op(c, send[r], recv[r])
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	algbw := float64(bytes) / sec / 1e9
	b.ReportMetric(algbw, "algGB/s")
	b.ReportMetric(algbw*factor, "busGB/s")
	b.ReportMetric(sec*1e6, "us/op")
}

// BenchmarkAllReduce: float32 sum, ranks as goroutines over shared memory
// ("auto") and TCP loopback. With 4 ranks the 2 cores here are oversubscribed.
func BenchmarkAllReduce(b *testing.B) {
	for _, tr := range []string{"auto", "tcp"} {
		for _, n := range []int{2, 4} {
			b.Run(fmt.Sprintf("tr=%s/n=%d", tr, n), func(b *testing.B) {
				comms := benchComms(b, n, tr)
				for _, size := range benchSizes {
					b.Run("bytes="+sizeName(size), func(b *testing.B) {
						runBench(b, comms, size, 2*float64(n-1)/float64(n), func(c *Comm, s, r []byte) error {
							return c.AllReduce(s, r, len(s)/4, Float32, Sum)
						})
					})
				}
			})
		}
	}
}

// BenchmarkAllToAll: bytes is each rank's send buffer (nccl-tests).
func BenchmarkAllToAll(b *testing.B) {
	for _, tr := range []string{"auto", "tcp"} {
		for _, n := range []int{2, 4} {
			b.Run(fmt.Sprintf("tr=%s/n=%d", tr, n), func(b *testing.B) {
				comms := benchComms(b, n, tr)
				for _, size := range benchSizes {
					b.Run("bytes="+sizeName(size), func(b *testing.B) {
						runBench(b, comms, size, float64(n-1)/float64(n), func(c *Comm, s, r []byte) error {
							return c.AllToAll(s, r, len(s)/4/n, Float32)
						})
					})
				}
			})
		}
	}
}

// BenchmarkOneRank is the issue path's own cost: a one-rank communicator
// checks, chooses and copies, nothing more (compare instruction counts
// under callgrind, which load does not change).
func BenchmarkOneRank(b *testing.B) {
	c := newLocal(b, 1, Options{})[0]
	s, r := make([]byte, 4096), make([]byte, 4096)
	for _, tc := range oneRankCalls(c, s, r) {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if err := tc.f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVirtualAllReduce: 8 virtual devices in blocks on 2 and 4 ranks
// (as goroutines over shared memory), float32 sum; bytes is one device's
// vector (814 KB: the sgd example's gradient).
func BenchmarkVirtualAllReduce(b *testing.B) {
	const m = 8
	for _, n := range []int{2, 4} {
		devices := make([]int, m)
		for v := range devices {
			devices[v] = v * n / m
		}
		comms := benchComms(b, n, "auto")
		for _, size := range []int{814 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("n=%d/bytes=%s", n, sizeName(size)), func(b *testing.B) {
				count := size / 4
				in := make([][]byte, n)
				for r := range comms {
					in[r] = make([]byte, m/n*size)
				}
				runBench(b, comms, size, 1, func(c *Comm, _, r []byte) error {
					send := make([][]byte, 0, m/n)
					for k := range m / n {
						send = append(send, in[c.Rank()][k*size:(k+1)*size])
					}
					return c.Virtual(devices).AllReduce(send, r, count, Float32, Sum)
				})
			})
		}
	}
}
