package recovery

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/agree"
)

// group is n recoverers over one simWorld, each with its own fake clock
// when clocks is set (the silence judgements then move only when the test
// moves them).
type group struct {
	w      *simWorld
	recs   []*Recoverer
	clocks []*fakeClock
}

func newGroup(t *testing.T, w *simWorld, timeout time.Duration, majority, clocks bool) *group {
	g := &group{w: w}
	for r := range w.n {
		cfg := Config{Rank: r, Size: w.n, Timeout: timeout, Majority: majority, Net: w.member(r)}
		if clocks {
			c := newFakeClock()
			g.clocks = append(g.clocks, c)
			cfg.Now = c.now
		}
		g.recs = append(g.recs, New(cfg))
	}
	t.Cleanup(func() {
		w.close()
		for _, s := range g.recs {
			s.Release()
		}
	})
	return g
}

// pass moves member r's clock on by d while its loop runs: in steps well
// under a stall, each followed by a few of its iterations (a jump at once
// would be a stall of its own, which the loop discounts).
func (g *group) pass(r int, d time.Duration) {
	s := g.recs[r]
	step := s.stallGap() / 5
	for d > 0 {
		g.clocks[r].advance(min(step, d))
		d -= step
		time.Sleep(2 * s.tick())
	}
}

type agreed struct {
	view []int
	err  error
	took time.Duration
}

// agreeAll starts the next agreement on the members in ranks, each in
// its goroutine, under ctx; the channel of each gives its outcome.
func (g *group) agreeAll(ctx context.Context, ranks []int) map[int]chan agreed {
	out := map[int]chan agreed{}
	for _, r := range ranks {
		ch := make(chan agreed, 1)
		out[r] = ch
		go func(s *Recoverer) {
			began := time.Now()
			s.Lock()
			defer s.Unlock()
			v, err := s.Agree(ctx, nil)
			ch <- agreed{v, err, time.Since(began)}
		}(g.recs[r])
	}
	return out
}

// waitingOn waits until member r's unfinished agreement has a silence
// clock running on peer p.
func (g *group) waitingOn(t *testing.T, r, p int) {
	t.Helper()
	s := g.recs[r]
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		_, ok := s.since[0][p]
		s.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("member %d never waited on %d", r, p)
		}
	}
}

func collect(t *testing.T, res map[int]chan agreed) map[int]agreed {
	t.Helper()
	got := map[int]agreed{}
	for r, ch := range res {
		select {
		case a := <-ch:
			got[r] = a
		case <-time.After(10 * time.Second):
			t.Fatalf("member %d's agreement never ended", r)
		}
	}
	return got
}

// TestQueuedAnswersBeforeSilence: a member whose loop stopped a while
// (shorter than a stall) past the timeout of a peer it waited for, with
// that peer's answer queued behind another event when it runs again,
// must handle every queued event before it judges silences: the peer
// answered in time.
func TestQueuedAnswersBeforeSilence(t *testing.T) {
	const timeout = time.Second
	w := newSimWorld(3, nil)
	w.hold(2, 0)
	g := newGroup(t, w, timeout, false, true)
	res := g.agreeAll(context.Background(), []int{0, 1, 2})
	g.waitingOn(t, 0, 2)
	for w.inFlight(2, 0) == 0 {
		time.Sleep(time.Millisecond)
	}
	g.pass(0, timeout*9/10) // the loop judges: not yet silent
	w.stallMember(t, 0)
	// Queued ahead of 2's answer: a setup blob from 1 (of a later round).
	simNet{w, 1}.Send(0, Msg{Inst: 1, Round: 1, Blob: []byte("x")})
	w.release(2, 0)
	// Past the timeout since 0 began to wait, but not a stall of its own.
	g.clocks[0].advance(timeout / 5)
	if timeout/5 >= g.recs[0].stallGap() {
		t.Fatal("the test's pause is a stall")
	}
	w.resume(0)
	for r, a := range collect(t, res) {
		if a.err != nil || !slices.Equal(a.view, []int{0, 1, 2}) {
			t.Errorf("member %d: view %v, %v; want [0 1 2] (2's answer was queued)", r, a.view, a.err)
		}
	}
	if f := g.recs[0].Failed(); len(f) != 0 {
		t.Errorf("member 0 took %v for failed", f)
	}
}

// TestOwnStallNotCountedAgainstPeers: a member whose own process stopped
// for many timeouts while it waited on a peer (SIGSTOP) does not take the
// peer for silent when it runs again: the peer's silence clock moves on
// by the stall, and the answer that comes after it is in time.
func TestOwnStallNotCountedAgainstPeers(t *testing.T) {
	const timeout = time.Second
	w := newSimWorld(3, nil)
	w.hold(0, 2)
	g := newGroup(t, w, timeout, false, true)
	res := g.agreeAll(context.Background(), []int{0, 1, 2})
	g.waitingOn(t, 2, 0)
	w.stallMember(t, 2)
	g.clocks[2].advance(5 * timeout)
	w.resume(2)
	time.Sleep(4 * g.recs[2].tick()) // the loop runs and judges
	if f := g.recs[2].Failed(); len(f) != 0 {
		t.Errorf("member 2 took %v for failed after its own stall", f)
	}
	w.release(0, 2)
	for r, a := range collect(t, res) {
		if a.err != nil || !slices.Equal(a.view, []int{0, 1, 2}) {
			t.Errorf("member %d: view %v, %v; want [0 1 2]", r, a.view, a.err)
		}
	}
}

