package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Errors of the connection handshake.
var (
	// ErrAuth: the other side does not hold the same secret and communicator
	// tag (or is not a gocoll endpoint at all).
	ErrAuth = errors.New("authentication failed")
	// ErrRefused: the other side authenticated but does not want this
	// connection (unexpected or duplicate rank); the text says why.
	ErrRefused = errors.New("connection refused by peer")
)

// The handshake, both directions authenticated (challenge-response, HMAC-SHA256):
//
//	client → server  hello   "GCHS" ver 0 0 0 | tag[8] | clientRank int32 | nonceC[32]   (52 B)
//	server → client  hello   "GCHS" ver 0 0 0 | serverRank int32 | nonceS[32] | macS[32] (76 B)
//	client → server  proof   macC[32]
//	server → client  verdict code u8 | len u16 | text      (code 0 = accepted, 1 = refused, 2/3: see verdicts)
//
//	macS = HMAC(secret, "gocoll/hs/server" | tag | clientRank | serverRank | nonceC | nonceS)
//	macC = HMAC(secret, "gocoll/hs/client" | tag | clientRank | serverRank | nonceC | nonceS)
//
// The server proves itself first, so a client talking to the wrong process
// (another job reusing the port, a wrong secret) learns it before it sends
// anything derived from the secret; distinct labels prevent reflecting one
// side's MAC back as the other's. The verdict is sent only to an
// authenticated client.
const (
	hsVersion      = 1
	nonceSize      = 32
	macSize        = sha256.Size
	clientHelloLen = 4 + 4 + 8 + 4 + nonceSize
	serverHelloLen = 4 + 4 + 4 + nonceSize + macSize
	maxVerdictText = 1024

	// DefaultHandshakeTimeout bounds one handshake when the caller's
	// deadline is further away, so a silent connection cannot hold a slot.
	DefaultHandshakeTimeout = 10 * time.Second
)

// sessionLabel derives a handshake's session key (the MACs of the hello
// and the proof use other labels: the key is never on the wire).
const sessionLabel = "gocoll/hs/session"

// verdicts are the verdict codes that carry no text, each a sentinel the
// client's error wraps (0: admitted, 1: refused with a reason).
var verdicts = [...]error{2: ErrCrossing, 3: errConnected}

var hsMagic = [4]byte{'G', 'C', 'H', 'S'}

func handshakeMAC(secret []byte, label string, tag [8]byte, clientRank, serverRank int32, nc, ns []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(tag[:])
	var r [8]byte
	binary.LittleEndian.PutUint32(r[0:], uint32(clientRank))
	binary.LittleEndian.PutUint32(r[4:], uint32(serverRank))
	m.Write(r[:])
	m.Write(nc)
	m.Write(ns)
	return m.Sum(nil)
}

func rankToWire(rank int) (int32, error) {
	if rank < -1 || rank > 1<<31-1 {
		return 0, fmt.Errorf("tcp: rank %d out of range for the handshake", rank)
	}
	return int32(rank), nil
}

// ServerHandshake authenticates an accepted connection. myRank is this
// side's identity (any value >= -1; the bootstrap root uses -1). After the
// client has proved it holds secret and tag, accept (if not nil) decides
// whether this rank is wanted: a non-nil error is sent to the client as the
// refusal text and returned wrapping ErrRefused. On success the client's
// rank is returned and conn's deadline is cleared; on failure the caller
// should close conn. deadline bounds the whole exchange (zero: none).
// A client that failed to authenticate after its hello yields the rank it
// claimed (unverified: only for telling the operator) with the error.
func ServerHandshake(conn net.Conn, secret []byte, tag [8]byte, myRank int, deadline time.Time, accept func(peerRank int) error) (peerRank int, err error) {
	peerRank, _, err = ServerHandshakeSession(conn, secret, tag, myRank, deadline, accept)
	return peerRank, err
}

