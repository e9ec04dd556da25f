package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// Growing: a process that was not in the job (a replacement for a lost
// rank, or an extra one) asks rank 0 of a communicator to let it in,
// through rank 0's control listener; the members admit the waiting
// processes with Grow, at a point of their choosing (a step boundary), so
// that waiting never holds up a step. The joiner authenticates with the
// job's secret, under a tag derived from the communicator's: JoinInfo names
// both the address and the tag, and holds nothing secret.

const joinInfoPrefix = "gocoll-join:1:"

// JoinInfo says how a new process reaches this communicator to join it
// (Join): rank 0's control address and the communicator's tag, nothing
// secret. Every rank returns the same. Only communicators over sockets
// have one.
func (c *Comm) JoinInfo() (string, error) {
	t, ok := c.ctl.(*recovery.TCP)
	if !ok {
		return "", fmt.Errorf("gocoll: rank %d: %w: an in-process communicator cannot be joined", c.rank, ErrInvalidUsage)
	}
	ns, ok := c.split.(*netSplitter)
	if !ok {
		return "", fmt.Errorf("gocoll: rank %d: %w: no tag to join by", c.rank, ErrInvalidUsage)
	}
	return joinInfoPrefix + hex.EncodeToString(ns.tag[:]) + ":" + t.Addr(0), nil
}

// Joiners is how many processes wait to join on this rank (rank 0 only:
// elsewhere 0). Cheap; a loop checks it at a step boundary (rank 0 tells
// the others, e.g. with the step's own allreduce) and calls Grow.
func (c *Comm) Joiners() int {
	if c.rank != 0 {
		return 0
	}
	s, err := c.recovery()
	if err != nil {
		return 0
	}
	return s.Joiners()
}

