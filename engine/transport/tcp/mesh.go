package tcp

// Connections. New connects the eager peers (the higher rank of a pair
// dials, the lower accepts) and returns once they are up. Without
// Config.Lazy that is every peer and the listener closes then, as a full
// mesh. With it the listener stays open for the transport's life, and a
// peer not connected yet is connected on its first Send or Recv by
// whichever side needs it first: each side's slot for the pair says what
// is under way, and the acceptor decides atomically which of two crossing
// dials survives (the higher rank's), so that both ends keep the same
// connection without a round trip beyond the handshake's. The data path
// (Send, Recv, the watcher, failure propagation) is in tcp.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/logthrottle"
)

// slotState is what this rank knows of its connection with one peer.
type slotState uint8

const (
	slotEmpty     slotState = iota
	slotDialing             // this rank's dial is in flight
	slotCrossed             // the peer refused that dial for its own, which wins: await it
	slotAdmitting           // the peer's dial passed its checks; the verdict is on its way
	slotUp                  // connected: Transport.peers holds it
)

const (
	// maxPendingHandshakes bounds the incoming connections in their
	// handshake at once; past it the oldest is closed to make room. A
	// flood of idle connections thus costs a legitimate peer a retry,
	// never its place.
	maxPendingHandshakes = 128
	// crossedWait is how long a rank waits for the peer's crossing dial
	// before it dials again itself (the peer's dial may have ended).
	crossedWait = time.Second
	// refusedLost is how many refused dials in a row, after New, make a
	// peer lost: its listener was open since before setup, so nobody
	// listening means its process or transport is gone.
	refusedLost = 3
	// unboundedDial bounds a dial started by a call without a deadline.
	unboundedDial = 6 * DefaultHandshakeTimeout
)

func (s slotState) String() string {
	return [...]string{"not connected", "dialling", "awaiting its dial", "admitting its dial", "connected"}[s]
}

// conns is the connecting state of a Transport.
type conns struct {
	cfg     Config
	allowed []bool // peers of cfg.Peers
	lazy    bool
	ln      net.Listener
	refused *logthrottle.Limiter
	life    context.Context // ends when the transport stops
	halt    context.CancelFunc
	wg      sync.WaitGroup // the acceptor, handshakes and dials

	mu         sync.Mutex
	state      []slotState
	crossedAt  []time.Time
	crossedFor []time.Duration // how long to await the peer's dial: doubles each time
	lost       []error         // fatal for the pair: a wrong endpoint, or gone
	lastErr    map[int]error
	changed    chan struct{} // closed and replaced at every change of state
	pending    []net.Conn    // incoming connections in their handshake, oldest first
	closed     bool
	started    bool // New returned: a refused dial now means the peer is gone
}

// New connects this rank to the eager peers (cfg.Eager, else every peer of
// cfg.Peers) and returns once each connection is up and authenticated, or
// fails when ctx ends (the error names the ranks still missing and wraps
// ctx's error) or a peer proves to be the wrong endpoint. Dialling retries
// with backoff, since a peer may not listen yet: give ctx a deadline. With
// cfg.Lazy the other peers are connected on first use.
func New(ctx context.Context, cfg Config) (*Transport, error) {
	t, eager, err := newTransport(cfg)
	if err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	if t.cs.ln != nil {
		t.cs.wg.Add(1)
		go t.acceptLoop()
	}
	if err := t.connectEager(ctx, eager); err != nil {
		t.stopWatch()
		t.closeConns()
		t.cs.refused.Flush()
		return nil, err
	}
	if !t.cs.lazy {
		// A full mesh: nobody may connect any more.
		t.cs.mu.Lock()
		t.cs.closeListener()
		t.cs.mu.Unlock()
		t.cs.wg.Wait()
		t.cs.refused.Flush() // every handshake ended: the count is final
	}
	t.cs.mu.Lock()
	t.cs.started = true
	t.cs.mu.Unlock()
	if canPeek {
		go t.watch()
	}
	t.logger.Debug("tcp: mesh ready", "rank", cfg.Rank, "peers", t.count(), "lazy", t.cs.lazy)
	return t, nil
}

