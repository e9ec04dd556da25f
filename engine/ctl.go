package engine

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/agree"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// The control mesh is a communicator's second set of links, apart from the
// transport its collectives use: the one Shrink agrees and rebuilds over
// after the transport failed or was revoked (an abort poisons every
// connection of the transport, on purpose). Its messages are few and small;
// a peer whose control connection breaks, or cannot be opened, is reported
// as down.

// ctlMsg is one control message: an agreement message or a setup blob, of
// agreement instance Inst (see shrinker).
type ctlMsg struct {
	Inst  uint64     `json:"i"`
	Agree *agree.Msg `json:"a,omitempty"`
	Round int        `json:"r,omitempty"` // setup exchange round, from 1
	Blob  []byte     `json:"b,omitempty"`
	// Table: the round's blobs of every member, from the exchange's root
	// (see recoverer.exchange).
	Table [][]byte `json:"t,omitempty"`
	// Lost: the root gave the round up because this rank (+1) of the
	// communicator being shrunk was lost, with why.
	Lost int      `json:"l,omitempty"`
	Why  string   `json:"w,omitempty"`
	Grow *growMsg `json:"g,omitempty"`
	// Bye: the sender closes its control mesh on purpose (every
	// communicator that used it was destroyed). Its process lives on and
	// is done with this mesh's agreements: down, never dead, so that a
	// rank resumed after the others moved on (a zombie) cannot count them
	// dead and agree a view of its own.
	Bye bool `json:"y,omitempty"`
}

// ctlEvent is what the mesh delivers: a message from a peer, or that the
// peer is down.
type ctlEvent struct {
	from int
	down bool
	dead bool   // down because its process ended (transport.Died), not a silence
	why  string // down: what broke
	msg  ctlMsg
	conn *ctlConn // grow: the joiner's connection (from is -1)
}

// ctlNet is one rank's end of a control mesh.
type ctlNet interface {
	// send queues m for peer to; it never blocks. A failure to deliver
	// comes back as a down event.
	send(to int, m ctlMsg)
	// next waits for the next event, or ctx's end.
	next(ctx context.Context) (ctlEvent, error)
	// close ends this rank's end with a goodbye: its peers see it down,
	// not dead.
	close()
	// crash ends it as a process's death does (tests): no goodbye.
	crash()
}

// ctlQueue is an unbounded FIFO of events.
type ctlQueue struct {
	mu     sync.Mutex
	items  []ctlEvent
	notify chan struct{}
}

func newCtlQueue() *ctlQueue { return &ctlQueue{notify: make(chan struct{}, 1)} }

func (q *ctlQueue) push(e ctlEvent) {
	q.mu.Lock()
	q.items = append(q.items, e)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *ctlQueue) next(ctx context.Context) (ctlEvent, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			e := q.items[0]
			q.items[0] = ctlEvent{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return e, nil
		}
		q.mu.Unlock()
		select {
		case <-q.notify:
		case <-ctx.Done():
			return ctlEvent{}, ctx.Err()
		}
	}
}

// localCtlWorld is the control mesh of in-process ranks.
type localCtlWorld struct {
	mu     sync.Mutex
	queues []*ctlQueue
	closed []bool
	left   []bool // closed with a goodbye (close, not crash)
	// cut, when set (tests), loses every message from one rank to another
	// for which it holds, silently: a network partition.
	cut func(from, to int) bool
}

func newLocalCtlWorld(n int) *localCtlWorld {
	w := &localCtlWorld{queues: make([]*ctlQueue, n), closed: make([]bool, n), left: make([]bool, n)}
	for i := range w.queues {
		w.queues[i] = newCtlQueue()
	}
	return w
}

type localCtl struct {
	w  *localCtlWorld
	me int
}

