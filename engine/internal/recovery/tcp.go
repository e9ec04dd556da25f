package recovery

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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

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
	// ctlByeTime bounds the goodbyes of Close: a stopped peer's socket
	// buffer takes them; one whose buffer is full does without.
	ctlByeTime = 100 * time.Millisecond
)

// TCP is the control mesh over TCP: each rank listens from the
// communicator's creation (a rank still inside a collective must not look
// dead to one that started recovering) and dials a peer on the first
// message to it; connections are authenticated as the data connections
// are (the job's secret), under the mesh's own tag.
type TCP struct {
	me      int
	addrs   []string
	secret  []byte
	tag     [8]byte
	timeout time.Duration
	ln      net.Listener
	q       *queue
	// growTag, when set, is the tag a joining process presents (see engine.Comm.Grow):
	// its connection is handed over whole.
	growTag [8]byte
	log     *slog.Logger
	life    context.Context // ends at close: dials stop
	halt    context.CancelFunc

	mu     sync.Mutex
	closed bool
	out    map[int]*ctlOutbox
	// in is each peer's one incoming connection: the newest it
	// authenticated (see bind). Close says goodbye on them.
	in         map[int]*Conn
	left       map[int]bool // peers that said goodbye: never dead after that
	writers    sync.WaitGroup
	conns      map[net.Conn]bool
	pending    []net.Conn // in their handshake, oldest first
	maxPending int
	// joining: the processes asking to join that were handed over (see
	// Grow) and not closed yet; joinSlots of maxJoiners more are held by
	// handshakes under way.
	joining    map[*Conn]bool
	joinSlots  int
	maxJoiners int
	wg         sync.WaitGroup
}

type ctlOutbox struct {
	mu     sync.Mutex
	msgs   []Msg
	notify chan struct{}
}

// NewTCP is rank me's end of the control mesh of the communicator tagged
// tag, whose ranks listen at addrs (ln is this rank's listener: the mesh
// owns it from now on).
func NewTCP(me int, addrs []string, secret []byte, tag [8]byte, timeout time.Duration, ln net.Listener, log *slog.Logger) *TCP {
	life, halt := context.WithCancel(context.Background())
	t := &TCP{me: me, log: log, addrs: addrs, secret: secret, tag: ctlTag(tag), timeout: timeout, ln: ln,
		q: newQueue(), out: map[int]*ctlOutbox{}, in: map[int]*Conn{}, left: map[int]bool{},
		conns: map[net.Conn]bool{}, life: life, halt: halt,
		maxPending: min(max(2*len(addrs), ctlMinPending), ctlMaxPending),
		joining:    map[*Conn]bool{}, maxJoiners: MaxJoiners(len(addrs))}
	t.growTag = GrowTag(tag)
	t.wg.Add(1)
	go t.accept()
	return t
}

func (t *TCP) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return false
	}
	t.conns[c] = true
	return true
}

func (t *TCP) untrack(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	c.Close()
}

// handshaking adds c to the connections in their handshake, closing the
// oldest past maxPending; done takes it off.
func (t *TCP) handshaking(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pending) >= t.maxPending {
		t.pending[0].Close()
		t.pending = t.pending[1:]
	}
	t.pending = append(t.pending, c)
}

func (t *TCP) done(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.pending, c); i >= 0 {
		t.pending = slices.Delete(t.pending, i, i+1)
	}
}

