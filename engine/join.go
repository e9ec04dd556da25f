package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"net"
	"strconv"
	"time"

	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/shmcoll"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// UniqueID names a job's rendezvous root and carries its secret; rank 0
// makes it and hands it to the others out of band (gocollUniqueId).
type UniqueID = bootstrap.UniqueID

// exchangeFunc is one all-to-all round of setup blobs: every rank gives one
// and gets everyone's, indexed by rank. Setup takes exactly three rounds
// (connect).
type exchangeFunc func(ctx context.Context, blob []byte) ([][]byte, error)

// NewUniqueID starts this process's rendezvous root (as ncclGetUniqueId
// does) and returns the id that lets ranks find it. The root serves one job
// and stops when every rank joined or after the timeout.
func NewUniqueID(opts Options) (UniqueID, error) {
	opts = opts.withDefaults()
	host, err := advertiseHost(opts, "")
	if err != nil {
		return UniqueID{}, err
	}
	secret := bootstrap.NewSecret()
	root, err := bootstrap.StartRoot(hostPort(host, 0), secret[:], opts.Timeout, opts.Logger)
	if err != nil {
		return UniqueID{}, fmt.Errorf("gocoll: unique id: %w", err)
	}
	id, err := bootstrap.NewUniqueID(hostPort(host, root.Port()), secret)
	if err != nil {
		root.Close()
		return UniqueID{}, fmt.Errorf("gocoll: unique id: %w", err)
	}
	return id, nil
}

// NewComm joins rank of an nranks job named by id. Every rank must call it;
// it returns once all ranks are connected.
func NewComm(id UniqueID, nranks, rank int, opts Options) (*Comm, error) {
	opts = opts.withDefaults()
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, invalidArg("rank %d of %d ranks", rank, nranks)
	}
	rootAddr, secret, err := id.Parse()
	if err != nil {
		return nil, fmt.Errorf("%w: unique id: %v", ErrInvalidArgument, err)
	}
	return joinRoot(rootAddr, secret, nranks, rank, opts)
}

// NewCommFromEnv joins the job described by the launcher's environment:
// torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: gocoll's root listens
// on GOCOLL_PORT or MASTER_PORT+1, since torchrun's store owns MASTER_PORT),
// Open MPI (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, SLURM_NTASKS, …) or
// GOCOLL_RANK/GOCOLL_SIZE/GOCOLL_ROOT_ADDR. Rank 0 runs the root.
func NewCommFromEnv(opts Options) (*Comm, error) {
	opts = opts.withDefaults()
	l, err := bootstrap.FromEnv(opts.Getenv)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	secret, secretFile := l.Secret, ""
	switch {
	case l.SecretFromEnv:
	case l.SingleHost:
		// Nobody but this user on this host may learn the secret: a
		// derived one could be computed by anyone who knows the launch.
		secret, secretFile, err = bootstrap.SecretFile(opts.Getenv, l.JobKey)
		if err != nil {
			return nil, fmt.Errorf("gocoll: rank %d: %w (or set GOCOLL_SECRET)", l.Rank, err)
		}
	case l.Rank == 0:
		opts.Logger.Warn("GOCOLL_SECRET is unset and the job spans hosts: its connections are authenticated with a secret derived from the launch environment, which anyone who can reach the root can compute. Set GOCOLL_SECRET to the same private value on every rank (e.g. export GOCOLL_SECRET=$(cat ~/.gocoll-secret) in the job script; a value on the mpirun command line is visible in ps)", "launcher", l.Source, "root", l.RootAddr)
	}
	if l.Rank == 0 {
		host, port, err := splitHostPort(l.RootAddr)
		if err != nil {
			return nil, err
		}
		bind := bindHost(host)
		if bind == "" {
			opts.Logger.Info("rendezvous root address is not one of this host's (NAT?): listening on every interface", "root", l.RootAddr)
		}
		root, err := bootstrap.StartRoot(hostPort(bind, port), secret, opts.Timeout, opts.Logger)
		if err != nil {
			if secretFile != "" {
				// No root, no job: the file would outlive it (the root
				// removes it when it stops, and none started).
				bootstrap.RemoveSecretFile(secretFile)
			}
			return nil, fmt.Errorf("gocoll: rank 0 could not start the rendezvous root on %s (set GOCOLL_PORT to another free port): %w", hostPort(bind, port), err)
		}
		if secretFile != "" {
			root.RemoveOnJoin(secretFile)
		}
		c, err := joinRoot(l.RootAddr, secret, l.Size, l.Rank, opts)
		if err != nil {
			// The root writes its verdict to every rank at once; rank 0 may
			// read its own first. Returning now could end this process
			// (and the root with it) before the others have theirs, and
			// they would see a closed connection instead of the cause.
			waitRoot(root, time.Second)
			return nil, err
		}
		// The root answers the other ranks' last round after this rank had
		// its answer: leaving at once could end this process (and the root
		// with it) before they have theirs, and they would find the
		// connection closed (1 run in ~25 of TestGuessedSecretRefused).
		// The root stops once every rank has closed its connection, right
		// after joining.
		waitRoot(root, time.Second)
		return c, nil
	}
	return joinRoot(l.RootAddr, secret, l.Size, l.Rank, opts)
}

