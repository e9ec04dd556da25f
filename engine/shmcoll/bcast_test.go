//go:build linux

package shmcoll

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport"
)

// bcast runs a Broadcast of n bytes from root: the root's buffer holds
// byte(seq+i), the others' garbage; it checks what every rank ends with.
func bcast(ctx context.Context, a *Arena, seq uint64, n, root int) error {
	buf := garbage(n)
	if a.Rank() == root {
		for i := range buf {
			buf[i] = byte(seq + uint64(i))
		}
	}
	if err := a.Broadcast(ctx, Call{Seq: seq, Sig: 7}, buf, root); err != nil {
		return err
	}
	for i, b := range buf {
		if b != byte(seq+uint64(i)) {
			return fmt.Errorf("rank %d: broadcast #%d: byte %d is %d, want %d", a.Rank(), seq, i, b, byte(seq+uint64(i)))
		}
	}
	return nil
}

// startedWorld is a world of n ranks past a first call (Barrier #1), which
// is a full barrier whatever the collective (it decides cross-memory
// reads), and a context for the test's calls.
func startedWorld(t *testing.T, n int) (*world, context.Context) {
	w := newWorld(t, n, testSlot)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	for _, err := range w.run(func(r int, a *Arena) error { return a.Barrier(ctx, Call{Seq: 1}) }) {
		if err != nil {
			t.Fatal(err)
		}
	}
	return w, ctx
}

// TestBroadcastRootDoesNotWait: a broadcast that fits a slot returns on its
// root before any other rank called it (it waits for nobody), the root may
// close at once, and the others still get the data; the root's next call
// waits for them.
func TestBroadcastRootDoesNotWait(t *testing.T) {
	const n, root = 4, 1
	w, ctx := startedWorld(t, n)
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	if err := bcast(short, w.arenas[root], 2, testSlot, root); err != nil {
		t.Fatalf("root, alone: %v", err)
	}
	// The root's next call needs every rank to have finished #2.
	next := make(chan error, 1)
	go func() { next <- bcast(ctx, w.arenas[root], 3, 100, root) }()
	select {
	case err := <-next:
		t.Fatalf("root's second broadcast returned before the others ran the first: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	errs := w.run(func(r int, a *Arena) error {
		if r == root {
			return nil
		}
		if err := bcast(ctx, a, 2, testSlot, root); err != nil {
			return err
		}
		return bcast(ctx, a, 3, 100, root)
	})
	if err := <-next; err != nil {
		errs[root] = err
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(errorsText(errs))
		}
	}
	// Root returns and closes; the others come later and still get the
	// data (also after a wait: rank 2 is late). A non-root returns only
	// once every rank arrived (TestBroadcastDisagreeingRoots), then one
	// of them closes too.
	const gone = 3
	if err := bcast(short, w.arenas[root], 4, 1000, root); err != nil {
		t.Fatal(err)
	}
	w.arenas[root].Close()
	errs = w.run(func(r int, a *Arena) error {
		switch r {
		case root:
			return nil
		case 2:
			time.Sleep(50 * time.Millisecond)
		}
		return bcast(ctx, a, 4, 1000, root)
	})
	w.arenas[gone].Close()
	for _, err := range errs {
		if err != nil {
			t.Fatal(errorsText(errs))
		}
	}
	// Their next call needs the ranks that left.
	errs = w.run(func(r int, a *Arena) error {
		if r == root || r == gone {
			return nil
		}
		return bcast(ctx, a, 5, 1000, 0)
	})
	for r, err := range errs {
		var ple *transport.PeerLostError
		if r != root && r != gone && (!errors.As(err, &ple) || (ple.Peer != root && ple.Peer != gone)) {
			t.Errorf("rank %d after ranks %d and %d closed: err = %v, want PeerLostError for one of them", r, root, gone, err)
		}
	}
}

// TestBroadcastRootMismatch: a root that broadcasts while the others call
// something else returns, and learns of the mismatch at its next call; the
// others fail at once.
func TestBroadcastRootMismatch(t *testing.T) {
	const n = 3
	w, ctx := startedWorld(t, n)
	errs := w.run(func(r int, a *Arena) error {
		if r == 0 {
			if err := bcast(ctx, a, 2, 256, 0); err != nil {
				return fmt.Errorf("the broadcast itself: %w", err)
			}
			return a.Barrier(ctx, Call{Seq: 3})
		}
		return allReduce(ctx, a, 2, 256)
	})
	for r, err := range errs {
		if !errors.Is(err, transport.ErrMismatch) {
			t.Errorf("rank %d: err = %v, want ErrMismatch", r, err)
		}
	}
}

// TestBroadcastLagStress: random mixes of broadcasts from varying roots
// (one and several pieces, so roots run ahead and settle) with the other
// collectives, every rank pausing at random, on more ranks than cores;
// every result is checked.
func TestBroadcastLagStress(t *testing.T) {
	const n = 5
	calls := 2000
	if raceEnabled || testing.Short() {
		calls = 300
	}
	w := newWorld(t, n, testSlot)
	rng := rand.New(rand.NewPCG(1, 2))
	var cases []tcase
	for range calls {
		c := tcase{kind: "broadcast", dt: kernel.Float32, count: 1 + rng.IntN(3*testSlot/4), root: rng.IntN(n), inPlace: true}
		switch rng.IntN(6) {
		case 0:
			c.kind = "allreduce"
		case 1:
			c.kind = []string{"reduce", "allgather", "alltoall", "reducescatter"}[rng.IntN(4)]
		}
		if c.kind != "broadcast" {
			c.count = 1 + rng.IntN(2*testSlot/n/4)
			c.inPlace = rng.IntN(2) == 0
		}
		cases = append(cases, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := w.run(func(r int, a *Arena) error {
		jitter := rand.New(rand.NewPCG(uint64(r), 3))
		for i, c := range cases {
			if jitter.IntN(4) == 0 {
				time.Sleep(time.Duration(jitter.IntN(300)) * time.Microsecond)
			}
			if _, err := runCase(ctx, a, uint64(i+1), c); err != nil {
				a.Abort(err)
				return fmt.Errorf("call %d (%v): %w", i, c, err)
			}
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(errorsText(errs))
		}
	}
}

// TestBroadcastDisagreeingRoots: rank 0 broadcasts from itself while the
// others broadcast from rank 1. Ranks 2 and 3 would read rank 1's data and
// return with data rank 0 does not have; they must fail in the call, and
// the two self-declared roots at the latest in their next call.
func TestBroadcastDisagreeingRoots(t *testing.T) {
	const n = 4
	for round := 0; round < 20; round++ {
		w, ctx := startedWorld(t, n)
		inCall := make([]error, n)
		errs := w.run(func(r int, a *Arena) error {
			root := 1
			if r == 0 {
				root = 0
			}
			buf := make([]byte, 1024)
			if inCall[r] = a.Broadcast(ctx, Call{Seq: 2, Sig: uint64(100 + root)}, buf, root); inCall[r] != nil {
				return inCall[r]
			}
			return a.Barrier(ctx, Call{Seq: 3, Sig: 7})
		})
		for r, err := range errs {
			if err == nil {
				t.Fatalf("round %d: rank %d saw no error", round, r)
			}
			if r >= 2 && inCall[r] == nil {
				t.Fatalf("round %d: non-root rank %d returned from the broadcast without an error", round, r)
			}
		}
	}
}
