//go:build linux

package shm

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

// Two ranks, default 4 MiB rings, either both in this process (goroutines)
// or rank 1 in a child process.
//
//	PingPong: rank 0 sends size bytes, rank 1 sends them back; ns/op is one
//	round trip (half of it is the one-way latency).
//	Stream: rank 0 sends b.N messages of size bytes one way; MB/s is the
//	one-way bandwidth.

func benchPair(b *testing.B, procs bool) (transport.Transport, func(cmd string, n, size int)) {
	b.Setenv(ringVar, strconv.Itoa(DefaultRingBytes))
	if procs {
		ts, kids := transporttest.StartMesh(b, maker{}, []string{"", "echo"})
		return ts[0], func(cmd string, n, size int) { kids[1].Say(b, "%s %d %d", cmd, n, size) }
	}
	ts := transporttest.NewMesh(b, maker{}, 2, nil)
	return ts[0], func(cmd string, n, size int) {
		go func() {
			if err := echo(context.Background(), ts[1], cmd == "PING", n, size); err != nil {
				panic(err)
			}
		}()
	}
}

func BenchmarkPingPong(b *testing.B) {
	for _, procs := range []bool{false, true} {
		for _, size := range []int{8, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%s", where(procs), sizeName(size)), func(b *testing.B) {
				tr, peer := benchPair(b, procs)
				ctx := context.Background()
				buf := make([]byte, size)
				h := transport.Header{Kind: transport.KindData, Len: uint64(size)}
				b.SetBytes(int64(2 * size))
				peer("PING", b.N, size)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					h.Seq = uint64(i)
					if err := tr.Send(ctx, 1, h, buf); err != nil {
						b.Fatal(err)
					}
					if err := tr.Recv(ctx, 1, h, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkStream(b *testing.B) {
	for _, procs := range []bool{false, true} {
		for _, size := range []int{1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("%s/%s", where(procs), sizeName(size)), func(b *testing.B) {
				tr, peer := benchPair(b, procs)
				ctx := context.Background()
				buf := make([]byte, size)
				h := transport.Header{Kind: transport.KindData, Len: uint64(size)}
				b.SetBytes(int64(size))
				peer("SINK", b.N, size)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					h.Seq = uint64(i)
					if err := tr.Send(ctx, 1, h, buf); err != nil {
						b.Fatal(err)
					}
				}
				if err := tr.Recv(ctx, 1, transport.Header{Kind: transport.KindData}, nil); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

func where(procs bool) string {
	if procs {
		return "procs"
	}
	return "goroutines"
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