// TestSilentPeerExcluded: the other side of the two tests above — a peer
// that stays silent past the timeout (nothing queued from it, no stall
// here) is taken for failed and left out, and told so when it asks.
func TestSilentPeerExcluded(t *testing.T) {
	const timeout = time.Second
	w := newSimWorld(3, nil)
	w.hold(2, 0)
	w.hold(2, 1)
	g := newGroup(t, w, timeout, false, true)
	res := g.agreeAll(context.Background(), []int{0, 1, 2})
	g.waitingOn(t, 0, 2)
	g.pass(0, timeout*3/2) // the coordinator's: 1 still waits on it
	got := map[int]agreed{}
	for _, r := range []int{0, 1} {
		select {
		case got[r] = <-res[r]:
		case <-time.After(10 * time.Second):
			t.Fatalf("member %d never decided", r)
		}
		if a := got[r]; a.err != nil || !slices.Equal(a.view, []int{0, 1}) {
			t.Errorf("member %d: view %v, %v; want [0 1]", r, a.view, a.err)
		}
	}
	w.release(2, 0)
	w.release(2, 1)
	if a := <-res[2]; !errors.Is(a.err, agree.ErrExcluded) {
		t.Errorf("member 2: view %v, %v; want ErrExcluded", a.view, a.err)
	}
}

// TestGaveUpEndsWatch: a member that gave an instance's setup up
// (GaveUpOn) ends every other member's setup of it at once, also one
// past its exchange and connecting to its peers: it waited on a member
// that moved on until the shrink's deadline, and a second agreement
// went on without it (chaos seed 1002).
func TestGaveUpEndsWatch(t *testing.T) {
	w := newSimWorld(3, nil)
	g := newGroup(t, w, 5*time.Second, true, false)
	ctx, stop := g.recs[1].WhileUp(context.Background(), 7, []int{0, 1, 2})
	defer stop()
	other, stopOther := g.recs[1].WhileUp(context.Background(), 8, []int{0, 1, 2})
	defer stopOther()
	g.recs[2].GaveUpOn(7, []int{0, 1, 2}, 0, errors.New("no setup data from it"))
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the setup of instance 7 still waits after a member gave it up")
	}
	var lost *LostError
	if cause := context.Cause(ctx); !errors.As(cause, &lost) || lost.Peer != 0 || !strings.Contains(lost.Why, "as rank 2 found") {
		t.Fatalf("cause %v, want rank 0 lost as rank 2 found", cause)
	}
	if other.Err() != nil {
		t.Fatalf("the setup of another instance ended too: %v", context.Cause(other))
	}
}

// TestStalledRankNoViewOfItsOwn: a member stopped past the timeout while
// the others agreed without it and closed their control meshes, too late
// for their goodbyes to reach it, finds their connections closed and
// their listeners refusing, as a dead process's would. It must not take
// them for dead and agree a view of itself alone (chaos seed 3034): a
// majority of the job has to answer it, and none does.
func TestStalledRankNoViewOfItsOwn(t *testing.T) {
	const timeout = time.Second
	w := newSimWorld(3, nil)
	g := newGroup(t, w, timeout, true, true)
	time.Sleep(4 * g.recs[2].tick()) // its loop runs
	w.stallMember(t, 2)
	g.clocks[2].advance(5 * timeout)
	for _, p := range []int{0, 1} {
		w.q[2].push(Event{from: p, down: true, dead: true, why: "nothing listens at its control address (process gone?)"})
	}
	w.resume(2)
	time.Sleep(4 * g.recs[2].tick())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	view, err := g.recs[2].Agree(ctx, nil)
	if err == nil {
		t.Fatalf("member 2, resumed after a stall past the timeout, agreed %v alone", view)
	}
	if !errors.Is(err, agree.ErrNoQuorum) {
		t.Errorf("got %v, want ErrNoQuorum", err)
	}
}

// TestOldInstancesPruned: a recoverer keeps the last agreements only
// (members lag by one at most), and no message parked for an instance it
// has passed: before, every agreement's state and every message parked
// for an instance never run stayed for the communicator's life.
func TestOldInstancesPruned(t *testing.T) {
	w := newSimWorld(3, nil)
	g := newGroup(t, w, 5*time.Second, true, false)
	const rounds = 6
	for i := range rounds {
		if i == 3 {
			// A message parked for an instance this member has passed
			// (one it never ran: a Grow's number, say).
			g.recs[0].mu.Lock()
			g.recs[0].pending[1] = []Event{{from: 1, msg: Msg{Inst: 1, Agree: &agree.Msg{}}}}
			g.recs[0].mu.Unlock()
		}
		for r, a := range collect(t, g.agreeAll(context.Background(), []int{0, 1, 2})) {
			if a.err != nil || len(a.view) != 3 {
				t.Fatalf("round %d: member %d: view %v, %v", i, r, a.view, a.err)
			}
		}
	}
	for r, s := range g.recs {
		s.mu.Lock()
		for k := range s.nodes {
			if k+3 < rounds {
				t.Errorf("member %d still holds agreement %d after %d", r, k, rounds)
			}
		}
		for k := range s.pending {
			if k < rounds {
				t.Errorf("member %d still holds messages parked for agreement %d", r, k)
			}
		}
		s.mu.Unlock()
	}
}
