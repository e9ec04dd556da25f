package bootstrap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// Client is one rank's open connection to the root, for further rounds,
// and in a tree its relay links (relay.go).
type Client struct {
	rootAddr     string
	rank, nranks int
	secret       []byte

	conn     net.Conn
	fromRoot chan frameResult // what the root sends (readLoop)
	life     context.Context  // ends with Close: the readers stop
	end      context.CancelFunc
	mu       sync.Mutex // one round at a time
	round    uint32
	broken   error
	closed   atomic.Bool
	once     sync.Once

	// The relay links (nil in a star). links guards them against Close.
	links         sync.Mutex
	ln            net.Listener       // where the parent dials in, until it did
	accepted      chan net.Conn      // the parent's authenticated link (acceptParent)
	stopAccepting context.CancelFunc // ends acceptParent's handshakes
	parent        net.Conn           // the link from relayParent(rank)
	fromParent    chan frameResult   // what the parent forwards (readLoop)
	children      map[int]net.Conn   // links to relayChildren(rank), those that work
}

// frameResult is one frame read from a connection, or why none could be.
type frameResult struct {
	f   []byte
	err error
}

// Exchange joins the job at rootAddr as rank of nranks, contributes blob
// (at most MaxBlob bytes) and returns every rank's blob, indexed by rank.
// It dials until ctx ends, since the root may start later (give ctx a
// deadline: without one it waits until ctx is cancelled). It is Join
// followed by Close.
func Exchange(ctx context.Context, rootAddr string, secret []byte, rank, nranks int, blob []byte) ([][]byte, error) {
	c, table, err := Join(ctx, rootAddr, secret, rank, nranks, blob)
	if err != nil {
		return nil, err
	}
	c.Close()
	return table, nil
}

// Join is Exchange that keeps the connection for later rounds
// (Client.AllGather). Errors: the root refused us (wrong secret: wraps
// tcp.ErrAuth; invalid rank: wraps ErrRendezvous), the root reported a failed
// rendezvous (wraps ErrRendezvous, naming the missing ranks), a relay
// parent was lost (naming its rank), or nobody answered before ctx ended
// (wraps ctx's error, naming rootAddr or the relay and how long it waited).
func Join(ctx context.Context, rootAddr string, secret []byte, rank, nranks int, blob []byte) (*Client, [][]byte, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, nil, fmt.Errorf("bootstrap: %w: rank %d out of range for nranks %d", ErrRankConflict, rank, nranks)
	}
	if len(blob) > MaxBlob {
		return nil, nil, fmt.Errorf("bootstrap: blob of %d bytes exceeds %d", len(blob), MaxBlob)
	}
	conn, err := dialRoot(ctx, rootAddr, secret, rank)
	if err != nil {
		return nil, nil, err
	}
	conn.SetDeadline(time.Time{})
	c := &Client{rootAddr: rootAddr, rank: rank, nranks: nranks, secret: slices.Clone(secret), conn: conn,
		fromRoot: make(chan frameResult)}
	c.life, c.end = context.WithCancel(context.Background())
	go c.readLoop(conn, c.fromRoot)
	msg := make([]byte, 5, 7+len(blob))
	msg[0] = frameJoin
	binary.LittleEndian.PutUint32(msg[1:], uint32(nranks))
	if nranks > Fanout && rank >= Fanout {
		port, err := c.listenForParent()
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		msg[0] = frameTreeJoin
		msg = binary.LittleEndian.AppendUint16(msg, uint16(port))
	}
	table, err := c.roundTrip(ctx, append(msg, blob...), "joining")
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, table, nil
}

// readLoop hands the frames read from conn to out, until it fails or the
// client closes.
func (c *Client) readLoop(conn net.Conn, out chan<- frameResult) {
	for {
		f, err := readFrame(conn, maxTable)
		select {
		case out <- frameResult{f, err}:
		case <-c.life.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

func dialRoot(ctx context.Context, rootAddr string, secret []byte, rank int) (net.Conn, error) {
	start := time.Now()
	backoff := 10 * time.Millisecond
	attempts := 0
	var lastErr error
	for {
		attempts++
		var d net.Dialer
		dctx, cancel := context.WithTimeout(ctx, tcp.DefaultHandshakeTimeout)
		conn, err := d.DialContext(dctx, "tcp", rootAddr)
		cancel()
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			// Out of descriptors: waiting does not free any.
			return nil, fmt.Errorf("bootstrap: rank %d: dialling the root at %s: %w", rank, rootAddr, tcp.DescribeLimit(err))
		}
		if err == nil {
			hsDeadline := time.Now().Add(tcp.DefaultHandshakeTimeout)
			if dl, ok := ctx.Deadline(); ok && dl.Before(hsDeadline) {
				hsDeadline = dl
			}
			stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
			_, err = tcp.ClientHandshake(conn, secret, bootstrapTag, rank, hsDeadline)
			if !stop() {
				err = ctx.Err()
			}
			if err == nil {
				return conn, nil
			}
			conn.Close()
			if errors.Is(err, tcp.ErrAuth) {
				return nil, fmt.Errorf("bootstrap: rank %d: the process at %s is not this job's root (wrong secret, or another job on that port; set GOCOLL_SECRET / GOCOLL_PORT alike on every rank): %w", rank, rootAddr, err)
			}
			if errors.Is(err, tcp.ErrRefused) {
				return nil, fmt.Errorf("bootstrap: rank %d: root at %s: %w", rank, rootAddr, err)
			}
		}
		if ctx.Err() != nil {
			if lastErr == nil {
				lastErr = err
			}
			return nil, fmt.Errorf("bootstrap: rank %d: no root answered at %s after %v (%d attempts, last error: %v); is rank 0 running, and do all ranks agree on the root address and port (GOCOLL_ROOT_ADDR, GOCOLL_PORT)?: %w",
				rank, rootAddr, time.Since(start).Round(time.Millisecond), attempts, lastErr, ctx.Err())
		}
		lastErr = err
		sleep := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, time.Second)
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
		}
	}
}

