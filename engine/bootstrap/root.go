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
	"sync/atomic"
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
	// sent counts the bytes the root wrote to ranks (frames and their
	// length words), and replying the time it spent writing them, for the
	// benchmark of its load.
	sent, replying atomic.Int64

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
	relay  string // the join's relay address ("": none offered)
	err    error
}

type member struct {
	conn      net.Conn
	addr      string
	relay     string // where its relay parent dials it ("": none)
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
	j, ok := parseJoin(f, c.RemoteAddr())
	if err != nil || !ok {
		r.refused.Warn("bootstrap: bad join message", "remote", c.RemoteAddr().String(), "rank", rank, "err", err)
		c.Close()
		return
	}
	j.conn, j.rank = c, rank
	if !r.send(j) {
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

// parseJoin reads a join frame from a client at remote; false: it is not
// one.
func parseJoin(f []byte, remote net.Addr) (event, bool) {
	if len(f) < 5 || f[0] != frameJoin && f[0] != frameTreeJoin {
		return event{}, false
	}
	e := event{kind: evJoin, nranks: int(binary.LittleEndian.Uint32(f[1:])), blob: f[5:]}
	if f[0] == frameTreeJoin {
		ta, ok := remote.(*net.TCPAddr)
		if len(f) < 7 || !ok {
			return event{}, false
		}
		port := binary.LittleEndian.Uint16(f[5:])
		if port == 0 {
			return event{}, false
		}
		e.relay = net.JoinHostPort(zoned(ta), fmt.Sprint(port))
		e.blob = f[7:]
	}
	return e, true
}

func (r *Root) send(e event) bool {
	select {
	case r.events <- e:
		return true
	case <-r.quit:
		return false
	}
}

// reply sends the frames, in order, to each connection, the connections in
// parallel, each bounded by writeTimeout.
func (r *Root) reply(conns []net.Conn, payloads ...[]byte) {
	start := time.Now()
	defer func() { r.replying.Add(int64(time.Since(start))) }()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			c.SetWriteDeadline(time.Now().Add(writeTimeout))
			for _, p := range payloads {
				if writeFrame(c, p) != nil {
					break
				}
				r.sent.Add(int64(4 + len(p)))
			}
			c.SetWriteDeadline(time.Time{})
		})
	}
	wg.Wait()
}

// serve owns the job's state: it hands each event to the rendezvous,
// until the rendezvous is over.
func (r *Root) serve() {
	z := &rendezvous{r: r, members: map[int]*member{}, first: -1, timer: time.NewTimer(r.timeout)}
	defer z.timer.Stop()
	for done := false; !done; {
		select {
		case <-r.closed:
			if r.err == nil {
				r.err = errors.New("bootstrap: root closed")
			}
			done = true
		case <-z.timer.C:
			z.expire()
			done = true
		case e := <-r.events:
			switch e.kind {
			case evJoin:
				done = z.join(e)
			case evRound:
				done = z.contribute(e)
			case evGone:
				done = z.gone(e)
			}
		}
	}
	r.shutdown()
}

// rendezvous is the root's state of the job: who joined, which round is
// gathered, who submitted to it, who left.
type rendezvous struct {
	r       *Root
	nranks  int // 0 until the first join
	first   int // the rank that set nranks
	members map[int]*member
	joined  bool // round 0 complete
	tree    bool // the tables go through the relays (see Fanout)
	// inRound counts the members that submitted to the current round
	// (after the join): each contribution and departure is O(1), not a
	// walk over every member.
	inRound    int
	round      uint32 // current round after join
	left       []int  // ranks that closed their connection after joining
	duplicates []string
	timer      *time.Timer
}

// conns are the members' connections that pred holds for (all: nil).
func (z *rendezvous) conns(pred func(*member) bool) []net.Conn {
	var cs []net.Conn
	for _, m := range z.members {
		if pred == nil || pred(m) {
			cs = append(cs, m.conn)
		}
	}
	return cs
}

func submitted(m *member) bool { return m.submitted }
func anyMember(*member) bool   { return true }