func (l localCtl) send(to int, m ctlMsg) {
	l.w.mu.Lock()
	gone, self, left := l.w.closed[to], l.w.closed[l.me], l.w.left[to]
	lost := l.w.cut != nil && l.w.cut(l.me, to)
	l.w.mu.Unlock()
	switch {
	case self, lost:
	case gone:
		l.w.queues[l.me].push(ctlEvent{from: to, down: true, dead: !left, why: "its control link closed"})
	default:
		l.w.queues[to].push(ctlEvent{from: l.me, msg: m})
	}
}

func (l localCtl) next(ctx context.Context) (ctlEvent, error) { return l.w.queues[l.me].next(ctx) }

func (l localCtl) close() { l.end(true) }

// crash is what a process's death looks like to the others.
func (l localCtl) crash() { l.end(false) }

func (l localCtl) end(bye bool) {
	l.w.mu.Lock()
	if l.w.closed[l.me] {
		l.w.mu.Unlock()
		return
	}
	l.w.closed[l.me], l.w.left[l.me] = true, bye
	l.w.mu.Unlock()
	why := "its control link closed"
	if bye {
		why = ctlByeWhy
	}
	for q := range l.w.queues {
		if q != l.me {
			l.w.queues[q].push(ctlEvent{from: l.me, down: true, dead: !bye, why: why})
		}
	}
}

// ctlByeWhy is why a peer that said goodbye is down.
const ctlByeWhy = "it closed its control links (its communicators were destroyed)"

// ctlTag is the handshake tag of the control mesh of the communicator
// tagged tag: never a data connection's.
func ctlTag(tag [8]byte) [8]byte {
	sum := sha256.Sum256(append([]byte("gocoll-ctl\x00"), tag[:]...))
	var t [8]byte
	copy(t[:], sum[:])
	return t
}

// maxCtlFrame bounds a control message (a setup blob is a few hundred
// bytes per rank).
const maxCtlFrame = 16 << 20

// The control listener is open while the job runs, so it must shrug off
// whatever reaches it without turning load into exclusions: each
// connection has ctlHelloTime to prove it holds the secret, and past
// ctlMaxPending in their handshake at once the oldest is closed to make
// room (a flood of idle connections costs a member a redial, never its
// place: writers redial until the timeout).
const (
	ctlMinPending = 64
	ctlMaxPending = 1024
	ctlHelloTime  = 5 * time.Second
	// ctlRefusedDown: refused dials in a row after which a peer is down:
	// its listener was open since the communicator was made, so nobody
	// listening means its process (or its recovery state) is gone.
	ctlRefusedDown = 3
	// ctlByeTime bounds the goodbyes of close: a stopped peer's socket
	// buffer takes them; one whose buffer is full does without.
	ctlByeTime = 100 * time.Millisecond
)

// tcpCtl is the control mesh over TCP: each rank listens from the
// communicator's creation (a rank still inside a collective must not look
// dead to one that started recovering) and dials a peer on the first
// message to it; connections are authenticated as the data connections
// are (the job's secret), under the mesh's own tag.
type tcpCtl struct {
	me      int
	addrs   []string
	secret  []byte
	tag     [8]byte
	timeout time.Duration
	ln      net.Listener
	q       *ctlQueue
	// growTag, when set, is the tag a joining process presents (see Grow):
	// its connection is handed over whole.
	growTag [8]byte
	log     *slog.Logger
	life    context.Context // ends at close: dials stop
	halt    context.CancelFunc

	mu         sync.Mutex
	closed     bool
	out        map[int]*ctlOutbox
	served     map[*ctlConn]bool // incoming, authenticated: close says goodbye on them
	left       map[int]bool      // peers that said goodbye: never dead after that
	writers    sync.WaitGroup
	conns      map[net.Conn]bool
	pending    []net.Conn // in their handshake, oldest first
	maxPending int
	wg         sync.WaitGroup
}

type ctlOutbox struct {
	mu     sync.Mutex
	msgs   []ctlMsg
	notify chan struct{}
}