// newTransport checks cfg and makes the transport, with the eager peers.
func newTransport(cfg Config) (*Transport, []int, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, nil, fmt.Errorf("tcp: rank %d out of range for size %d", cfg.Rank, cfg.Size)
	}
	allowed := make([]bool, cfg.Size)
	for _, r := range cfg.Peers {
		if r < 0 || r >= cfg.Size {
			return nil, nil, fmt.Errorf("tcp: peer rank %d out of range for size %d", r, cfg.Size)
		}
		if allowed[r] {
			return nil, nil, fmt.Errorf("tcp: peer rank %d listed twice", r)
		}
		allowed[r] = r != cfg.Rank
	}
	eager := cfg.Peers
	if cfg.Lazy && cfg.Eager != nil {
		eager = cfg.Eager
	}
	var mine []int // eager peers, without this rank
	accepts := false
	for _, r := range eager {
		if r < 0 || r >= cfg.Size || !allowed[r] && r != cfg.Rank {
			return nil, nil, fmt.Errorf("tcp: eager peer rank %d is not among the peers", r)
		}
		if r == cfg.Rank || slices.Contains(mine, r) {
			continue
		}
		mine = append(mine, r)
		accepts = accepts || r > cfg.Rank
	}
	for r, ok := range allowed {
		// Lazily, any peer may need this rank's address, and may dial it.
		if !ok || !(cfg.Lazy || r < cfg.Rank) {
			continue
		}
		if len(cfg.Addrs) != cfg.Size {
			return nil, nil, fmt.Errorf("tcp: %d addresses for %d ranks", len(cfg.Addrs), cfg.Size)
		}
		if cfg.Addrs[r] == "" && (cfg.Lazy || slices.Contains(mine, r)) {
			return nil, nil, fmt.Errorf("tcp: no address for rank %d", r)
		}
		accepts = accepts || cfg.Lazy
	}
	if accepts && cfg.Listener == nil {
		return nil, nil, fmt.Errorf("tcp: rank %d must accept connections from its peers but has no listener", cfg.Rank)
	}
	life, halt := context.WithCancel(context.Background())
	t := &Transport{rank: cfg.Rank, size: cfg.Size, peers: make([]peerSlot, cfg.Size), logger: logger, quit: make(chan struct{})}
	t.cs = conns{cfg: cfg, allowed: allowed, lazy: cfg.Lazy, ln: cfg.Listener,
		refused: logthrottle.New(logger, "refused connections", 0, 0, nil), life: life, halt: halt,
		state: make([]slotState, cfg.Size), crossedAt: make([]time.Time, cfg.Size), crossedFor: make([]time.Duration, cfg.Size), lost: make([]error, cfg.Size),
		lastErr: map[int]error{}, changed: make(chan struct{})}
	return t, mine, nil
}

// connectEager dials the eager peers below this rank and waits for every
// eager peer to be connected.
func (t *Transport) connectEager(ctx context.Context, eager []int) error {
	t.cs.mu.Lock()
	for _, r := range eager {
		if r < t.rank {
			t.startDialLocked(ctx, r)
		}
	}
	t.cs.mu.Unlock()
	for {
		t.cs.mu.Lock()
		var missing []int
		for _, r := range eager {
			if t.peers[r].Load() == nil {
				missing = append(missing, r)
			}
			if err := t.cs.lost[r]; err != nil {
				t.cs.mu.Unlock()
				return err
			}
		}
		ch := t.cs.changed
		t.cs.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			slices.Sort(missing)
			err := fmt.Errorf("tcp: rank %d: connecting to peers: %w; no connection with ranks %v", t.rank, ctx.Err(), missing)
			t.cs.mu.Lock()
			for _, r := range missing {
				if e := t.cs.lastErr[r]; e != nil {
					err = fmt.Errorf("%w (rank %d at %s: %v)", err, r, t.cs.cfg.Addrs[r], e)
				}
			}
			t.cs.mu.Unlock()
			return err
		}
	}
}