// ServerHandshakeSession is ServerHandshake that also returns the
// session's key: a secret only the two ends of this handshake derive (from
// the job's secret and both nonces), for authenticating what follows on
// the connection.
func ServerHandshakeSession(conn net.Conn, secret []byte, tag [8]byte, myRank int, deadline time.Time, accept func(peerRank int) error) (peerRank int, key []byte, err error) {
	me, err := rankToWire(myRank)
	if err != nil {
		return -1, nil, err
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return -1, nil, err
	}
	var hello [clientHelloLen]byte
	if _, err := io.ReadFull(conn, hello[:]); err != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: reading hello: %w", err)
	}
	if [4]byte(hello[0:4]) != hsMagic {
		return -1, nil, fmt.Errorf("tcp: handshake: %w: not a gocoll client (magic %q)", ErrAuth, hello[0:4])
	}
	if hello[4] != hsVersion {
		return -1, nil, fmt.Errorf("tcp: handshake: %w: protocol version %d, want %d", ErrAuth, hello[4], hsVersion)
	}
	theirTag := [8]byte(hello[8:16])
	client := int32(binary.LittleEndian.Uint32(hello[16:20]))
	nc := hello[20 : 20+nonceSize]

	var out [serverHelloLen]byte
	copy(out[0:4], hsMagic[:])
	out[4] = hsVersion
	binary.LittleEndian.PutUint32(out[8:12], uint32(me))
	ns := out[12 : 12+nonceSize]
	rand.Read(ns)
	// The MAC is over this side's tag: a client of another communicator
	// fails to verify it and learns it reached the wrong endpoint.
	copy(out[12+nonceSize:], handshakeMAC(secret, "gocoll/hs/server", tag, client, me, nc, ns))
	if _, err := conn.Write(out[:]); err != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: %w", err)
	}
	var proof [macSize]byte
	if _, err := io.ReadFull(conn, proof[:]); err != nil {
		if theirTag != tag {
			return int(client), nil, fmt.Errorf("tcp: handshake: %w: client (claiming rank %d) belongs to communicator %x, this is %x", ErrAuth, client, theirTag, tag)
		}
		return int(client), nil, fmt.Errorf("tcp: handshake: client (claiming rank %d) hung up before proving its identity (wrong secret or communicator?): %w", client, err)
	}
	if theirTag != tag {
		return int(client), nil, fmt.Errorf("tcp: handshake: %w: client (claiming rank %d) belongs to communicator %x, this is %x", ErrAuth, client, theirTag, tag)
	}
	if !hmac.Equal(proof[:], handshakeMAC(secret, "gocoll/hs/client", tag, client, me, nc, ns)) {
		return int(client), nil, fmt.Errorf("tcp: handshake: %w: client claiming rank %d has a wrong secret", ErrAuth, client)
	}
	var refusal error
	if accept != nil {
		refusal = accept(int(client))
	}
	if err := writeVerdict(conn, refusal); err != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: sending verdict to rank %d: %w", client, err)
	}
	if errors.Is(refusal, ErrCrossing) || errors.Is(refusal, errConnected) {
		return int(client), nil, fmt.Errorf("tcp: handshake: rank %d: %w", client, refusal)
	}
	if refusal != nil {
		return int(client), nil, fmt.Errorf("tcp: handshake: %w: rank %d: %v", ErrRefused, client, refusal)
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return -1, nil, err
	}
	return int(client), handshakeMAC(secret, sessionLabel, tag, client, me, nc, ns), nil
}

func writeVerdict(conn net.Conn, refusal error) error {
	if refusal == nil {
		_, err := conn.Write([]byte{0, 0, 0})
		return err
	}
	for code, sentinel := range verdicts {
		if sentinel != nil && errors.Is(refusal, sentinel) {
			_, err := conn.Write([]byte{byte(code), 0, 0})
			return err
		}
	}
	text := refusal.Error()
	if len(text) > maxVerdictText {
		text = text[:maxVerdictText]
	}
	b := make([]byte, 3+len(text))
	b[0] = 1
	binary.LittleEndian.PutUint16(b[1:], uint16(len(text)))
	copy(b[3:], text)
	_, err := conn.Write(b)
	return err
}

