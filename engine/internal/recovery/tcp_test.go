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
