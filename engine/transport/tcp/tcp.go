// Package tcp is a transport.Transport over TCP: one authenticated
// connection per pair of ranks, a 32-byte header and the payload written with
// one writev, payloads read straight into the caller's buffer.
//
// Setup (New) builds a full mesh among the configured peers: for each pair
// the higher rank dials the lower one, which accepts on its listener. Both
// sides of every connection prove that they hold the job's secret and the
// communicator's tag (challenge-response, HMAC-SHA256, see ServerHandshake);
// a connection that fails is closed and logged, and setup goes on.
//
// Failure propagation: Abort writes a KindAbort message to every peer, Close
// an orderly goodbye (KindClose). A watcher goroutine looks, every
// watchEvery, at the front of each connection that no Recv is reading,
// without consuming anything (MSG_PEEK): an abort message there, or the end
// of the stream without a goodbye (the peer's process died), stops this
// transport too. A failure noticed this way or by a Recv fails every pending
// and later call with a *transport.RemoteAbortError or
// *transport.PeerLostError naming the rank where it started, and is announced
// to this rank's own peers in turn, so that a whole job unwinds within about
// a second even when its ranks are connected only partly. A goodbye fails
// nothing: messages sent before it are delivered, and only a later Recv from
// (or Send to) the closed rank fails with transport.ErrPeerLost.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

const (
	// DefaultSocketBuffer is the SO_SNDBUF/SO_RCVBUF size used when
	// Config.SocketBuffer is 0. (Linux caps it at net.core.{r,w}mem_max.)
	DefaultSocketBuffer = 4 << 20
	// maxAbortReason bounds the reason text carried by an abort message.
	maxAbortReason = 64 << 10
	// abortBudget bounds how long Abort spends telling peers.
	abortBudget = time.Second
	// watchEvery is how often the watcher looks at idle connections.
	watchEvery = 50 * time.Millisecond
	// goodbyeWait bounds how long Close waits for its goodbyes to be
	// written; one that does not fit into a full socket buffer by then is
	// finished in the background for up to goodbyeLinger, so that a peer
	// still reading the last messages does not take the close for a crash.
	goodbyeWait   = time.Second
	goodbyeLinger = 30 * time.Second
)

// Config describes one rank's transport.
type Config struct {
	Rank, Size int
	// Listener accepts the connections of the higher-ranked peers. New
	// closes it before returning (also on error) unless Lazy; with Lazy
	// the transport closes it when it stops. It may be nil when no peer
	// ranks above Rank and Lazy is off.
	Listener net.Listener
	// Addrs holds every rank's listen address ("host:port"), indexed by
	// rank; only the entries of lower-ranked peers are used (they are dialled).
	Addrs []string
	// Peers are the ranks this transport connects to (others are served by
	// another transport, e.g. shared memory). Rank itself is ignored if present.
	Peers []int
	// Secret authenticates every connection; all ranks of the job hold it.
	Secret []byte
	// Tag identifies the communicator; connections made for another
	// communicator are refused.
	Tag [8]byte
	// Logger receives refused connections (WARN) and setup progress
	// (DEBUG). Nil discards.
	Logger *slog.Logger
	// Lazy keeps Listener open after New, for the transport's life: a
	// peer of Peers that is not connected yet is connected on its first
	// Send or Recv, by whichever side needs it first. Addrs must then hold
	// every peer's address.
	Lazy bool
	// Eager are the peers New connects before it returns, with Lazy (nil:
	// every peer of Peers; empty: none). Without Lazy every peer is.
	Eager []int
	// SocketBuffer sets SO_SNDBUF and SO_RCVBUF in bytes: 0 means
	// DefaultSocketBuffer, a negative value leaves the kernel's defaults
	// (and its buffer autotuning) alone.
	SocketBuffer int
	// Timeout is the communicator's: the kernel's keepalive gives a
	// silent connection up only after at least this long (0: 30 s), so
	// that a host too busy to answer probes for a while (its loopback
	// backlog dropping them, say) is not taken for gone before the
	// communicator's own timeout says so.
	Timeout time.Duration
}

