package recovery

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
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
	// The same bytes replayed on another connection of rank 1.
	b := dial()
	if _, err := b.Conn.Write(rec.b); err != nil {
		t.Fatal(err)
	}
	if ev := next(); !ev.down || ev.dead || !strings.Contains(ev.why, "authentication") {
		t.Fatalf("replayed frame: %+v, want the connection down for a failed MAC", ev)
	}
	// An altered frame on the first connection.
	frame := append([]byte(nil), rec.b...)
	frame[4+2] ^= 1 // a byte of the JSON
	binary.LittleEndian.PutUint32(frame, binary.LittleEndian.Uint32(rec.b))
	if _, err := a.Conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	if ev := next(); !ev.down || !strings.Contains(ev.why, "authentication") {
		t.Fatalf("altered frame: %+v, want the connection down for a failed MAC", ev)
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