// missing are the ranks of the job that pred does not hold for.
func (z *rendezvous) missing(pred func(*member) bool) []int {
	var ms []int
	for i := range z.nranks {
		if m := z.members[i]; m == nil || !pred(m) {
			ms = append(ms, i)
		}
	}
	return ms
}

// reject refuses one connection, telling it why.
func (z *rendezvous) reject(c net.Conn, text string) {
	z.r.refused.Warn("bootstrap: rejected rank", "remote", c.RemoteAddr().String(), "reason", text)
	z.r.reply([]net.Conn{c}, errorReply(ErrRankConflict, text))
	c.Close()
}

// fail ends the rendezvous, telling conns why.
func (z *rendezvous) fail(conns []net.Conn, cause error, text string) {
	z.r.err = fmt.Errorf("bootstrap: %w (%w): %s", ErrRendezvous, cause, text)
	z.r.logger.Warn("bootstrap: rendezvous failed", "reason", text)
	z.r.reply(conns, errorReply(cause, "root at "+z.r.Addr()+": "+text))
}

// complete sends the table of the round to every member, or in a tree to
// the root's children (after the relays frame, in round 0).
func (z *rendezvous) complete() {
	blobs := make([][]byte, z.nranks)
	for i, m := range z.members {
		blobs[i] = m.blob
		m.blob, m.submitted = nil, false
	}
	z.inRound = 0
	table := encodeTable(blobs)
	if !z.tree {
		z.r.reply(z.conns(nil), table)
		return
	}
	kids := make([]net.Conn, Fanout)
	for i := range kids {
		kids[i] = z.members[i].conn
	}
	if z.joined {
		z.r.reply(kids, table)
		return
	}
	addrs := make([]string, z.nranks)
	for i, m := range z.members {
		addrs[i] = m.relay
	}
	z.r.reply(kids, encodeRelays(addrs), table)
}

// relayable: the job is larger than a star and every rank that would have
// a relay parent offered an address to be dialled at.
func (z *rendezvous) relayable() bool {
	if z.nranks <= Fanout {
		return false
	}
	for i := Fanout; i < z.nranks; i++ {
		if z.members[i].relay == "" {
			return false
		}
	}
	return true
}

// expire: the timeout passed before the join or a round completed.
func (z *rendezvous) expire() {
	if z.joined {
		z.fail(z.conns(submitted), ErrRankMissing,
			fmt.Sprintf("round %d: ranks %s did not take part within %v", z.round, formatRanks(z.missing(submitted)), z.r.timeout))
		return
	}
	text := fmt.Sprintf("ranks %s never joined within %v (%d of %d arrived)", formatRanks(z.missing(anyMember)), z.r.timeout, len(z.members), z.nranks)
	if z.nranks == 0 {
		text = fmt.Sprintf("no rank joined within %v", z.r.timeout)
	}
	if len(z.duplicates) > 0 {
		text += "; rejected duplicates: " + strings.Join(z.duplicates, ", ")
	}
	// A missing rank whose connections failed authentication has a wrong
	// secret: a setup error, not a slow rank, and every rank should say
	// so alike.
	cause := ErrRankMissing
	var badSecret []int
	for _, q := range z.missing(anyMember) {
		if z.r.authFailed(q) {
			badSecret = append(badSecret, q)
		}
	}
	if z.nranks == 0 && z.r.authFailed(-1) {
		badSecret = append(badSecret, -1)
	}
	if len(badSecret) > 0 {
		cause = ErrAuth
		text += "; connections claiming to be ranks " + formatRanks(badSecret) + " failed authentication (a wrong GOCOLL_SECRET or unique id?)"
	}
	z.fail(z.conns(nil), cause, text)
}

