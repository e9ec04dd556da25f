package recovery

import (
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/gocoll/gocoll/engine/agree"
)

// BenchmarkCtlWrite is the sender's cost of one control message over
// loopback TCP (JSON, MAC, one write; the reader drains): an agreement
// message carrying ids member ids (the cost per id), the proposal a
// coordinator of n members sends in a shrink by one (the view as the one
// member it leaves out, that member dead: a proposal of the whole view
// was agree/ids=n-1), and the setup table a shrink's exchange sends down
// its tree (packed, packTable; entries of the size of a rank's first
// setup blob). The shrink model's inputs (docs/scale.md) are read off
// these.
func BenchmarkCtlWrite(b *testing.B) {
	ln := drain(b)
	dial := func(b *testing.B) *Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return &Conn{Conn: c, key: make([]byte, 32), dialled: true}
	}
	for _, ids := range []int{0, 1024, 16384} {
		b.Run(fmt.Sprintf("agree/ids=%d", ids), func(b *testing.B) {
			cc := dial(b)
			view := make([]int, ids)
			for i := range view {
				view[i] = i
			}
			m := Msg{Inst: 7, Agree: &agree.Msg{Kind: agree.Propose, Ballot: 3, Base: agree.BaseOf(view), Set: view}}
			for range b.N {
				if err := cc.WriteMsg(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, n := range []int{64, 1024, 16384} {
		b.Run(fmt.Sprintf("agree/propose/n=%d", n), func(b *testing.B) {
			cc := dial(b)
			gone := []int{n - 1}
			m := Msg{Inst: 7, Agree: &agree.Msg{Kind: agree.Propose, Ballot: 1<<32 | 3, Base: agree.BaseOf(ranks(n)), Set: gone, Dead: gone}}
			for range b.N {
				if err := cc.WriteMsg(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, n := range []int{256, 1024} {
		b.Run(fmt.Sprintf("table/n=%d", n), func(b *testing.B) {
			cc := dial(b)
			table := make([][]byte, n)
			for i := range table {
				table[i] = make([]byte, 177)
			}
			b.SetBytes(int64(n * 177))
			packed := packTable(table)
			for range b.N {
				if err := cc.WriteMsg(Msg{Inst: 7, Round: 1, Table: packed}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// drain is a loopback listener, closed when b ends, that reads and drops
// whatever its connections carry: the far end of a benchmarked writer.
func drain(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return ln
}
