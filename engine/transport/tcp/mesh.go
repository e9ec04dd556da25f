package tcp

// Setup: New builds the mesh of authenticated connections (the higher rank
// of a pair dials, the lower accepts) and tunes each connection; the data
// path (Send, Recv, the watcher, failure propagation) is in tcp.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/gocoll/gocoll/engine/logthrottle"
)

// New connects this rank to cfg.Peers and returns once every connection is
// up and authenticated, or fails when ctx ends (the error names the ranks
// still missing and wraps ctx's error) or a peer proves to be the wrong
// endpoint. Dialling retries with backoff, since a peer may not listen yet:
// give ctx a deadline.
func New(ctx context.Context, cfg Config) (*Transport, error) {
	if cfg.Listener != nil {
		defer cfg.Listener.Close()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("tcp: rank %d out of range for size %d", cfg.Rank, cfg.Size)
	}
	var lower, higher []int
	seen := make(map[int]bool)
	for _, r := range cfg.Peers {
		if r < 0 || r >= cfg.Size {
			return nil, fmt.Errorf("tcp: peer rank %d out of range for size %d", r, cfg.Size)
		}
		if seen[r] {
			return nil, fmt.Errorf("tcp: peer rank %d listed twice", r)
		}
		seen[r] = true
		switch {
		case r < cfg.Rank:
			if len(cfg.Addrs) != cfg.Size {
				return nil, fmt.Errorf("tcp: %d addresses for %d ranks", len(cfg.Addrs), cfg.Size)
			}
			if cfg.Addrs[r] == "" {
				return nil, fmt.Errorf("tcp: no address for rank %d", r)
			}
			lower = append(lower, r)
		case r > cfg.Rank:
			higher = append(higher, r)
		}
	}
	if len(higher) > 0 && cfg.Listener == nil {
		return nil, fmt.Errorf("tcp: rank %d must accept ranks %v but has no listener", cfg.Rank, higher)
	}
	t := &Transport{rank: cfg.Rank, size: cfg.Size, peers: make([]*peer, cfg.Size), logger: logger, quit: make(chan struct{})}
	m := &mesh{
		cfg:      cfg,
		logger:   logger,
		results:  make(chan dialed),
		inflight: make(map[net.Conn]struct{}),
		lastErr:  make(map[int]error),
		refused:  logthrottle.New(logger, "refused connections", 0, 0, nil),
	}
	conns, err := m.run(ctx, lower, higher)
	m.refused.Flush() // run waited for every handshake: the count is final
	if err != nil {
		return nil, err
	}
	for r, c := range conns {
		tune(c, cfg.SocketBuffer, logger)
		t.peers[r] = &peer{rank: r, addr: c.RemoteAddr().String(), conn: c}
	}
	if len(conns) > 0 && canPeek {
		go t.watch()
	}
	logger.Debug("tcp: mesh ready", "rank", cfg.Rank, "peers", len(conns))
	return t, nil
}

type dialed struct {
	rank int
	conn net.Conn
	err  error // fatal for New
}

// mesh is the state of one New call.
type mesh struct {
	cfg     Config
	logger  *slog.Logger
	results chan dialed
	wg      sync.WaitGroup

	mu       sync.Mutex
	inflight map[net.Conn]struct{} // connections in their handshake
	lastErr  map[int]error         // last dial error per lower rank
	done     bool

	// refused throttles the WARN per refused connection: a port scan or
	// a flood must not flood the log.
	refused *logthrottle.Limiter
}

func (m *mesh) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return false
	}
	m.inflight[c] = struct{}{}
	return true
}

func (m *mesh) untrack(c net.Conn) {
	m.mu.Lock()
	delete(m.inflight, c)
	m.mu.Unlock()
}