func newTCPCtl(me int, addrs []string, secret []byte, tag [8]byte, timeout time.Duration, ln net.Listener, log *slog.Logger) *tcpCtl {
	life, halt := context.WithCancel(context.Background())
	t := &tcpCtl{me: me, log: log, addrs: addrs, secret: secret, tag: ctlTag(tag), timeout: timeout, ln: ln,
		q: newCtlQueue(), out: map[int]*ctlOutbox{}, served: map[*ctlConn]bool{}, left: map[int]bool{},
		conns: map[net.Conn]bool{}, life: life, halt: halt,
		maxPending: min(max(2*len(addrs), ctlMinPending), ctlMaxPending)}
	t.growTag = growTag(tag)
	t.wg.Add(1)
	go t.accept()
	return t
}

func (t *tcpCtl) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return false
	}
	t.conns[c] = true
	return true
}

func (t *tcpCtl) untrack(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	c.Close()
}

// handshaking adds c to the connections in their handshake, closing the
// oldest past maxPending; done takes it off.
func (t *tcpCtl) handshaking(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pending) >= t.maxPending {
		t.pending[0].Close()
		t.pending = t.pending[1:]
	}
	t.pending = append(t.pending, c)
}

func (t *tcpCtl) done(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.pending, c); i >= 0 {
		t.pending = slices.Delete(t.pending, i, i+1)
	}
}

func (t *tcpCtl) accept() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || t.life.Err() != nil {
				return
			}
			t.log.Warn("control: accept failed", "err", tcp.DescribeLimit(err))
			select {
			case <-time.After(50 * time.Millisecond):
			case <-t.life.Done():
				return
			}
			continue
		}
		if !t.track(c) {
			return
		}
		t.handshaking(c)
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			t.serve(c)
		}()
	}
}

// serve authenticates an incoming connection and reads its messages.
func (t *tcpCtl) serve(c net.Conn) {
	deadline := time.Now().Add(min(t.timeout, ctlHelloTime))
	rc := &replayConn{Conn: c}
	grow := isGrowHello(rc, t.growTag, deadline)
	tag := t.tag
	if grow {
		tag = t.growTag
	}
	peer, key, err := tcp.ServerHandshakeSession(rc, t.secret, tag, t.me, deadline, func(p int) error {
		if !grow && (p < 0 || p >= len(t.addrs) || p == t.me) {
			return fmt.Errorf("rank %d is not a member", p)
		}
		return nil
	})
	t.done(c)
	if err != nil {
		if grow {
			t.log.Info("refused a process asking to join", "from", c.RemoteAddr(), "err", err)
		}
		t.untrack(c)
		return
	}
	cc := &ctlConn{Conn: rc, key: key}
	if grow {
		// A process asking to join: the members' Grow reads it.
		t.q.push(ctlEvent{from: -1, conn: cc})
		return
	}
	c.SetDeadline(time.Time{})
	t.mu.Lock()
	t.served[cc] = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.served, cc)
		t.mu.Unlock()
	}()
	for {
		m, err := cc.read()
		if err == nil && !m.Bye {
			t.q.push(ctlEvent{from: peer, msg: m})
			continue
		}
		t.untrack(c)
		t.lost(peer, err)
		return
	}
}

// lost reports peer down after its connection ended with err (nil: a
// goodbye): dead when the connection's end shows its process ended,
// unless it said goodbye before.
func (t *tcpCtl) lost(peer int, err error) {
	t.mu.Lock()
	if err == nil {
		t.left[peer] = true
	}
	left, closed := t.left[peer], t.closed
	t.mu.Unlock()
	if closed {
		return
	}
	why := "its control connection closed (process gone?)"
	switch {
	case left:
		why = ctlByeWhy
	case !errors.Is(err, io.EOF):
		why = err.Error()
	}
	t.q.push(ctlEvent{from: peer, down: true, dead: !left && transport.Died(err), why: why})
}

