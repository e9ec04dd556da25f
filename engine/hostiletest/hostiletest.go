// Package hostiletest (test support, like net/http/httptest) plays the
// clients a job's ports must survive: port scanners, confused services,
// attackers without the job's secret, and eavesdroppers replaying what they
// recorded. Tests in engine/bootstrap, engine/transport/tcp, engine and
// capi/ctest aim them at the rendezvous root, the TCP transport's listeners
// and the metrics endpoint, and find those ports in /proc the way an
// operator would (ListeningPorts).
//
// Every hostile client waits, after its act, for the server to close the
// connection, bounded by its context: a port that keeps a hostile
// connection open forever (a descriptor and a goroutine leaked per
// connection) shows as Outcome.Closed false.
package hostiletest

import (
	"bufio"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proto is what a port speaks first.
type Proto int

const (
	// Gocoll ports start with gocoll's handshake (engine/transport/tcp):
	// the rendezvous root and the TCP transport's listeners.
	Gocoll Proto = iota
	// HTTP is the metrics endpoint.
	HTTP
)

func (p Proto) String() string {
	if p == HTTP {
		return "http"
	}
	return "gocoll"
}

// Kind is one hostile behaviour.
type Kind int

const (
	// Garbage: bytes that are not the protocol (an HTTP request to a gocoll
	// port, random bytes to the HTTP one), more than a handshake's first
	// message.
	Garbage Kind = iota
	// HugeLength: a length field of about 4 GiB (a gocoll frame, after an
	// authenticated handshake when Target.Authenticate is set) or a
	// Content-Length of 1 TB (HTTP), followed by 64 KiB: a server that
	// believes it allocates or waits for the rest.
	HugeLength
	// Silent: connects and sends nothing.
	Silent
	// WrongSecret: a whole handshake whose proof is computed with a wrong
	// secret (the client ignores that the server's proof does not match its
	// secret, as an attacker would).
	WrongSecret
	// HalfHello: half of a handshake's first message (or of an HTTP
	// request line), then the client hangs up (its end of the stream).
	HalfHello
	// HangUpAfterHello: a whole first message; the server's answer is read,
	// then the client hangs up before the proof.
	HangUpAfterHello
	// Replay: the bytes a valid client sent on a recorded connection
	// (Record), sent again verbatim.
	Replay
	numKinds
)

var kindNames = [...]string{"garbage", "huge length", "silent", "wrong secret", "half hello", "hang up after hello", "replay"}

func (k Kind) String() string {
	if k >= 0 && k < numKinds {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Kinds are the behaviours that apply to tg: the handshake ones only to
// gocoll ports, Replay only with a recording.
func Kinds(tg Target) []Kind {
	if tg.Proto == HTTP {
		return []Kind{Garbage, HugeLength, Silent, HalfHello}
	}
	ks := []Kind{Garbage, HugeLength, Silent, WrongSecret, HalfHello, HangUpAfterHello}
	if len(tg.Replay) > 0 {
		ks = append(ks, Replay)
	}
	return ks
}

// Target is a port under attack.
type Target struct {
	Addr  string // host:port
	Proto Proto
	// Tag is the communicator tag a handshake presents (gocoll's root and
	// each communicator have their own); zero is as good for a stranger
	// who does not know it.
	Tag [8]byte
	// Rank is the rank a hostile handshake claims.
	Rank int
	// Replay is a valid client's recorded bytes (Record); Replay is not
	// among Kinds without it.
	Replay []byte
	// Authenticate, when set, completes a valid handshake on a fresh
	// connection (a client that holds the secret): HugeLength then sends
	// its length field after it, where the server reads framed messages.
	Authenticate func(net.Conn) error
}

// Outcome is what one hostile client saw.
type Outcome struct {
	Target Target
	Kind   Kind
	// Refused: nothing listened (the kernel refused the connection).
	Refused bool
	// Got is how many bytes the server sent.
	Got int
	// Accepted: the server took the client for a peer (a gocoll verdict
	// of acceptance, or any data after an authenticated HugeLength).
	Accepted bool
	// Closed: the server closed the connection before the context ended.
	Closed bool
	// Elapsed runs from the connection to the server's close.
	Elapsed time.Duration
	// Err is a failure of the client itself (e.g. it could not write).
	Err error
}

func (o Outcome) String() string {
	s := fmt.Sprintf("%s at %s (%s)", o.Kind, o.Target.Addr, o.Target.Proto)
	switch {
	case o.Refused:
		return s + ": nothing listens"
	case o.Accepted:
		return s + ": ACCEPTED"
	case !o.Closed:
		return s + fmt.Sprintf(": still open after %v (%d bytes answered)", o.Elapsed.Round(time.Millisecond), o.Got)
	}
	return s + fmt.Sprintf(": closed by the server after %v (%d bytes answered)", o.Elapsed.Round(time.Millisecond), o.Got)
}

// Handshake layout (engine/transport/tcp/handshake.go): the client's hello
// is magic, version, tag, rank and nonce; the server answers its own hello
// with a proof, and after the client's proof a verdict.
const (
	clientHelloLen = 52
	serverHelloLen = 76
	macLen         = 32
	hsVersion      = 1
)

func hello(tag [8]byte, rank int) []byte {
	b := make([]byte, clientHelloLen)
	copy(b, "GCHS")
	b[4] = hsVersion
	copy(b[8:16], tag[:])
	binary.LittleEndian.PutUint32(b[16:20], uint32(int32(rank)))
	rand.Read(b[20:])
	return b
}

// wrongProof is the client's proof computed as the protocol says, with a
// secret the job does not have.
func wrongProof(tag [8]byte, clientHello, serverHello []byte) []byte {
	m := hmac.New(sha256.New, []byte("not the job's secret"))
	m.Write([]byte("gocoll/hs/client"))
	m.Write(tag[:])
	m.Write(clientHello[16:20])
	m.Write(serverHello[8:12])
	m.Write(clientHello[20:])
	m.Write(serverHello[12 : 12+32])
	return m.Sum(nil)
}

// Attack runs one hostile client of kind k against tg and waits for the
// server to close the connection, at most until ctx ends.
func Attack(ctx context.Context, tg Target, k Kind) Outcome {
	return attack(ctx, tg, k, nil)
}

// attack is Attack; it closes connected (when not nil) once the connection
// is made or failed.
func attack(ctx context.Context, tg Target, k Kind, connected chan struct{}) Outcome {
	o := Outcome{Target: tg, Kind: k}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", tg.Addr)
	if connected != nil {
		close(connected)
	}
	if err != nil {
		o.Refused = errors.Is(err, syscall.ECONNREFUSED)
		if !o.Refused {
			o.Err = err
		}
		return o
	}
	defer c.Close()
	start := time.Now()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	o.Err = act(c, tg, k, &o)
	if o.Closed || o.Err != nil {
		o.Elapsed = time.Since(start)
		return o
	}
	// Wait for the server to close; count what it says meanwhile.
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		o.Got += n
		if err != nil {
			o.Closed = !errors.Is(err, os.ErrDeadlineExceeded)
			break
		}
	}
	o.Elapsed = time.Since(start)
	// After an authenticated handshake, any answer to the frame (a table,
	// an error reply) means the server took it.
	if k == HugeLength && tg.Authenticate != nil && o.Got > 0 {
		o.Accepted = true
	}
	return o
}

// act performs k on c; it sets o.Closed when the act itself ends the
// connection (or saw the server end it) and o.Accepted when the server lets
// the client in.
func act(c net.Conn, tg Target, k Kind, o *Outcome) error {
	if tg.Proto == HTTP {
		return actHTTP(c, k, o)
	}
	switch k {
	case Garbage:
		_, err := c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: gocoll\r\n\r\n" + strings.Repeat("\x00garbage", 16)))
		return err
	case HugeLength:
		if tg.Authenticate != nil {
			if err := tg.Authenticate(c); err != nil {
				return fmt.Errorf("authenticating before the huge frame: %w", err)
			}
		}
		b := make([]byte, 4+64<<10)
		binary.LittleEndian.PutUint32(b, 0xffffffff)
		b[4] = 'J'
		if _, err := c.Write(b); err != nil && !isReset(err) {
			return err
		}
		return nil
	case Silent:
		return nil
	case WrongSecret, HangUpAfterHello:
		h := hello(tg.Tag, tg.Rank)
		if _, err := c.Write(h); err != nil {
			return err
		}
		sh := make([]byte, serverHelloLen)
		n, err := io.ReadFull(c, sh)
		o.Got += n
		if err != nil {
			o.Closed = true // the server hung up on a well-formed hello
			return nil
		}
		if k == HangUpAfterHello {
			return hangUp(c)
		}
		if _, err := c.Write(wrongProof(tg.Tag, h, sh)); err != nil {
			return err
		}
		v := make([]byte, 3)
		n, err = io.ReadFull(c, v)
		o.Got += n
		o.Accepted = err == nil && v[0] == 0
		if err != nil {
			o.Closed = !errors.Is(err, os.ErrDeadlineExceeded)
		}
		return nil
	case HalfHello:
		if _, err := c.Write(hello(tg.Tag, tg.Rank)[:clientHelloLen/2]); err != nil {
			return err
		}
		return hangUp(c)
	case Replay:
		if _, err := c.Write(tg.Replay); err != nil && !isReset(err) {
			return err
		}
		// A server fooled by the replay answers its hello, then a verdict
		// of acceptance.
		buf := make([]byte, serverHelloLen+3)
		n, err := io.ReadFull(c, buf)
		o.Got += n
		o.Accepted = err == nil && buf[serverHelloLen] == 0
		if err != nil {
			o.Closed = !errors.Is(err, os.ErrDeadlineExceeded)
		}
		return nil
	}
	return fmt.Errorf("hostiletest: no %v against a gocoll port", k)
}

func actHTTP(c net.Conn, k Kind, o *Outcome) error {
	switch k {
	case Garbage:
		b := make([]byte, 4096)
		rand.Read(b)
		b[0] = 0 // never a method name
		_, err := c.Write(append(b, "\r\n\r\n"...))
		if isReset(err) {
			err = nil
		}
		return err
	case HugeLength:
		_, err := c.Write([]byte("POST /metrics HTTP/1.1\r\nHost: gocoll\r\nContent-Length: 1000000000000\r\n\r\n" + strings.Repeat("x", 64<<10)))
		if isReset(err) {
			err = nil
		}
		return err
	case Silent:
		return nil
	case HalfHello:
		if _, err := c.Write([]byte("GET /metr")); err != nil {
			return err
		}
		return hangUp(c)
	}
	return fmt.Errorf("hostiletest: no %v against an HTTP port", k)
}

// hangUp ends the client's side of c (the server reads the end of the
// stream, as from a client that closed) but keeps reading, so that the
// client sees the server act on it.
func hangUp(c net.Conn) error {
	return c.(*net.TCPConn).CloseWrite()
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// All runs every kind that applies to each target except Silent, all at
// once, and returns their outcomes once the servers have closed every
// connection (or ctx ended). A server refuses these at once, so All
// returns quickly from a healthy port; Hold keeps silent connections.
func All(ctx context.Context, targets ...Target) []Outcome {
	var mu sync.Mutex
	var out []Outcome
	var wg sync.WaitGroup
	for _, tg := range targets {
		for _, k := range Kinds(tg) {
			if k == Silent {
				continue
			}
			wg.Go(func() {
				o := Attack(ctx, tg, k)
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return out
}

// Held is a set of silent connections (Hold).
type Held struct {
	wg  sync.WaitGroup
	out []Outcome
}

// Hold opens a Silent connection to each target and keeps it until the
// server closes it or ctx ends; Wait returns their outcomes. It returns
// once every connection is established (or refused), so that what the
// caller does next happens while they are held.
func Hold(ctx context.Context, targets ...Target) *Held {
	h := &Held{out: make([]Outcome, len(targets))}
	for i, tg := range targets {
		connected := make(chan struct{})
		h.wg.Go(func() { h.out[i] = attack(ctx, tg, Silent, connected) })
		<-connected
	}
	return h
}

// Wait waits for every held connection to end and returns the outcomes.
func (h *Held) Wait() []Outcome {
	h.wg.Wait()
	return h.out
}

// Flood opens n Garbage connections to tg at once (a scan, a
// misconfigured client retrying) and returns their outcomes.
func Flood(ctx context.Context, tg Target, n int) []Outcome {
	out := make([]Outcome, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() { out[i] = Attack(ctx, tg, Garbage) })
	}
	wg.Wait()
	return out
}

// Record runs client against a one-connection proxy in front of target and
// returns the bytes the client sent: what an eavesdropper on the wire
// would have. client gets the proxy's address.
func Record(ctx context.Context, target string, client func(addr string) error) ([]byte, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	type result struct {
		b   []byte
		err error
	}
	res := make(chan result, 1)
	go func() {
		in, err := ln.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		defer in.Close()
		var d net.Dialer
		out, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			res <- result{err: err}
			return
		}
		defer out.Close()
		var rec recorder
		done := make(chan struct{})
		go func() {
			io.Copy(in, out)
			in.(*net.TCPConn).CloseWrite()
			close(done)
		}()
		io.Copy(io.MultiWriter(out, &rec), in)
		out.(*net.TCPConn).CloseWrite()
		<-done
		res <- result{b: rec.bytes()}
	}()
	cerr := client(ln.Addr().String())
	ln.Close()
	select {
	case r := <-res:
		if cerr != nil {
			return nil, fmt.Errorf("hostiletest: recorded client: %w", cerr)
		}
		return r.b, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type recorder struct {
	mu sync.Mutex
	b  []byte
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.b = append(r.b, p...)
	r.mu.Unlock()
	return len(p), nil
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b
}

// ListeningPorts returns the TCP addresses process pid listens on (in its
// network namespace), from /proc: the sockets among its descriptors whose
// state is LISTEN.
func ListeningPorts(pid int) ([]netip.AddrPort, error) {
	inodes := map[string]bool{}
	fdDir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var out []netip.AddrPort
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "net", table))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" || !inodes[fs[9]] {
				continue
			}
			if ap, ok := parseProcAddr(fs[1]); ok {
				out = append(out, ap)
			}
		}
		f.Close()
	}
	return out, nil
}

// parseProcAddr decodes /proc/net/tcp's "0100007F:1F90" (the address in
// host byte order per 32-bit word, the port in hex).
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil || (len(h) != 8 && len(h) != 32) {
		return netip.AddrPort{}, false
	}
	raw := make([]byte, len(h)/2)
	for i := range raw {
		v, err := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		if err != nil {
			return netip.AddrPort{}, false
		}
		raw[i] = byte(v)
	}
	for w := 0; w+4 <= len(raw); w += 4 {
		raw[w], raw[w+1], raw[w+2], raw[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), true
}

// Dialable is ap with a wildcard address replaced by loopback.
func Dialable(ap netip.AddrPort) string {
	a := ap.Addr()
	if a.IsUnspecified() {
		a = netip.MustParseAddr("127.0.0.1")
	}
	return netip.AddrPortFrom(a, ap.Port()).String()
}

// Descriptors is how many file descriptors process pid holds.
func Descriptors(pid int) (int, error) {
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	return len(ents), err
}

// Logged counts refusals in the output of slog's text handler: the lines
// logged in full whose message is one of msgs, and the events counted by
// the summary lines of engine/logthrottle's limiter for what.
func Logged(out, what string, msgs ...string) (full, counted int) {
	for _, m := range msgs {
		full += strings.Count(out, "msg="+strconv.Quote(m)+" ")
	}
	summary := regexp.MustCompile(`msg="more ` + regexp.QuoteMeta(what) + ` not logged" [^\n]*\bcount=(\d+)`)
	for _, m := range summary.FindAllStringSubmatch(out, -1) {
		c, _ := strconv.Atoi(m[1])
		counted += c
	}
	return full, counted
}

// WaitGoroutines waits, polling for up to 10 s, until no more goroutines
// run than before, and fails t with every goroutine's stack otherwise.
func WaitGoroutines(t testing.TB, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Summary describes outcomes in one line per protocol and kind: how many
// connections, how they ended, the slowest close and what the servers
// answered.
func Summary(outcomes []Outcome) string {
	type key struct {
		p Proto
		k Kind
	}
	type agg struct {
		n, refused, accepted, open int
		slowest                    time.Duration
		minGot, maxGot             int
	}
	aggs := map[key]*agg{}
	var keys []key
	for _, o := range outcomes {
		kk := key{o.Target.Proto, o.Kind}
		a := aggs[kk]
		if a == nil {
			a = &agg{minGot: o.Got, maxGot: o.Got}
			aggs[kk] = a
			keys = append(keys, kk)
		}
		a.n++
		switch {
		case o.Refused:
			a.refused++
		case o.Accepted:
			a.accepted++
		case !o.Closed:
			a.open++
		default:
			a.slowest = max(a.slowest, o.Elapsed)
			a.minGot, a.maxGot = min(a.minGot, o.Got), max(a.maxGot, o.Got)
		}
	}
	slices.SortFunc(keys, func(a, b key) int { return cmp.Or(cmp.Compare(a.p, b.p), cmp.Compare(a.k, b.k)) })
	var b strings.Builder
	for _, kk := range keys {
		a := aggs[kk]
		fmt.Fprintf(&b, "%s %s: %d connections", kk.p, kk.k, a.n)
		if closed := a.n - a.refused - a.accepted - a.open; closed > 0 {
			fmt.Fprintf(&b, ", %d closed by the server within %v after answering %d-%d bytes", closed, a.slowest.Round(time.Millisecond), a.minGot, a.maxGot)
		}
		for _, c := range []struct {
			n    int
			what string
		}{{a.refused, "refused (nothing listened)"}, {a.accepted, "ACCEPTED"}, {a.open, "still open"}} {
			if c.n > 0 {
				fmt.Fprintf(&b, ", %d %s", c.n, c.what)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}