// waitRoot waits for the root to finish, at most limit.
func waitRoot(root *bootstrap.Root, limit time.Duration) {
	done := make(chan struct{})
	go func() { root.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
	}
}

// bindHost is the address the root listens on for the advertised root
// host: that address itself when it is one of this host's (so that the
// root answers nowhere else, e.g. only on loopback for 127.0.0.1), else ""
// (every interface: the advertised address may be a NAT's or a name for
// this host that resolves elsewhere).
func bindHost(host string) string {
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else if addrs, err := net.LookupIP(host); err == nil {
		ips = addrs
	}
	local, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return ip.String()
		}
		for _, a := range local {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.Equal(ip) {
				return ip.String()
			}
		}
	}
	return ""
}

func joinRoot(rootAddr string, secret []byte, nranks, rank int, opts Options) (c *Comm, err error) {
	defer func() {
		err = setupTimeout(err, fmt.Sprintf("joining the job (rank %d of %d, root %s)", rank, nranks, rootAddr), opts.Timeout)
	}()
	// The root gives up after opts.Timeout and tells every rank why; a rank
	// waits a little longer so that it hears that verdict (the same cause
	// on every rank) rather than timing out on its own a moment earlier.
	grace := min(max(opts.Timeout/10, time.Second), 30*time.Second)
	grace = min(grace, math.MaxInt64-opts.Timeout) // a timeout of "never" must not wrap
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout+grace)
	defer cancel()
	host, err := advertiseHost(opts, rootAddr)
	if err != nil {
		return nil, err
	}
	// What setup will hold: the root's connection, its relay links, two
	// listeners, the ring and doubling neighbours; a clear error now
	// rather than connections failing one by one later.
	if err := tcp.CheckFiles(3 + bootstrap.RelayFiles + 2 + bits.Len(uint(nranks))); err != nil {
		return nil, fmt.Errorf("gocoll: rank %d of %d: %w", rank, nranks, err)
	}
	var client *bootstrap.Client
	exchange := func(ctx context.Context, blob []byte) ([][]byte, error) {
		if client == nil {
			var all [][]byte
			var err error
			client, all, err = bootstrap.Join(ctx, rootAddr, secret, rank, nranks, blob)
			return all, err
		}
		return client.AllGather(ctx, blob)
	}
	tag := commTag(secret, rootAddr)
	l, err := connect(ctx, rank, nranks, tag, secret, host, exchange, opts)
	if client != nil {
		client.Close()
	}
	if err != nil {
		return nil, err
	}
	c, err = adopt(rank, nranks, l, &netSplitter{secret: secret, tag: tag, host: host}, opts)
	if err != nil {
		return nil, err
	}
	if err := c.tune(); err != nil {
		c.Abort()
		return nil, err
	}
	return c, nil
}

// adopt makes rank's communicator of size ranks over the links l, whose
// sub-communicators sp builds; on failure it closes l.
func adopt(rank, size int, l links, sp splitter, opts Options) (*Comm, error) {
	c, err := newComm(rank, size, l.tr, opts)
	if err != nil {
		l.close()
		return nil, err
	}
	c.split, c.arena, c.id, c.ctl = sp, l.arena, l.id, l.ctl
	c.place(l.hosts, l.names)
	if c.ctl != nil {
		// The recovery loop runs from the start, not from the first
		// Shrink: it is what sees this process stall (a pause, SIGSTOP),
		// and a rank that stalled past the timeout must not take peers
		// that moved on without it for dead (Recoverer.stalled).
		c.recovery()
	}
	return c, nil
}