func (t *tcpCtl) send(to int, m ctlMsg) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	ob := t.out[to]
	if ob == nil {
		ob = &ctlOutbox{notify: make(chan struct{}, 1)}
		t.out[to] = ob
		t.writers.Add(1)
		go t.writer(to, ob)
	}
	t.mu.Unlock()
	ob.mu.Lock()
	ob.msgs = append(ob.msgs, m)
	ob.mu.Unlock()
	select {
	case ob.notify <- struct{}{}:
	default:
	}
}

// writer dials peer to and writes its queued messages in order. After a
// failure it reports the peer down and lets the outbox go, with what it
// held: the agreement fences a peer that is down, and a later message to
// it (telling it it is out) starts a new writer.
func (t *tcpCtl) writer(to int, ob *ctlOutbox) {
	defer t.writers.Done()
	down := func(why string, dead bool) {
		t.mu.Lock()
		if t.out[to] == ob {
			delete(t.out, to)
		}
		left := t.left[to]
		t.mu.Unlock()
		if why != "" {
			t.q.push(ctlEvent{from: to, down: true, dead: dead && !left, why: why})
		}
	}
	c, why, dead := t.dial(to)
	if c == nil {
		down(why, dead)
		return
	}
	// The peer writes on this connection only its goodbye: a read ends
	// when it goes away, which a rank that only sends to it (a member
	// waiting for its setup data) must learn without writing again.
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for {
			m, err := c.read()
			if err == nil && !m.Bye {
				continue
			}
			t.lost(to, err)
			// The writer's next message fails at once and lets the
			// outbox go: a later one dials anew.
			c.Close()
			return
		}
	}()
	for {
		<-ob.notify
		ob.mu.Lock()
		msgs := ob.msgs
		ob.msgs = nil
		ob.mu.Unlock()
		t.mu.Lock()
		closed := t.closed
		t.mu.Unlock()
		if closed {
			c.SetWriteDeadline(time.Now().Add(ctlByeTime))
			c.write(ctlMsg{Bye: true})
			return
		}
		for _, m := range msgs {
			t.mu.Lock()
			closed := t.closed
			t.mu.Unlock()
			if closed {
				break // its goodbye, next round
			}
			c.SetWriteDeadline(time.Now().Add(t.timeout))
			if err := c.write(m); err != nil {
				t.untrack(c.Conn)
				down(fmt.Sprintf("control write: %v", err), transport.Died(err))
				return
			}
		}
	}
}

// dial connects to peer to's control listener, retrying with backoff
// until the mesh closes: a peer that is slow to answer (busy, stopped, or
// behind a flood of connections on its port) is not down — whether its
// silence lasted too long is the recovery loop's to judge, with the
// patience its place in the agreement calls for. It gives up at once on a
// wrong endpoint, and after ctlRefusedDown refusals in a row (nobody
// listens: dead). why is empty when the mesh closed meanwhile.
func (t *tcpCtl) dial(to int) (c *ctlConn, why string, dead bool) {
	backoff, refused := 5*time.Millisecond, 0
	for {
		c, err := t.dialOnce(t.life, to)
		if err == nil {
			return c, "", false
		}
		if t.life.Err() != nil {
			return nil, "", false
		}
		switch {
		case errors.Is(err, tcp.ErrAuth) || errors.Is(err, tcp.ErrRefused):
			return nil, fmt.Sprintf("control handshake: %v", err), false
		case errors.Is(err, syscall.ECONNREFUSED):
			if refused++; refused >= ctlRefusedDown {
				return nil, fmt.Sprintf("nothing listens at its control address %s (process gone?): %v", t.addrs[to], err), true
			}
		default:
			refused = 0
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, time.Second)
		select {
		case <-time.After(sleep):
		case <-t.life.Done():
			return nil, "", false
		}
	}
}

