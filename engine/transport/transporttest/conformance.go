package transporttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// RunConformance checks what every transport must do when nothing fails:
// every pair of a mesh exchanging messages of many sizes (0 and odd ones
// included) both ways at once, in order per pair; header mismatches
// reported as transport.ErrMismatch; bad arguments refused; a context's
// deadline and cancellation honoured while a call waits.
func RunConformance(t *testing.T, mk Maker) {
	t.Run("Exchange", func(t *testing.T) {
		for n := 1; n <= 5; n++ {
			t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) { testExchange(t, mk, n) })
		}
	})
	t.Run("Order", func(t *testing.T) { testOrder(t, mk) })
	t.Run("Mismatch", func(t *testing.T) { testMismatch(t, mk) })
	t.Run("BadArguments", func(t *testing.T) { testBadArguments(t, mk) })
	t.Run("Context", func(t *testing.T) { testContext(t, mk) })
	t.Run("RecvVar", func(t *testing.T) { testRecvVar(t, mk) })
}

// testRecvVar: a transport that is a transport.VarReceiver takes messages
// whose step and length only their headers say, in the order sent and
// across its buffers' wrap-around; a different sequence is still a
// mismatch, and a length the caller's allocator refuses fails the call
// (and the stream, where a mismatch breaks it).
func testRecvVar(t *testing.T, mk Maker) {
	ts := NewMesh(t, mk, 2, nil)
	if _, ok := ts[0].(transport.VarReceiver); !ok {
		t.Skip("not a transport.VarReceiver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	alloc := func(k int) ([]byte, error) { return make([]byte, k), nil }
	sz := append([]int{0, 5}, sizes(mk.Caps())...)
	go func() {
		for i, n := range sz {
			h := Hdr(1, n)
			h.Step = uint32(10 + i)
			if err := ts[0].Send(ctx, 1, h, Payload(0, 1, i, n)); err != nil {
				t.Errorf("send %d: %v", i, err)
				return
			}
		}
	}()
	v1 := ts[1].(transport.VarReceiver)
	for i, n := range sz {
		got, buf, err := v1.RecvVar(ctx, 0, Hdr(1, 0), alloc)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if got.Step != uint32(10+i) || got.Len != uint64(n) || string(buf) != string(Payload(0, 1, i, n)) {
			t.Fatalf("message %d: step %d, %d bytes; want step %d, %d bytes", i, got.Step, len(buf), 10+i, n)
		}
	}
	if err := ts[0].Send(ctx, 1, Hdr(2, 4), make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v1.RecvVar(ctx, 0, Hdr(3, 0), alloc); !errors.Is(err, transport.ErrMismatch) || !strings.Contains(err.Error(), "sequence") {
		t.Fatalf("got %v, want a sequence mismatch", err)
	}
	refused := errors.New("too long")
	if err := ts[1].Send(ctx, 0, Hdr(4, 8), make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	v0 := ts[0].(transport.VarReceiver)
	if _, _, err := v0.RecvVar(ctx, 1, Hdr(4, 0), func(int) ([]byte, error) { return nil, refused }); !errors.Is(err, refused) {
		t.Fatalf("got %v, want the allocator's error", err)
	}
	if mk.Caps().StreamBreaksOnMismatch {
		if err := ts[0].Recv(ctx, 1, Hdr(4, 8), make([]byte, 8)); !errors.Is(err, refused) {
			t.Fatalf("after a refused message: %v, want the same error", err)
		}
	}
}

func testExchange(t *testing.T, mk Maker, n int) {
	ts := NewMesh(t, mk, n, nil)
	// Megabytes between every pair: slow under the race detector.
	ctx, cancel := context.WithTimeout(context.Background(), 4*Hang)
	defer cancel()
	for r, tr := range ts {
		if tr.Rank() != r || tr.Size() != n {
			t.Fatalf("rank %d: Rank()=%d Size()=%d", r, tr.Rank(), tr.Size())
		}
	}
	// Twice, so that the second round starts where the first left the
	// buffers (wrapped rings).
	sz := sizes(mk.Caps())
	if err := exchangeAll(ctx, ts, sz, 0); err != nil {
		t.Fatal(err)
	}
	if err := exchangeAll(ctx, ts, sz, len(sz)); err != nil {
		t.Fatal(err)
	}
}

// testOrder: many small messages, more than any transport buffers, between
// every pair of three ranks at once arrive in order.
func testOrder(t *testing.T, mk Maker) {
	const n, msgs = 3, 300
	ts := NewMesh(t, mk, n, nil)
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	sz := make([]int, msgs)
	for k := range sz {
		sz[k] = k % 13 * 5
	}
	if err := exchangeAll(ctx, ts, sz, 0); err != nil {
		t.Fatal(err)
	}
}

func testMismatch(t *testing.T, mk Maker) {
	base := Hdr(5, 4)
	for _, tc := range []struct {
		name string
		edit func(h *transport.Header)
		says string
	}{
		{"seq", func(h *transport.Header) { h.Seq++ }, "sequence"},
		{"sig", func(h *transport.Header) { h.Sig++ }, "signature"},
		{"len", func(h *transport.Header) { h.Len++ }, "length"},
		{"step", func(h *transport.Header) { h.Step++ }, "step"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := NewMesh(t, mk, 2, nil)
			ctx, cancel := context.WithTimeout(context.Background(), Hang)
			defer cancel()
			sent := base
			tc.edit(&sent)
			if err := ts[0].Send(ctx, 1, sent, make([]byte, sent.Len)); err != nil {
				t.Fatal(err)
			}
			err := ts[1].Recv(ctx, 0, base, make([]byte, base.Len))
			if !errors.Is(err, transport.ErrMismatch) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want ErrMismatch about the %s", err, tc.says)
			}
			if mk.Caps().StreamBreaksOnMismatch {
				if err := ts[1].Recv(ctx, 0, base, make([]byte, base.Len)); !errors.Is(err, transport.ErrMismatch) {
					t.Errorf("second Recv from the out-of-step stream: %v", err)
				}
			}
		})
	}
}

// testBadArguments: calls a caller got wrong fail with an error, send
// nothing, and leave the mesh working.
func testBadArguments(t *testing.T, mk Maker) {
	ts := NewMesh(t, mk, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	tr := ts[0]
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"send with a header longer than the data", tr.Send(ctx, 1, Hdr(0, 8), make([]byte, 4))},
		{"send with a header shorter than the data", tr.Send(ctx, 1, Hdr(0, 2), make([]byte, 4))},
		{"send to itself", tr.Send(ctx, 0, Hdr(0, 1), []byte{1})},
		{"send to rank -1", tr.Send(ctx, -1, Hdr(0, 1), []byte{1})},
		{"send to a rank past the end", tr.Send(ctx, 2, Hdr(0, 1), []byte{1})},
		{"recv from itself", tr.Recv(ctx, 0, Hdr(0, 1), make([]byte, 1))},
		{"recv from rank -1", tr.Recv(ctx, -1, Hdr(0, 1), make([]byte, 1))},
		{"recv from a rank past the end", tr.Recv(ctx, 7, Hdr(0, 1), make([]byte, 1))},
		{"recv into a buffer shorter than the header says", tr.Recv(ctx, 1, Hdr(0, 8), make([]byte, 4))},
	} {
		if tc.err == nil {
			t.Errorf("%s: succeeded", tc.name)
		}
	}
	// Nothing was sent or consumed: the next messages are the first.
	if err := exchangeAll(ctx, ts, []int{3}, 0); err != nil {
		t.Fatalf("after the bad calls: %v", err)
	}
}

// testContext: a call waiting on a peer returns ctx's error when ctx
// ends; a Recv that consumed nothing leaves the stream usable.
func testContext(t *testing.T, mk Maker) {
	for _, send := range sendRecv {
		for _, how := range []string{"deadline", "cancel"} {
			t.Run(opName(send)+"/"+how, func(t *testing.T) {
				ts := NewMesh(t, mk, 2, nil)
				var ctx context.Context
				var cancel context.CancelFunc
				want := context.Canceled
				if how == "deadline" {
					// The deadline is what is tested: the call is pending
					// when it expires, however long it takes to start.
					ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
					want = context.DeadlineExceeded
				} else {
					ctx, cancel = context.WithCancel(context.Background())
				}
				defer cancel()
				blk := mk.Caps().Block
				c := goCall(func() error {
					if send {
						return sendBlock(ctx, ts[0], 1, blk)
					}
					return ts[0].Recv(ctx, 1, Hdr(0, 4), make([]byte, 4))
				})
				if how == "cancel" {
					blockedOn(t, mk, c, ts[0], 1, send)
					cancel()
				}
				if err := Within(t, c.res, "the waiting call"); !errors.Is(err, want) {
					t.Fatalf("got %v, want %v", err, want)
				}
				if err := ts[0].Recv(ctx, 1, Hdr(0, 4), make([]byte, 4)); !errors.Is(err, want) {
					t.Errorf("Recv with the ended context: got %v, want %v", err, want)
				}
				bg, cancel2 := context.WithTimeout(context.Background(), Hang)
				defer cancel2()
				if !send {
					// Nothing was read: the stream still works.
					if err := exchangeAll(bg, ts, []int{4}, 0); err != nil {
						t.Fatalf("after the ended call: %v", err)
					}
					return
				}
				// Either the cut Send put part of its message on the way, and
				// later Sends fail with its error, or it put nothing: the
				// receiver gets the messages sent before it, then the next.
				next := uint64(max(blk.Msgs, 1))
				rctx, rcancel := context.WithCancel(bg)
				defer rcancel()
				got := goCall(func() error {
					buf := make([]byte, blk.Bytes)
					for k := range next - 1 {
						if err := ts[1].Recv(rctx, 0, Hdr(k, blk.Bytes), buf); err != nil {
							return fmt.Errorf("message %d, sent before the cut Send: %w", k, err)
						}
					}
					b := make([]byte, 4)
					if err := ts[1].Recv(rctx, 0, Hdr(next, 4), b); err != nil || string(b) != "next" {
						return fmt.Errorf("the message after the cut Send: %v %q", err, b)
					}
					return nil
				})
				err := ts[0].Send(bg, 1, Hdr(next, 4), []byte("next"))
				if err != nil {
					if !mk.Caps().PartialSends || !errors.Is(err, want) {
						t.Fatalf("Send after a Send cut short: %v", err)
					}
					rcancel()
					return
				}
				if err := Within(t, got.res, "the receiver"); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