// Transport is one rank's TCP connections; it implements transport.Transport.
type Transport struct {
	rank, size int
	peers      []peerSlot // by rank; empty where this transport has no connection (yet)
	cs         conns      // connecting (mesh.go)
	logger     *slog.Logger
	stop       atomic.Pointer[error] // set once by Abort, Close or a peer's failure
	closeOnce  sync.Once
	quit       chan struct{} // closed to stop the watcher
	quitOnce   sync.Once
}

// peerSlot holds a peer's connection once it is up: set once, read on
// every call without a lock.
type peerSlot = atomic.Pointer[peer]

var (
	_ transport.Transport   = (*Transport)(nil)
	_ transport.VarReceiver = (*Transport)(nil)
	_ transport.Peeker      = (*Transport)(nil)
)

type peer struct {
	rank int
	addr string // remote address, for messages
	conn net.Conn

	// Write side, guarded by wmu.
	wmu  sync.Mutex
	whdr [transport.HeaderSize]byte
	wvec [2][]byte
	wb   net.Buffers // kept here so writev does not allocate
	werr error       // sticky: a partial message was written

	// Read side: one Recv at a time (the interface's contract).
	rhdr [transport.HeaderSize]byte
	rerr error // sticky: the stream is out of step

	// What the watcher needs to know about the read side: reads is odd
	// while a Recv runs (and changes with every Recv), broken is set with
	// rerr (the front of the stream is not at a message boundary), goodbye
	// once the peer's orderly goodbye was seen.
	reads   atomic.Uint64
	broken  atomic.Bool
	goodbye atomic.Bool

	// Cancellation: a context.AfterFunc sets a past deadline; the
	// generation counters keep a late one from hitting the next call.
	dlmu       sync.Mutex
	rgen, wgen uint64
}

// aLongTimeAgo is a deadline in the past: it unblocks pending I/O at once.
var aLongTimeAgo = time.Unix(1, 0)

// Rank is this endpoint's rank.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks of the communicator.
func (t *Transport) Size() int { return t.size }

// Connected reports whether this transport has a connection to rank peer.
func (t *Transport) Connected(peer int) bool {
	return t.peer(peer) != nil
}

// peer is the connection with rank q, nil if none is up.
func (t *Transport) peer(q int) *peer {
	if q < 0 || q >= len(t.peers) {
		return nil
	}
	return t.peers[q].Load()
}

// lookup is the connection with rank q, made first if it is not up yet
// (Config.Lazy).
func (t *Transport) lookup(ctx context.Context, q int) (*peer, error) {
	if p := t.peer(q); p != nil {
		return p, nil
	}
	return t.connect(ctx, q)
}

// lostErr is the error of a call to q once nothing listens at its address
// any more: its process (or communicator) is gone.
func (t *Transport) lostErr(q int, what string) error {
	return fmt.Errorf("tcp: rank %d: %w", t.rank, &transport.PeerLostError{Peer: q, Reason: what, Dead: true})
}

func (t *Transport) stopErr() error {
	if e := t.stop.Load(); e != nil {
		return *e
	}
	return nil
}

// ioErr classifies a failed read or write on p's connection. lost is set
// when the connection itself failed (the peer went away without a goodbye).
func (t *Transport) ioErr(ctx context.Context, p *peer, op string, err error) (_ error, lost bool) {
	if se := t.stopErr(); se != nil {
		return se, false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		cerr := ctx.Err()
		if cerr == nil {
			// The connection's deadline fired a moment before ctx's timer.
			cerr = context.DeadlineExceeded
		}
		return fmt.Errorf("tcp: %s rank %d: %w", op, p.rank, cerr), false
	}
	if p.goodbye.Load() {
		return closedErr(op, p), false
	}
	what := fmt.Sprintf("connection broke (%v)", err)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		what = "connection closed without goodbye (process died?)"
	}
	return fmt.Errorf("tcp: %s rank %d (%s): %w", op, p.rank, p.addr, &transport.PeerLostError{Peer: p.rank, Reason: what, Dead: transport.Died(err)}), true
}

