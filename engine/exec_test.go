package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
		return c.run(c.newReq(sched.Barrier, &algorithm{name: "program"}, Uint8, len(bufs[sched.Work]), func(x *execCtx) error {
			x.sig = 42
			return x.runSchedule(s, ops, bufs, Uint8, Sum)
		}))
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
