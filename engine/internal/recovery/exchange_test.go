package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestTreeShape: every index but the root has one parent, whose children
// include it; the depth is ⌈log_d⌉ levels; the waits grow with the depth
// and do not overflow.
func TestTreeShape(t *testing.T) {
	for d := 2; d <= 5; d++ {
		for n := 1; n <= 300; n++ {
			seen := make([]int, n)
			for i := range n {
				lo, hi := treeChildren(i, n, d)
				if hi-lo > d || lo < hi && lo <= i {
					t.Fatalf("d=%d n=%d: children of %d are [%d, %d)", d, n, i, lo, hi)
				}
				for c := lo; c < hi; c++ {
					seen[c]++
					if treeParent(c, d) != i {
						t.Fatalf("d=%d n=%d: child %d of %d has parent %d", d, n, c, i, treeParent(c, d))
					}
				}
			}
			for i, k := range seen {
				if want := min(i, 1); k != want {
					t.Fatalf("d=%d n=%d: index %d is a child %d times", d, n, i, k)
				}
			}
			depth := 0
			for i := n - 1; i > 0; i = treeParent(i, d) {
				depth++
			}
			if reach := int(math.Pow(float64(d), float64(depth-1))); depth > 1 && reach >= n {
				t.Fatalf("d=%d n=%d: depth %d, deeper than log_d", d, n, depth)
			}
		}
	}
	if w := treeWait(time.Second, 0); w != time.Second {
		t.Errorf("treeWait(1s, 0) = %v", w)
	}
	if w := treeWait(time.Second, 2); w != 1500*time.Millisecond {
		t.Errorf("treeWait(1s, 2) = %v", w)
	}
	if w := treeWait(math.MaxInt64/2, 10); w != math.MaxInt64 {
		t.Errorf("treeWait(huge, 10) = %v, want the largest duration", w)
	}
}

// TestPackTable: a table survives packing; a damaged one is an error,
// never a crash or a wrong table.
func TestPackTable(t *testing.T) {
	table := [][]byte{[]byte("a"), nil, bytes.Repeat([]byte{7}, 300)}
	p := packTable(table)
	got, err := unpackTable(p, 3)
	if err != nil || len(got) != 3 || !bytes.Equal(got[0], table[0]) || len(got[1]) != 0 || !bytes.Equal(got[2], table[2]) {
		t.Fatalf("unpack(pack) = %q, %v", got, err)
	}
	for name, b := range map[string][]byte{
		"empty":         nil,
		"count only":    p[:1],
		"cut short":     p[:len(p)-1],
		"trailing":      append(slices.Clone(p), 0),
		"huge length":   {3, 0xff, 0xff, 0xff, 0xff, 0x0f, 'x'},
		"bad varint":    {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"other members": packTable(table[:2]),
	} {
		if got, err := unpackTable(b, 3); err == nil {
			t.Errorf("%s: unpacked %q, want an error", name, got)
		}
	}
}

// sentTable is a table message a member sent.
type sentTable struct {
	from, to int
	table    []byte
}

// tapNet records the table messages its member sends.
type tapNet struct {
	Net
	me  int
	mu  *sync.Mutex
	log *[]sentTable
}

func (n tapNet) Send(to int, m Msg) {
	if m.Table != nil {
		n.mu.Lock()
		*n.log = append(*n.log, sentTable{n.me, to, m.Table})
		n.mu.Unlock()
	}
	n.Net.Send(to, m)
}

// exchangeWorld is the members of view, each with a recoverer over one
// LocalWorld of size ranks, their table messages recorded.
type exchangeWorld struct {
	w    *LocalWorld
	recs map[int]*Recoverer
	mu   sync.Mutex
	sent []sentTable
}

func newExchangeWorld(t *testing.T, size int, view []int, timeout time.Duration, skip ...int) *exchangeWorld {
	x := &exchangeWorld{w: NewLocalWorld(size), recs: map[int]*Recoverer{}}
	for _, r := range view {
		if slices.Contains(skip, r) {
			continue
		}
		net := tapNet{Net: x.w.Member(r), me: r, mu: &x.mu, log: &x.sent}
		x.recs[r] = New(Config{Rank: r, Size: size, Timeout: timeout, Net: net})
	}
	t.Cleanup(func() {
		for _, s := range x.recs {
			s.Release()
		}
	})
	return x
}

type exchanged struct {
	table [][]byte
	err   error
}

// run has every member with a recoverer run round 1 of instance 0's
// exchange, giving up as Shrink does (GaveUpOn, naming whom it lost).
func (x *exchangeWorld) run(ctx context.Context, view []int, blob func(r int) []byte) map[int]exchanged {
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[int]exchanged{}
	for r, s := range x.recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			table, err := s.Exchange(0, view)(ctx, blob(r))
			if err != nil {
				p := -1
				var lost *LostError
				if errors.As(err, &lost) {
					p = lost.Peer
				}
				s.GaveUpOn(0, view, p, err)
			}
			mu.Lock()
			out[r] = exchanged{table, err}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func testBlob(r int) []byte {
	if r == 3 {
		return nil // an empty blob is an entry too
	}
	return fmt.Appendf(nil, "blob of rank %d %s", r, bytes.Repeat([]byte{'x'}, r%7))
}

// TestExchangeTree: the table arrives whole at every member, for views
// of 1 to 40 members and 300; the root packs it once and sends it to at
// most exchangeFanOut members; every member forwards the very bytes it
// got to its own children in the tree, and each member gets it once.
func TestExchangeTree(t *testing.T) {
	sizes := []int{300}
	for n := 1; n <= 40; n++ {
		sizes = append(sizes, n)
	}
	for _, n := range sizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			// Ranks 0 and 2, 3, … n of a communicator of n+1: rank 1 left
			// out, so that view positions and ranks differ.
			view := []int{0}
			for r := 2; r <= n; r++ {
				view = append(view, r)
			}
			x := newExchangeWorld(t, n+1, view, time.Minute)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res := x.run(ctx, view, testBlob)
			for _, r := range view {
				got := res[r]
				if got.err != nil {
					t.Fatalf("rank %d: %v", r, got.err)
				}
				if len(got.table) != len(view) {
					t.Fatalf("rank %d: %d entries for %d members", r, len(got.table), len(view))
				}
				for i, p := range view {
					if !bytes.Equal(got.table[i], testBlob(p)) {
						t.Fatalf("rank %d: entry %d (rank %d) is %q, want %q", r, i, p, got.table[i], testBlob(p))
					}
				}
			}
			x.checkTree(t, view)
		})
	}
}

