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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// Client is one rank's open connection to the root, for further rounds.
type Client struct {
	rootAddr     string
	rank, nranks int

	conn   net.Conn
	mu     sync.Mutex // one round at a time
	round  uint32
	broken error
	closed atomic.Bool
	once   sync.Once
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
// rendezvous (wraps ErrRendezvous, naming the missing ranks), or nobody
// answered before ctx ended (wraps ctx's error, naming rootAddr and how
// long it waited).
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
	c := &Client{rootAddr: rootAddr, rank: rank, nranks: nranks, conn: conn}
	msg := make([]byte, 5, 5+len(blob))
	msg[0] = frameJoin
	binary.LittleEndian.PutUint32(msg[1:], uint32(nranks))
	table, err := c.roundTrip(ctx, append(msg, blob...), "joining")
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, table, nil
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

// roundTrip sends one frame and reads the root's reply, honouring ctx. Any
// failure leaves the client unusable.
func (c *Client) roundTrip(ctx context.Context, msg []byte, what string) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("bootstrap: rank %d %s: %w", c.rank, what, err)
	}
	dl, _ := ctx.Deadline()
	c.conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	err := writeFrame(c.conn, msg)
	var reply []byte
	if err == nil {
		reply, err = readFrame(c.conn, maxTable)
	}
	if !stop() && err != nil {
		err = ctx.Err()
	}
	if err != nil {
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			err = fmt.Errorf("bootstrap: rank %d %s: waiting for the root at %s: %w", c.rank, what, c.rootAddr, context.DeadlineExceeded)
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("bootstrap: rank %d %s: waiting for the root at %s: %w", c.rank, what, c.rootAddr, err)
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			err = fmt.Errorf("bootstrap: rank %d %s: the root at %s closed the connection", c.rank, what, c.rootAddr)
		default:
			err = fmt.Errorf("bootstrap: rank %d %s: root at %s: %w", c.rank, what, c.rootAddr, err)
		}
		c.broken = err
		return nil, err
	}
	c.conn.SetDeadline(time.Time{})
	if len(reply) > 0 && reply[0] == replyError {
		c.broken = replyErr(fmt.Sprintf("bootstrap: rank %d %s", c.rank, what), reply)
		return nil, c.broken
	}
	table, err := decodeTable(reply)
	if err == nil && len(table) != c.nranks {
		err = fmt.Errorf("%d entries for %d ranks", len(table), c.nranks)
	}
	if err != nil {
		c.broken = fmt.Errorf("bootstrap: rank %d %s: root at %s sent a bad table: %v", c.rank, what, c.rootAddr, err)
		return nil, c.broken
	}
	return table, nil
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

// Close leaves the job (the root stops once every rank has left).
// Idempotent.
// A pending AllGather fails.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.conn.Close()
	})
	return nil
}
