package transporttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// Group is one rank of a collective path: ranks that run collectives
// together without exchanging messages (the shared-memory collectives).
// Its scenarios are the collective ones (RunGroup).
type Group interface {
	Rank() int
	Size() int
	// AllReduce sums buf, int8 elements, in place over every rank. seq
	// numbers the call and sig fingerprints it, as the engine's do: ranks
	// that pass different values, or buffers of different lengths, fail
	// with an error wrapping transport.ErrMismatch.
	AllReduce(ctx context.Context, seq, sig uint64, buf []byte) error
	// Abort fails this rank's pending and later calls with an error
	// wrapping transport.ErrAborted, and every other rank's with a
	// *transport.RemoteAbortError naming this rank.
	Abort(reason error)
	// Close releases the rank; the others' calls then fail with a
	// *transport.PeerLostError naming it.
	Close() error
}

// GroupCaps describes a collective path where paths legitimately differ.
type GroupCaps struct {
	// Sizes are AllReduce sizes worth testing besides the kit's (0, 1,
	// odd ones): where the path changes algorithm or splits the buffer.
	Sizes []int
	// Processes: ranks can run in child processes (the package's TestMain
	// calls MainGroup).
	Processes bool
	// Closed is the error that calls made on, or pending during, a closed
	// rank wrap.
	Closed error
}

// GroupMaker sets up the ranks of a collective path for the kit.
type GroupMaker interface {
	GroupCaps() GroupCaps
	PrepareGroup(cfg Config) (Setup[Group], error)
}

// GroupRoles adds child roles to a GroupMaker's (see Role).
type GroupRoles interface {
	GroupRoles() map[string]Role[Group]
}

// NewGroup makes n connected ranks of gm in this process; they are closed,
// and the job checked for leftovers (Residue), at cleanup.
func NewGroup(t testing.TB, gm GroupMaker, n int) []Group {
	t.Helper()
	gs, _ := startMesh(t, make([]string, n), gm.PrepareGroup, residueOf(gm))
	return gs
}

// StartGroup is StartMesh for a collective path: rank r runs in a child
// process with role roles[r] (idle, abort, close, allreduce: the calls of
// RunGroup's sums, or one of GroupRoles) or in this process where roles[r]
// is "".
func StartGroup(t testing.TB, gm GroupMaker, roles []string) ([]Group, []*Child) {
	t.Helper()
	if !gm.GroupCaps().Processes {
		t.Fatal("the collective path cannot run ranks in other processes")
	}
	return startMesh(t, roles, gm.PrepareGroup, residueOf(gm))
}

// MainGroup is Main for a package that runs RunGroup.
func MainGroup(m *testing.M, gm GroupMaker) int {
	role := os.Getenv(envRole)
	if role == "" {
		return m.Run()
	}
	roles := commonRoles[Group]()
	roles["close"] = func(ctx context.Context, g Group, p *Parent) error {
		g.Close()
		p.Say("CLOSED")
		return nil
	}
	roles["allreduce"] = func(ctx context.Context, g Group, p *Parent) error {
		if err := checkSums(ctx, g, groupSizes(gm.GroupCaps())); err != nil {
			return err
		}
		p.Say("OK")
		return nil
	}
	if r, ok := gm.(GroupRoles); ok {
		for name, f := range r.GroupRoles() {
			roles[name] = f
		}
	}
	return runChild(role, gm.PrepareGroup, roles)
}

// element is rank r's element i of call seq: small, so that sums over a
// few ranks never overflow an int8.
func element(r, i int, seq uint64) int8 {
	return int8((r*7+i*3+int(seq))%5 - 2)
}

