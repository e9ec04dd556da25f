//go:build linux

package shmcoll

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport"
)

func allReduce(ctx context.Context, a *Arena, seq uint64, n int) error {
	buf := make([]byte, n)
	return a.AllReduce(ctx, Call{Seq: seq, Sig: 42}, buf, buf, kernel.Int8, kernel.Sum)
}

// TestMismatch: calls that differ in what only a collective has (op,
// collective, barrier); sequence, signature and length are the kit's.
func TestMismatch(t *testing.T) {
	type variant struct {
		name string
		call func(ctx context.Context, a *Arena) error // what rank 2 does; the others allreduce 256 bytes, #1, sig 42
	}
	buf := func() []byte { return make([]byte, 256) }
	for _, v := range []variant{
		{"op", func(ctx context.Context, a *Arena) error {
			b := buf()
			return a.AllReduce(ctx, Call{Seq: 1, Sig: 42}, b, b, kernel.Int8, kernel.Max)
		}},
		{"collective", func(ctx context.Context, a *Arena) error {
			return a.Broadcast(ctx, Call{Seq: 1, Sig: 42}, buf(), 0)
		}},
		{"barrier", func(ctx context.Context, a *Arena) error {
			return a.Barrier(ctx, Call{Seq: 1, Sig: 42})
		}},
	} {
		t.Run(v.name, func(t *testing.T) {
			w := newWorld(t, 3, testSlot)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errs := w.run(func(r int, a *Arena) error {
				if r == 2 {
					return v.call(ctx, a)
				}
				return allReduce(ctx, a, 1, 256)
			})
			for r, err := range errs {
				if !errors.Is(err, transport.ErrMismatch) {
					t.Errorf("rank %d: err = %v, want ErrMismatch", r, err)
				}
			}
			t.Log(errs[0])
		})
	}
}