// closedErr is the error of a call to a peer that closed its communicator.
func closedErr(op string, p *peer) error {
	return fmt.Errorf("tcp: %s rank %d: %w", op, p.rank, &transport.PeerLostError{Peer: p.rank, Reason: "closed its communicator"})
}

func (p *peer) setRerr(err error) error {
	p.rerr = err
	p.broken.Store(true)
	return err
}

func (p *peer) armWrite(ctx context.Context) (stop func() bool) {
	d, _ := ctx.Deadline()
	p.conn.SetWriteDeadline(d)
	if ctx.Done() == nil {
		return nil
	}
	p.dlmu.Lock()
	gen := p.wgen
	p.dlmu.Unlock()
	return context.AfterFunc(ctx, func() {
		p.dlmu.Lock()
		if p.wgen == gen {
			p.conn.SetWriteDeadline(aLongTimeAgo)
		}
		p.dlmu.Unlock()
	})
}

func (p *peer) disarmWrite(stop func() bool) {
	if stop == nil {
		return
	}
	stop()
	p.dlmu.Lock()
	p.wgen++
	p.dlmu.Unlock()
}

func (p *peer) armRead(ctx context.Context) (stop func() bool) {
	d, _ := ctx.Deadline()
	p.conn.SetReadDeadline(d)
	if ctx.Done() == nil {
		return nil
	}
	p.dlmu.Lock()
	gen := p.rgen
	p.dlmu.Unlock()
	return context.AfterFunc(ctx, func() {
		p.dlmu.Lock()
		if p.rgen == gen {
			p.conn.SetReadDeadline(aLongTimeAgo)
		}
		p.dlmu.Unlock()
	})
}

func (p *peer) disarmRead(stop func() bool) {
	if stop == nil {
		return
	}
	stop()
	p.dlmu.Lock()
	p.rgen++
	p.dlmu.Unlock()
}

