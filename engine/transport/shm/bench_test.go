//go:build linux

package shm

import (
	"context"
	"fmt"
	"testing"

	"github.com/gocoll/gocoll/engine/transport"
)

// Two ranks, default 4 MiB rings, either both in this process (goroutines)
// or rank 1 in a child process.
//
//	PingPong: rank 0 sends size bytes, rank 1 sends them back; ns/op is one
//	round trip (half of it is the one-way latency).
//	Stream: rank 0 sends b.N messages of size bytes one way; MB/s is the
//	one-way bandwidth.

func benchPair(b *testing.B, procs bool) (*Transport, func(cmd string, n, size int)) {
	tag := newTag(b)
	tr0, err := Create(Config{Rank: 0, Size: 2, Peers: []int{1}, Tag: tag})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr0.Close() })
	if procs {
		c := startChild(b, "echo", 1, 2, tag, DefaultRingBytes)
		connectChildren(b, []*child{c}, []*Transport{tr0})
		return tr0, func(cmd string, n, size int) { c.say(b, "%s %d %d", cmd, n, size) }
	}
	tr1, err := Create(Config{Rank: 1, Size: 2, Peers: []int{0}, Tag: tag})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr1.Close() })
	ctx := context.Background()
	for _, p := range [][2]*Transport{{tr0, tr1}, {tr1, tr0}} {
		if err := p[0].Connect(ctx, map[int]PeerInfo{p[1].Rank(): p[1].Ref()}); err != nil {
			b.Fatal(err)
		}
	}
	return tr0, func(cmd string, n, size int) {
		go func() {
			buf := make([]byte, size)
			h := transport.Header{Kind: transport.KindData, Len: uint64(size)}
			for i := 0; i < n; i++ {
				h.Seq = uint64(i)
				if err := tr1.Recv(ctx, 0, h, buf); err != nil {
					panic(err)
				}
				if cmd == "PING" {
					if err := tr1.Send(ctx, 0, h, buf); err != nil {
						panic(err)
					}
				}
			}
			if cmd == "SINK" {
				if err := tr1.Send(ctx, 0, transport.Header{Kind: transport.KindData}, nil); err != nil {
					panic(err)
				}
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
