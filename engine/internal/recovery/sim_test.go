package recovery

import (
	"context"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"
)

// simWorld is a control mesh the test drives: messages are FIFO per
// directed link, as the TCP mesh's are; with a seed, a pump delivers
// them link by link in a random order (so interleavings across links are
// the seed's), and without one at once. A link can be held (its messages
// wait for release), dropped (both ends see the other down, alive), a
// member killed (its messages stop, in flight or not, and every peer gets
// a death event) or stalled (its loop stops in Next and what it sends
// waits, while what is sent to it queues up, as for a stopped process).
type simWorld struct {
	mu      sync.Mutex
	n       int
	q       []*queue
	rng     *rand.Rand       // nil: deliver at once
	links   map[[2]int][]Msg // in flight
	held    map[[2]int]bool
	dropped map[[2]int]bool
	killed  []bool
	stall   []chan struct{} // closed at resume; nil while running
	parked  []chan struct{} // a stalled member's loop waits in Next
	outbox  [][][2]any      // a stalled member's sends: {to, Msg}
	kick    chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newSimWorld(n int, rng *rand.Rand) *simWorld {
	w := &simWorld{n: n, q: make([]*queue, n), rng: rng, links: map[[2]int][]Msg{}, held: map[[2]int]bool{},
		dropped: map[[2]int]bool{}, killed: make([]bool, n), stall: make([]chan struct{}, n),
		parked: make([]chan struct{}, n), outbox: make([][][2]any, n), kick: make(chan struct{}, 1), stop: make(chan struct{})}
	for i := range w.q {
		w.q[i] = newQueue()
		w.parked[i] = make(chan struct{}, 1)
	}
	if rng != nil {
		w.wg.Add(1)
		go w.pump()
	}
	return w
}

// close stops the pump and resumes every stalled member (their loops must
// see their end).
func (w *simWorld) close() {
	close(w.stop)
	w.wg.Wait()
	for r := range w.n {
		w.resume(r)
	}
}

type simNet struct {
	w  *simWorld
	me int
}

func (w *simWorld) member(r int) Net { return simNet{w, r} }

func (s simNet) Send(to int, m Msg) {
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	switch l := [2]int{s.me, to}; {
	case w.killed[s.me] || w.dropped[l]:
	case w.stall[s.me] != nil:
		w.outbox[s.me] = append(w.outbox[s.me], [2]any{to, m})
	case w.killed[to]:
		w.q[s.me].push(Event{from: to, down: true, dead: true, why: "killed by the test"})
	default:
		w.links[l] = append(w.links[l], m)
		if w.rng == nil && !w.held[l] {
			w.deliverLocked(l, len(w.links[l]))
		}
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// Next parks while the member is stalled: its process does not run.
func (s simNet) Next(ctx context.Context) (Event, error) {
	w := s.w
	w.mu.Lock()
	ch := w.stall[s.me]
	w.mu.Unlock()
	if ch != nil {
		select {
		case w.parked[s.me] <- struct{}{}:
		default:
		}
		<-ch
	}
	return w.q[s.me].next(ctx)
}

// Close and Crash: the simulation has no goodbyes; either kills.
func (s simNet) Close() { s.w.kill(s.me) }

func (s simNet) Crash() { s.w.kill(s.me) }

// deliverLocked hands the first k messages in flight on l to its
// receiver. Called with mu held.
func (w *simWorld) deliverLocked(l [2]int, k int) {
	for _, m := range w.links[l][:k] {
		if !w.killed[l[1]] {
			w.q[l[1]].push(Event{from: l[0], msg: m})
		}
	}
	w.links[l] = w.links[l][k:]
	if len(w.links[l]) == 0 {
		delete(w.links, l)
	}
}

// pump delivers one message at a time, of a link drawn by the seed, after
// a pause drawn by it.
func (w *simWorld) pump() {
	defer w.wg.Done()
	for {
		w.mu.Lock()
		var ready [][2]int
		for l := range w.links {
			if !w.held[l] {
				ready = append(ready, l)
			}
		}
		slices.SortFunc(ready, func(a, b [2]int) int { return (a[0]-b[0])*w.n + a[1] - b[1] })
		var pause time.Duration
		if len(ready) > 0 {
			w.deliverLocked(ready[w.rng.Intn(len(ready))], 1)
			pause = time.Duration(w.rng.Intn(300)) * time.Microsecond
		}
		w.mu.Unlock()
		if len(ready) == 0 {
			select {
			case <-w.kick:
			case <-w.stop:
				return
			}
			continue
		}
		select {
		case <-time.After(pause):
		case <-w.stop:
			return
		}
	}
}

// kill ends member r: what it sent and was not delivered is lost, and
// every peer learns it died.
func (w *simWorld) kill(r int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.killed[r] {
		return
	}
	w.killed[r] = true
	for l := range w.links {
		if l[0] == r || l[1] == r {
			delete(w.links, l)
		}
	}
	w.outbox[r] = nil
	for p := range w.n {
		if p != r && !w.killed[p] {
			w.q[p].push(Event{from: r, down: true, dead: true, why: "killed by the test"})
		}
	}
}

// drop breaks the link between a and b: what is in flight is lost, and
// each end sees the other down (not dead).
func (w *simWorld) drop(a, b int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range [][2]int{{a, b}, {b, a}} {
		w.dropped[l] = true
		delete(w.links, l)
		if !w.killed[l[0]] {
			w.q[l[0]].push(Event{from: l[1], down: true, why: "link dropped by the test"})
		}
	}
}

// hold keeps the messages on the link from a to b in flight until
// release.
func (w *simWorld) hold(a, b int) {
	w.mu.Lock()
	w.held[[2]int{a, b}] = true
	w.mu.Unlock()
}

func (w *simWorld) inFlight(a, b int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.links[[2]int{a, b}])
}

func (w *simWorld) release(a, b int) {
	w.mu.Lock()
	l := [2]int{a, b}
	delete(w.held, l)
	if w.rng == nil {
		w.deliverLocked(l, len(w.links[l]))
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// stallMember stops r's process: it returns once r's loop is parked.
func (w *simWorld) stallMember(t testing.TB, r int) {
	w.mu.Lock()
	w.stall[r] = make(chan struct{})
	w.mu.Unlock()
	select {
	case <-w.parked[r]:
	case <-time.After(10 * time.Second):
		t.Fatalf("member %d's loop did not park", r)
	}
}

// resume lets r run again: first what it sent while stopped leaves, then
// its loop goes on.
func (w *simWorld) resume(r int) {
	w.mu.Lock()
	ch, out := w.stall[r], w.outbox[r]
	w.stall[r], w.outbox[r] = nil, nil
	w.mu.Unlock()
	if ch == nil {
		return
	}
	for _, o := range out {
		simNet{w, r}.Send(o[0].(int), o[1].(Msg))
	}
	close(ch)
}

// fakeClock is one member's clock, moved by the test only.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