func (t *TCP) accept() {
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
func (t *TCP) serve(c net.Conn) {
	deadline := time.Now().Add(min(t.timeout, ctlHelloTime))
	rc := &replayConn{Conn: c}
	grow := isGrowHello(rc, t.growTag, deadline)
	tag := t.tag
	if grow {
		tag = t.growTag
	}
	held := false // a joiner's place (holdJoiner), from the handshake's verdict on
	peer, key, err := tcp.ServerHandshakeSession(rc, t.secret, tag, t.me, deadline, func(p int) error {
		if grow {
			err := t.holdJoiner()
			held = err == nil
			return err
		}
		if p < 0 || p >= len(t.addrs) || p == t.me {
			return fmt.Errorf("rank %d is not a member", p)
		}
		return nil
	})
	t.done(c)
	if err != nil {
		if grow {
			t.log.Info("refused a process asking to join", "from", c.RemoteAddr(), "err", err)
		}
		if held {
			t.mu.Lock()
			t.joinSlots--
			t.mu.Unlock()
		}
		t.untrack(c)
		return
	}
	cc := &Conn{Conn: rc, key: key}
	if grow {
		// A process asking to join: the members' Grow reads it.
		t.handOver(cc)
		return
	}
	c.SetDeadline(time.Time{})
	if !t.bind(peer, cc) {
		t.untrack(c)
		return
	}
	for {
		m, err := cc.ReadMsg()
		t.mu.Lock()
		current := t.in[peer] == cc
		if current && err == nil && !m.Bye {
			t.q.push(Event{from: peer, msg: m})
			t.mu.Unlock()
			continue
		}
		if current {
			delete(t.in, peer)
		}
		t.mu.Unlock()
		t.untrack(c)
		if current {
			t.lost(peer, err)
		}
		return
	}
}

// bind makes cc, authenticated as rank peer, that peer's one incoming
// connection: its frames are the only ones delivered as peer's (a frame
// names no sender: it is the handshake's rank, whose session key its MAC
// is under), until it ends or peer connects again.
//
// A newer connection of a rank replaces the older one, which is closed
// without reporting the rank down, and whose frames are no longer
// delivered. A member's mesh dials a peer again only after its own end of
// the older connection failed; the listener may not have seen that end (a
// link that broke silently, a reset that never arrived), and refusing the
// redial while the older connection looks alive would leave a live member
// unable to reach this rank: taken for silent, then excluded. A holder of
// the secret can displace a member's connection this way, but it can as
// well claim the member's rank outright: the secret is the trust boundary
// (docs/trust.md). What binding does rule out is two connections speaking
// for one rank at once, and an older connection's end reporting down a
// rank whose newer connection is alive.
func (t *TCP) bind(peer int, cc *Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if old := t.in[peer]; old != nil {
		t.log.Info("control: a rank connected again; its older connection is closed", "peer", peer)
		old.Conn.Close()
	}
	t.in[peer] = cc
	return true
}

// MaxJoiners is how many processes may wait at once to join a
// communicator of size ranks (the control listener of its rank 0 refuses
// more, saying so): twice the size, so that every rank can be replaced
// and the job doubled in one Grow, and at least ctlMinJoiners; at most
// ctlMaxPending, as many as may be in their handshake. Each waiting
// process holds a descriptor on rank 0 until a Grow takes it.
func MaxJoiners(size int) int {
	return min(max(2*size, ctlMinJoiners), ctlMaxPending)
}

const ctlMinJoiners = 64

// holdJoiner takes a place for a process asking to join, once those that
// went away while they waited are dropped, or says why there is none: the
// refusal is the handshake's verdict, so the process's Join fails with it
// at once rather than waiting for a Grow that could never take it.
func (t *TCP) holdJoiner() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.joining)+t.joinSlots >= t.maxJoiners {
		for j := range t.joining {
			if j.gone() {
				// The recoverer drops it too (gone holds from now on).
				j.closed.Store(true)
				j.Conn.Close()
				delete(t.joining, j)
			}
		}
	}
	if n := len(t.joining) + t.joinSlots; n >= t.maxJoiners {
		return fmt.Errorf("%d processes already wait to join this communicator of %d ranks (at most %d may wait): ask again after the members' next Grow", n, len(t.addrs), t.maxJoiners)
	}
	t.joinSlots++
	return nil
}

// handOver passes cc, a process asking to join, to the recoverer; its
// place (holdJoiner) is given back when it is closed.
func (t *TCP) handOver(cc *Conn) {
	cc.onClose = func(j *Conn) {
		t.mu.Lock()
		delete(t.joining, j)
		t.mu.Unlock()
	}
	t.mu.Lock()
	t.joinSlots--
	t.joining[cc] = true
	t.mu.Unlock()
	t.q.push(Event{from: -1, conn: cc})
}

// lost reports peer down after its connection ended with err (nil: a
// goodbye): dead when the connection's end shows its process ended,
// unless it said goodbye before.
func (t *TCP) lost(peer int, err error) {
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
		why = byeWhy
	case !errors.Is(err, io.EOF):
		why = err.Error()
	}
	t.q.push(Event{from: peer, down: true, dead: !left && transport.Died(err), why: why})
}

