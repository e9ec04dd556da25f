package recovery

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// TestCtlFramesAuthenticated: after the handshake every control frame
// carries a MAC under the connection's session key: a frame altered, or
// one recorded on one connection and replayed on another (same secret,
// same rank), is refused and the connection dropped as down — never
// delivered.
func TestCtlFramesAuthenticated(t *testing.T) {
	secret, tag := []byte("ctl-frames-secret"), [8]byte{1, 2, 3}
	ln, err := tcp.Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{ln.Addr().String(), "127.0.0.1:1"}
	ctl := NewTCP(0, addrs, secret, tag, 5*time.Second, ln, slog.New(slog.DiscardHandler))
	defer ctl.Close()
	dial := func() *Conn {
		c, err := net.Dial("tcp", addrs[0])
		if err != nil {
			t.Fatal(err)
		}
		_, key, err := tcp.ClientHandshakeSession(c, secret, ctlTag(tag), 1, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return &Conn{Conn: c, key: key, dialled: true}
	}
	next := func() Event {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ev, err := ctl.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	// A good frame is delivered; record its bytes.
	a := dial()
	rec := &tapeConn{Conn: a.Conn}
	a.Conn = rec
	if err := a.WriteMsg(Msg{Inst: 7, Round: 1, Blob: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.down || ev.from != 1 || string(ev.msg.Blob) != "hello" {
		t.Fatalf("good frame: %+v", ev)
	}
	// An altered frame on the same connection.
	frame := append([]byte(nil), rec.b...)
	frame[4+2] ^= 1 // a byte of the JSON
	binary.LittleEndian.PutUint32(frame, binary.LittleEndian.Uint32(rec.b))
	if _, err := a.Conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	if ev := next(); !ev.down || !strings.Contains(ev.why, "authentication") {
		t.Fatalf("altered frame: %+v, want the connection down for a failed MAC", ev)
	}
	// The recorded bytes replayed on a new connection of rank 1 (its one
	// connection now: see TestCtlDuplicateRank).
	b := dial()
	if _, err := b.Conn.Write(rec.b); err != nil {
		t.Fatal(err)
	}
	if ev := next(); !ev.down || ev.dead || !strings.Contains(ev.why, "authentication") {
		t.Fatalf("replayed frame: %+v, want the connection down for a failed MAC", ev)
	}
}

// tapeConn keeps what is written through it.
type tapeConn struct {
	net.Conn
	b []byte
}

func (r *tapeConn) Write(p []byte) (int, error) {
	r.b = append(r.b, p...)
	return r.Conn.Write(p)
}

// TestCtlGoodbye: a peer that closes its control mesh (its communicators
// destroyed, its process alive) is down, never dead, on both of its
// connections and on every later dial that finds nothing listening; one
// that crashes is dead. Counting the first dead let a coordinator paused
// past the timeout, resumed after the others had moved on, agree a view
// of its own (chaos seed 1002).
func TestCtlGoodbye(t *testing.T) {
	for _, bye := range []bool{true, false} {
		secret, tag := []byte("ctl-bye-secret"), [8]byte{4, 5, 6}
		lns := make([]net.Listener, 2)
		addrs := make([]string, 2)
		for i := range lns {
			ln, err := tcp.Listen("127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			lns[i], addrs[i] = ln, ln.Addr().String()
		}
		a := NewTCP(0, addrs, secret, tag, 5*time.Second, lns[0], slog.New(slog.DiscardHandler))
		b := NewTCP(1, addrs, secret, tag, 5*time.Second, lns[1], slog.New(slog.DiscardHandler))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		// Both directions connected: each sends, each receives.
		a.Send(1, Msg{Inst: 1, Round: 1, Blob: []byte("a")})
		b.Send(0, Msg{Inst: 1, Round: 1, Blob: []byte("b")})
		for _, c := range []*TCP{a, b} {
			if ev, err := c.Next(ctx); err != nil || ev.down {
				t.Fatalf("bye=%v: %+v %v", bye, ev, err)
			}
		}
		if bye {
			b.Close()
		} else {
			b.Crash()
		}
		// Its two connections, then a message to it: a new dial refused.
		ev, err := a.Next(ctx)
		if err != nil || !ev.down || ev.dead == bye {
			t.Fatalf("bye=%v: first event %+v %v, want down and dead=%v", bye, ev, err, !bye)
		}
		if bye {
			// The other connection's goodbye; a message to it, whose
			// write fails; another, whose dial is refused three times:
			// down, never dead.
			for i := range 3 {
				if i > 0 {
					a.Send(1, Msg{Inst: 2, Round: 1, Blob: []byte("again")})
				}
				ev, err := a.Next(ctx)
				if err != nil || !ev.down || ev.dead {
					t.Fatalf("event %d after the goodbye: %+v %v, want down and not dead", i+2, ev, err)
				}
			}
		}
		cancel()
		a.Close()
	}
}

// ctlRank0 is rank 0's control mesh of a communicator of size ranks
// (the others' addresses lead nowhere), with a dial that authenticates as
// rank r of it and next, its next event.
func ctlRank0(t *testing.T, size int, secret []byte, tag [8]byte) (*TCP, func(r int) *Conn, func() Event) {
	t.Helper()
	ln, err := tcp.Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{ln.Addr().String()}
	for range size - 1 {
		addrs = append(addrs, "127.0.0.1:1")
	}
	ctl := NewTCP(0, addrs, secret, tag, 5*time.Second, ln, slog.New(slog.DiscardHandler))
	t.Cleanup(ctl.Close)
	dial := func(r int) *Conn {
		t.Helper()
		c, err := net.Dial("tcp", addrs[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, key, err := tcp.ClientHandshakeSession(c, secret, ctlTag(tag), r, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return &Conn{Conn: c, key: key, dialled: true}
	}
	next := func() Event {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ev, err := ctl.Next(ctx)
		if err != nil {
			t.Fatalf("no control event within 5 s: %v", err)
		}
		return ev
	}
	return ctl, dial, next
}

// TestCtlDuplicateRank: a rank has one incoming control connection. A
// second one authenticated as the same rank (a redial after a link that
// broke without the listener seeing it; or a holder of the secret) replaces
// the first, which the listener closes without reporting the rank down;
// only the newer one's frames are the rank's from then on, and its end is
// the rank's end. Before, both were served at once, and the older one's
// end reported down a rank whose newer connection was alive.
func TestCtlDuplicateRank(t *testing.T) {
	_, dial, next := ctlRank0(t, 3, []byte("ctl-dup-secret"), [8]byte{7})
	send := func(c *Conn, s string) {
		t.Helper()
		if err := c.WriteMsg(Msg{Inst: 1, Round: 1, Blob: []byte(s)}); err != nil {
			t.Fatal(err)
		}
	}
	old := dial(1)
	send(old, "old")
	if ev := next(); ev.down || ev.from != 1 || string(ev.msg.Blob) != "old" {
		t.Fatalf("first connection's frame: %+v", ev)
	}
	cur := dial(1)
	old.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := old.ReadMsg(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the older connection of rank 1 is still open after a newer one authenticated (read: %v)", err)
	}
	old.WriteMsg(Msg{Inst: 1, Round: 2, Blob: []byte("stale")}) // nobody reads it
	send(cur, "new")
	if ev := next(); ev.down || ev.from != 1 || string(ev.msg.Blob) != "new" {
		t.Fatalf("after the older connection closed: %+v, want the newer one's frame (rank 1 is not down)", ev)
	}
	cur.Close()
	if ev := next(); !ev.down || ev.from != 1 {
		t.Fatalf("after rank 1's current connection closed: %+v, want it down", ev)
	}
}

// TestCtlFrameBinding: a frame is rank r's only on the connection that
// authenticated as r, for this communicator: one recorded on rank 2's
// connection and sent on rank 1's, or recorded on a connection to another
// communicator's mesh (same secret, same rank), fails its MAC and drops
// the connection; nothing is delivered as anyone's. (This held before
// the connection binding too: a frame names no sender, and its MAC key is
// the handshake's session key, derived from the tag and both ranks.)
func TestCtlFrameBinding(t *testing.T) {
	secret := []byte("ctl-bind-secret")
	_, dial, next := ctlRank0(t, 3, secret, [8]byte{8})
	record := func(c *Conn) []byte {
		rec := &tapeConn{Conn: c.Conn}
		c.Conn = rec
		if err := c.WriteMsg(Msg{Inst: 1, Round: 1, Blob: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		return rec.b
	}
	two := record(dial(2))
	if ev := next(); ev.down || ev.from != 2 {
		t.Fatalf("rank 2's frame: %+v", ev)
	}
	one := dial(1)
	if _, err := one.Conn.Write(two); err != nil {
		t.Fatal(err)
	}
	if ev := next(); !ev.down || ev.from != 1 || ev.dead || !strings.Contains(ev.why, "authentication") {
		t.Fatalf("rank 2's frame on rank 1's connection: %+v, want rank 1's connection down for a failed MAC", ev)
	}
	_, dialOther, nextOther := ctlRank0(t, 3, secret, [8]byte{9})
	other := record(dialOther(1))
	if ev := nextOther(); ev.down || ev.from != 1 {
		t.Fatalf("the other communicator's frame: %+v", ev)
	}
	one = dial(1)
	if _, err := one.Conn.Write(other); err != nil {
		t.Fatal(err)
	}
	if ev := next(); !ev.down || ev.from != 1 || !strings.Contains(ev.why, "authentication") {
		t.Fatalf("another communicator's frame: %+v, want the connection down for a failed MAC", ev)
	}
}

// TestCtlDialChecksRank: a mesh dialling rank 1 talks to rank 1 only: a
// listener at rank 1's address that authenticates as another rank of the
// communicator (rank 2: an address list gone stale, a port taken over) is
// refused, and rank 1 is down — not dead: its process may live on
// elsewhere. Before, the dialler ignored the rank the handshake
// authenticated: its messages for rank 1 reached rank 2, as rank 0's, and
// rank 2's goodbye or end would have been taken for rank 1's.
func TestCtlDialChecksRank(t *testing.T) {
	secret, tag := []byte("ctl-dial-secret"), [8]byte{10}
	lns := make([]net.Listener, 2)
	for i := range lns {
		ln, err := tcp.Listen("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
	}
	addrs := []string{lns[0].Addr().String(), lns[1].Addr().String(), lns[1].Addr().String()}
	a := NewTCP(0, addrs, secret, tag, 5*time.Second, lns[0], slog.New(slog.DiscardHandler))
	defer a.Close()
	b := NewTCP(2, addrs, secret, tag, 5*time.Second, lns[1], slog.New(slog.DiscardHandler))
	defer b.Close()
	a.Send(1, Msg{Inst: 1, Round: 1, Blob: []byte("for rank 1")})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ev, err := a.Next(ctx)
	if err != nil || !ev.down || ev.from != 1 || ev.dead || !strings.Contains(ev.why, "answered as rank 2") {
		t.Fatalf("dialling rank 1, rank 2 answering: %+v %v, want rank 1 down (not dead) for a wrong rank", ev, err)
	}
	// Rank 2 saw a connection from rank 0 come and go; never a message.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		ev, err := b.Next(ctx)
		cancel()
		if err != nil {
			break
		}
		if !ev.down {
			t.Fatalf("rank 2 received %+v, meant for rank 1", ev)
		}
	}
}

// TestCtlJoinerQueueBounded: rank 0 keeps at most MaxJoiners processes
// waiting to join; one more is refused in its handshake, with an error
// naming the bound (its Join fails at once rather than waiting out its
// timeout), while one that went away while it waited, or that a Grow took
// and closed, gives its place back. Before, every process that asked was
// kept, with its descriptor, until a Grow took it.
func TestCtlJoinerQueueBounded(t *testing.T) {
	secret, tag := []byte("ctl-join-secret"), [8]byte{11}
	ln, err := tcp.Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{ln.Addr().String(), "127.0.0.1:1"}
	ctl := NewTCP(0, addrs, secret, tag, 5*time.Second, ln, slog.New(slog.DiscardHandler))
	ctl.mu.Lock()
	ctl.maxJoiners = 2
	ctl.mu.Unlock()
	s := New(Config{Rank: 0, Size: 2, Timeout: 5 * time.Second, Net: ctl})
	defer s.Release()
	join := func() (net.Conn, error) {
		c, err := net.Dial("tcp", addrs[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, _, err = tcp.ClientHandshakeSession(c, secret, GrowTag(tag), -1, time.Now().Add(5*time.Second))
		return c, err
	}
	waitJoiners := func(n int) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); s.Joiners() != n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%d joiners wait, want %d", s.Joiners(), n)
			}
		}
	}
	first, err := join()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := join(); err != nil {
		t.Fatal(err)
	}
	waitJoiners(2)
	_, err = join()
	if !errors.Is(err, tcp.ErrRefused) || !strings.Contains(err.Error(), "at most 2") {
		t.Fatalf("a third joiner with room for 2: %v, want refused naming the bound", err)
	}
	// The first goes away: its place is free once rank 0 sees it gone.
	first.Close()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err = join(); err == nil {
			break
		}
		if !errors.Is(err, tcp.ErrRefused) || time.Now().After(end) {
			t.Fatalf("a joiner after one went away: %v", err)
		}
	}
	waitJoiners(2)
	// A Grow takes one and closes it: its place is free at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	taken, _, err := s.TakeJoiners(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	taken[0].Close()
	if _, err := join(); err != nil {
		t.Fatalf("a joiner after a Grow took one: %v", err)
	}
	waitJoiners(2)
}