// connect returns the connection with peer q, making it first if need be
// (Lazy). It waits until ctx ends.
func (t *Transport) connect(ctx context.Context, q int) (*peer, error) {
	if q < 0 || q >= t.size || !t.cs.allowed[q] || !t.cs.lazy {
		return nil, fmt.Errorf("tcp: rank %d has no TCP connection to rank %d", t.rank, q)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if p := t.peers[q].Load(); p != nil {
			return p, nil
		}
		t.cs.mu.Lock()
		if p := t.peers[q].Load(); p != nil {
			t.cs.mu.Unlock() // installed since the look above
			return p, nil
		}
		if err := t.stopErr(); err != nil {
			t.cs.mu.Unlock()
			return nil, err
		}
		if err := t.cs.lost[q]; err != nil {
			t.cs.mu.Unlock()
			return nil, err
		}
		var retry <-chan time.Time
		switch t.cs.state[q] {
		case slotEmpty:
			t.startDialLocked(ctx, q)
		case slotCrossed:
			if wait := t.cs.crossedFor[q] - time.Since(t.cs.crossedAt[q]); wait <= 0 {
				t.cs.state[q] = slotEmpty
				t.startDialLocked(ctx, q)
			} else {
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				retry = timer.C
			}
		}
		ch := t.cs.changed
		t.cs.mu.Unlock()
		select {
		case <-ch:
		case <-retry:
		case <-t.quit:
		case <-ctx.Done():
			t.cs.mu.Lock()
			err := fmt.Errorf("tcp: rank %d connecting to rank %d (%s): %w", t.rank, q, t.cs.state[q], ctx.Err())
			if e := t.cs.lastErr[q]; e != nil {
				err = fmt.Errorf("%w (at %s: %v)", err, t.cs.cfg.Addrs[q], e)
			}
			t.cs.mu.Unlock()
			return nil, err
		}
	}
}

// crossed: this rank's dial of q lost to q's own, which it awaits for
// crossedWait, then twice as long each time it has to dial again (a peer
// slow to dial under load is the common case, one whose dial ended the
// rare one). Called with mu held.
func (cs *conns) crossed(q int) {
	cs.state[q], cs.crossedAt[q] = slotCrossed, time.Now()
	cs.crossedFor[q] = min(max(2*cs.crossedFor[q], crossedWait), 16*crossedWait)
}

// broadcastLocked wakes everyone waiting for a change of state.
func (cs *conns) broadcastLocked() {
	close(cs.changed)
	cs.changed = make(chan struct{})
}

// startDialLocked starts this rank's dial to q, which lasts until it
// connects, q's answer settles the pair, ctx's deadline passes or the
// transport stops. Not when ctx is cancelled: the connection may serve
// other calls, and a dial abandoned after the peer admitted it would leave
// the peer holding a connection this rank closed.
func (t *Transport) startDialLocked(ctx context.Context, q int) {
	if t.cs.closed {
		return
	}
	t.cs.state[q] = slotDialing
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(unboundedDial)
	}
	dctx, cancel := context.WithDeadline(t.cs.life, deadline)
	t.cs.wg.Add(1)
	go func() {
		defer t.cs.wg.Done()
		defer cancel()
		t.dial(dctx, q)
	}()
}

// dial is one dial of peer q, retried with backoff until it settles.
func (t *Transport) dial(ctx context.Context, q int) {
	addr := t.cs.cfg.Addrs[q]
	backoff := 5 * time.Millisecond
	refusals := 0
	for ctx.Err() == nil {
		c, err := t.dialOnce(ctx, addr, q)
		if err == nil {
			t.install(q, c, slotDialing)
			return
		}
		t.cs.mu.Lock()
		if t.cs.state[q] != slotDialing {
			t.cs.mu.Unlock()
			return // settled by the peer's own dial
		}
		switch {
		case errors.Is(err, ErrCrossing):
			t.cs.crossed(q)
			t.cs.broadcastLocked()
			t.cs.mu.Unlock()
			return
		case errors.Is(err, errConnected):
			// The peer holds the connection of this rank's admission (in
			// progress here), or of an earlier dial of this rank's that
			// will settle: await it as a crossing.
			t.cs.crossed(q)
			t.cs.broadcastLocked()
			t.cs.mu.Unlock()
			return
		case errors.Is(err, ErrAuth) || errors.Is(err, ErrRefused):
			// The listener at addr is not our peer (or does not want us):
			// retrying cannot help.
			t.cs.lost[q] = fmt.Errorf("tcp: rank %d connecting to rank %d at %s: %w", t.rank, q, addr, err)
			t.cs.state[q] = slotEmpty
			t.cs.broadcastLocked()
			t.cs.mu.Unlock()
			return
		case errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE):
			// Out of descriptors: waiting does not free any.
			t.cs.lost[q] = fmt.Errorf("tcp: rank %d connecting to rank %d: %w", t.rank, q, DescribeLimit(err))
			t.cs.state[q] = slotEmpty
			t.cs.broadcastLocked()
			t.cs.mu.Unlock()
			return
		case errors.Is(err, syscall.ECONNREFUSED) && t.cs.started:
			if refusals++; refusals >= refusedLost {
				t.cs.lost[q] = t.lostErr(q, "nothing listens at its address any more (process gone, or its communicator closed)")
				t.cs.state[q] = slotEmpty
				t.cs.broadcastLocked()
				t.cs.mu.Unlock()
				return
			}
		default:
			refusals = 0
		}
		t.cs.lastErr[q] = err
		t.cs.mu.Unlock()
		sleep := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, time.Second)
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
		}
	}
	t.cs.mu.Lock()
	if t.cs.state[q] == slotDialing {
		t.cs.state[q] = slotEmpty
		t.cs.broadcastLocked()
	}
	t.cs.mu.Unlock()
}

