package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// runProgram runs a hand-written schedule on every rank of comms, rank r
// with work[r] as its Work buffer, as a collective (so it gets a sequence
// number, a deadline and failure handling like any other).
func runProgram(comms []*Comm, s *sched.Schedule, work [][]byte) []error {
	return runRanks(comms, func(c *Comm) error {
		ops := s.Ops(c.Rank())
		var bufs [sched.NumBufs][]byte
		bufs[sched.Work] = work[c.Rank()]
		r := Request{op: "barrier", algo: "program", dt: Uint8, hasType: true, bytes: len(bufs[sched.Work]), peer: -1, run: func(x *execCtx) error {
			x.sig = 42
			return exec.Run(x, s, ops, bufs, Uint8, Sum, nil)
		}}
		return c.run(&r, nil)
	})
}

func rng(off, n int) sched.Range { return sched.Range{Buf: sched.Work, Off: off, Len: n} }

// A receive followed by a send of the same bytes forwards what was
// received (read after write); a send followed by a receive into the same
// bytes sends the old contents (write after read).
func TestExecHazards(t *testing.T) {
	s := sched.New(sched.Barrier, "hazards", 3, 1, func(r int, yield func(sched.Op) bool) {
		switch r {
		case 0: // sends its own bytes to 1, then receives 2's into the same place
			yield(sched.Op{Kind: sched.Send, Peer: 1, Src: rng(0, 4)})
			yield(sched.Op{Kind: sched.Recv, Peer: 2, Dst: rng(0, 4)})
		case 1: // receives 0's bytes, forwards them to 2
			yield(sched.Op{Kind: sched.Recv, Peer: 0, Dst: rng(0, 4)})
			yield(sched.Op{Kind: sched.Send, Peer: 2, Src: rng(0, 4)})
		case 2:
			yield(sched.Op{Kind: sched.Send, Peer: 0, Src: rng(0, 4)})
			yield(sched.Op{Kind: sched.Recv, Peer: 1, Dst: rng(4, 4)})
		}
	})
	s.WorkLen, s.Rounds = 8, 1
	if err := sched.Validate(s); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 50; round++ {
		comms := newLocal(t, 3, Options{Timeout: time.Minute})
		work := [][]byte{{1, 2, 3, 4, 0, 0, 0, 0}, make([]byte, 8), {9, 9, 9, 9, 0, 0, 0, 0}}
		for r, err := range runProgram(comms, s, work) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		if !bytes.Equal(work[1][:4], []byte{1, 2, 3, 4}) || !bytes.Equal(work[2][4:], []byte{1, 2, 3, 4}) {
			t.Fatalf("round %d: rank 1 got % x, rank 2 got % x; want rank 0's original bytes", round, work[1][:4], work[2][4:])
		}
		if !bytes.Equal(work[0][:4], []byte{9, 9, 9, 9}) {
			t.Fatalf("round %d: rank 0 has % x, want rank 2's bytes", round, work[0][:4])
		}
	}
}

// Segmented sends and receives to one peer stay in order, and a reduction
// with TheirsFirst puts the peer's partial on the left.
func TestExecSegmentsInOrder(t *testing.T) {
	const n = 1000
	s := sched.New(sched.Barrier, "segments", 2, 1, func(r int, yield func(sched.Op) bool) {
		peer := 1 - r
		yield(sched.Op{Kind: sched.Send, Peer: peer, Tag: 10, Segs: 7, Src: rng(0, n)})
		yield(sched.Op{Kind: sched.RecvReduce, Peer: peer, Tag: 10, Segs: 7, Dst: rng(0, n), TheirsFirst: peer < r})
	})
	s.WorkLen, s.Rounds = n, 7
	if err := sched.Validate(s); err != nil {
		t.Fatal(err)
	}
	comms := newLocal(t, 2, Options{Timeout: time.Minute})
	work := [][]byte{make([]byte, n), make([]byte, n)}
	for r := range work {
		for i := range work[r] {
			work[r][i] = byte(i*(r+1) + r)
		}
	}
	want := make([]byte, n)
	for i := range want {
		want[i] = work[0][i] + work[1][i]
	}
	for r, err := range runProgram(comms, s, work) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range work {
		if !bytes.Equal(work[r], want) {
			t.Fatalf("rank %d: %s", r, diffBytes(work[r], want, 1))
		}
	}
}

// The first failure ends the schedule on this rank at once (the other
// transport calls are cancelled, not left to the timeout), and the error is
// that failure, not a cancellation it caused.
func TestExecFailureCancels(t *testing.T) {
	w := mem.NewWorld(3)
	boom := errors.New("link cut")
	w.Hook = func(from, to int, h transport.Header) error {
		if from == 0 && to == 1 {
			return boom
		}
		return nil
	}
	comms := newPlaced(t, w, nil, Options{Timeout: time.Hour})
	// Rank 0 waits for rank 2, which never sends, while its send to 1 fails.
	s := sched.New(sched.Barrier, "cancel", 3, 1, func(r int, yield func(sched.Op) bool) {
		if r == 0 {
			yield(sched.Op{Kind: sched.Recv, Peer: 2, Dst: rng(0, 1)})
			yield(sched.Op{Kind: sched.Send, Peer: 1, Src: rng(1, 1)})
		}
	})
	s.WorkLen = 2
	done := make(chan error, 1)
	go func() {
		done <- runProgram(comms[:1], s, [][]byte{make([]byte, 2)})[0]
	}()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("got %v, want the link's error", err)
		}
		if errors.Is(err, context.Canceled) {
			t.Fatalf("error %v reports the cancellation, not the cause", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a failed send left the schedule waiting on another peer")
	}
}