// roundTrip sends one frame to the root and waits for the round's table:
// from the root, or in a tree from the relay parent (forwarding it to the
// children), honouring ctx. Any failure leaves the client unusable, and
// the children are told.
func (c *Client) roundTrip(ctx context.Context, msg []byte, what string) ([][]byte, error) {
	table, err := c.exchange(ctx, msg, what)
	if err != nil {
		c.broken = err
		c.failChildren(err)
	}
	return table, err
}

func (c *Client) exchange(ctx context.Context, msg []byte, what string) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bootstrap: rank %d %s: %w", c.rank, what, err)
	}
	if err := c.write(ctx, msg); err != nil {
		// The root may have said why before it closed the connection.
		select {
		case r := <-c.fromRoot:
			if r.err == nil && len(r.f) > 0 && r.f[0] == replyError {
				return nil, replyErr(fmt.Sprintf("bootstrap: rank %d %s", c.rank, what), r.f)
			}
		case <-ctx.Done():
		case <-c.life.Done():
		}
		return nil, c.rootErr(what, err)
	}
	reply, err := c.next(ctx, what)
	if err == nil && len(reply) > 0 && reply[0] == replyRelays && c.round == 0 {
		if err = c.relay(ctx, reply, what); err == nil {
			reply, err = c.next(ctx, what)
		}
	}
	if err != nil {
		return nil, err
	}
	if len(reply) > 0 && reply[0] == replyError {
		return nil, replyErr(fmt.Sprintf("bootstrap: rank %d %s", c.rank, what), reply)
	}
	table, err := decodeTable(reply)
	if err == nil && len(table) != c.nranks {
		err = fmt.Errorf("%d entries for %d ranks", len(table), c.nranks)
	}
	if err != nil {
		return nil, fmt.Errorf("bootstrap: rank %d %s: %s sent a bad table: %v", c.rank, what, c.source(), err)
	}
	c.forward(reply)
	return table, nil
}

// write sends msg to the root, bounded by ctx.
func (c *Client) write(ctx context.Context, msg []byte) error {
	dl, _ := ctx.Deadline()
	c.conn.SetWriteDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.conn.SetWriteDeadline(time.Unix(1, 0)) })
	err := writeFrame(c.conn, msg)
	if !stop() && err != nil {
		err = ctx.Err()
	}
	c.conn.SetWriteDeadline(time.Time{})
	return err
}

// rootErr describes a failure of the connection to the root.
func (c *Client) rootErr(what string, err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("bootstrap: rank %d %s: waiting for the root at %s: %w", c.rank, what, c.rootAddr, context.DeadlineExceeded)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("bootstrap: rank %d %s: waiting for the root at %s: %w", c.rank, what, c.rootAddr, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("bootstrap: rank %d %s: the root at %s closed the connection", c.rank, what, c.rootAddr)
	default:
		return fmt.Errorf("bootstrap: rank %d %s: root at %s: %w", c.rank, what, c.rootAddr, err)
	}
}

// next waits for the next frame of the round: from the relay parent once
// it has connected (an error verdict may still come from the root),
// otherwise from the root.
func (c *Client) next(ctx context.Context, what string) ([]byte, error) {
	for {
		c.links.Lock()
		accepted, fromParent := c.accepted, c.fromParent
		c.links.Unlock()
		select {
		case r := <-c.fromRoot:
			if r.err != nil {
				return nil, c.rootErr(what, r.err)
			}
			return r.f, nil
		case r := <-fromParent:
			if r.err != nil {
				return nil, c.parentErr(what, r.err)
			}
			return r.f, nil
		case p := <-accepted:
			c.adoptParent(p)
		case <-c.life.Done():
			return nil, fmt.Errorf("bootstrap: rank %d %s: client closed", c.rank, what)
		case <-ctx.Done():
			if accepted != nil || fromParent != nil {
				return nil, c.parentErr(what, ctx.Err())
			}
			return nil, c.rootErr(what, ctx.Err())
		}
	}
}

// AllGather runs one more round over the same job: every rank calls it
// with its blob and gets all of them, indexed by rank. Every rank must call
// AllGather the same number of times, in the same order; a rank that
// closes its client instead fails the round for the others.
func (c *Client) AllGather(ctx context.Context, blob []byte) ([][]byte, error) {
	if len(blob) > MaxBlob {
		return nil, fmt.Errorf("bootstrap: blob of %d bytes exceeds %d", len(blob), MaxBlob)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, c.broken
	}
	if c.closed.Load() {
		return nil, errors.New("bootstrap: client closed")
	}
	c.round++
	msg := make([]byte, 5, 5+len(blob))
	msg[0] = frameRound
	binary.LittleEndian.PutUint32(msg[1:], c.round)
	return c.roundTrip(ctx, append(msg, blob...), fmt.Sprintf("round %d", c.round))
}

// Rank is the client's rank; Size the job's number of ranks.
func (c *Client) Rank() int { return c.rank }

// Size is the job's number of ranks.
func (c *Client) Size() int { return c.nranks }

// Close leaves the job (the root stops once every rank has left), and
// closes the relay links. Idempotent.
// A pending AllGather fails.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.end()
		c.conn.Close()
		c.closeLinks()
	})
	return nil
}
