package exec

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport"
)

// The aggregated all-to-all under the control tree of docs/design/aggregated-alltoall.md
// (aggregate-tree; sched/control.go has the protocol): no rank knows
// before the call who repacks which sub-matrix, or in which order the
// decisions come. Each rank runs the tree's protocol on this goroutine —
// its registration up, its children's forwarded, the root's decisions
// down, each forwarded to the children before it is acted on — while a
// second goroutine issues the data movement of each batch of decisions it
// learns into a block-mode runner (sched.RankOps). The protocol's messages
// and the data share each pair's stream in an order no rank can predict,
// so every receive takes its message by tag from a per-peer mailbox.

// Control messages' tags stay clear of the data's (3 per sub-matrix).
const (
	TagUp   = 1 << 31 // | index of the registration message on its edge
	TagDown = 1 << 30 // | index of the decision message on its edge
)

// mailbox takes one peer's messages of a matched run in whatever order
// they come and hands each to the receive of its tag. It reads from the
// transport only while it has more receives posted than messages read, so
// it never takes a message of the next collective.
type mailbox struct {
	mu      sync.Mutex
	posted  int
	read    int
	reading bool
	msgs    map[uint32][]byte
	waiting map[uint32]chan struct{}
}

// mailRecv waits for the message with tag from peer.
func (r *runner) mailRecv(peer int, tag uint32) ([]byte, error) {
	mb := r.mail[peer]
	mb.mu.Lock()
	if _, dup := mb.waiting[tag]; dup {
		mb.mu.Unlock()
		return nil, fmt.Errorf("gocoll: two receives of tag %d from rank %d", tag, peer)
	}
	ch := make(chan struct{})
	mb.waiting[tag] = ch
	if _, in := mb.msgs[tag]; in {
		close(ch)
	}
	mb.posted++
	start := !mb.reading && mb.read < mb.posted
	mb.reading = mb.reading || start
	mb.mu.Unlock()
	if start {
		r.wg.Add(1)
		go r.readMail(peer)
	}
	select {
	case <-ch:
	case <-r.failed:
		return nil, errStopped
	}
	mb.mu.Lock()
	defer mb.mu.Unlock()
	msg := mb.msgs[tag]
	delete(mb.msgs, tag)
	return msg, nil
}

// errStopped is what a wait returns once the run failed elsewhere (the
// first error is the run's).
var errStopped = fmt.Errorf("gocoll: stopped")

// readMail reads peer's messages while receives are posted for them.
func (r *runner) readMail(peer int) {
	defer r.wg.Done()
	mb := r.mail[peer]
	for {
		mb.mu.Lock()
		if mb.read >= mb.posted || r.stopped() {
			mb.reading = false
			mb.mu.Unlock()
			return
		}
		mb.mu.Unlock()
		h, msg, err := r.l.RecvVar(peer)
		if err != nil {
			r.fail(err)
			mb.mu.Lock()
			mb.reading = false
			mb.mu.Unlock()
			return
		}
		mb.mu.Lock()
		mb.read++
		if _, dup := mb.msgs[h.Step]; dup {
			mb.reading = false
			mb.mu.Unlock()
			r.fail(r.l.PeerError(peer, fmt.Errorf("%w: rank %d sent two messages with step %d", transport.ErrProtocol, peer, h.Step)))
			return
		}
		mb.msgs[h.Step] = msg
		if ch, ok := mb.waiting[h.Step]; ok {
			close(ch)
		}
		mb.mu.Unlock()
	}
}

// runTree runs the aggregated all-to-all for p's ranks and sub-groups
// under the control tree, over the call's layout (in block mode, whatever
// the collective).
func RunTree(l Link, p sched.Params, lay *Layout) error {
	p.ElemSize, p.Count = 1, 1
	tree, err := sched.NewTree(p)
	if err != nil {
		return fmt.Errorf("gocoll: %s control tree for %d ranks: %w", p.Coll, p.N, err)
	}
	n, me := l.Size(), l.Rank()
	r := newRunner(l, NoType, 0)
	r.blk = &blockState{lay: lay}
	defer r.blk.release(l.Pool())
	r.mail = make([]*mailbox, n)
	for i := range r.mail {
		r.mail[i] = &mailbox{msgs: map[uint32][]byte{}, waiting: map[uint32]chan struct{}{}}
	}
	r.sendMu = make([]sync.Mutex, n)

	// The data movement: batches of decisions, in the root's order.
	batches := make(chan []sched.Decision, tree.Subs()+1)
	issued := make(chan struct{})
	go func() {
		defer close(issued)
		ops := tree.RankOps(me)
		issue := func(o sched.Op) bool {
			if r.stopped() {
				return false
			}
			r.issue(&o)
			return true
		}
		ops.Prologue(issue)
		round := 0
		for b := range batches {
			// Take what else came meanwhile: one batch's sends go out
			// before any of its repacking waits.
			for more := true; more; {
				select {
				case next, ok := <-batches:
					b, more = append(b, next...), ok
				default:
					more = false
				}
			}
			ops.Batch(b, round, issue)
			round++
		}
		ops.Epilogue(round, issue)
	}()

	err = control(l, r, tree, batches)
	close(batches)
	<-issued
	r.wg.Wait()
	if r.err != nil {
		return r.err
	}
	if err != nil {
		return err
	}
	for peer, mb := range r.mail {
		if len(mb.msgs) > 0 || mb.read != mb.posted {
			return r.l.PeerError(peer, fmt.Errorf("%w: %d messages from rank %d left unread", transport.ErrProtocol, len(mb.msgs), peer))
		}
	}
	return nil
}