// Concurrent receives from different peers reduce into disjoint ranges
// with scratch of their own.
func TestExecConcurrentReceives(t *testing.T) {
	const n, block = 5, 4096
	s := sched.New(sched.Barrier, "gather-reduce", n, 1, func(r int, yield func(sched.Op) bool) {
		if r == 0 {
			for p := 1; p < n; p++ {
				yield(sched.Op{Kind: sched.RecvReduce, Peer: p, Segs: 3, Dst: rng(p*block, block)})
			}
			return
		}
		yield(sched.Op{Kind: sched.Send, Peer: 0, Segs: 3, Src: rng(r*block, block)})
	})
	s.WorkLen = n * block
	comms := newLocal(t, n, Options{Timeout: time.Minute})
	work := make([][]byte, n)
	for r := range work {
		work[r] = bytes.Repeat([]byte{byte(r)}, n*block)
	}
	for r, err := range runProgram(comms, s, work) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for p := 1; p < n; p++ {
		if got := work[0][p*block : (p+1)*block]; !bytes.Equal(got, bytes.Repeat([]byte{byte(p)}, block)) {
			t.Fatalf("block %d: %s", p, fmt.Sprint(got[:8]))
		}
	}
}

// sendSpy records where the data of every message a rank sends lies.
type sendSpy struct {
	*mem.Endpoint
	mu   sync.Mutex
	sent [][]byte
}

func (s *sendSpy) Send(ctx context.Context, peer int, h transport.Header, data []byte) error {
	s.mu.Lock()
	s.sent = append(s.sent, data)
	s.mu.Unlock()
	return s.Endpoint.Send(ctx, peer, h, data)
}

// sentFrom says whether any message came straight out of buf.
func (s *sendSpy) sentFrom(buf []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.sent, func(b []byte) bool { return within(b, buf) })
}

func within(b, buf []byte) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return len(b) > 0 && p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(buf))
}

// An out-of-place reduction does not copy the user's send buffer into the
// one it works in before it starts (lazyWork): an exchange algorithm sends
// its first step straight from the send buffer. Every result is still
// right, with the receive buffer full of garbage that nothing may read,
// and the send buffer is left as it was.
func TestOutOfPlaceReductionSendsFromSend(t *testing.T) {
	const n, count = 4, 1 << 14
	for _, algo := range []string{"allreduce=ring,reducescatter=ring,reduce=tree", "allreduce=hd,reducescatter=hd,reduce=hd", "allreduce=rd", "allreduce=dbtree"} {
		t.Run(algo, func(t *testing.T) {
			w := mem.NewWorld(n)
			spies := make([]*sendSpy, n)
			comms := make([]*Comm, n)
			for r := range comms {
				spies[r] = &sendSpy{Endpoint: w.Endpoint(r)}
				c, err := newComm(r, n, spies[r], Options{Algo: algo, Timeout: time.Minute})
				comms[r] = closedAtEnd(t, []*Comm{c}, err)[0]
			}
			inputs := make([][]byte, n)
			for q := range inputs {
				inputs[q] = inputFor(Float32, Sum, q, count*n, 7)
			}
			want := expectReduce(inputs, Float32, Sum)
			garbage := func(m int) []byte { return bytes.Repeat([]byte{0xa5}, m) }
			for _, coll := range []string{"allreduce", "reducescatter", "reduce"} {
				if coll != "allreduce" && !strings.Contains(algo, coll) {
					continue
				}
				for _, s := range spies {
					s.sent = nil
				}
				mustRanks(t, comms, func(c *Comm) error {
					r := c.Rank()
					send := append([]byte(nil), inputs[r]...)
					var got, exp []byte
					var err error
					switch coll {
					case "allreduce":
						got, exp = garbage(len(send)), want
						err = c.AllReduce(send, got, count*n, Float32, Sum)
					case "reducescatter":
						got, exp = garbage(len(send)/n), want[r*len(send)/n:(r+1)*len(send)/n]
						err = c.ReduceScatter(send, got, count, Float32, Sum)
					case "reduce":
						got, exp = garbage(len(send)), want
						if r != 1 {
							exp = got
						}
						err = c.Reduce(send, got, count*n, Float32, Sum, 1)
					}
					if err != nil {
						return err
					}
					if d := diffBytes(got, exp, 4); d != "" {
						return fmt.Errorf("%s: %s", coll, d)
					}
					if !bytes.Equal(send, inputs[r]) {
						return fmt.Errorf("%s: the send buffer changed", coll)
					}
					// (In a tree a rank with children sends what it reduced.)
					exchange := coll != "reduce" && !strings.Contains(algo, "dbtree")
					if exchange && !spies[r].sentFrom(send) {
						return fmt.Errorf("%s: no message was sent from the send buffer", coll)
					}
					return nil
				})
			}
		})
	}
}