// commTag is the tag of the communicator of the job with secret whose root
// is rootAddr: every rank computes the same, and another job's connections
// (another root, or another secret) present another. Its segments' headers
// carry it; split children derive theirs from it.
func commTag(secret []byte, rootAddr string) [8]byte {
	sum := sha256.Sum256(append(append([]byte("gocoll-comm\x00"), secret...), rootAddr...))
	var tag [8]byte
	copy(tag[:], sum[:])
	return tag
}

// links is what connecting a rank made: its transport, the shared-memory
// collectives when every rank is on this host, and the placement of the
// ranks on hosts (see Comm.layout).
type links struct {
	tr    transport.Transport
	arena *shmcoll.Arena
	hosts [][]int
	names []string     // host names, as the ranks reported them
	id    uint64       // names the communicator in dumps, equal on every rank
	ctl   recovery.Net // control links (package engine/internal/recovery)
}

func (l links) close() {
	l.tr.Close()
	if l.ctl != nil {
		l.ctl.Close()
	}
	if l.arena != nil {
		l.arena.Close()
	}
}

// advertiseHost is the address this rank listens on and publishes:
// GOCOLL_SOCKET_IFNAME's address, else the local address that routes to the
// root, else any non-loopback address, else loopback.
func advertiseHost(opts Options, rootAddr string) (string, error) {
	if opts.SocketIfname != "" {
		a, err := tcp.InterfaceAddr(opts.SocketIfname)
		if err != nil {
			return "", fmt.Errorf("%w: GOCOLL_SOCKET_IFNAME: %v", ErrInvalidArgument, err)
		}
		return a, nil
	}
	if rootAddr != "" {
		if a, err := tcp.RouteAddr(rootAddr); err == nil {
			return a, nil
		}
	}
	return defaultHost(), nil
}

// defaultHost is the first IPv4 address of an interface that is up and not
// loopback, or 127.0.0.1 on a machine with none.
func defaultHost() string {
	ifs, _ := net.Interfaces()
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// netSplitter builds a child's connections through two setup rounds run as
// allgathers over the parent communicator.
type netSplitter struct {
	secret []byte
	tag    [8]byte
	host   string
}

func (s *netSplitter) child(c *Comm, seq uint64, color int, members []int, childRank int) (links, splitter, error) {
	exchange := func(ctx context.Context, blob []byte) ([][]byte, error) {
		all, err := allgatherBlobs(c, blob)
		if err != nil || members == nil {
			return nil, err
		}
		out := make([][]byte, len(members))
		for i, m := range members {
			out[i] = all[m]
		}
		return out, nil
	}
	if members == nil {
		// Not in any child: still take part in the setup rounds.
		for i := 0; i < 3; i++ {
			if _, err := exchange(context.Background(), nil); err != nil {
				return links{}, nil, err
			}
		}
		return links{}, nil, nil
	}
	var buf [24]byte
	copy(buf[:], s.tag[:])
	binary.LittleEndian.PutUint64(buf[8:], seq)
	binary.LittleEndian.PutUint64(buf[16:], uint64(int64(color)))
	sum := sha256.Sum256(buf[:])
	var tag [8]byte
	copy(tag[:], sum[:])
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	l, err := connect(ctx, childRank, len(members), tag, s.secret, s.host, exchange, c.opts)
	if err != nil {
		return links{}, nil, err
	}
	return l, &netSplitter{secret: s.secret, tag: tag, host: s.host}, nil
}

// allgatherBlobs gathers one variable-length blob per rank over c.
func allgatherBlobs(c *Comm, blob []byte) ([][]byte, error) {
	n := c.Size()
	var mine [8]byte
	binary.LittleEndian.PutUint64(mine[:], uint64(len(blob)))
	lens := make([]byte, 8*n)
	if err := c.AllGather(mine[:], lens, 1, Uint64); err != nil {
		return nil, err
	}
	width := 0
	for q := 0; q < n; q++ {
		width = max(width, int(binary.LittleEndian.Uint64(lens[8*q:])))
	}
	padded := make([]byte, width)
	copy(padded, blob)
	all := make([]byte, width*n)
	if err := c.AllGather(padded, all, width, Uint8); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for q := range out {
		l := int(binary.LittleEndian.Uint64(lens[8*q:]))
		out[q] = all[q*width : q*width+l]
	}
	return out, nil
}

func hostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}

func splitHostPort(a string) (string, int, error) {
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, fmt.Errorf("%w: address %q: %v", ErrInvalidArgument, a, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("%w: address %q: bad port", ErrInvalidArgument, a)
	}
	return h, port, nil
}
