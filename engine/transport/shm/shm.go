//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

// maxAbortPayload bounds the reason text of an abort message accepted from a
// peer; longer means the stream is corrupt.
const maxAbortPayload = 64 << 10

// Transport is one rank's shared-memory endpoint. It implements
// transport.Transport.
type Transport struct {
	rank, size int
	tag        [8]byte
	file       *shmseg.OwnFile // the segment's memory file, open until Release
	ref        PeerInfo        // how peers open it
	open       shmsync.Opener
	ringBytes  int
	log        *slog.Logger

	own     []byte       // own segment, whole
	slots   map[int]int  // producing peer rank -> slot in own segment
	watched map[int]bool // the hot peers, whose processes this rank watches

	// conns[peer] is set by Connect before connected is stored; read only
	// after connected was seen true.
	conns     []*peerConn
	connected atomic.Bool
	connectMu sync.Mutex

	// opMu is read-held by every Send/Recv while it touches the mappings;
	// shutdown takes it for writing (after setting aborted/closed and waking
	// waiters) before unmapping.
	opMu     sync.RWMutex
	aborted  atomic.Bool
	closed   atomic.Bool
	failMu   sync.Mutex        // serialises failWith and Close's choice of the final state
	abortErr error             // set before aborted is stored
	failure  transport.Failure // what this rank announced; set before aborted is stored

	quit     chan struct{} // closed to stop the watcher
	quitOnce sync.Once

	shutMu   sync.Mutex
	shutDone bool
}

// peerConn is the pair of rings between this rank and one peer.
type peerConn struct {
	rank    int
	remote  bool           // in another process: check its liveness while waiting
	watched bool           // the watcher checks its process (a hot peer)
	policy  shmsync.Policy // how a wait on this peer polls and yields before the futex
	pidfd   int            // the remote process's pidfd for the watcher, or -1
	seg     *peerSegment
	out     *ring // in the peer's segment: this rank produces
	in      ring  // in the own segment: this rank consumes

	sendMu  sync.Mutex
	sendErr error  // sticky: the stream to the peer is unusable
	outTail uint64 // producer's copy of out.tail

	recvMu  sync.Mutex
	recvErr error  // sticky: the stream from the peer is unusable
	inHead  uint64 // consumer's copy of in.head
}

var (
	_ transport.Transport   = (*Transport)(nil)
	_ transport.VarReceiver = (*Transport)(nil)
	_ transport.Peeker      = (*Transport)(nil)
)

// Create makes this rank's segment, with one inbound ring per peer in
// cfg.Peers, maps it and pre-touches it (with many peers, the hot peers'
// rings only: see allHotPeers).
func Create(cfg Config) (*Transport, error) {
	if cfg.Size <= 0 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("shm: rank %d out of range for size %d", cfg.Rank, cfg.Size)
	}
	var peers []int
	for _, p := range cfg.Peers {
		if p < 0 || p >= cfg.Size {
			return nil, fmt.Errorf("shm: peer rank %d out of range for size %d", p, cfg.Size)
		}
		if p != cfg.Rank && !slices.Contains(peers, p) {
			peers = append(peers, p)
		}
	}
	ringBytes := cfg.RingBytes
	if ringBytes == 0 {
		ringBytes = autoRingBytes(len(peers))
	}
	if ringBytes < 0 || ringBytes > MaxRingBytes {
		return nil, fmt.Errorf("shm: ring size %d out of range (max %d)", ringBytes, MaxRingBytes)
	}
	ringBytes = max(ringBytes, MinRingBytes)
	for ringBytes&(ringBytes-1) != 0 {
		ringBytes += ringBytes & -ringBytes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Transport{
		rank:      cfg.Rank,
		size:      cfg.Size,
		tag:       cfg.Tag,
		open:      cfg.Open,
		ringBytes: ringBytes,
		log:       log,
		slots:     make(map[int]int, len(peers)),
		watched:   make(map[int]bool, len(peers)),
		conns:     make([]*peerConn, cfg.Size),
		quit:      make(chan struct{}),
	}
	hot, cold := hotPeers(cfg.Rank, cfg.Size, peers)
	peers = append(hot[:len(hot):len(hot)], cold...) // by slot: the hot first
	for i, p := range peers {
		t.slots[p] = i
		t.watched[p] = i < len(hot)
	}
	m, fd, err := createSegment(cfg.Tag, cfg.Rank, cfg.Size, peers, len(hot), ringBytes)
	if err != nil {
		return nil, fmt.Errorf("shm: rank %d: %w", cfg.Rank, err)
	}
	t.own, t.file = m, shmseg.NewOwnFile(fd)
	if t.ref, err = shmsync.RefOf(fd); err != nil {
		syscall.Munmap(m)
		syscall.Close(fd)
		return nil, fmt.Errorf("shm: rank %d: %w", cfg.Rank, err)
	}
	log.Debug("shm: segment created", "rank", t.rank, "file", t.ref, "peers", peers, "hot", len(hot), "ring", ringBytes, "bytes", len(m))
	return t, nil
}