// Send writes h and data to peer with one writev. It honours ctx's deadline
// and cancellation; after a failure that left part of a message on the wire,
// later Sends to peer fail with the same error.
func (t *Transport) Send(ctx context.Context, peer int, h transport.Header, data []byte) error {
	if h.Len != uint64(len(data)) {
		return fmt.Errorf("tcp: send to rank %d: header says %d bytes, data has %d", peer, h.Len, len(data))
	}
	p, err := t.lookup(ctx, peer)
	if err != nil {
		return err
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if err := t.stopErr(); err != nil {
		return err
	}
	if p.werr != nil {
		return p.werr
	}
	if p.goodbye.Load() {
		return closedErr("send to", p)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tcp: send to rank %d: %w", peer, err)
	}
	h.Encode(p.whdr[:])
	p.wvec[0], p.wvec[1] = p.whdr[:], data
	p.wb = p.wvec[:]
	stop := p.armWrite(ctx)
	n, werr := p.wb.WriteTo(p.conn)
	p.disarmWrite(stop)
	p.wvec[1], p.wb = nil, nil
	if werr != nil {
		err, lost := t.ioErr(ctx, p, "send to", werr)
		if lost {
			// The peer may have aborted (its message waits unread) or
			// closed: look at what it sent before deciding.
			if ferr := t.inspect(p, nil); ferr != nil {
				err = t.fail(ferr)
			} else if se := t.stopErr(); se != nil {
				err = se // this transport stopped meanwhile: that is why
			} else if p.goodbye.Load() {
				err = closedErr("send to", p)
			}
		}
		if n > 0 || lost {
			p.werr = err
		}
		return err
	}
	return nil
}

// Recv reads the next message from peer into buf (no intermediate copy). It
// fails with an error wrapping transport.ErrMismatch, ErrProtocol,
// ErrRemoteAbort (a *transport.RemoteAbortError), ErrPeerLost, ErrAborted or
// ctx's error. After a failure that left the stream out of step (a mismatch,
// a partial read), later Recvs from peer fail with the same error.
func (t *Transport) Recv(ctx context.Context, peer int, want transport.Header, buf []byte) error {
	if want.Len != uint64(len(buf)) {
		return fmt.Errorf("tcp: recv from rank %d: expected header says %d bytes, buffer has %d", peer, want.Len, len(buf))
	}
	_, _, err := t.recvMsg(ctx, peer, want, buf, nil)
	return err
}

// RecvVar reads the next message from peer, whatever its step and length,
// into the buffer alloc returns for its length (transport.VarReceiver).
func (t *Transport) RecvVar(ctx context.Context, peer int, want transport.Header, alloc func(n int) ([]byte, error)) (transport.Header, []byte, error) {
	return t.recvMsg(ctx, peer, want, nil, alloc)
}

// recvMsg is Recv (alloc nil: buf is the message's) and RecvVar.
func (t *Transport) recvMsg(ctx context.Context, peer int, want transport.Header, buf []byte, alloc func(int) ([]byte, error)) (transport.Header, []byte, error) {
	p, err := t.lookup(ctx, peer)
	if err != nil {
		return transport.Header{}, nil, err
	}
	if err := t.stopErr(); err != nil {
		return transport.Header{}, nil, err
	}
	if p.rerr != nil {
		return transport.Header{}, nil, p.rerr
	}
	if err := ctx.Err(); err != nil {
		return transport.Header{}, nil, fmt.Errorf("tcp: recv from rank %d: %w", peer, err)
	}
	p.reads.Add(1) // odd: the watcher leaves this stream alone
	stop := p.armRead(ctx)
	// Close sets a past read deadline after stopping: check again now
	// that armRead may have replaced it.
	var got transport.Header
	if err = t.stopErr(); err == nil {
		got, buf, err = t.recv(ctx, p, want, buf, alloc)
	}
	p.disarmRead(stop)
	p.reads.Add(1)
	return got, buf, err
}

func (t *Transport) recv(ctx context.Context, p *peer, want transport.Header, buf []byte, alloc func(int) ([]byte, error)) (transport.Header, []byte, error) {
	if n, err := io.ReadFull(p.conn, p.rhdr[:]); err != nil {
		err, lost := t.ioErr(ctx, p, "recv from", err)
		if lost {
			err = t.fail(err)
		}
		if n > 0 || lost {
			p.setRerr(err)
		}
		return transport.Header{}, nil, err
	}
	got, err := transport.DecodeHeader(p.rhdr[:])
	if err != nil {
		return got, nil, p.setRerr(fmt.Errorf("tcp: recv from rank %d: %w", p.rank, err))
	}
	switch got.Kind {
	case transport.KindAbort:
		reason := make([]byte, min(got.Len, maxAbortReason))
		n, _ := io.ReadFull(p.conn, reason)
		ferr := transport.FailureFrom(p.rank, got, string(reason[:n])).Err()
		return got, nil, p.setRerr(t.fail(ferr))
	case transport.KindClose:
		// Everything the peer sent was delivered: only talking to it
		// fails from now on.
		p.goodbye.Store(true)
		return got, nil, p.setRerr(closedErr("recv from", p))
	}
	if alloc == nil {
		err = transport.Check(p.rank, want, got)
	} else if err = transport.CheckVar(p.rank, want, got); err == nil {
		var n int
		if n, err = transport.VarLen(p.rank, got); err == nil {
			buf, err = alloc(n)
		}
	}
	if err != nil {
		return got, nil, p.setRerr(err)
	}
	if _, err := io.ReadFull(p.conn, buf); err != nil {
		err, lost := t.ioErr(ctx, p, "recv from", err)
		if lost {
			err = t.fail(err)
		}
		return got, nil, p.setRerr(err)
	}
	return got, buf, nil
}

// Abort tells every peer whose connection is not busy sending why this rank
// stops (a KindAbort message carrying reason.Error(); at most about a second
// in all), then closes every connection. Pending and later calls fail with
// an error wrapping transport.ErrAborted. Only the first Abort or Close acts.
//
// A reason that wraps a *transport.RemoteAbortError or a
// *transport.PeerLostError (a failure this rank learnt of, e.g. through
// another transport) is announced as that failure, naming the rank where it
// started.
func (t *Transport) Abort(reason error) {
	if reason == nil {
		reason = errors.New("abort requested")
	}
	stopErr := fmt.Errorf("%w: %v", transport.ErrAborted, reason)
	if !t.stop.CompareAndSwap(nil, &stopErr) {
		return
	}
	t.stopWatch()
	t.announce(transport.FailureOf(t.rank, reason))
	t.logger.Debug("tcp: aborted", "rank", t.rank, "reason", reason)
	t.closeConns()
}

// fail stops the transport because of a peer's failure (err is or wraps a
// *transport.RemoteAbortError or *transport.PeerLostError): pending and
// later calls fail with err, and the failure is announced to every peer.
// It returns the error the transport stopped with: err, or the failure (or
// Abort or Close) that came first.
func (t *Transport) fail(err error) error {
	if !t.stop.CompareAndSwap(nil, &err) {
		return t.stopErr()
	}
	t.stopWatch()
	t.logger.Warn("tcp: stopping after a peer's failure", "rank", t.rank, "err", err)
	t.announce(transport.FailureOf(t.rank, err))
	t.closeConns()
	return err
}

// announce writes a KindAbort message describing f to every peer whose
// connection is not busy sending (at most abortBudget in all), each followed
// by a FIN.
func (t *Transport) announce(f transport.Failure) {
	msg := []byte(f.Reason)
	if len(msg) > maxAbortReason {
		msg = msg[:maxAbortReason]
	}
	deadline := time.Now().Add(abortBudget)
	var wg sync.WaitGroup
	for i := range t.peers {
		p := t.peers[i].Load()
		if p == nil || p.goodbye.Load() || p.rank == f.Origin {
			continue // gone, or where the failure came from
		}
		if !p.wmu.TryLock() {
			continue // a Send holds the stream: the peer sees the connection close
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.wmu.Unlock()
			if p.werr != nil {
				return
			}
			var hdr [transport.HeaderSize]byte
			f.AbortHeader(len(msg)).Encode(hdr[:])
			p.conn.SetWriteDeadline(deadline)
			bufs := net.Buffers{hdr[:], msg}
			if _, err := bufs.WriteTo(p.conn); err == nil {
				if tc, ok := p.conn.(*net.TCPConn); ok {
					tc.CloseWrite() // FIN after the message
				}
			}
		}()
	}
	wg.Wait()
}

// Close says goodbye to every peer (a KindClose message: they can tell this
// orderly close from a crash, and still read what this rank sent before),
// then closes every connection; pending and later calls fail with an error
// wrapping transport.ErrAborted ("transport closed"). Close waits at most
// about a second for the goodbyes. Idempotent.
func (t *Transport) Close() error {
	closed := fmt.Errorf("%w: transport closed", transport.ErrAborted)
	if !t.stop.CompareAndSwap(nil, &closed) {
		t.closeConns()
		return nil
	}
	t.stopWatch()
	t.closeOnce.Do(t.sayGoodbye)
	return nil
}

// sayGoodbye writes the goodbye to every peer whose connection is free and
// closes each connection after it; a connection whose Send is in progress
// is closed at once (not an orderly close: the peer sees a cut message).
func (t *Transport) sayGoodbye() {
	var hdr [transport.HeaderSize]byte
	transport.Header{Kind: transport.KindClose}.Encode(hdr[:])
	deadline := time.Now().Add(goodbyeLinger)
	var wg sync.WaitGroup
	for i := range t.peers {
		p := t.peers[i].Load()
		if p == nil {
			continue
		}
		p.conn.SetReadDeadline(aLongTimeAgo) // fail the pending Recvs now
		if p.goodbye.Load() || !p.wmu.TryLock() {
			p.conn.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.wmu.Unlock()
			defer p.conn.Close()
			if p.werr != nil {
				return
			}
			p.conn.SetWriteDeadline(deadline)
			if _, err := p.conn.Write(hdr[:]); err == nil {
				if tc, ok := p.conn.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(goodbyeWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.logger.Warn("tcp: goodbye still pending after closing, finishing it in the background", "rank", t.rank)
	}
}

func (t *Transport) closeConns() {
	t.stopWatch()
	t.closeOnce.Do(func() {
		for i := range t.peers {
			if p := t.peers[i].Load(); p != nil {
				p.conn.Close()
			}
		}
	})
}

// stopWatch stops the watcher and everything that connects: the listener,
// the handshakes and dials in progress (and waits for them), so that the
// set of connections is final.
func (t *Transport) stopWatch() {
	t.quitOnce.Do(func() {
		close(t.quit)
		t.cs.mu.Lock()
		t.cs.closed = true
		t.cs.closeListener()
		if t.cs.halt != nil {
			t.cs.halt()
		}
		t.cs.broadcastLocked()
		t.cs.mu.Unlock()
		t.cs.wg.Wait()
		t.cs.refused.Flush()
	})
}

// watch looks at every idle connection every watchEvery until the transport
// stops, and fails the transport when a peer aborted or was lost.
func (t *Transport) watch() {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	var hdr [transport.HeaderSize]byte
	for {
		select {
		case <-t.quit:
			return
		case <-tick.C:
		}
		if !t.watchOnce(hdr[:]) {
			return
		}
	}
}

// watchOnce looks at every idle connection once, failing the transport
// when a peer aborted or was lost; it returns false once the transport
// stopped. hdr is scratch space (see inspect).
func (t *Transport) watchOnce(hdr []byte) bool {
	for i := range t.peers {
		p := t.peers[i].Load()
		if t.stopErr() != nil {
			return false
		}
		if p == nil || p.goodbye.Load() {
			continue
		}
		if err := t.inspect(p, hdr); err != nil {
			t.fail(err)
			return false
		}
	}
	return true
}

// Peek returns the header at the front of the stream from peer once all of
// it arrived, without consuming it (transport.Peeker). Where the system
// cannot peek at a socket nothing is ever ready.
func (t *Transport) Peek(peer int) (transport.Header, bool) {
	p := t.peer(peer)
	if p == nil || t.stopErr() != nil || p.broken.Load() || p.goodbye.Load() {
		return transport.Header{}, false
	}
	var hdr [transport.HeaderSize]byte
	n, err := peek(p.conn, hdr[:])
	if err != nil || n < transport.HeaderSize {
		return transport.Header{}, false
	}
	h, err := transport.DecodeHeader(hdr[:])
	return h, err == nil
}

// inspect peeks, without consuming or blocking, at the front of the stream
// from p while no Recv reads it, and returns the failure found there: an
// abort message, or the end of the stream (or a reset) without a goodbye. A
// goodbye found there sets p.goodbye. hdr is scratch space (nil: allocate).
func (t *Transport) inspect(p *peer, hdr []byte) error {
	if hdr == nil {
		hdr = make([]byte, transport.HeaderSize)
	}
	g := p.reads.Load()
	if g&1 != 0 {
		return nil // a Recv is reading: it sees for itself
	}
	n, err := peek(p.conn, hdr)
	if p.reads.Load() != g || t.stopErr() != nil || err == errNoData {
		return nil // raced with a Recv, stopped, or nothing to see
	}
	if err != nil || n == 0 {
		what, dead := "connection closed without goodbye (process died?)", true
		if err != nil {
			what, dead = fmt.Sprintf("connection broke (%v)", err), transport.Died(err)
		}
		return fmt.Errorf("tcp: rank %d watching rank %d (%s): %w", t.rank, p.rank, p.addr, &transport.PeerLostError{Peer: p.rank, Reason: what, Dead: dead})
	}
	if n < transport.HeaderSize || p.broken.Load() {
		return nil // mid-message, or the rest is on its way
	}
	h, err := transport.DecodeHeader(hdr)
	if err != nil {
		return nil // a Recv will report it
	}
	switch h.Kind {
	case transport.KindClose:
		p.goodbye.Store(true)
	case transport.KindAbort:
		msg := make([]byte, transport.HeaderSize+int(min(h.Len, maxAbortReason)))
		n, err := peek(p.conn, msg)
		if err != nil || n < len(msg) || p.reads.Load() != g {
			return nil // the reason is still on its way
		}
		return transport.FailureFrom(p.rank, h, string(msg[transport.HeaderSize:])).Err()
	}
	return nil
}
