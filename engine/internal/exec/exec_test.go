package exec

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// memLink is a Link over the in-memory transport, with no communicator:
// what the executor needs, and nothing else.
type memLink struct {
	ep     *mem.Endpoint
	ctx    context.Context
	cancel context.CancelFunc
	pool   *Pool
	bufs   [4][]byte
}

func newLinks(t *testing.T, w *mem.World, n int) []*memLink {
	links := make([]*memLink, n)
	for r := range links {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		links[r] = &memLink{ep: w.Endpoint(r), ctx: ctx, cancel: cancel, pool: &Pool{}}
	}
	return links
}

func (l *memLink) hdr(step, n int) transport.Header {
	return transport.Header{Kind: transport.KindData, Seq: 1, Step: uint32(step), Len: uint64(n)}
}
func (l *memLink) Rank() int { return l.ep.Rank() }
func (l *memLink) Size() int { return l.ep.Size() }
func (l *memLink) Send(peer, step int, data []byte) error {
	return l.ep.Send(l.ctx, peer, l.hdr(step, len(data)), data)
}
func (l *memLink) Recv(peer, step int, buf []byte) error {
	return l.ep.Recv(l.ctx, peer, l.hdr(step, len(buf)), buf)
}
func (l *memLink) RecvVar(peer int) (transport.Header, []byte, error) {
	return l.ep.RecvVar(l.ctx, peer, l.hdr(0, 0), func(n int) ([]byte, error) { return l.pool.Get(n), nil })
}
func (l *memLink) CheckStep(peer, step int, h transport.Header) error {
	return transport.Check(peer, l.hdr(step, int(h.Len)), h)
}
func (l *memLink) PeerError(peer int, err error) error { return fmt.Errorf("rank %d: %w", peer, err) }
func (l *memLink) Stop()                               { l.cancel() }
func (l *memLink) Locked() bool                        { return false }
func (l *memLink) Pool() *Pool                         { return l.pool }
func (l *memLink) Buf(i, n int) []byte {
	if cap(l.bufs[i]) < n {
		l.bufs[i] = make([]byte, n)
	}
	return l.bufs[i][:n]
}

// each runs f on every rank at once.
func each(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// TestRunAllReduce runs the ring and halving–doubling allreduce schedules
// on 2 to 5 goroutine ranks: every rank ends with the sum (small
// integers, exact in any order).
func TestRunAllReduce(t *testing.T) {
	for _, build := range []func(sched.Params) (*sched.Schedule, error){sched.RingAllReduce, sched.HDAllReduce} {
		for n := 2; n <= 5; n++ {
			const count = 1001
			p := sched.Params{Coll: sched.AllReduce, N: n, ElemSize: 4, Count: count}
			s, err := build(p)
			if err != nil {
				t.Fatal(err)
			}
			links := newLinks(t, mem.NewWorld(n), n)
			want := make([]byte, 4*count)
			in := make([][]byte, n)
			for r := range in {
				in[r] = make([]byte, 4*count)
				for i := range count {
					binary.LittleEndian.PutUint32(in[r][4*i:], math.Float32bits(float32((r+i)%7)))
				}
				kernel.Reduce(want, in[r], kernel.Float32, kernel.Sum)
			}
			errs := each(n, func(r int) error {
				var bufs [sched.NumBufs][]byte
				bufs[sched.Work] = bytes.Clone(in[r])
				if err := Run(links[r], s, s.Ops(r), bufs, kernel.Float32, kernel.Sum, nil); err != nil {
					return err
				}
				if !bytes.Equal(bufs[sched.Work], want) {
					return fmt.Errorf("%s: rank %d: not the sum", s.Algo, r)
				}
				return nil
			})
			for _, err := range errs {
				if err != nil {
					t.Errorf("%d ranks: %v", n, err)
				}
			}
		}
	}
}

// TestRunFailureStops: a send that fails ends the operation on its rank
// with that error, and the rank's other transport calls stop at once
// (Stop) instead of waiting for a peer that never sends.
func TestRunFailureStops(t *testing.T) {
	w := mem.NewWorld(3)
	boom := errors.New("link cut")
	w.Hook = func(from, to int, h transport.Header) error {
		if from == 0 && to == 1 {
			return boom
		}
		return nil
	}
	links := newLinks(t, w, 3)
	s := sched.New(sched.Barrier, "cut", 3, 1, func(r int, yield func(sched.Op) bool) {
		if r == 0 {
			yield(sched.Op{Kind: sched.Recv, Peer: 2, Dst: sched.Range{Buf: sched.Work, Off: 0, Len: 1}})
			yield(sched.Op{Kind: sched.Send, Peer: 1, Src: sched.Range{Buf: sched.Work, Off: 1, Len: 1}})
		}
	})
	s.WorkLen = 2
	var bufs [sched.NumBufs][]byte
	bufs[sched.Work] = make([]byte, 2)
	done := make(chan error, 1)
	go func() { done <- Run(links[0], s, s.Ops(0), bufs, NoType, 0, nil) }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("got %v, want the link's error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a failed send left the operation waiting on another peer")
	}
}

// TestRunBlocksAllToAllv runs the aggregated all-to-allv in block mode on
// 4 and 5 goroutine ranks: blocks of different sizes (some empty), which
// the repacking ranks learn only from the messages; every rank ends with
// each peer's block for it.
func TestRunBlocksAllToAllv(t *testing.T) {
	for _, n := range []int{4, 5} {
		s, err := sched.AggregateAllToAllv(sched.Params{Coll: sched.AllToAllv, N: n, ElemSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		size := func(from, to int) int { return (from*7 + to*3) % 5 * 17 } // 0 on the diagonal of some
		payload := func(from, to, i int) byte { return byte(from*31 + to*7 + i) }
		links := newLinks(t, mem.NewWorld(n), n)
		errs := each(n, func(r int) error {
			lay := &Layout{In: make([]Span, n), Work: make([]Span, n)}
			for j := range n {
				lay.In[j] = Span{Off: len(lay.Send), N: size(r, j), Runs: 1}
				for i := range size(r, j) {
					lay.Send = append(lay.Send, payload(r, j, i))
				}
			}
			recvLen := 0
			for j := range n {
				lay.Work[j] = Span{Off: recvLen, N: size(j, r), Runs: 1}
				recvLen += size(j, r)
			}
			lay.Recv = make([]byte, recvLen)
			if err := RunBlocks(links[r], s, s.Ops(r), lay); err != nil {
				return err
			}
			for j := range n {
				got := lay.Recv[lay.Work[j].Off:][:size(j, r)]
				for i, b := range got {
					if b != payload(j, r, i) {
						return fmt.Errorf("rank %d: byte %d of rank %d's block is %d, want %d", r, i, j, b, payload(j, r, i))
					}
				}
			}
			return nil
		})
		for _, err := range errs {
			if err != nil {
				t.Errorf("%d ranks: %v", n, err)
			}
		}
	}
}
