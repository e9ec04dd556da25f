package recovery

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// wireNet is the exchange root's end of a control mesh whose every Send
// is written at once, as the mesh's writer would, on one loopback
// connection (a reader drains it), counting the bytes; Next gives what
// the benchmark queued. The root's time and bytes for an exchange are
// then what its sends cost on the wire.
type wireNet struct {
	q     *queue
	c     *Conn
	bytes atomic.Int64
	sends atomic.Int64
}

func (w *wireNet) Send(to int, m Msg) {
	if err := w.c.WriteMsg(m); err != nil {
		panic(err)
	}
	w.sends.Add(1)
}
func (w *wireNet) Next(ctx context.Context) (Event, error) { return w.q.next(ctx) }
func (w *wireNet) Close()                                  {}
func (w *wireNet) Crash()                                  {}

// countConn counts the bytes written through it.
type countConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countConn) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return c.Conn.Write(p)
}

// BenchmarkExchangeRoot is the root's part of one shrink setup exchange
// round among n members over loopback TCP: every other member's blob
// (of the size of a rank's first setup entry) already queued, the root
// gathers them and sends the table on (JSON, MAC, write), as
// Recoverer.Exchange does. rootB/op is the bytes the root wrote.
func BenchmarkExchangeRoot(b *testing.B) {
	ln := drain(b)
	for _, n := range []int{256, 1024} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			w := &wireNet{q: newQueue()}
			w.c = &Conn{Conn: countConn{c, &w.bytes}, key: make([]byte, 32), dialled: true}
			s := New(Config{Rank: 0, Size: n, Timeout: time.Minute, Net: w})
			defer s.Release()
			view := make([]int, n)
			for i := range view {
				view[i] = i
			}
			blob := make([]byte, 177)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				inst := uint64(i)
				for p := 1; p < n; p++ {
					w.q.push(Event{from: p, msg: Msg{Inst: inst, Round: 1, Blob: blob}})
				}
				b.StartTimer()
				if _, err := s.Exchange(inst, view)(context.Background(), blob); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				s.Forget(inst)
				b.StartTimer()
			}
			b.ReportMetric(float64(w.bytes.Load())/float64(b.N), "rootB/op")
			b.ReportMetric(float64(w.sends.Load())/float64(b.N), "sends/op")
		})
	}
}

// frameConn is a connection whose reads replay one recorded stream and
// whose writes record.
type frameConn struct {
	net.Conn
	r bytes.Reader
	w bytes.Buffer
}

func (c *frameConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *frameConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// BenchmarkTableRead is what a member of the shrink's exchange tree
// spends on the table before it can forward it: read one frame (MAC,
// JSON with base64), and check and split it (unpackTable). Entries of
// the size of a rank's first setup blob.
func BenchmarkTableRead(b *testing.B) {
	for _, n := range []int{256, 1024} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			table := make([][]byte, n)
			for i := range table {
				table[i] = make([]byte, 177)
			}
			key := make([]byte, 32)
			fc := &frameConn{}
			w := &Conn{Conn: fc, key: key, dialled: true}
			if err := w.WriteMsg(Msg{Inst: 7, Round: 1, Table: packTable(table)}); err != nil {
				b.Fatal(err)
			}
			frame := fc.w.Bytes()
			b.SetBytes(int64(n * 177))
			for range b.N {
				fc.r.Reset(frame)
				r := &Conn{Conn: fc, key: key}
				m, err := r.ReadMsg()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := unpackTable(m.Table, n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
