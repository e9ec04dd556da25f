package bootstrap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gocoll/gocoll/engine/logthrottle"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// Root is the rendezvous service of one job (usually run by rank 0, or by
// the process that made the unique id).
type Root struct {
	ln      net.Listener
	secret  []byte
	timeout time.Duration
	logger  *slog.Logger
	// refused throttles the WARN per refused or rejected connection, so
	// that a flood of them cannot flood the log.
	refused *logthrottle.Limiter

	events chan event
	quit   chan struct{} // closed when serve ends: readers stop
	done   chan struct{} // closed after everything is torn down
	closed chan struct{} // Close was called
	once   sync.Once
	err    error // outcome, readable after done

	mu       sync.Mutex
	conns    map[net.Conn]struct{} // every live connection, for teardown
	authFail map[int]bool          // ranks claimed by connections that failed authentication
	// secretFile is removed once every rank joined, or when the root stops
	// (see SecretFile); joined says the first happened.
	secretFile string
	joined     bool
	wg         sync.WaitGroup
}

type eventKind int

const (
	evJoin eventKind = iota
	evRound
	evGone
)

type event struct {
	kind   eventKind
	conn   net.Conn
	rank   int
	nranks int
	round  uint32
	blob   []byte
	err    error
}

type member struct {
	conn      net.Conn
	addr      string
	blob      []byte
	submitted bool
}

// StartRoot listens on addr ("host:port"; ":0" or "0.0.0.0:0" picks a free
// port on every interface) and serves one job in the background. secret
// authenticates every client. timeout bounds the wait for all ranks to join
// (counted from now) and the wait for all ranks to take part in each later
// round (counted from the first rank's arrival in that round); 0 means
// DefaultTimeout. When it expires the ranks that did arrive are told which
// did not, and the root stops. logger (nil: discard) gets WARN for refused
// connections and failed rendezvous.
func StartRoot(addr string, secret []byte, timeout time.Duration, logger *slog.Logger) (*Root, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: root cannot listen on %s: %w", addr, err)
	}
	r := &Root{
		ln:      ln,
		secret:  slices.Clone(secret),
		timeout: timeout,
		logger:  logger,
		refused: logthrottle.New(logger, "refused connections to the rendezvous root", 0, 0, nil),
		events:  make(chan event),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
		closed:  make(chan struct{}),
		conns:   make(map[net.Conn]struct{}),
	}
	r.wg.Add(1)
	go r.acceptLoop()
	go r.serve()
	return r, nil
}

// Addr is the address the root listens on (for a wildcard listener, e.g.
// "[::]:29501": combine Port with a reachable host name for clients).
func (r *Root) Addr() string { return r.ln.Addr().String() }

// Port is the TCP port the root listens on.
func (r *Root) Port() int {
	if ta, ok := r.ln.Addr().(*net.TCPAddr); ok {
		return ta.Port
	}
	return 0
}

// Done is closed when the root has stopped.
func (r *Root) Done() <-chan struct{} { return r.done }

// Wait blocks until the root stops and returns why: nil when every rank
// took part in every round and then closed its connection.
func (r *Root) Wait() error {
	<-r.done
	return r.err
}

// Close stops the root at once, closing every client connection. It waits
// for the root's goroutines and returns nil; idempotent.
func (r *Root) Close() error {
	r.once.Do(func() { close(r.closed) })
	<-r.done
	return nil
}

func (r *Root) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

// RemoveOnJoin has the root remove the job's secret file (SecretFile) as
// soon as every rank has joined (nobody needs it after that, and a file
// left behind would be a secret lying around), or when the root stops,
// whichever comes first; at once if that already happened.
func (r *Root) RemoveOnJoin(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.joined || r.conns == nil {
		RemoveSecretFile(path)
		return
	}
	r.secretFile = path
}

func (r *Root) removeSecretFile() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.joined = true
	if r.secretFile != "" {
		RemoveSecretFile(r.secretFile)
		r.secretFile = ""
	}
}

func (r *Root) noteAuthFailure(claimed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.authFail == nil {
		r.authFail = map[int]bool{}
	}
	if len(r.authFail) < 64 { // bounded: a flood must not grow the root
		r.authFail[claimed] = true
	}
}

// authFailed: a connection claiming rank (any rank, for -1) failed
// authentication.
func (r *Root) authFailed(rank int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.authFail[rank] || rank == -1 && len(r.authFail) > 0
}

func (r *Root) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

func (r *Root) acceptLoop() {
	defer r.wg.Done()
	joinDeadline := time.Now().Add(r.timeout)
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.logger.Warn("bootstrap: accept failed", "err", err)
			select {
			case <-time.After(50 * time.Millisecond):
				continue
			case <-r.quit:
				return
			}
		}
		if !r.track(c) {
			c.Close()
			return
		}
		r.wg.Add(1)
		go r.handle(c, joinDeadline)
	}
}