// dialOnce connects to addr and runs the client's handshake, expecting
// rank q there.
func (t *Transport) dialOnce(ctx context.Context, addr string, q int) (net.Conn, error) {
	var d net.Dialer
	dctx, dcancel := context.WithTimeout(ctx, DefaultHandshakeTimeout)
	c, err := d.DialContext(dctx, "tcp", addr)
	dcancel()
	if err != nil {
		return nil, err
	}
	// The handshake may take as long as the caller allows: a verdict
	// given but not read would leave the acceptor holding a connection
	// this rank closed.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(aLongTimeAgo) })
	defer stop()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultHandshakeTimeout)
	}
	got, err := ClientHandshake(c, t.cs.cfg.Secret, t.cs.cfg.Tag, t.rank, deadline)
	if err == nil && got != q {
		err = fmt.Errorf("tcp: %w: %s answered as rank %d, expected rank %d", ErrAuth, addr, got, q)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	t.logger.Debug("tcp: connected", "rank", t.rank, "peer", q, "remote", addr)
	return c, nil
}

// install makes c the connection with q if q's slot is still in state
// from (this rank's dial, or the peer's admitted one), else closes it.
func (t *Transport) install(q int, c net.Conn, from slotState) {
	t.cs.mu.Lock()
	ok := !t.cs.closed && t.cs.state[q] == from
	if ok {
		tune(c, t.cs.cfg.SocketBuffer, t.cs.cfg.Timeout, t.logger)
		t.peers[q].Store(&peer{rank: q, addr: c.RemoteAddr().String(), conn: c})
		t.cs.state[q] = slotUp
		delete(t.cs.lastErr, q)
	}
	t.cs.broadcastLocked()
	t.cs.mu.Unlock()
	if !ok {
		c.Close()
	}
}

// admit decides, in the handshake, whether the peer claiming rank q may
// connect: the verdict. Of two crossing dials the higher rank's wins.
func (t *Transport) admit(q int) error {
	t.cs.mu.Lock()
	defer t.cs.mu.Unlock()
	switch {
	case q < 0 || q >= t.size || !t.cs.allowed[q]:
		return fmt.Errorf("rank %d does not accept a connection from rank %d on this communicator", t.rank, q)
	case t.cs.closed:
		return fmt.Errorf("rank %d is closing its connections", t.rank)
	}
	switch t.cs.state[q] {
	case slotUp, slotAdmitting:
		// The peer dialled again after its dial crossed this rank's and it
		// tired of waiting (crossedWait); its own admission of this rank's
		// dial settles the pair.
		return fmt.Errorf("rank %d with rank %d: %w", t.rank, q, errConnected)
	case slotDialing:
		if t.rank > q {
			return ErrCrossing
		}
	}
	t.cs.state[q] = slotAdmitting
	return nil
}

// unadmit undoes admit after the verdict could not be delivered.
func (t *Transport) unadmit(q int) {
	t.cs.mu.Lock()
	if t.cs.state[q] == slotAdmitting {
		t.cs.state[q] = slotEmpty
		t.cs.broadcastLocked()
	}
	t.cs.mu.Unlock()
}

// track adds c to the handshakes in progress, closing the oldest one past
// maxPendingHandshakes; false once the transport closed.
func (cs *conns) track(c net.Conn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return false
	}
	if len(cs.pending) >= maxPendingHandshakes {
		cs.pending[0].Close()
		cs.pending = cs.pending[1:]
	}
	cs.pending = append(cs.pending, c)
	return true
}

func (cs *conns) untrack(c net.Conn) {
	cs.mu.Lock()
	if i := slices.Index(cs.pending, c); i >= 0 {
		cs.pending = slices.Delete(cs.pending, i, i+1)
	}
	cs.mu.Unlock()
}

// closeListener stops accepting and cuts the handshakes in progress.
// Called with mu held.
func (cs *conns) closeListener() {
	if cs.ln != nil {
		cs.ln.Close()
	}
	for _, c := range cs.pending {
		c.Close()
	}
	cs.pending = nil
}