func (t *TCP) Send(to int, m Msg) {
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
func (t *TCP) writer(to int, ob *ctlOutbox) {
	defer t.writers.Done()
	down := func(why string, dead bool) {
		t.mu.Lock()
		if t.out[to] == ob {
			delete(t.out, to)
		}
		left := t.left[to]
		t.mu.Unlock()
		if why != "" {
			t.q.push(Event{from: to, down: true, dead: dead && !left, why: why})
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
			m, err := c.ReadMsg()
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
			c.WriteMsg(Msg{Bye: true})
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
			if err := c.WriteMsg(m); err != nil {
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
func (t *TCP) dial(to int) (c *Conn, why string, dead bool) {
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

func (t *TCP) dialOnce(ctx context.Context, to int) (*Conn, error) {
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
	peer, key, err := tcp.ClientHandshakeSession(c, t.secret, t.tag, t.me, deadline)
	stop()
	if err == nil && peer != to {
		// Whatever answers at to's address speaks for the rank it
		// authenticated, not for to: what this rank sends on it, and the
		// goodbye or end it reads, would be taken for to's.
		err = fmt.Errorf("%w: %s, rank %d's control address, answered as rank %d", tcp.ErrAuth, t.addrs[to], to, peer)
	}
	if err != nil {
		t.untrack(c)
		return nil, err
	}
	return &Conn{Conn: c, key: key, dialled: true}, nil
}

// Addr is rank r's control address.
func (t *TCP) Addr(r int) string { return t.addrs[r] }

func (t *TCP) Next(ctx context.Context) (Event, error) { return t.q.next(ctx) }

// Close says goodbye on every connection, then closes them.
func (t *TCP) Close() { t.end(true) }

// Crash closes every connection without a goodbye, as a death would.
func (t *TCP) Crash() { t.end(false) }

func (t *TCP) end(bye bool) {
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
	var served []*Conn
	for _, cc := range t.in {
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
		// Only Close writes on an incoming connection; each writer says
		// its own goodbye on the way out.
		for _, cc := range served {
			cc.SetWriteDeadline(time.Now().Add(ctlByeTime))
			cc.WriteMsg(Msg{Bye: true})
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

// Conn is one authenticated control connection: every frame carries
// a MAC under the session key of its handshake (tcp.ServerHandshakeSession)
// over its direction and number, so that after the handshake nobody
// without the key can inject, replay, reorder or reflect a frame, or
// splice a stream of another connection in.
type Conn struct {
	net.Conn
	key       []byte
	dialled   bool   // this end dialled: its frames go client → server
	sent, got uint64 // frames written and read
	closed    atomic.Bool
	onClose   func(*Conn) // a joiner's: gives its place on the listener back
}

// Close closes the connection (a joiner's: giving its place back).
func (c *Conn) Close() error {
	c.closed.Store(true)
	if c.onClose != nil {
		c.onClose(c)
	}
	return c.Conn.Close()
}

// gone says whether c was closed here or by its peer (a process asking
// to join that went away while it waited): see tcp.Gone.
func (c *Conn) gone() bool {
	if c.closed.Load() {
		return true
	}
	raw := c.Conn
	if rc, ok := raw.(*replayConn); ok {
		raw = rc.Conn
	}
	return tcp.Gone(raw)
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

func (c *Conn) WriteMsg(m Msg) error {
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

func (c *Conn) ReadMsg() (Msg, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
		return Msg{}, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > maxCtlFrame {
		return Msg{}, fmt.Errorf("control message of %d bytes (at most %d)", n, maxCtlFrame)
	}
	b := make([]byte, int(n)+ctlMACSize)
	if _, err := io.ReadFull(c.Conn, b); err != nil {
		return Msg{}, err
	}
	b, mac := b[:n], b[n:]
	if !hmac.Equal(mac, ctlMAC(c.key, !c.dialled, c.got, b)) {
		return Msg{}, errCtlForged
	}
	c.got++
	var m Msg
	if err := json.Unmarshal(b, &m); err != nil {
		return Msg{}, fmt.Errorf("control message: %w", err)
	}
	return m, nil
}
