package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/shmcoll"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/shm"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// Connection setup: connect walks a table of providers, each a way of
// reaching peers, asking each which peers it can connect (as NCCL's
// transport.cc asks canConnect). The probe that decides who may map whose
// memory is in setup_probe.go, the exchange rounds in setup_rendezvous.go.
//
// These files stay in package engine rather than an internal package:
// setup reads Options and their test hooks and builds the links a Comm is
// made of, all of this package (the control links' mesh is
// engine/internal/recovery's).

// A provider is one way of linking this rank to its peers.
type provider struct {
	name string
	// allowed says whether the options let it run at all (GOCOLL_TRANSPORT).
	allowed func(o *Options) bool
	// offer makes what this rank announces in the second round (its
	// segments), from what the first round and the probe told; nil:
	// nothing to make.
	offer func(s *setup) error
	// canConnect says whether it links this rank to peer q. Every rank
	// decides alike for a pair, from both rounds.
	canConnect func(s *setup, q int) bool
	// open links the peers given, if any; given none, it lets go of what
	// offer made.
	open func(s *setup, peers []int) error
	// whole: it links every peer or none, over the links of the
	// providers before it, and takes no peer from those after it (the
	// arena's collectives need every pair to share memory).
	whole bool
}

// providers, in order of preference: the first that can connect a peer
// takes it.
var providers = []provider{
	{name: "shm", allowed: notTCPOnly, offer: offerSegment, canConnect: shmCanConnect, open: openSegment},
	{name: "arena", allowed: notTCPOnly, offer: offerArena, canConnect: arenaCanConnect, open: openArena, whole: true},
	{name: "tcp", allowed: func(*Options) bool { return true }, canConnect: func(*setup, int) bool { return true }, open: openTCP},
}

func notTCPOnly(o *Options) bool { return o.Transport != "tcp" }

// setup is one rank's connect in progress.
type setup struct {
	ctx        context.Context
	rank, size int
	tag        [8]byte
	secret     []byte
	host       string
	opts       Options
	log        *slog.Logger
	exchange   exchangeFunc
	open       shmsync.Opener

	ln       net.Listener // the setup's TCP listener, handed to the mesh
	hostname string
	me       setupInfo
	first    []setupInfo // the first round: who is where
	second   []setupInfo // the second round: who sees whom, and the segments
	probeFd  int
	sees     []int // ranks whose memory this rank can map

	seg    *shm.Transport
	arena  *shmcoll.Arena
	byPeer []transport.Transport
	parts  []transport.Transport // the transports opened, for the routed one
	linked map[string]int        // peers per provider, for the log
}

// connect links rank to the others: shared memory to the ranks that see the
// same /dev/shm and whose memory this rank may map (both ways), TCP to the
// rest. It takes three exchange rounds: who is where, who sees whom (with
// where each rank's segments are), and "everyone connected" (with where
// each rank's control listener is).
func connect(ctx context.Context, rank, size int, tag [8]byte, secret []byte, host string, exchange exchangeFunc, opts Options) (_ links, err error) {
	s := &setup{ctx: ctx, rank: rank, size: size, tag: tag, secret: secret, host: host, opts: opts,
		log: opts.Logger.With("rank", rank, "nranks", size), exchange: exchange, open: opts.hooks.opener(),
		probeFd: -1, byPeer: make([]transport.Transport, size), linked: map[string]int{}}
	defer func() {
		s.closeProbe()
		if err != nil {
			s.abandon()
		}
	}()
	if err := s.listen(); err != nil {
		return links{}, err
	}
	if s.allowed("shm") {
		s.makeProbe()
	}
	opts.hooks.at(setupProbed)
	if s.first, err = s.round(); err != nil {
		return links{}, err
	}
	s.sees = s.mappable()
	for _, p := range providers {
		if p.offer != nil && p.allowed(&opts) {
			if err := p.offer(s); err != nil {
				return links{}, err
			}
		}
	}
	s.me.Sees = s.sees
	opts.hooks.at(setupCreated)
	if s.second, err = s.round(); err != nil {
		return links{}, err
	}
	s.closeProbe() // every rank has tried it
	opts.hooks.at(setupExchanged)
	if err := s.openAll(); err != nil {
		return links{}, err
	}
	tr := transport.NewRouted(rank, s.byPeer)
	opts.hooks.at(setupConnected)
	ctl, err := s.controlRound()
	if err != nil {
		return links{}, err // (abandon closes tr's transports)
	}
	// Once everyone connected nobody opens the segments again: close
	// their descriptors.
	if s.seg != nil {
		s.seg.Release()
	}
	if s.arena != nil {
		s.arena.Release()
	}
	opts.hooks.at(setupReleased)
	s.log.Info("connected", "shm_peers", s.linked["shm"], "tcp_peers", s.linked["tcp"], "arena", s.arena != nil, "addr", s.me.Addr)
	hosts, names := hostsOf(s.first)
	return links{tr, s.arena, hosts, names, binary.BigEndian.Uint64(tag[:]), ctl}, nil
}