func (t *Transport) acceptLoop() {
	defer t.cs.wg.Done()
	for {
		c, err := t.cs.ln.Accept()
		if err != nil {
			if t.cs.life.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. out of file descriptors): keep serving.
			t.logger.Warn("tcp: accept failed", "rank", t.rank, "err", DescribeLimit(err))
			select {
			case <-time.After(50 * time.Millisecond):
			case <-t.cs.life.Done():
				return
			}
			continue
		}
		if !t.cs.track(c) {
			c.Close()
			return
		}
		t.cs.wg.Add(1)
		go func() {
			defer t.cs.wg.Done()
			t.serveHandshake(c)
		}()
	}
}

// serveHandshake authenticates an incoming connection and, admitted,
// installs it.
func (t *Transport) serveHandshake(c net.Conn) {
	admitted := -1
	r, err := ServerHandshake(c, t.cs.cfg.Secret, t.cs.cfg.Tag, t.rank, time.Now().Add(DefaultHandshakeTimeout), func(r int) error {
		err := t.admit(r)
		switch {
		case err == nil:
			admitted = r
		case errors.Is(err, ErrCrossing) || errors.Is(err, errConnected):
			// A dial that crossed this rank's own: the pair settles on one.
			t.logger.Debug("tcp: crossing dial", "rank", t.rank, "peer", r, "err", err)
		default:
			// Before the client reads the verdict: once it has, setup may
			// end before a later log.
			t.cs.refused.Warn("tcp: refused connection", "rank", t.rank, "remote", c.RemoteAddr().String(), "err", err)
		}
		return err
	})
	t.cs.untrack(c)
	if err != nil {
		if admitted >= 0 {
			t.unadmit(admitted)
		}
		// (A failed handshake is logged before the connection is closed,
		// so before the client can tell.) Handshakes cut because the
		// transport closed are no refusal; a client that hung up is one.
		if !errors.Is(err, net.ErrClosed) && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrCrossing) && !errors.Is(err, errConnected) && t.cs.life.Err() == nil {
			t.cs.refused.Warn("tcp: refused connection", "rank", t.rank, "remote", c.RemoteAddr().String(), "err", err)
		}
		c.Close()
		return
	}
	t.logger.Debug("tcp: accepted", "rank", t.rank, "peer", r, "remote", c.RemoteAddr().String())
	t.install(r, c, slotAdmitting)
}

// count is the number of peers connected now.
func (t *Transport) count() int {
	n := 0
	for i := range t.peers {
		if t.peers[i].Load() != nil {
			n++
		}
	}
	return n
}

// Connections is the number of peers this transport is connected with now
// (for the logs and the descriptor figures of lazy connections).
func (t *Transport) Connections() int { return t.count() }

// keepAlive is the kernel's keepalive for a communicator with timeout:
// probes every keepAliveEvery after keepAliveEvery of silence, as many as
// it takes to cover the timeout (Linux counts at most 127).
func keepAlive(timeout time.Duration) net.KeepAliveConfig {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	every := max(keepAliveEvery, timeout/120)
	return net.KeepAliveConfig{Enable: true, Idle: every, Interval: every, Count: int(min(timeout/every+1, 127))}
}

// keepAliveEvery is the keepalive's idle time and interval, at least.
const keepAliveEvery = 5 * time.Second

func tune(c net.Conn, bufSize int, timeout time.Duration, logger *slog.Logger) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	if err := tc.SetNoDelay(true); err != nil {
		logger.Debug("tcp: TCP_NODELAY", "err", err)
	}
	if bufSize == 0 {
		bufSize = DefaultSocketBuffer
	}
	if bufSize > 0 {
		if err := tc.SetWriteBuffer(bufSize); err != nil {
			logger.Debug("tcp: SO_SNDBUF", "err", err)
		}
		if err := tc.SetReadBuffer(bufSize); err != nil {
			logger.Debug("tcp: SO_RCVBUF", "err", err)
		}
	}
	// A peer host that vanishes (power loss, partition) is noticed after
	// Idle + Count·Interval of silence, not after the kernel's default
	// idle time of hours; but not before the communicator's timeout
	// (keepAlive): thousands of connections on a loaded host once lost
	// their probes and broke before it, failing a healthy job
	// (docs/scale.md, "Keepalive no shorter than the timeout").
	if err := tc.SetKeepAliveConfig(keepAlive(timeout)); err != nil {
		logger.Debug("tcp: keepalive", "err", err)
	}
}