// Ref is where the peers' Connect finds this rank's segment (until
// Release).
func (t *Transport) Ref() PeerInfo { return t.ref }

// Rank is this rank.
func (t *Transport) Rank() int { return t.rank }

// Size is the communicator size.
func (t *Transport) Size() int { return t.size }

// Connect maps the segment of every peer in peers (each must be in
// cfg.Peers) and verifies its header: magic, version, communicator tag, rank,
// size, creator pid and the creator's start time. It may be called once.
func (t *Transport) Connect(ctx context.Context, peers map[int]PeerInfo) error {
	t.connectMu.Lock()
	defer t.connectMu.Unlock()
	t.opMu.RLock()
	defer t.opMu.RUnlock()
	if err := t.localErr(); err != nil {
		return err
	}
	if t.connected.Load() {
		return errors.New("shm: Connect called twice")
	}
	ranks := make([]int, 0, len(peers))
	for r := range peers {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	var done []*peerConn
	fail := func(err error) error {
		for _, c := range done {
			c.seg.unmap()
			c.closePidfd()
		}
		return err
	}
	self := os.Getpid()
	for _, r := range ranks {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		info := peers[r]
		slot, ok := t.slots[r]
		if !ok {
			return fail(fmt.Errorf("shm: rank %d: peer %d was not in Config.Peers", t.rank, r))
		}
		seg, err := openSegment(t.open, info, t.tag, t.rank, r, t.size)
		if err != nil {
			return fail(fmt.Errorf("shm: rank %d connecting to rank %d: %w", t.rank, r, err))
		}
		c := &peerConn{rank: r, remote: seg.proc.Pid != self, watched: t.watched[r], seg: seg, out: &seg.ring, pidfd: -1}
		done = append(done, c)
		if c.remote && c.watched {
			// Before the liveness check, so that it is known to refer
			// to the process that created the segment.
			c.pidfd = pidfdOpen(seg.proc.Pid)
		}
		if c.remote && !seg.proc.Alive() {
			return fail(fmt.Errorf("shm: rank %d connecting to rank %d: %w (process %d is gone)", t.rank, r, transport.ErrPeerLost, seg.proc.Pid))
		}
		if st := seg.state(); st != shmseg.StateReady {
			if err, _ := c.remoteErr(); err != nil {
				return fail(fmt.Errorf("shm: rank %d connecting: %w", t.rank, err))
			}
			return fail(fmt.Errorf("shm: rank %d connecting to rank %d: %w: segment state %d", t.rank, r, transport.ErrProtocol, st))
		}
		base := ctrlOff + slot*ctrlBytes
		data := dataOffset(len(t.slots)) + slot*t.ringBytes
		c.in = makeRing(t.own[base:base+ctrlBytes], t.own[data:data+t.ringBytes])
		c.inHead = c.in.head.Load()
		c.outTail = c.out.tail.Load()
	}
	pids := []int{self}
	for _, c := range done {
		pids = append(pids, c.seg.proc.Pid)
	}
	policy := shmsync.PolicyAmong(len(t.slots)+1, pids) // the local ranks
	for _, c := range done {
		c.policy = policy
		t.conns[c.rank] = c
	}
	t.connected.Store(true)
	if len(done) > 0 {
		var pfds []pollFd
		polled := make(map[int]int)
		for _, c := range done {
			if c.pidfd >= 0 {
				polled[c.rank] = len(pfds)
				pfds = append(pfds, pollFd{fd: int32(c.pidfd)})
			}
		}
		go t.watch(pfds, polled)
	}
	t.log.Debug("shm: connected", "rank", t.rank, "peers", ranks)
	return nil
}

// Release closes the descriptor through which peers open this rank's
// segment; the mappings stay valid. Call it once every peer connected.
// Idempotent; Close releases too.
func (t *Transport) Release() { t.file.Release() }

func (t *Transport) localErr() error {
	if t.aborted.Load() {
		return t.abortErr
	}
	if t.closed.Load() {
		return ErrClosed
	}
	return nil
}

// begin read-locks opMu and returns the connection to peer; on error opMu is
// not held.
func (t *Transport) begin(peer int) (*peerConn, error) {
	t.opMu.RLock()
	if err := t.localErr(); err != nil {
		t.opMu.RUnlock()
		return nil, err
	}
	if peer < 0 || peer >= t.size || peer == t.rank || !t.connected.Load() || t.conns[peer] == nil {
		t.opMu.RUnlock()
		if !t.connected.Load() {
			return nil, fmt.Errorf("shm: rank %d: not connected", t.rank)
		}
		return nil, fmt.Errorf("shm: rank %d: no connection to rank %d", t.rank, peer)
	}
	return t.conns[peer], nil
}

// Send copies h and data into this rank's ring in the peer's segment.
func (t *Transport) Send(ctx context.Context, peer int, h transport.Header, data []byte) error {
	if h.Len != uint64(len(data)) {
		return fmt.Errorf("shm: send to rank %d: header length %d, payload %d bytes", peer, h.Len, len(data))
	}
	p, err := t.begin(peer)
	if err != nil {
		return err
	}
	defer t.opMu.RUnlock()
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.sendErr != nil {
		return p.sendErr
	}
	if err := t.localErr(); err != nil {
		return err
	}
	if p.seg.state() != shmseg.StateReady {
		// Closed (nobody will read) or failed: do not write into the void.
		if err, failed := p.remoteErr(); err != nil {
			if failed {
				err = t.fail(err)
			}
			p.sendErr = err
			return err
		}
	}
	var hb [transport.HeaderSize]byte
	h.Encode(hb[:])
	start := p.outTail
	if err := t.write(ctx, p, hb[:], data); err != nil {
		if p.outTail != start || isPeerGone(err) {
			p.sendErr = err
		}
		return err
	}
	return nil
}

func isPeerGone(err error) bool {
	return errors.Is(err, transport.ErrPeerLost) || errors.Is(err, transport.ErrRemoteAbort)
}

// write streams a then b into p.out, publishing tail after every chunk.
func (t *Transport) write(ctx context.Context, p *peerConn, a, b []byte) error {
	r := p.out
	size := uint64(len(r.data))
	tail := p.outTail
	for len(a)+len(b) > 0 {
		head := r.head.Load()
		free := size - (tail - head)
		if free == 0 {
			if err := t.await(ctx, p, waitSpace, r.head, head, r.prodWait); err != nil {
				return err
			}
			continue
		}
		free = min(free, r.chunk)
		for free > 0 && len(a)+len(b) > 0 {
			if len(a) == 0 {
				a, b = b, nil
			}
			n := min(free, uint64(len(a)))
			off := tail & r.mask
			k := copy(r.data[off:], a[:n])
			copy(r.data, a[k:n])
			a = a[n:]
			tail += n
			free -= n
		}
		r.tail.Store(tail)
		p.outTail = tail
		if r.consWait.Load() != 0 {
			futexWake(r.tail)
		}
		if len(a)+len(b) > 0 {
			if err := t.localErr(); err != nil {
				return err
			}
		}
	}
	return nil
}

// read streams len(dst) bytes out of p.in, publishing head after every chunk.
func (t *Transport) read(ctx context.Context, p *peerConn, dst []byte) error {
	r := &p.in
	head := p.inHead
	for len(dst) > 0 {
		tail := r.tail.Load()
		avail := tail - head
		if avail == 0 {
			if err := t.await(ctx, p, waitData, r.tail, tail, r.consWait); err != nil {
				return err
			}
			continue
		}
		n := min(avail, uint64(len(dst)), r.chunk)
		off := head & r.mask
		k := copy(dst[:n], r.data[off:])
		copy(dst[k:n], r.data)
		dst = dst[n:]
		head += n
		r.head.Store(head)
		p.inHead = head
		if r.prodWait.Load() != 0 {
			futexWake(r.head)
		}
		if len(dst) > 0 {
			if err := t.localErr(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Peek returns the header at the front of the ring from peer once all of
// it arrived, without consuming it (transport.Peeker).
func (t *Transport) Peek(peer int) (transport.Header, bool) {
	p, err := t.begin(peer)
	if err != nil {
		return transport.Header{}, false
	}
	defer t.opMu.RUnlock()
	if !p.recvMu.TryLock() {
		return transport.Header{}, false // a Recv is reading (the caller broke the rule)
	}
	defer p.recvMu.Unlock()
	if p.recvErr != nil || p.in.tail.Load()-p.inHead < transport.HeaderSize {
		return transport.Header{}, false
	}
	var hb [transport.HeaderSize]byte
	peekRing(&p.in, p.inHead, hb[:])
	h, err := transport.DecodeHeader(hb[:])
	return h, err == nil
}

// Recv receives the next message from peer into buf and checks its header
// against want.
func (t *Transport) Recv(ctx context.Context, peer int, want transport.Header, buf []byte) error {
	if want.Len != uint64(len(buf)) {
		return fmt.Errorf("shm: recv from rank %d: expected length %d, buffer %d bytes", peer, want.Len, len(buf))
	}
	_, _, err := t.recvMsg(ctx, peer, want, buf, nil)
	return err
}

// RecvVar receives the next message from peer, whatever its step and
// length, into the buffer alloc returns for its length
// (transport.VarReceiver).
func (t *Transport) RecvVar(ctx context.Context, peer int, want transport.Header, alloc func(n int) ([]byte, error)) (transport.Header, []byte, error) {
	return t.recvMsg(ctx, peer, want, nil, alloc)
}

// recvMsg is Recv (alloc nil: buf is the message's) and RecvVar.
func (t *Transport) recvMsg(ctx context.Context, peer int, want transport.Header, buf []byte, alloc func(int) ([]byte, error)) (transport.Header, []byte, error) {
	p, err := t.begin(peer)
	if err != nil {
		return transport.Header{}, nil, err
	}
	defer t.opMu.RUnlock()
	p.recvMu.Lock()
	defer p.recvMu.Unlock()
	if p.recvErr != nil {
		return transport.Header{}, nil, p.recvErr
	}
	if err := t.localErr(); err != nil {
		return transport.Header{}, nil, err
	}
	var hb [transport.HeaderSize]byte
	start := p.inHead
	if err := t.read(ctx, p, hb[:]); err != nil {
		if p.inHead != start || isPeerGone(err) {
			p.recvErr = err
		}
		return transport.Header{}, nil, err
	}
	got, err := transport.DecodeHeader(hb[:])
	if err == nil && got.Kind == transport.KindAbort {
		err = fmt.Errorf("%w: abort message from rank %d with %d bytes", transport.ErrProtocol, peer, got.Len)
		if got.Len <= maxAbortPayload {
			reason := make([]byte, got.Len)
			if err = t.read(ctx, p, reason); err == nil {
				err = t.fail(transport.FailureFrom(peer, got, string(reason)).Err())
			}
		}
	} else if err == nil && alloc == nil {
		err = transport.Check(peer, want, got)
	} else if err == nil {
		if err = transport.CheckVar(peer, want, got); err == nil {
			var n int
			if n, err = transport.VarLen(peer, got); err == nil {
				buf, err = alloc(n)
			}
		}
	}
	if err == nil {
		err = t.read(ctx, p, buf)
	}
	if err != nil {
		// The stream is now inside or past a message that was not
		// consumed as expected: unusable.
		p.recvErr = err
		return got, nil, err
	}
	return got, buf, nil
}

// Abort stops this rank: it records the reason in its segment and writes a
// KindAbort message to every peer whose ring has room (without blocking),
// fails pending and later calls with an error wrapping transport.ErrAborted,
// then unmaps and unlinks. Later Aborts and Close do nothing.
//
// A reason that wraps a *transport.RemoteAbortError or a
// *transport.PeerLostError (a failure this rank learnt of, e.g. through
// another transport) is announced as that failure, naming the rank where it
// started. After this transport stopped by itself because of a peer's
// failure, Abort keeps that failure as the error of later calls.
func (t *Transport) Abort(reason error) {
	if reason == nil {
		reason = errors.New("aborted")
	}
	t.shutdown(reason)
}

// Close marks this rank's segment closed (peers waiting on it fail with
// transport.ErrPeerLost, after what it sent before; the others go on), fails
// pending calls with ErrClosed, unmaps and releases. Idempotent.
func (t *Transport) Close() error {
	return t.shutdown(nil)
}

// failWith stops this transport with err (calls fail with it from now on)
// and announces f in the own segment, so that the peers stop too: they watch
// every peer's state word. Only the first failure acts; an orderly close in
// progress is left alone. The caller holds opMu for reading (or is shutdown,
// before it unmaps). It returns whether this call acted.
func (t *Transport) failWith(err error, f transport.Failure) bool {
	t.failMu.Lock()
	defer t.failMu.Unlock()
	if t.closed.Load() || t.aborted.Load() {
		return false
	}
	t.abortErr = err
	t.failure = f
	shmseg.Header(t.own).Fail(f, false)
	t.aborted.Store(true)
	t.stopWatch()
	t.wakeAll()
	return true
}

// fail stops this transport because of a peer's failure: err is or wraps
// the *transport.RemoteAbortError or *transport.PeerLostError naming the
// rank where it started. It returns the error calls fail with now: err, or
// the failure (or Abort or Close) that came first. Caller as for failWith.
func (t *Transport) fail(err error) error {
	if t.failWith(err, transport.FailureOf(t.rank, err)) {
		t.log.Warn("shm: stopping after a peer's failure", "rank", t.rank, "err", err)
	}
	if lerr := t.localErr(); lerr != nil {
		return lerr
	}
	return err
}

func (t *Transport) stopWatch() {
	t.quitOnce.Do(func() { close(t.quit) })
}

func (t *Transport) shutdown(reason error) error {
	t.shutMu.Lock()
	defer t.shutMu.Unlock()
	if t.shutDone {
		return nil
	}
	t.shutDone = true
	t.stopWatch()
	if reason != nil {
		t.failWith(fmt.Errorf("%w: %v", transport.ErrAborted, reason), transport.FailureOf(t.rank, reason))
	}
	t.failMu.Lock()
	failed := t.aborted.Load()
	if !failed {
		t.closed.Store(true)
		shmseg.Header(t.own).State().Store(shmseg.StateClosed)
	}
	t.failMu.Unlock()
	if failed {
		text := t.failure.Reason
		if len(text) > shmseg.MaxReason {
			text = text[:shmseg.MaxReason]
		}
		t.log.Debug("shm: abort", "rank", t.rank, "reason", text)
		if t.connected.Load() {
			for _, p := range t.conns {
				if p != nil {
					t.sendAbort(p, text)
				}
			}
		}
	}
	// Wake everything that may sleep on these rings, here and in the peers,
	// until the calls in flight left (a wake can miss a waiter that is just
	// going to sleep; the futex timeout bounds that, the loop shortens it).
	for i := 0; ; i++ {
		t.wakeAll()
		if t.opMu.TryLock() {
			break
		}
		time.Sleep(time.Duration(min(i+1, 10)) * 100 * time.Microsecond)
	}
	if t.connected.Load() {
		for _, p := range t.conns {
			if p != nil {
				p.seg.unmap()
				p.closePidfd() // the watcher is gone: it holds opMu while it polls
			}
		}
	}
	syscall.Munmap(t.own)
	t.own = nil
	t.opMu.Unlock()
	t.file.Release()
	t.log.Debug("shm: closed", "rank", t.rank)
	return nil
}

// sendAbort writes a KindAbort message announcing t.failure to p if no Send
// is in progress, the ring has room for all of it, and p is not where the
// failure came from.
func (t *Transport) sendAbort(p *peerConn, reason string) {
	if p.rank == t.failure.Origin || !p.sendMu.TryLock() {
		return
	}
	defer p.sendMu.Unlock()
	if p.sendErr != nil {
		return
	}
	r := p.out
	need := uint64(transport.HeaderSize + len(reason))
	if uint64(len(r.data))-(p.outTail-r.head.Load()) < need {
		return
	}
	var hb [transport.HeaderSize]byte
	t.failure.AbortHeader(len(reason)).Encode(hb[:])
	tail := p.outTail
	for _, b := range [][]byte{hb[:], []byte(reason)} {
		off := tail & r.mask
		k := copy(r.data[off:], b)
		copy(r.data, b[k:])
		tail += uint64(len(b))
	}
	r.tail.Store(tail)
	p.outTail = tail
	p.sendErr = t.abortErr
}

func (p *peerConn) closePidfd() {
	if p.pidfd >= 0 {
		syscall.Close(p.pidfd)
		p.pidfd = -1
	}
}

func (t *Transport) wakeAll() {
	if !t.connected.Load() {
		return
	}
	for _, p := range t.conns {
		if p == nil {
			continue
		}
		futexWake(p.in.tail)
		futexWake(p.in.head)
		futexWake(p.out.tail)
		futexWake(p.out.head)
	}
}