func (s *setup) allowed(name string) bool {
	for _, p := range providers {
		if p.name == name {
			return p.allowed(&s.opts)
		}
	}
	return false
}

// listen opens the setup's TCP listener, whose address the first round
// announces.
func (s *setup) listen() error {
	ln, err := tcp.Listen(s.host)
	if err != nil {
		return fmt.Errorf("gocoll: rank %d: listen: %w", s.rank, err)
	}
	s.ln = ln
	addr, err := tcp.AdvertiseAddr(ln, s.host)
	if err != nil {
		return err
	}
	s.hostname, _ = os.Hostname()
	s.me = setupInfo{Host: s.hostname, Addr: addr, Pid: os.Getpid()}
	return nil
}

// openAll gives each peer to the first provider that can connect it.
func (s *setup) openAll() error {
	taken := make([]bool, s.size)
	taken[s.rank] = true
	for _, p := range providers {
		var peers []int
		for q := range s.size {
			if (p.whole || !taken[q]) && q != s.rank && p.allowed(&s.opts) && p.canConnect(s, q) {
				peers = append(peers, q)
			}
		}
		if err := p.open(s, peers); err != nil {
			return err
		}
		if !p.whole {
			for _, q := range peers {
				taken[q] = true
			}
			s.linked[p.name] = len(peers)
		}
	}
	return nil
}

// abandon closes what a failed setup opened (closing twice is harmless).
func (s *setup) abandon() {
	for _, p := range s.parts {
		p.Close()
	}
	if s.seg != nil {
		s.seg.Close()
	}
	if s.arena != nil {
		s.arena.Close()
	}
	if s.ln != nil {
		s.ln.Close()
	}
}

// offerSegment makes this rank's shared-memory segment for the ranks it
// can map.
func offerSegment(s *setup) error {
	if len(s.sees) == 0 {
		return nil
	}
	seg, err := shm.Create(shm.Config{Rank: s.rank, Size: s.size, Peers: s.sees, Tag: s.tag, Logger: s.log, Open: s.open})
	if err != nil {
		return fmt.Errorf("gocoll: rank %d: shared memory: %w", s.rank, err)
	}
	s.seg = seg
	ref := seg.Ref()
	s.me.ShmSeg = &ref
	return nil
}

// shmCanConnect: shared memory only where both sides see each other, so
// both pick it.
func shmCanConnect(s *setup, q int) bool {
	mine, theirs := slices.Contains(s.sees, q), slices.Contains(s.second[q].Sees, s.rank)
	if mine && !theirs {
		s.log.Warn("a rank on this host cannot map this rank's shared memory (its log says why): TCP to it", "peer", q, "pid", s.first[q].Pid)
	}
	return mine && theirs && s.second[q].ShmSeg != nil
}

func openSegment(s *setup, peers []int) error {
	if len(peers) == 0 {
		if s.seg != nil {
			s.seg.Close()
			s.seg = nil
		}
		return nil
	}
	local := make(map[int]shm.PeerInfo, len(peers))
	for _, q := range peers {
		local[q] = *s.second[q].ShmSeg
	}
	if err := s.seg.Connect(s.ctx, local); err != nil {
		return fmt.Errorf("gocoll: rank %d: shared memory: %w", s.rank, err)
	}
	s.route(s.seg, peers)
	return nil
}

