// Package recovery is what Shrink and Grow run on: the control mesh (a
// communicator's second set of links, apart from its transport), the
// recoverer that agrees on the ranks that go on over it (engine/agree
// instances, driven by the mesh's events, with silences judged against the
// timeout) and the exchanges that set the new communicator up from one
// member (Shrink's table goes down a tree, Exchange). It knows nothing of the communicator: a Config gives it the
// rank, the size, the logger, the timeout, the quorum and the mesh, and
// engine builds the new communicator from what it decides.
package recovery

import (
	"context"
	"sync"

	"github.com/gocoll/gocoll/engine/agree"
)

// The control mesh is a communicator's second set of links, apart from the
// transport its collectives use: the one Shrink agrees and rebuilds over
// after the transport failed or was revoked (an abort poisons every
// connection of the transport, on purpose). Its messages are few and small;
// a peer whose control connection breaks, or cannot be opened, is reported
// as down.

// Msg is one control message: an agreement message or a setup blob, of
// agreement instance Inst (see Recoverer).
type Msg struct {
	Inst  uint64     `json:"i"`
	Agree *agree.Msg `json:"a,omitempty"`
	Round int        `json:"r,omitempty"` // setup exchange round, from 1
	Blob  []byte     `json:"b,omitempty"`
	// Table: the round's blobs of every member, packed once by the
	// exchange's root (packTable) and forwarded as they are down its tree
	// (see Recoverer.Exchange).
	Table []byte `json:"t,omitempty"`
	// Lost: the root gave the round up because this rank (+1) of the
	// communicator being shrunk was lost, with why.
	Lost int      `json:"l,omitempty"`
	Why  string   `json:"w,omitempty"`
	Grow *GrowMsg `json:"g,omitempty"`
	// Bye: the sender closes its control mesh on purpose (every
	// communicator that used it was destroyed). Its process lives on and
	// is done with this mesh's agreements: down, never dead, so that a
	// rank resumed after the others moved on (a zombie) cannot count them
	// dead and agree a view of its own.
	Bye bool `json:"y,omitempty"`
}

// GrowMsg is what rank 0 tells a joiner (its rank, the new size and
// tag), and the gathered setup blobs it sends back each round.
type GrowMsg struct {
	Rank int      `json:"rank"`
	Size int      `json:"size"`
	Tag  []byte   `json:"tag,omitempty"`
	All  [][]byte `json:"all,omitempty"`
}

// Event is what the mesh delivers: a message from a peer, or that the
// peer is down.
type Event struct {
	from int
	down bool
	dead bool   // down because its process ended (transport.Died), not a silence
	why  string // down: what broke
	msg  Msg
	conn *Conn // grow: the joiner's connection (from is -1)
}

// Net is one rank's end of a control mesh.
type Net interface {
	// Send queues m for peer to; it never blocks. A failure to deliver
	// comes back as a down event.
	Send(to int, m Msg)
	// Next waits for the next event, or ctx's end.
	Next(ctx context.Context) (Event, error)
	// Close ends this rank's part with a goodbye: its peers see it down,
	// not dead.
	Close()
	// Crash ends it as a process's death does (tests): no goodbye.
	Crash()
}

// queue is an unbounded FIFO of events.
type queue struct {
	mu     sync.Mutex
	items  []Event
	notify chan struct{}
}

func newQueue() *queue { return &queue{notify: make(chan struct{}, 1)} }

func (q *queue) push(e Event) {
	q.mu.Lock()
	q.items = append(q.items, e)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *queue) next(ctx context.Context) (Event, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			e := q.items[0]
			q.items[0] = Event{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return e, nil
		}
		q.mu.Unlock()
		select {
		case <-q.notify:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// LocalWorld is the control mesh of in-process ranks.
type LocalWorld struct {
	mu     sync.Mutex
	queues []*queue
	closed []bool
	left   []bool // closed with a goodbye (Close, not Crash)
	// cut, when set (tests), loses every message from one rank to another
	// for which it holds, silently: a network partition.
	cut func(from, to int) bool
}

// NewLocalWorld is the control mesh of n in-process ranks.
func NewLocalWorld(n int) *LocalWorld {
	w := &LocalWorld{queues: make([]*queue, n), closed: make([]bool, n), left: make([]bool, n)}
	for i := range w.queues {
		w.queues[i] = newQueue()
	}
	return w
}

// Member is rank me's end of w.
func (w *LocalWorld) Member(me int) Net { return localNet{w, me} }

// SetCut makes every message from one rank to another for which cut holds
// lost, silently (tests: a network partition); nil heals it.
func (w *LocalWorld) SetCut(cut func(from, to int) bool) {
	w.mu.Lock()
	w.cut = cut
	w.mu.Unlock()
}

type localNet struct {
	w  *LocalWorld
	me int
}

func (l localNet) Send(to int, m Msg) {
	l.w.mu.Lock()
	gone, self, left := l.w.closed[to], l.w.closed[l.me], l.w.left[to]
	lost := l.w.cut != nil && l.w.cut(l.me, to)
	l.w.mu.Unlock()
	switch {
	case self, lost:
	case gone:
		l.w.queues[l.me].push(Event{from: to, down: true, dead: !left, why: "its control link closed"})
	default:
		l.w.queues[to].push(Event{from: l.me, msg: m})
	}
}

func (l localNet) Next(ctx context.Context) (Event, error) { return l.w.queues[l.me].next(ctx) }

func (l localNet) Close() { l.end(true) }

// Crash is what a process's death looks like to the others.
func (l localNet) Crash() { l.end(false) }

func (l localNet) end(bye bool) {
	l.w.mu.Lock()
	if l.w.closed[l.me] {
		l.w.mu.Unlock()
		return
	}
	l.w.closed[l.me], l.w.left[l.me] = true, bye
	l.w.mu.Unlock()
	why := "its control link closed"
	if bye {
		why = byeWhy
	}
	for q := range l.w.queues {
		if q != l.me {
			l.w.queues[q].push(Event{from: l.me, down: true, dead: !bye, why: why})
		}
	}
}

// byeWhy is why a peer that said goodbye is down.
const byeWhy = "it closed its control links (its communicators were destroyed)"