func (t *tcpCtl) dialOnce(ctx context.Context, to int) (*ctlConn, error) {
	var d net.Dialer
	dctx, dcancel := context.WithTimeout(ctx, tcp.DefaultHandshakeTimeout)
	defer dcancel()
	c, err := d.DialContext(dctx, "tcp", t.addrs[to])
	if err != nil {
		return nil, err
	}
	if !t.track(c) {
		return nil, net.ErrClosed
	}
	deadline, _ := dctx.Deadline()
	stop := context.AfterFunc(dctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	_, key, err := tcp.ClientHandshakeSession(c, t.secret, t.tag, t.me, deadline)
	stop()
	if err != nil {
		t.untrack(c)
		return nil, err
	}
	return &ctlConn{Conn: c, key: key, dialled: true}, nil
}

func (t *tcpCtl) next(ctx context.Context) (ctlEvent, error) { return t.q.next(ctx) }

// close says goodbye on every connection, then closes them.
func (t *tcpCtl) close() { t.end(true) }

// crash closes every connection without a goodbye, as a death would.
func (t *tcpCtl) crash() { t.end(false) }

func (t *tcpCtl) end(bye bool) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.halt()
	t.ln.Close()
	for c := range t.conns {
		if bye {
			// A write blocked on a peer that does not read ends now.
			c.SetWriteDeadline(time.Now().Add(ctlByeTime))
		} else {
			c.Close()
		}
	}
	var served []*ctlConn
	for cc := range t.served {
		served = append(served, cc)
	}
	for _, ob := range t.out {
		select {
		case ob.notify <- struct{}{}:
		default:
		}
	}
	t.mu.Unlock()
	if bye {
		// Only close writes on an incoming connection; each writer says
		// its own goodbye on the way out.
		for _, cc := range served {
			cc.SetWriteDeadline(time.Now().Add(ctlByeTime))
			cc.write(ctlMsg{Bye: true})
		}
	}
	t.writers.Wait()
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}

// ctlConn is one authenticated control connection: every frame carries
// a MAC under the session key of its handshake (tcp.ServerHandshakeSession)
// over its direction and number, so that after the handshake nobody
// without the key can inject, replay, reorder or reflect a frame, or
// splice a stream of another connection in.
type ctlConn struct {
	net.Conn
	key       []byte
	dialled   bool   // this end dialled: its frames go client → server
	sent, got uint64 // frames written and read
}

const ctlMACSize = 16

// ctlMAC is the MAC of frame number seq with payload b, going from the
// dialler (toServer) or back.
func ctlMAC(key []byte, toServer bool, seq uint64, b []byte) []byte {
	m := hmac.New(sha256.New, key)
	dir := byte('s')
	if toServer {
		dir = 'c'
	}
	var h [9]byte
	h[0] = dir
	binary.LittleEndian.PutUint64(h[1:], seq)
	m.Write(h[:])
	m.Write(b)
	return m.Sum(nil)[:ctlMACSize]
}

func (c *ctlConn) write(m ctlMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	frame := make([]byte, 4, 4+len(b)+ctlMACSize)
	binary.LittleEndian.PutUint32(frame, uint32(len(b)))
	frame = append(frame, b...)
	frame = append(frame, ctlMAC(c.key, c.dialled, c.sent, b)...)
	c.sent++
	_, err = c.Conn.Write(frame)
	return err
}

// errCtlForged: a control frame whose MAC does not check.
var errCtlForged = errors.New("control message failed authentication (not from the peer that connected, or altered)")

func (c *ctlConn) read() (ctlMsg, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
		return ctlMsg{}, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > maxCtlFrame {
		return ctlMsg{}, fmt.Errorf("control message of %d bytes (at most %d)", n, maxCtlFrame)
	}
	b := make([]byte, int(n)+ctlMACSize)
	if _, err := io.ReadFull(c.Conn, b); err != nil {
		return ctlMsg{}, err
	}
	b, mac := b[:n], b[n:]
	if !hmac.Equal(mac, ctlMAC(c.key, !c.dialled, c.got, b)) {
		return ctlMsg{}, errCtlForged
	}
	c.got++
	var m ctlMsg
	if err := json.Unmarshal(b, &m); err != nil {
		return ctlMsg{}, fmt.Errorf("control message: %w", err)
	}
	return m, nil
}