// checkTree: the recorded table messages are the tree's edges, once
// each, all carrying the root's one packed table.
func (x *exchangeWorld) checkTree(t *testing.T, view []int) {
	t.Helper()
	if len(x.sent) != len(view)-1 {
		t.Fatalf("%d table messages for %d members", len(x.sent), len(view))
	}
	got := map[int]int{}
	for _, m := range x.sent {
		if &m.table[0] != &x.sent[0].table[0] {
			t.Fatalf("rank %d sent rank %d a table of its own making: the root packs it once, the others forward it", m.from, m.to)
		}
		i, j := slices.Index(view, m.from), slices.Index(view, m.to)
		if lo, hi := treeChildren(i, len(view), exchangeFanOut); j < lo || j >= hi {
			t.Fatalf("rank %d (index %d) sent the table to rank %d (index %d), not one of its children", m.from, i, m.to, j)
		}
		got[m.to]++
	}
	for _, r := range view[1:] {
		if got[r] != 1 {
			t.Fatalf("rank %d got the table %d times", r, got[r])
		}
	}
}

// interior is an exchange among 40 members in which the member at view
// index 2 (children 9–12, grandchildren 37–39) sends its blob, takes the
// table and then, instead of forwarding it, does what act says.
func interior(t *testing.T, timeout time.Duration, act func(Net)) (map[int]exchanged, []int, time.Duration) {
	const n, victim = 40, 2
	view := make([]int, n)
	for i := range view {
		view[i] = i
	}
	x := newExchangeWorld(t, n, view, timeout, victim)
	vn := x.w.Member(victim)
	go func() {
		vn.Send(0, Msg{Inst: 0, Round: 1, Blob: testBlob(victim)})
		for {
			ev, err := vn.Next(context.Background())
			if err != nil || ev.msg.Table != nil {
				act(vn)
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	res := x.run(ctx, view, testBlob)
	return res, []int{9, 10, 11, 12, 37, 38, 39}, time.Since(began)
}

// checkSubtree: the victim's subtree lost it, by name; each of the rest
// got the table whole or, when the news came first (GaveUpOn reaches
// every member), lost the victim too: never another rank.
func checkSubtree(t *testing.T, res map[int]exchanged, subtree []int, victim int) {
	t.Helper()
	for r, got := range res {
		var lost *LostError
		switch {
		case slices.Contains(subtree, r) && !errors.As(got.err, &lost):
			t.Errorf("rank %d, below the lost rank %d: %v, want a LostError", r, victim, got.err)
		case got.err != nil && !errors.As(got.err, &lost):
			t.Errorf("rank %d: %v, want a LostError", r, got.err)
		case got.err != nil && lost.Peer != victim:
			t.Errorf("rank %d: lost rank %d (%v), want %d", r, lost.Peer, got.err, victim)
		case got.err == nil && len(got.table) != 40:
			t.Errorf("rank %d: %d entries", r, len(got.table))
		case got.err == nil && !bytes.Equal(got.table[r], testBlob(r)):
			t.Errorf("rank %d: its own entry is %q", r, got.table[r])
		}
	}
}

// TestExchangeInteriorKilled: an interior member that dies holding the
// table fails its whole subtree at once, naming it; nobody waits out the
// timeout, and the rest have the table.
func TestExchangeInteriorKilled(t *testing.T) {
	res, subtree, took := interior(t, time.Minute, func(n Net) { n.Crash() })
	checkSubtree(t, res, subtree, 2)
	if took > 20*time.Second {
		t.Errorf("took %v: the subtree waited on a dead member", took)
	}
}

// TestExchangeInteriorStalled: an interior member that stalls holding the
// table is blamed by its children when their wait ends; its grandchildren,
// who wait longer, learn it from them (GaveUpOn) rather than blame their
// own parents.
func TestExchangeInteriorStalled(t *testing.T) {
	res, subtree, _ := interior(t, 3*time.Second, func(Net) {})
	checkSubtree(t, res, subtree, 2)
}