// Grow makes a communicator of c's ranks (same numbers) and n processes
// that asked to join (Join), numbered from c.Size() up in the order they
// asked. Every rank of c calls it with the same n, at most as many as may
// wait to join (twice c's size, at least 64); rank 0 waits up to the
// timeout for n joiners. c is left as it was.
func (c *Comm) Grow(n int) (*Comm, error) {
	if n < 1 {
		return nil, invalidArg("grow by %d processes (at least 1)", n)
	}
	if most := recovery.MaxJoiners(c.size); n > most {
		// Rank 0's listener refuses joiners past this many: a Grow
		// waiting for more would only time out.
		return nil, invalidArg("grow by %d processes: at most %d may wait to join a communicator of %d ranks (grow in steps)", n, most, c.size)
	}
	ns, ok := c.split.(*netSplitter)
	if !ok {
		return nil, fmt.Errorf("gocoll: rank %d: %w: an in-process communicator cannot grow", c.rank, ErrInvalidUsage)
	}
	s, err := c.recovery()
	if err != nil {
		return nil, err
	}
	s.Lock()
	defer s.Unlock()
	// Every rank numbers the instance alike, whatever fails on it alone
	// afterwards: a rank that returns early must not be an instance
	// behind the others at the next Shrink or Grow.
	inst := s.NextInst()
	if err := c.AsyncError(); err != nil {
		return nil, fmt.Errorf("gocoll: grow on rank %d: %w: the communicator failed (shrink it first): %v", c.rank, ErrInvalidUsage, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	size := c.size + n
	var b [16]byte
	copy(b[:], ns.tag[:])
	binary.LittleEndian.PutUint64(b[8:], inst)
	sum := sha256.Sum256(append([]byte("gocoll-grown\x00"), b[:]...))
	var tag [8]byte
	copy(tag[:], sum[:])

	var joiners []*recovery.Conn
	if c.rank == 0 {
		var have int
		if joiners, have, err = s.TakeJoiners(ctx, n); err != nil {
			return nil, c.growError(fmt.Errorf("%w: %d of %d joining processes arrived within %v", ErrTimeout, have, n, c.opts.Timeout))
		}
		defer func() {
			for _, j := range joiners {
				j.Close()
			}
		}()
		for i, j := range joiners {
			j.SetWriteDeadline(time.Now().Add(c.opts.Timeout))
			if err := j.WriteMsg(recovery.Msg{Grow: &recovery.GrowMsg{Rank: c.size + i, Size: size, Tag: tag[:]}}); err != nil {
				return nil, c.growError(fmt.Errorf("%w: telling joining process %d its rank: %v", ErrPeerLost, c.size+i, err))
			}
		}
	}
	l, err := connect(ctx, c.rank, size, tag, ns.secret, ns.host, s.GrowExchange(inst, joiners, size), c.opts)
	if err != nil {
		if !errors.Is(err, ErrPeerLost) {
			// A member or joiner that could not be reached: a peer
			// failure to recover from (shrink, then grow again), not a
			// usage error.
			err = fmt.Errorf("%w: %w", ErrPeerLost, err)
		}
		return nil, c.growError(err)
	}
	grown, err := adopt(c.rank, size, l, &netSplitter{secret: ns.secret, tag: tag, host: ns.host}, c.opts)
	if err != nil {
		return nil, c.growError(err)
	}
	// Every rank, joiners included, confirms on the grown communicator
	// that all of them have it: rank 0's last write to a joiner can fail
	// after the members had their last round, and then nobody must go on
	// with a communicator rank 0 does not hold (Join confirms alike).
	if err := grown.Barrier(); err != nil {
		grown.Abort()
		grown.Destroy()
		return nil, c.growError(fmt.Errorf("confirming the grown communicator: %w", err))
	}
	return grown, nil
}

func (c *Comm) growError(err error) error {
	return fmt.Errorf("gocoll: grow on rank %d: %w", c.rank, err)
}

// JoinSecret is the secret a joining process passes to Join: the job's
// unique id's when id is not nil, else the one NewCommFromEnv uses with
// GOCOLL_SECRET set (a job whose secret was derived or kept in a file
// cannot be joined from outside: set GOCOLL_SECRET).
func JoinSecret(id *UniqueID, getenv func(string) string) ([]byte, error) {
	if id != nil {
		_, secret, err := id.Parse()
		if err != nil {
			return nil, fmt.Errorf("%w: unique id: %v", ErrInvalidArgument, err)
		}
		return secret, nil
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	s := getenv("GOCOLL_SECRET")
	if s == "" {
		return nil, invalidArg("join: no unique id and GOCOLL_SECRET is unset: the job's secret is needed to join it")
	}
	return bootstrap.HashSecret(s), nil
}

// parseJoinInfo reads JoinInfo's tag and address.
func parseJoinInfo(info string) (tag [8]byte, addr string, err error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(info), joinInfoPrefix)
	tagHex, addr, ok2 := strings.Cut(rest, ":")
	tagb, err := hex.DecodeString(tagHex)
	if !ok || !ok2 || err != nil || len(tagb) != 8 {
		return tag, "", invalidArg("join info %q is not a communicator's JoinInfo", info)
	}
	return [8]byte(tagb), addr, nil
}

// Join makes this process a rank of a communicator that admits it (its
// members call Grow). info is the communicator's JoinInfo (handed over by
// a job file, or a variable the launcher sets); secret is the
// job's (the unique id's, or GOCOLL_SECRET). It waits up to the timeout to
// be admitted; when as many processes wait already as may
// (recovery.MaxJoiners: twice the communicator's size, at least 64), it
// fails at once with an ErrTimeout that says so.
func Join(info string, secret []byte, opts Options) (*Comm, error) {
	opts = opts.withDefaults()
	tag, addr, err := parseJoinInfo(info)
	if err != nil {
		return nil, err
	}
	if len(secret) == 0 {
		return nil, invalidArg("join: empty secret")
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	d := net.Dialer{Timeout: opts.Timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gocoll: join %s: %w: %v", addr, ErrPeerLost, err)
	}
	defer conn.Close()
	_, key, err := tcp.ClientHandshakeSession(conn, secret, recovery.GrowTag(tag), -1, time.Now().Add(opts.Timeout))
	if errors.Is(err, tcp.ErrRefused) {
		// Too many processes wait already (recovery.MaxJoiners): not
		// admitted, as if it had waited its timeout out; it may ask again.
		return nil, fmt.Errorf("gocoll: join %s: %w: not admitted: %w", addr, ErrTimeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("gocoll: join %s: %w", addr, err)
	}
	cc := recovery.NewConn(conn, key)
	conn.SetReadDeadline(time.Now().Add(opts.Timeout))
	hello, err := cc.ReadMsg()
	if err != nil || hello.Grow == nil || hello.Grow.Rank < 1 || hello.Grow.Rank >= hello.Grow.Size || len(hello.Grow.Tag) != 8 {
		return nil, fmt.Errorf("gocoll: join %s: %w: not admitted within %v (%v)", addr, ErrTimeout, opts.Timeout, err)
	}
	rank, size, newTag := hello.Grow.Rank, hello.Grow.Size, [8]byte(hello.Grow.Tag)
	host, err := advertiseHost(opts, addr)
	if err != nil {
		return nil, err
	}
	round := 0
	exchange := func(ctx context.Context, blob []byte) ([][]byte, error) {
		round++
		dl, _ := ctx.Deadline()
		conn.SetDeadline(dl)
		if err := cc.WriteMsg(recovery.Msg{Round: round, Blob: blob}); err != nil {
			return nil, fmt.Errorf("%w: rank 0: %v", ErrPeerLost, err)
		}
		m, err := cc.ReadMsg()
		if err != nil || m.Grow == nil || len(m.Grow.All) != size {
			return nil, fmt.Errorf("%w: rank 0 during setup: %v", ErrPeerLost, err)
		}
		return m.Grow.All, nil
	}
	l, err := connect(ctx, rank, size, newTag, secret, host, exchange, opts)
	if err != nil {
		return nil, err
	}
	c, err := adopt(rank, size, l, &netSplitter{secret: secret, tag: newTag, host: host}, opts)
	if err != nil {
		return nil, err
	}
	// The members' Grow confirms the grown communicator with a barrier on
	// it: take part.
	if err := c.Barrier(); err != nil {
		c.Abort()
		c.Destroy()
		return nil, fmt.Errorf("gocoll: join: confirming the grown communicator: %w", err)
	}
	return c, nil
}
