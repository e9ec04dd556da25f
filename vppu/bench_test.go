package vppu

import (
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
)

// benchColl times call on 8 devices in blocks over 2 in-process ranks,
// each device sending sendMul·count and receiving recvMul·count float32s.
func benchColl(b *testing.B, count, sendMul, recvMul int, call func(c *Comm, send, recv [][]byte) error) {
	const n, m = 2, 8
	comms, err := engine.NewLocalComms(n, engine.Options{Timeout: 60 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	l, err := ParseLogical("ring", m)
	if err != nil {
		b.Fatal(err)
	}
	vcs, errs := make([]*Comm, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { vcs[r], errs[r] = New(comms[r], l, Block(m, n)) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(4 * count * sendMul))
	b.ResetTimer()
	for r := range n {
		wg.Go(func() {
			local := vcs[r].Local()
			send, recv := make([][]byte, len(local)), make([][]byte, len(local))
			for k := range local {
				send[k] = make([]byte, 4*count*sendMul)
				recv[k] = make([]byte, 4*count*recvMul)
			}
			for i := 0; i < b.N && errs[r] == nil; i++ {
				errs[r] = call(vcs[r], send, recv)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCollectives: every virtual collective on 256 KiB per device.
func BenchmarkCollectives(b *testing.B) {
	const count, m = 1 << 16, 8
	f32, sum := engine.Float32, engine.Sum
	b.Run("allreduce", func(b *testing.B) {
		benchColl(b, count, 1, 1, func(c *Comm, s, r [][]byte) error { return c.AllReduce(s, r, count, f32, sum) })
	})
	b.Run("reduce", func(b *testing.B) {
		benchColl(b, count, 1, 1, func(c *Comm, s, r [][]byte) error { return c.Reduce(s, r, count, f32, sum, 0) })
	})
	b.Run("broadcast", func(b *testing.B) {
		benchColl(b, count, 1, 1, func(c *Comm, s, r [][]byte) error { return c.Broadcast(s, r, count, f32, 5) })
	})
	b.Run("allgather", func(b *testing.B) {
		benchColl(b, count/m, 1, m, func(c *Comm, s, r [][]byte) error { return c.AllGather(s, r, count/m, f32) })
	})
	b.Run("reducescatter", func(b *testing.B) {
		benchColl(b, count/m, m, 1, func(c *Comm, s, r [][]byte) error { return c.ReduceScatter(s, r, count/m, f32, sum) })
	})
	b.Run("alltoall", func(b *testing.B) {
		benchColl(b, count/m, m, m, func(c *Comm, s, r [][]byte) error { return c.AllToAll(s, r, count/m, f32) })
	})
}