// offerArena: with every rank on this host, collectives read each other's
// slots directly (shmcoll) instead of exchanging messages. Without it
// they fall back to message algorithms.
func offerArena(s *setup) error {
	if len(s.sees) != s.size-1 || s.size <= 1 {
		return nil
	}
	arena, err := shmcoll.Create(shmcoll.Config{Rank: s.rank, Size: s.size, Tag: s.tag, Logger: s.log, NoCMA: s.opts.NoCMA, Open: s.open})
	if err != nil {
		s.log.Info("no shared-memory collectives (message algorithms only)", "err", err)
		return nil
	}
	s.arena = arena
	ref := arena.Ref()
	s.me.ArenaSeg = &ref
	return nil
}

// arenaCanConnect: over shared memory, to a rank that offered its arena.
func arenaCanConnect(s *setup, q int) bool {
	return s.arena != nil && s.seg != nil && s.byPeer[q] == transport.Transport(s.seg) && s.second[q].ArenaSeg != nil
}

// openArena connects the arena if every peer can (every rank decides
// alike), else closes it.
func openArena(s *setup, peers []int) error {
	if s.arena == nil {
		return nil
	}
	if len(peers) != s.size-1 {
		s.arena.Close()
		s.arena = nil
		return nil
	}
	m := make(map[int]shmcoll.PeerInfo, len(peers))
	for _, q := range peers {
		m[q] = *s.second[q].ArenaSeg
	}
	if err := s.arena.Connect(s.ctx, m); err != nil {
		return fmt.Errorf("gocoll: rank %d: shared-memory collectives: %w", s.rank, err)
	}
	return nil
}

// openTCP connects the rest over TCP, through the setup's listener.
func openTCP(s *setup, peers []int) error {
	if len(peers) == 0 {
		s.ln.Close()
		s.ln = nil
		return nil
	}
	if h := s.opts.hooks; h != nil && h.beforeTCP != nil {
		h.beforeTCP()
	}
	addrs := make([]string, s.size)
	for q, in := range s.first {
		addrs[q] = in.Addr
	}
	cfg := tcp.Config{Rank: s.rank, Size: s.size, Listener: s.ln, Addrs: addrs, Peers: peers, Secret: s.secret, Tag: s.tag, Logger: s.log, Timeout: s.opts.Timeout}
	if s.opts.Connect != "all" {
		cfg.Lazy, cfg.Eager = true, eagerPeers(s.rank, s.size, peers)
	}
	// The connections made now, and a few for those made on first use.
	need := len(peers)
	if cfg.Lazy {
		need = len(cfg.Eager) + 8
	}
	if err := tcp.CheckFiles(need); err != nil {
		return fmt.Errorf("gocoll: rank %d: %d TCP peers: %w", s.rank, len(peers), err)
	}
	tt, err := tcp.New(s.ctx, cfg)
	if err != nil {
		return fmt.Errorf("gocoll: rank %d: tcp: %w", s.rank, err)
	}
	s.ln = nil // the transport's now
	s.route(tt, peers)
	return nil
}

// eagerPeers are the TCP peers connected when a communicator is made, the
// rest being connected on first use: the ring neighbours and the
// recursive-doubling partners (sched.DoublingPeers: the barrier's, and
// the small allreduces'). The relation is symmetric, so
// both ends of a pair decide alike; the graph it makes is connected with a
// diameter of about log2 of the ranks, so a failure announced along it
// reaches every rank in a few hops (tcp.go relays it), and it holds the
// peers of the ring and halving–doubling schedules.
func eagerPeers(rank, size int, peers []int) []int {
	ok := make(map[int]bool, len(peers))
	for _, q := range peers {
		ok[q] = true
	}
	// Never nil: tcp.Config reads a nil Eager as "every peer", and this
	// rank would then wait for peers that, by this same relation, do not
	// dial it (a rank of 7 over 2 hosts whose neighbours are all local).
	out := []int{}
	add := func(q int) {
		if q != rank && ok[q] && !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	add((rank + 1) % size)
	add((rank - 1 + size) % size)
	for _, q := range sched.DoublingPeers(rank, size) {
		add(q)
	}
	return out
}

// route sends the messages to peers through t.
func (s *setup) route(t transport.Transport, peers []int) {
	for _, q := range peers {
		s.byPeer[q] = t
	}
	s.parts = append(s.parts, t)
}