func handshakeDeadline(ctx context.Context) time.Time {
	d := time.Now().Add(DefaultHandshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}

func (m *mesh) run(ctx context.Context, lower, higher []int) (map[int]net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	want := make(map[int]bool, len(higher))
	for _, r := range higher {
		want[r] = true
	}
	if len(higher) > 0 {
		m.wg.Add(1)
		go m.acceptLoop(ctx, want)
	}
	for _, r := range lower {
		m.wg.Add(1)
		go m.dial(ctx, r)
	}

	conns := make(map[int]net.Conn)
	var fail error
	for len(conns) < len(lower)+len(higher) && fail == nil {
		select {
		case d := <-m.results:
			if d.err != nil {
				fail = d.err
				break
			}
			if old := conns[d.rank]; old != nil {
				// An authenticated rank dialled again: it gave up on the
				// first connection (e.g. lost the verdict), so keep the new one.
				m.logger.Warn("tcp: rank connected twice, keeping the newer connection", "rank", m.cfg.Rank, "peer", d.rank, "remote", d.conn.RemoteAddr().String())
				old.Close()
			}
			conns[d.rank] = d.conn
		case <-ctx.Done():
			var missing []int
			for _, r := range append(slices.Clone(lower), higher...) {
				if conns[r] == nil {
					missing = append(missing, r)
				}
			}
			slices.Sort(missing)
			fail = fmt.Errorf("tcp: rank %d: connecting to peers: %w; no connection with ranks %v", m.cfg.Rank, ctx.Err(), missing)
			m.mu.Lock()
			for _, r := range missing {
				if e := m.lastErr[r]; e != nil {
					fail = fmt.Errorf("%w (rank %d at %s: %v)", fail, r, m.cfg.Addrs[r], e)
				}
			}
			m.mu.Unlock()
		}
	}
	// Stop accepting and dialling, unblock handshakes, wait for every goroutine.
	cancel()
	if m.cfg.Listener != nil {
		m.cfg.Listener.Close()
	}
	m.mu.Lock()
	m.done = true
	for c := range m.inflight {
		c.Close()
	}
	m.mu.Unlock()
	m.wg.Wait()
	if fail != nil {
		for _, c := range conns {
			c.Close()
		}
		return nil, fail
	}
	return conns, nil
}

// deliver hands a connection to run, or closes it if run has finished.
func (m *mesh) deliver(ctx context.Context, d dialed) {
	select {
	case m.results <- d:
	case <-ctx.Done():
		if d.conn != nil {
			d.conn.Close()
		}
	}
}

func (m *mesh) acceptLoop(ctx context.Context, want map[int]bool) {
	defer m.wg.Done()
	for {
		c, err := m.cfg.Listener.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. out of file descriptors): keep serving.
			m.logger.Warn("tcp: accept failed", "rank", m.cfg.Rank, "err", err)
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			continue
		}
		if !m.track(c) {
			c.Close()
			return
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			r, err := ServerHandshake(c, m.cfg.Secret, m.cfg.Tag, m.cfg.Rank, handshakeDeadline(ctx), func(r int) error {
				if !want[r] {
					err := fmt.Errorf("rank %d does not accept a connection from rank %d on this communicator", m.cfg.Rank, r)
					// Before the client reads the verdict: once it has,
					// setup may end and cancel ctx before a later log.
					m.refused.Warn("tcp: refused connection", "rank", m.cfg.Rank, "remote", c.RemoteAddr().String(), "err", err)
					return err
				}
				return nil
			})
			m.untrack(c)
			if err != nil {
				// (A failed handshake is logged before the connection is
				// closed, so before the client can tell.) Handshakes cut
				// because setup ended are no refusal; a client that hung up
				// is one, even if setup ended before this goroutine saw it
				// (run waits for it, so the log is complete when New returns).
				if !errors.Is(err, net.ErrClosed) && !errors.Is(err, ErrRefused) {
					m.refused.Warn("tcp: refused connection", "rank", m.cfg.Rank, "remote", c.RemoteAddr().String(), "err", err)
				}
				c.Close()
				return
			}
			m.logger.Debug("tcp: accepted", "rank", m.cfg.Rank, "peer", r, "remote", c.RemoteAddr().String())
			m.deliver(ctx, dialed{rank: r, conn: c})
		}()
	}
}

func (m *mesh) dial(ctx context.Context, r int) {
	defer m.wg.Done()
	addr := m.cfg.Addrs[r]
	backoff := 5 * time.Millisecond
	for ctx.Err() == nil {
		var d net.Dialer
		dctx, dcancel := context.WithTimeout(ctx, DefaultHandshakeTimeout)
		c, err := d.DialContext(dctx, "tcp", addr)
		dcancel()
		if err == nil {
			if !m.track(c) {
				c.Close()
				return
			}
			var got int
			got, err = ClientHandshake(c, m.cfg.Secret, m.cfg.Tag, m.cfg.Rank, handshakeDeadline(ctx))
			m.untrack(c)
			if err == nil && got != r {
				err = fmt.Errorf("tcp: %w: %s answered as rank %d, expected rank %d", ErrAuth, addr, got, r)
			}
			if err == nil {
				m.logger.Debug("tcp: connected", "rank", m.cfg.Rank, "peer", r, "remote", addr)
				m.deliver(ctx, dialed{rank: r, conn: c})
				return
			}
			c.Close()
			if errors.Is(err, ErrAuth) || errors.Is(err, ErrRefused) {
				// The listener at addr is not our peer (or does not want
				// us): retrying cannot help.
				m.deliver(ctx, dialed{err: fmt.Errorf("tcp: rank %d connecting to rank %d at %s: %w", m.cfg.Rank, r, addr, err)})
				return
			}
		}
		m.mu.Lock()
		m.lastErr[r] = err
		m.mu.Unlock()
		sleep := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, time.Second)
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
		}
	}
}

func tune(c net.Conn, bufSize int, logger *slog.Logger) {
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
	// idle time of hours.
	if err := tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 4}); err != nil {
		logger.Debug("tcp: keepalive", "err", err)
	}
}