// controlEvent is a control message received from a neighbour, or why none was.
type controlEvent struct {
	from int
	msg  []byte
	err  error
}

// control runs this rank's node of the tree until it has sent and
// received every control message, handing decisions to batches.
func control(l Link, r *runner, tree *sched.Tree, batches chan<- []sched.Decision) error {
	me := l.Rank()
	node := tree.Node(me)
	parent, children := tree.Parent(me), tree.Children(me)
	events := make(chan controlEvent, len(children)+1)
	sentUp, sentDown := 0, map[int]int{}
	gotUp, gotDown := map[int]int{}, 0
	outstanding := 0
	post := func(from int, tag uint32) {
		outstanding++
		go func() {
			msg, err := r.mailRecv(from, tag)
			events <- controlEvent{from, msg, err}
		}()
	}
	// expect posts the next receive from each neighbour that has more to
	// say and none posted.
	posted := map[int]bool{}
	expect := func() {
		for _, c := range children {
			if !posted[c] && node.ExpectsUp(c) {
				posted[c] = true
				post(c, TagUp|uint32(gotUp[c]))
			}
		}
		if parent >= 0 && !posted[parent] && !node.Complete() {
			posted[parent] = true
			post(parent, TagDown|uint32(gotDown))
		}
	}
	act := func(out []sched.Msg, decided []sched.Decision) error {
		for _, m := range out {
			tag := TagUp | uint32(sentUp)
			if m.Up {
				sentUp++
			} else {
				tag = TagDown | uint32(sentDown[m.To])
				sentDown[m.To]++
			}
			if err := r.sendMsg(m.To, int(tag), encodeControl(m)); err != nil {
				return err
			}
		}
		if len(decided) > 0 {
			batches <- slices.Clone(decided)
		}
		return nil
	}
	// stop fails the run and drains the other receives, which return
	// once it stopped.
	stop := func(err error) error {
		r.fail(err)
		for ; outstanding > 0; outstanding-- {
			<-events
		}
		return err
	}
	if err := act(node.Arrive()); err != nil {
		r.fail(err)
		return err
	}
	expect()
	for outstanding > 0 {
		ev := <-events
		outstanding--
		posted[ev.from] = false
		if ev.err != nil {
			return stop(ev.err)
		}
		var out []sched.Msg
		var decided []sched.Decision
		var err error
		if ev.from == parent {
			gotDown++
			var ds []sched.Decision
			if ds, err = decodeDecisions(ev.msg); err == nil {
				out, decided, err = node.Down(ds)
			}
		} else {
			gotUp[ev.from]++
			var ranks []int
			if ranks, err = decodeRanks(ev.msg); err == nil {
				out, decided, err = node.Up(ev.from, ranks)
			}
		}
		l.Pool().Put(ev.msg)
		if err == nil {
			err = act(out, decided)
		}
		if err != nil {
			return stop(l.PeerError(ev.from, err))
		}
		expect()
	}
	return nil
}

// encodeControl is a control message's body: the ranks of a registration
// (up), the decisions of a reply (down), 32-bit little-endian each.
func encodeControl(m sched.Msg) []byte {
	if m.Up {
		body := make([]byte, 4*len(m.Ranks))
		for i, q := range m.Ranks {
			binary.LittleEndian.PutUint32(body[4*i:], uint32(q))
		}
		return body
	}
	body := make([]byte, 8*len(m.Decisions))
	for i, d := range m.Decisions {
		binary.LittleEndian.PutUint32(body[8*i:], uint32(d.Sub))
		binary.LittleEndian.PutUint32(body[8*i+4:], uint32(d.Rep))
	}
	return body
}

func decodeDecisions(msg []byte) ([]sched.Decision, error) {
	if len(msg)%8 != 0 || len(msg) == 0 {
		return nil, fmt.Errorf("%w: a %d-byte decision message", transport.ErrProtocol, len(msg))
	}
	ds := make([]sched.Decision, len(msg)/8)
	for i := range ds {
		ds[i] = sched.Decision{Sub: int(binary.LittleEndian.Uint32(msg[8*i:])), Rep: int(binary.LittleEndian.Uint32(msg[8*i+4:]))}
	}
	return ds, nil
}

func decodeRanks(msg []byte) ([]int, error) {
	if len(msg)%4 != 0 || len(msg) == 0 {
		return nil, fmt.Errorf("%w: a %d-byte registration message", transport.ErrProtocol, len(msg))
	}
	ranks := make([]int, len(msg)/4)
	for i := range ranks {
		ranks[i] = int(binary.LittleEndian.Uint32(msg[4*i:]))
	}
	return ranks, nil
}