// handle authenticates one client, forwards its frames to serve, and
// reports when it goes away.
func (r *Root) handle(c net.Conn, joinDeadline time.Time) {
	defer r.wg.Done()
	defer r.untrack(c)
	now := time.Now()
	deadline := now.Add(tcp.DefaultHandshakeTimeout)
	switch {
	case joinDeadline.Before(now):
		deadline = now.Add(time.Second) // a late rank: let it hear why it is refused
	case joinDeadline.Before(deadline):
		deadline = joinDeadline
	}
	rank, err := tcp.ServerHandshake(c, r.secret, bootstrapTag, RootRank, deadline, func(rank int) error {
		if rank < 0 {
			return fmt.Errorf("rank %d is invalid", rank)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, tcp.ErrAuth) || !errors.Is(err, tcp.ErrRefused) && rank != -1 {
			r.noteAuthFailure(rank)
		}
		r.refused.Warn("bootstrap: refused connection", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	c.SetReadDeadline(deadline)
	f, err := readFrame(c, 5+MaxBlob)
	c.SetReadDeadline(time.Time{})
	if err != nil || len(f) < 5 || f[0] != frameJoin {
		r.refused.Warn("bootstrap: bad join message", "remote", c.RemoteAddr().String(), "rank", rank, "err", err)
		c.Close()
		return
	}
	if !r.send(event{kind: evJoin, conn: c, rank: rank, nranks: int(binary.LittleEndian.Uint32(f[1:])), blob: f[5:]}) {
		c.Close()
		return
	}
	for {
		f, err := readFrame(c, 5+MaxBlob)
		if err == nil && (len(f) < 5 || f[0] != frameRound) {
			err = fmt.Errorf("unexpected message %q", f[:min(len(f), 1)])
		}
		if err != nil {
			r.send(event{kind: evGone, conn: c, rank: rank, err: err})
			c.Close()
			return
		}
		if !r.send(event{kind: evRound, conn: c, rank: rank, round: binary.LittleEndian.Uint32(f[1:]), blob: f[5:]}) {
			c.Close()
			return
		}
	}
}

func (r *Root) send(e event) bool {
	select {
	case r.events <- e:
		return true
	case <-r.quit:
		return false
	}
}

// reply sends one frame to each connection, in parallel, each bounded by
// writeTimeout.
func reply(conns []net.Conn, payload []byte) {
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			c.SetWriteDeadline(time.Now().Add(writeTimeout))
			writeFrame(c, payload)
			c.SetWriteDeadline(time.Time{})
		})
	}
	wg.Wait()
}