func TestCloseAfterLastCall(t *testing.T) {
	for range 20 {
		w := newWorld(t, 3, testSlot)
		errs := w.run(func(r int, a *Arena) error {
			err := allReduce(context.Background(), a, 1, 1<<20)
			if r == 0 {
				a.Close()
			}
			return err
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
}

func TestConnectVerifies(t *testing.T) {
	tag := newTag()
	mk := func(rank, size, slot int, tag [8]byte) *Arena {
		a, err := Create(Config{Rank: rank, Size: size, Tag: tag, SlotBytes: slot})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	a0 := mk(0, 2, testSlot, tag)
	a1 := mk(1, 2, testSlot, tag)
	other := mk(1, 2, testSlot, newTag())
	tag3 := newTag()
	size3 := mk(1, 3, testSlot, tag3)
	conn3 := mk(0, 2, testSlot, tag3)
	with := func(r PeerInfo, f func(*PeerInfo)) PeerInfo { f(&r); return r }
	for _, tc := range []struct {
		name  string
		peers map[int]PeerInfo
		want  string
	}{
		{"missing peer", map[int]PeerInfo{}, "no segment for rank 1"},
		{"no file", map[int]PeerInfo{1: with(a1.Ref(), func(r *PeerInfo) { r.Fd = 1 << 20 })}, "peer connection lost"},
		{"other tag", map[int]PeerInfo{1: other.Ref()}, "tag"},
		{"wrong rank", map[int]PeerInfo{1: a0.Ref()}, "created by rank 0"},
		{"recycled descriptor", map[int]PeerInfo{1: with(a1.Ref(), func(r *PeerInfo) { r.Ino++ })}, "not the file"},
		{"rank out of range", map[int]PeerInfo{1: a1.Ref(), 5: {}}, "out of range"},
	} {
		err := a0.Connect(context.Background(), tc.peers)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
	if err := conn3.Connect(context.Background(), map[int]PeerInfo{1: size3.Ref()}); err == nil || !strings.Contains(err.Error(), "size 3") {
		t.Errorf("other size: err = %v", err)
	}
	if err := a0.Connect(context.Background(), map[int]PeerInfo{0: a0.Ref(), 1: a1.Ref()}); err != nil {
		t.Fatal(err)
	}
	if err := a0.Connect(context.Background(), map[int]PeerInfo{1: a1.Ref()}); !errors.Is(err, ErrInvalid) {
		t.Errorf("second Connect: err = %v", err)
	}
	c1 := mk(1, 2, 2*testSlot, newTag())
	c0 := mk(0, 2, testSlot, c1.tag)
	if err := c0.Connect(context.Background(), map[int]PeerInfo{1: c1.Ref()}); err == nil || !strings.Contains(err.Error(), "slot size") {
		t.Errorf("slot size mismatch: err = %v", err)
	}
}

func TestConfig(t *testing.T) {
	for _, cfg := range []Config{{Rank: 0, Size: 0}, {Rank: 2, Size: 2}, {Rank: -1, Size: 2}, {Size: MaxRanks + 1}, {Size: 1, SlotBytes: -1}, {Size: 1, SlotBytes: MaxSlotBytes + 1}} {
		if a, err := Create(cfg); !errors.Is(err, ErrInvalid) {
			if a != nil {
				a.Close()
			}
			t.Errorf("Create(%+v): err = %v", cfg, err)
		}
	}
	for _, tc := range []struct{ size, slot, want int }{{1, 0, DefaultSlotBytes}, {2, 1, MinSlotBytes}, {2, 5000, 8192}, {200, 4096, 4096 * 4}} {
		a, err := Create(Config{Size: tc.size, SlotBytes: tc.slot, Tag: newTag()})
		if err != nil {
			t.Fatal(err)
		}
		if a.SlotBytes() != tc.want {
			t.Errorf("size %d, SlotBytes %d: got %d, want %d", tc.size, tc.slot, a.SlotBytes(), tc.want)
		}
		a.Close()
	}
}

func TestInvalidArguments(t *testing.T) {
	w := newWorld(t, 2, testSlot)
	a := w.arenas[0]
	ctx := context.Background()
	c := Call{Seq: 1}
	b := make([]byte, 64)
	for name, err := range map[string]error{
		"allreduce lengths":      a.AllReduce(ctx, c, b[:8], b[8:12], kernel.Float32, kernel.Sum),
		"allreduce partial":      a.AllReduce(ctx, c, b[:16], b[8:24], kernel.Float32, kernel.Sum),
		"allreduce odd length":   a.AllReduce(ctx, c, b[:6], b[8:14], kernel.Float32, kernel.Sum),
		"allreduce type":         a.AllReduce(ctx, c, b[:8], b[8:16], kernel.DataType(99), kernel.Sum),
		"allreduce op":           a.AllReduce(ctx, c, b[:8], b[8:16], kernel.Float32, kernel.RedOp(9)),
		"allreduce band float":   a.AllReduce(ctx, c, b[:8], b[8:16], kernel.Float32, kernel.Band),
		"allreduce avg bool":     a.AllReduce(ctx, c, b[:8], b[8:16], kernel.Bool, kernel.Avg),
		"reducescatter bxor f16": a.ReduceScatter(ctx, c, b[:16], b[16:24], kernel.Float16, kernel.Bxor),
		"reduce root":            a.Reduce(ctx, c, b[:8], b[8:16], kernel.Float32, kernel.Sum, 2),
		"broadcast root":         a.Broadcast(ctx, c, b, -1),
		"allgather length":       a.AllGather(ctx, c, b[:8], b[8:20]),
		"allgather overlap":      a.AllGather(ctx, c, b[8:16], b[:16]),
		"reducescatter length":   a.ReduceScatter(ctx, c, b[:12], b[16:24], kernel.Float32, kernel.Sum),
		"reducescatter overlap":  a.ReduceScatter(ctx, c, b[:16], b[8:16], kernel.Float32, kernel.Sum),
		"alltoall length":        a.AllToAll(ctx, c, b[:9], b[16:25]),
		"alltoall partial":       a.AllToAll(ctx, c, b[:16], b[8:24]),
		"alltoall recv length":   a.AllToAll(ctx, c, b[:16], b[16:24]),
		"reducescatter bad type": a.ReduceScatter(ctx, c, b[:12], b[16:22], kernel.Float32, kernel.Sum),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	// Nothing happened: the world still works.
	errs := w.run(func(r int, a *Arena) error { return allReduce(ctx, a, 1, 64) })
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestConcurrentCallsRejected(t *testing.T) {
	w := newWorld(t, 2, testSlot)
	done := make(chan error, 1)
	go func() { done <- allReduce(context.Background(), w.arenas[0], 1, 64) }()
	proctest.Until(t, time.Minute, "call in progress on rank 0", w.arenas[0].busy.Load)
	if err := allReduce(context.Background(), w.arenas[0], 2, 64); !errors.Is(err, ErrInvalid) {
		t.Errorf("second concurrent call: err = %v", err)
	}
	if err := allReduce(context.Background(), w.arenas[1], 1, 64); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFailureNamesTheFailedRank: rank 2 waits for rank 0 (which never
// arrives) when rank 1 fails: the error must lead with rank 1, not read as
// if rank 0 had failed ("waiting for rank 0: … rank 1").
func TestFailureNamesTheFailedRank(t *testing.T) {
	for _, how := range []string{"closed", "aborted"} {
		t.Run(how, func(t *testing.T) {
			w := newWorld(t, 3, testSlot)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- allReduce(ctx, w.arenas[2], 1, 64) }()
			// Rank 2 sleeps on rank 0's arrival word once it registered as
			// a waiter there.
			waiting := w.arenas[2].segs[0].waiters
			for waiting.Load() == 0 {
				if ctx.Err() != nil {
					t.Fatal("rank 2 never waited for rank 0")
				}
				runtime.Gosched()
			}
			if how == "closed" {
				w.arenas[1].Close()
			} else {
				w.arenas[1].Abort(errors.New("boom"))
			}
			err := <-done
			if err == nil {
				t.Fatal("rank 2 succeeded without ranks 0 and 1")
			}
			want := "shmcoll: rank 2: allreduce #1: rank 1 failed while this rank waited for rank 0: "
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("rank 2's error %q does not start with %q", err, want)
			}
			var ple *transport.PeerLostError
			var rae *transport.RemoteAbortError
			if !(errors.As(err, &ple) && ple.Peer == 1) && !(errors.As(err, &rae) && rae.Peer == 1) {
				t.Errorf("rank 2's error does not wrap rank 1's failure: %v", err)
			}
		})
	}
}