// checkSums runs one AllReduce of every size, numbered from 1, and checks
// the sums.
func checkSums(ctx context.Context, g Group, sizes []int) error {
	n := g.Size()
	for k, size := range sizes {
		seq := uint64(k + 1)
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = byte(element(g.Rank(), i, seq))
		}
		if err := g.AllReduce(ctx, seq, sig(size), buf); err != nil {
			return fmt.Errorf("rank %d: allreduce #%d of %d bytes: %w", g.Rank(), seq, size, err)
		}
		for i, b := range buf {
			var want int8
			for r := range n {
				want += element(r, i, seq)
			}
			if int8(b) != want {
				return fmt.Errorf("rank %d: allreduce #%d of %d bytes: element %d is %d, want %d", g.Rank(), seq, size, i, int8(b), want)
			}
		}
	}
	return nil
}

// sig is the signature of an AllReduce of size bytes.
func sig(size int) uint64 { return 0xa11 ^ uint64(size)<<12 }

func groupSizes(c GroupCaps) []int {
	return unique(append([]int{0, 1, 7, 4093}, c.Sizes...))
}

// RunGroup checks a collective path: sums right for 1 to 4 ranks at every
// size; a call that differs (sequence, signature, length) fails on every
// rank with ErrMismatch; a rank that aborts, closes, misses its deadline or
// dies (a child process killed with SIGKILL) while the others wait inside
// a collective makes them fail, naming it; no goroutine outlives Close.
func RunGroup(t *testing.T, gm GroupMaker) {
	t.Run("AllReduce", func(t *testing.T) {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
				gs := NewGroup(t, gm, n)
				if err := onEveryRank(gs, func(g Group) error { return checkSums(context.Background(), g, groupSizes(gm.GroupCaps())) }); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
	t.Run("Mismatch", func(t *testing.T) { testGroupMismatch(t, gm) })
	t.Run("Abort", func(t *testing.T) {
		for _, size := range edgeSizes(gm) {
			t.Run(fmt.Sprintf("bytes=%d", size), func(t *testing.T) { testGroupAbort(t, gm, size) })
		}
	})
	t.Run("Close", func(t *testing.T) { testGroupClose(t, gm) })
	t.Run("Deadline", func(t *testing.T) { testGroupDeadline(t, gm) })
	t.Run("NoGoroutineLeak", func(t *testing.T) { testGroupNoLeak(t, gm) })
	if gm.GroupCaps().Processes {
		t.Run("Processes", func(t *testing.T) { runGroupProcesses(t, gm) })
	}
}

// edgeSizes: the smallest and the largest AllReduce of the Maker's sizes.
func edgeSizes(gm GroupMaker) []int {
	s := groupSizes(gm.GroupCaps())
	return slices.Compact([]int{64, s[len(s)-1]})
}

// onEveryRank runs f on every rank at once.
func onEveryRank(gs []Group, f func(g Group) error) error {
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for r, g := range gs {
		if g != nil {
			wg.Go(func() { errs[r] = f(g) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// allReduceCall starts rank g's AllReduce #seq of size bytes.
func allReduceCall(ctx context.Context, g Group, seq uint64, size int) *call {
	return goCall(func() error { return g.AllReduce(ctx, seq, sig(size), make([]byte, size)) })
}

// testGroupMismatch: rank 2 of 3 calls another collective than ranks 0
// and 1; every rank reports it.
func testGroupMismatch(t *testing.T, gm GroupMaker) {
	large := groupSizes(gm.GroupCaps())
	for _, tc := range []struct {
		name      string
		seq, size uint64
		sig       uint64
	}{
		{"seq", 2, 256, sig(256)},
		{"sig", 1, 256, sig(256) + 1},
		// Another length changes the number of pieces a path cuts the
		// buffer in, and so of its steps.
		{"len", 1, uint64(large[len(large)-1]), sig(256)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gs := NewGroup(t, gm, 3)
			ctx, cancel := context.WithTimeout(context.Background(), Hang)
			defer cancel()
			err := onEveryRank(gs, func(g Group) error {
				var err error
				if g.Rank() == 2 {
					err = g.AllReduce(ctx, tc.seq, tc.sig, make([]byte, tc.size))
				} else {
					err = g.AllReduce(ctx, 1, sig(256), make([]byte, 256))
				}
				if !errors.Is(err, transport.ErrMismatch) {
					return fmt.Errorf("rank %d: got %v, want ErrMismatch", g.Rank(), err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// testGroupAbort: ranks 0 and 2 wait in an AllReduce that rank 1 never
// joins; rank 2 aborts meanwhile. Rank 2's call fails as aborted, rank 0's
// names rank 2 with its reason, and so does rank 1's next call.
func testGroupAbort(t *testing.T, gm GroupMaker, size int) {
	gs := NewGroup(t, gm, 3)
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	c0, c2 := allReduceCall(ctx, gs[0], 1, size), allReduceCall(ctx, gs[2], 1, size)
	blocked(t, c0, "rank 0's call", nil)
	blocked(t, c2, "rank 2's call", nil)
	gs[2].Abort(errors.New(reason))
	if err := Within(t, c2.res, "rank 2's call"); !errors.Is(err, transport.ErrAborted) || errors.Is(err, transport.ErrRemoteAbort) {
		t.Errorf("rank 2's own call: got %v, want ErrAborted", err)
	}
	WantAbortFrom(t, "rank 0's call", Within(t, c0.res, "rank 0's call"), 2, reason)
	WantAbortFrom(t, "rank 1's next call", gs[1].AllReduce(ctx, 1, sig(size), make([]byte, size)), 2, reason)
	for r, g := range gs {
		if err := g.AllReduce(ctx, 2, sig(size), make([]byte, size)); !errors.Is(err, transport.ErrAborted) && !errors.Is(err, transport.ErrRemoteAbort) {
			t.Errorf("rank %d's call after the abort: got %v", r, err)
		}
	}
}

// testGroupClose: a rank that closes fails its own pending and later
// calls with Caps.Closed, and the others' calls (pending ones waiting for
// it, and later ones) with a PeerLostError naming it.
func testGroupClose(t *testing.T, gm GroupMaker) {
	closed := gm.GroupCaps().Closed
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	wantClosed := func(what string, err error) {
		t.Helper()
		WantLost(t, what, err, 0)
		if err != nil && !strings.Contains(err.Error(), "closed") {
			t.Errorf("%s: %v, want it to say that rank 0 closed", what, err)
		}
	}
	t.Run("waited-for", func(t *testing.T) {
		// Ranks 1 and 2 wait in an AllReduce for rank 0, which closes.
		gs := NewGroup(t, gm, 3)
		c1, c2 := allReduceCall(ctx, gs[1], 1, 64), allReduceCall(ctx, gs[2], 1, 64)
		blocked(t, c1, "rank 1's call", nil)
		blocked(t, c2, "rank 2's call", nil)
		if err := gs[0].Close(); err != nil {
			t.Fatal(err)
		}
		wantClosed("rank 1's call", Within(t, c1.res, "rank 1's call"))
		wantClosed("rank 2's call", Within(t, c2.res, "rank 2's call"))
	})
	t.Run("pending", func(t *testing.T) {
		// Rank 0 closes while it waits in an AllReduce for the others.
		gs := NewGroup(t, gm, 3)
		c0 := allReduceCall(ctx, gs[0], 1, 64)
		blocked(t, c0, "rank 0's call", nil)
		if err := gs[0].Close(); err != nil {
			t.Fatal(err)
		}
		if err := Within(t, c0.res, "rank 0's call"); !errors.Is(err, closed) {
			t.Errorf("rank 0's pending call: got %v, want %v", err, closed)
		}
		if err := gs[0].Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if err := gs[0].AllReduce(ctx, 2, sig(64), make([]byte, 64)); !errors.Is(err, closed) {
			t.Errorf("call after Close: got %v, want %v", err, closed)
		}
		gs[0].Abort(errors.New("after close")) // no effect, no crash
		err := onEveryRank(gs[1:], func(g Group) error {
			wantClosed(fmt.Sprintf("rank %d's next call", g.Rank()), g.AllReduce(ctx, 1, sig(64), make([]byte, 64)))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// testGroupDeadline: ranks 0 and 1 give up waiting for rank 2 when their
// deadline passes, and rank 2 learns of it instead of waiting for them.
func testGroupDeadline(t *testing.T, gm GroupMaker) {
	gs := NewGroup(t, gm, 3)
	size := edgeSizes(gm)[len(edgeSizes(gm))-1]
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range errs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			errs[r] = gs[r].AllReduce(ctx, 1, sig(size), make([]byte, size))
		})
	}
	wg.Wait()
	// Both deadlines pass together: whichever rank notices first aborts,
	// and the other may learn of that (with the reason) before its own.
	direct := 0
	for r, err := range errs {
		var rae *transport.RemoteAbortError
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			direct++
		case errors.As(err, &rae) && strings.Contains(rae.Reason, context.DeadlineExceeded.Error()):
		default:
			t.Errorf("rank %d: got %v, want DeadlineExceeded", r, err)
		}
	}
	if direct == 0 {
		t.Errorf("no rank reported its own deadline: %v", errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Hang)
	defer cancel()
	if err := gs[2].AllReduce(ctx, 1, sig(size), make([]byte, size)); !errors.Is(err, transport.ErrRemoteAbort) {
		t.Errorf("rank 2 later: got %v, want ErrRemoteAbort", err)
	}
}

func testGroupNoLeak(t *testing.T, gm GroupMaker) {
	before := runtime.NumGoroutine()
	func() {
		gs := NewGroup(t, gm, 3)
		if err := onEveryRank(gs, func(g Group) error { return checkSums(context.Background(), g, edgeSizes(gm)) }); err != nil {
			t.Fatal(err)
		}
		for _, g := range gs {
			g.Close()
		}
	}()
	awaitGoroutines(t, before)
}

// awaitGoroutines waits until no more than before goroutines run.
func awaitGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(Hang)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

// ---- with rank 2 in a child process ----

func runGroupProcesses(t *testing.T, gm GroupMaker) {
	t.Run("AllReduce", func(t *testing.T) {
		gs, kids := StartGroup(t, gm, []string{"", "allreduce", "allreduce"})
		if err := checkSums(context.Background(), gs[0], groupSizes(gm.GroupCaps())); err != nil {
			t.Fatal(err)
		}
		for _, c := range kids[1:] {
			c.Expect(t, "OK")
		}
	})
	for _, f := range []struct {
		name, role string
		fail       func(t *testing.T, c *Child)
		check      func(t testing.TB, what string, err error)
	}{
		{"Killed", "idle",
			func(t *testing.T, c *Child) { c.Expect(t, "IDLE"); c.Kill(t) },
			func(t testing.TB, what string, err error) { WantLost(t, what, err, 2) }},
		{"Abort", "abort",
			func(t *testing.T, c *Child) {
				c.Expect(t, "WAITING")
				c.Say(t, "%s", reason)
				c.Expect(t, "ABORTED")
			},
			func(t testing.TB, what string, err error) { WantAbortFrom(t, what, err, 2, reason) }},
	} {
		t.Run(f.name, func(t *testing.T) {
			for _, size := range edgeSizes(gm) {
				t.Run(fmt.Sprintf("bytes=%d", size), func(t *testing.T) {
					// Ranks 0 and 1 wait inside an AllReduce for rank 2.
					gs, kids := StartGroup(t, gm, []string{"", "", f.role})
					ctx, cancel := context.WithTimeout(context.Background(), Hang)
					defer cancel()
					c0, c1 := allReduceCall(ctx, gs[0], 1, size), allReduceCall(ctx, gs[1], 1, size)
					blocked(t, c0, "rank 0's call", nil)
					blocked(t, c1, "rank 1's call", nil)
					f.fail(t, kids[2])
					start := time.Now()
					err := Within(t, c0.res, "rank 0's call")
					t.Logf("rank 0 failed %v after the fault: %v", time.Since(start), err)
					f.check(t, "rank 0's call", err)
					f.check(t, "rank 1's call", Within(t, c1.res, "rank 1's call"))
				})
			}
		})
	}
}