// serve owns the job's state.
func (r *Root) serve() {
	var (
		nranks     int  // 0 until the first join
		first      = -1 // the rank that set nranks
		members    = map[int]*member{}
		joined     bool   // round 0 complete
		round      uint32 // current round after join
		left       []int  // ranks that closed their connection after joining
		duplicates []string
		timer      = time.NewTimer(r.timeout)
	)
	defer timer.Stop()

	memberConns := func(pred func(*member) bool) []net.Conn {
		var cs []net.Conn
		for _, m := range members {
			if pred == nil || pred(m) {
				cs = append(cs, m.conn)
			}
		}
		return cs
	}
	reject := func(c net.Conn, text string) {
		r.refused.Warn("bootstrap: rejected rank", "remote", c.RemoteAddr().String(), "reason", text)
		reply([]net.Conn{c}, errorReply(ErrRankConflict, text))
		c.Close()
	}
	fail := func(conns []net.Conn, cause error, text string) {
		r.err = fmt.Errorf("bootstrap: %w (%w): %s", ErrRendezvous, cause, text)
		r.logger.Warn("bootstrap: rendezvous failed", "reason", text)
		reply(conns, errorReply(cause, "root at "+r.Addr()+": "+text))
	}
	missing := func(pred func(*member) bool) []int {
		var ms []int
		for i := range nranks {
			if m := members[i]; m == nil || !pred(m) {
				ms = append(ms, i)
			}
		}
		return ms
	}
	complete := func() {
		blobs := make([][]byte, nranks)
		for i, m := range members {
			blobs[i] = m.blob
			m.blob, m.submitted = nil, false
		}
		reply(memberConns(nil), encodeTable(blobs))
	}

loop:
	for {
		select {
		case <-r.closed:
			if r.err == nil {
				r.err = errors.New("bootstrap: root closed")
			}
			break loop

		case <-timer.C:
			if !joined {
				text := fmt.Sprintf("ranks %s never joined within %v (%d of %d arrived)", formatRanks(missing(func(*member) bool { return true })), r.timeout, len(members), nranks)
				if nranks == 0 {
					text = fmt.Sprintf("no rank joined within %v", r.timeout)
				}
				if len(duplicates) > 0 {
					text += "; rejected duplicates: " + strings.Join(duplicates, ", ")
				}
				// A missing rank whose connections failed authentication
				// has a wrong secret: a setup error, not a slow rank, and
				// every rank should say so alike.
				cause := ErrRankMissing
				var badSecret []int
				for _, q := range missing(func(*member) bool { return true }) {
					if r.authFailed(q) {
						badSecret = append(badSecret, q)
					}
				}
				if nranks == 0 && r.authFailed(-1) {
					badSecret = append(badSecret, -1)
				}
				if len(badSecret) > 0 {
					cause = ErrAuth
					text += "; connections claiming to be ranks " + formatRanks(badSecret) + " failed authentication (a wrong GOCOLL_SECRET or unique id?)"
				}
				fail(memberConns(nil), cause, text)
			} else {
				fail(memberConns(func(m *member) bool { return m.submitted }), ErrRankMissing,
					fmt.Sprintf("round %d: ranks %s did not take part within %v", round, formatRanks(missing(func(m *member) bool { return m.submitted })), r.timeout))
			}
			break loop

		case e := <-r.events:
			switch e.kind {
			case evJoin:
				switch {
				case joined:
					reject(e.conn, fmt.Sprintf("rank %d arrived after the job had joined", e.rank))
				case e.nranks < 1 || e.nranks > MaxRanks:
					reject(e.conn, fmt.Sprintf("rank %d says nranks=%d (the root serves 1 to %d ranks)", e.rank, e.nranks, MaxRanks))
				case nranks != 0 && e.nranks != nranks:
					fail(append(memberConns(nil), e.conn), ErrSizeMismatch, fmt.Sprintf("ranks disagree on the job size: rank %d says nranks=%d, rank %d said %d", e.rank, e.nranks, first, nranks))
					break loop
				case e.rank >= e.nranks:
					reject(e.conn, fmt.Sprintf("rank %d is out of range for nranks=%d", e.rank, e.nranks))
				case members[e.rank] != nil:
					old := members[e.rank].addr
					duplicates = append(duplicates, fmt.Sprintf("rank %d from %s (already joined from %s)", e.rank, e.conn.RemoteAddr(), old))
					reject(e.conn, fmt.Sprintf("rank %d already joined from %s", e.rank, old))
				default:
					if nranks == 0 {
						nranks, first = e.nranks, e.rank
					}
					members[e.rank] = &member{conn: e.conn, addr: e.conn.RemoteAddr().String(), blob: e.blob, submitted: true}
					r.logger.Debug("bootstrap: rank joined", "rank", e.rank, "remote", e.conn.RemoteAddr().String(), "joined", len(members), "nranks", nranks)
					if len(members) == nranks {
						r.ln.Close() // the job is complete: nobody else may join
						r.removeSecretFile()
						complete()
						joined, round = true, 1
						timer.Stop()
					}
				}

			case evRound:
				m := members[e.rank]
				if m == nil || m.conn != e.conn {
					e.conn.Close()
					continue
				}
				switch {
				case e.round != round:
					fail(memberConns(nil), ErrSizeMismatch, fmt.Sprintf("rank %d is at round %d, the root at round %d", e.rank, e.round, round))
					break loop
				case len(left) > 0:
					text := fmt.Sprintf("round %d: ranks %s have left the job", round, formatRanks(left))
					r.err = fmt.Errorf("bootstrap: %w (%w): %s", ErrRendezvous, ErrRankLeft, text)
					reply([]net.Conn{m.conn}, errorReply(ErrRankLeft, "root at "+r.Addr()+": "+text))
					continue
				case m.submitted:
					fail(memberConns(nil), ErrSizeMismatch, fmt.Sprintf("rank %d sent round %d twice", e.rank, round))
					break loop
				}
				if len(memberConns(func(m *member) bool { return m.submitted })) == 0 {
					timer.Reset(r.timeout) // first arrival in this round
				}
				m.blob, m.submitted = e.blob, true
				if len(missing(func(m *member) bool { return m.submitted })) == 0 {
					complete()
					round++
					timer.Stop()
				}

			case evGone:
				m := members[e.rank]
				if m == nil || m.conn != e.conn {
					continue // a rejected connection
				}
				delete(members, e.rank)
				if !joined {
					// It may dial again; nothing was promised to it yet.
					r.logger.Warn("bootstrap: rank left before the job joined", "rank", e.rank, "err", e.err)
					continue
				}
				left = append(left, e.rank)
				if waiting := memberConns(func(m *member) bool { return m.submitted }); len(waiting) > 0 {
					fail(waiting, ErrRankLeft, fmt.Sprintf("round %d: rank %d left the job (%v)", round, e.rank, e.err))
					break loop
				}
				if len(members) == 0 {
					break loop // every rank closed its connection: the job is over
				}
			}
		}
	}
	r.shutdown()
}

func (r *Root) shutdown() {
	close(r.quit)
	r.ln.Close()
	r.removeSecretFile()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
	r.refused.Flush()
	close(r.done)
}

// formatRanks prints sorted ranks with runs folded: [0 2 5-9].
func formatRanks(ranks []int) string {
	rs := slices.Sorted(slices.Values(ranks))
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		switch {
		case j == i:
			fmt.Fprintf(&b, "%d", rs[i])
		case j == i+1:
			fmt.Fprintf(&b, "%d %d", rs[i], rs[j])
		default:
			fmt.Fprintf(&b, "%d-%d", rs[i], rs[j])
		}
		i = j + 1
	}
	b.WriteByte(']')
	return b.String()
}