// join takes a rank's join; true ends the rendezvous.
func (z *rendezvous) join(e event) bool {
	switch {
	case z.joined:
		z.reject(e.conn, fmt.Sprintf("rank %d arrived after the job had joined", e.rank))
	case e.nranks < 1 || e.nranks > MaxRanks:
		z.reject(e.conn, fmt.Sprintf("rank %d says nranks=%d (the root serves 1 to %d ranks)", e.rank, e.nranks, MaxRanks))
	case z.nranks != 0 && e.nranks != z.nranks:
		z.fail(append(z.conns(nil), e.conn), ErrSizeMismatch, fmt.Sprintf("ranks disagree on the job size: rank %d says nranks=%d, rank %d said %d", e.rank, e.nranks, z.first, z.nranks))
		return true
	case e.rank >= e.nranks:
		z.reject(e.conn, fmt.Sprintf("rank %d is out of range for nranks=%d", e.rank, e.nranks))
	case z.members[e.rank] != nil:
		old := z.members[e.rank].addr
		z.duplicates = append(z.duplicates, fmt.Sprintf("rank %d from %s (already joined from %s)", e.rank, e.conn.RemoteAddr(), old))
		z.reject(e.conn, fmt.Sprintf("rank %d already joined from %s", e.rank, old))
	default:
		if z.nranks == 0 {
			z.nranks, z.first = e.nranks, e.rank
		}
		z.members[e.rank] = &member{conn: e.conn, addr: e.conn.RemoteAddr().String(), relay: e.relay, blob: e.blob, submitted: true}
		z.r.logger.Debug("bootstrap: rank joined", "rank", e.rank, "remote", e.conn.RemoteAddr().String(), "joined", len(z.members), "nranks", z.nranks)
		if len(z.members) == z.nranks {
			z.r.ln.Close() // the job is complete: nobody else may join
			z.r.removeSecretFile()
			z.tree = z.relayable()
			z.complete()
			z.joined, z.round = true, 1
			z.timer.Stop()
		}
	}
	return false
}

// contribute takes a member's contribution to a later round; true ends
// the rendezvous.
func (z *rendezvous) contribute(e event) bool {
	m := z.members[e.rank]
	if m == nil || m.conn != e.conn {
		e.conn.Close()
		return false
	}
	switch {
	case e.round != z.round:
		z.fail(z.conns(nil), ErrSizeMismatch, fmt.Sprintf("rank %d is at round %d, the root at round %d", e.rank, e.round, z.round))
		return true
	case len(z.left) > 0:
		text := fmt.Sprintf("round %d: ranks %s have left the job", z.round, formatRanks(z.left))
		z.r.err = fmt.Errorf("bootstrap: %w (%w): %s", ErrRendezvous, ErrRankLeft, text)
		z.r.reply([]net.Conn{m.conn}, errorReply(ErrRankLeft, "root at "+z.r.Addr()+": "+text))
		return false
	case m.submitted:
		z.fail(z.conns(nil), ErrSizeMismatch, fmt.Sprintf("rank %d sent round %d twice", e.rank, z.round))
		return true
	}
	if z.inRound == 0 {
		z.timer.Reset(z.r.timeout) // first arrival in this round
	}
	m.blob, m.submitted = e.blob, true
	// Nobody has left (checked above): every rank is a member.
	if z.inRound++; z.inRound == z.nranks {
		z.complete()
		z.round++
		z.timer.Stop()
	}
	return false
}

// gone: a member's connection ended; true ends the rendezvous.
func (z *rendezvous) gone(e event) bool {
	m := z.members[e.rank]
	if m == nil || m.conn != e.conn {
		return false // a rejected connection
	}
	delete(z.members, e.rank)
	if z.joined && m.submitted {
		z.inRound--
	}
	if !z.joined {
		// It may dial again; nothing was promised to it yet.
		z.r.logger.Warn("bootstrap: rank left before the job joined", "rank", e.rank, "err", e.err)
		return false
	}
	z.left = append(z.left, e.rank)
	if z.inRound > 0 {
		// The rendezvous ends for every rank: all are told why, not only
		// those already waiting.
		z.fail(z.conns(nil), ErrRankLeft, fmt.Sprintf("round %d: rank %d left the job (%v)", z.round, e.rank, e.err))
		return true
	}
	return len(z.members) == 0 // every rank closed its connection: the job is over
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