// ClientHandshake authenticates a dialled connection: it checks that the
// server holds secret and tag, proves the same to the server, and waits for
// the server to accept myRank. It returns the server's rank (-1 for the
// bootstrap root). Errors wrap ErrAuth (the server is not who we expected:
// wrong secret, tag, or not gocoll), ErrRefused (authenticated, but the
// server does not want this rank), or an I/O error. On success conn's
// deadline is cleared; on failure the caller should close conn.
func ClientHandshake(conn net.Conn, secret []byte, tag [8]byte, myRank int, deadline time.Time) (peerRank int, err error) {
	peerRank, _, err = ClientHandshakeSession(conn, secret, tag, myRank, deadline)
	return peerRank, err
}

// ClientHandshakeSession is ClientHandshake that also returns the
// session's key (see ServerHandshakeSession).
func ClientHandshakeSession(conn net.Conn, secret []byte, tag [8]byte, myRank int, deadline time.Time) (peerRank int, key []byte, err error) {
	me, err := rankToWire(myRank)
	if err != nil {
		return -1, nil, err
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return -1, nil, err
	}
	var hello [clientHelloLen]byte
	copy(hello[0:4], hsMagic[:])
	hello[4] = hsVersion
	copy(hello[8:16], tag[:])
	binary.LittleEndian.PutUint32(hello[16:20], uint32(me))
	nc := hello[20 : 20+nonceSize]
	rand.Read(nc)
	if _, err := conn.Write(hello[:]); err != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: %w", err)
	}
	var in [serverHelloLen]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: reading server hello: %w", err)
	}
	if [4]byte(in[0:4]) != hsMagic {
		return -1, nil, fmt.Errorf("tcp: handshake: %w: %s is not a gocoll endpoint", ErrAuth, conn.RemoteAddr())
	}
	if in[4] != hsVersion {
		return -1, nil, fmt.Errorf("tcp: handshake: %w: %s speaks protocol version %d, want %d", ErrAuth, conn.RemoteAddr(), in[4], hsVersion)
	}
	server := int32(binary.LittleEndian.Uint32(in[8:12]))
	ns := in[12 : 12+nonceSize]
	if !hmac.Equal(in[12+nonceSize:], handshakeMAC(secret, "gocoll/hs/server", tag, me, server, nc, ns)) {
		return -1, nil, fmt.Errorf("tcp: handshake: %w: %s (rank %d) holds another secret or communicator id", ErrAuth, conn.RemoteAddr(), server)
	}
	if _, err := conn.Write(handshakeMAC(secret, "gocoll/hs/client", tag, me, server, nc, ns)); err != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: %w", err)
	}
	var v [3]byte
	if _, err := io.ReadFull(conn, v[:]); err != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: reading verdict from %s: %w", conn.RemoteAddr(), err)
	}
	if int(v[0]) < len(verdicts) && verdicts[v[0]] != nil {
		return -1, nil, fmt.Errorf("tcp: handshake: %s (rank %d): %w", conn.RemoteAddr(), server, verdicts[v[0]])
	}
	if v[0] != 0 {
		text := make([]byte, binary.LittleEndian.Uint16(v[1:]))
		if _, err := io.ReadFull(conn, text); err != nil {
			return -1, nil, fmt.Errorf("tcp: handshake: %w: %s (rank %d)", ErrRefused, conn.RemoteAddr(), server)
		}
		return -1, nil, fmt.Errorf("tcp: handshake: %w: %s (rank %d): %s", ErrRefused, conn.RemoteAddr(), server, text)
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return -1, nil, err
	}
	return int(server), handshakeMAC(secret, sessionLabel, tag, me, server, nc, ns), nil
}
