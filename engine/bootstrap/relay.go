package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// maxParentHandshakes bounds the handshakes a rank's relay listener runs
// at once: connections beyond it (a flood) are closed unread. Only one is
// expected, but strangers holding silent connections (each until its
// handshake deadline, or until the parent has linked) must not fill the
// slots and shut the parent out: its dial retries, and 64 are far more
// than a stray scan holds.
const maxParentHandshakes = 64

// listenForParent opens the listener where this rank's relay parent will
// dial in, on the address this rank reaches the root from (the one the
// root will tell the parent), and returns its port.
func (c *Client) listenForParent() (int, error) {
	host := "127.0.0.1"
	if ta, ok := c.conn.LocalAddr().(*net.TCPAddr); ok {
		host = zoned(ta)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("bootstrap: rank %d: listening for its relay parent (rank %d) on %s: %w", c.rank, relayParent(c.rank), host, tcp.DescribeLimit(err))
	}
	// Handshakes still under way when the parent has linked (or the
	// client closes) are cut short: nobody else is expected.
	ctx, cancel := context.WithCancel(c.life)
	c.links.Lock()
	c.ln, c.accepted, c.stopAccepting = ln, make(chan net.Conn, 1), cancel
	c.links.Unlock()
	go c.acceptParent(ctx, ln, c.accepted)
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// zoned is a's host, with its zone (a link-local IPv6 address needs it).
func zoned(a *net.TCPAddr) string {
	if a.Zone != "" {
		return a.IP.String() + "%" + a.Zone
	}
	return a.IP.String()
}

// acceptParent authenticates the connections to ln and hands the first
// from this rank's relay parent to out; it ends when ln closes.
func (c *Client) acceptParent(ctx context.Context, ln net.Listener, out chan<- net.Conn) {
	parent := relayParent(c.rank)
	slots := make(chan struct{}, maxParentHandshakes)
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			conn.Close()
			continue
		}
		go func() {
			defer func() { <-slots }()
			stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
			_, err := tcp.ServerHandshake(conn, c.secret, bootstrapTag, c.rank, time.Now().Add(tcp.DefaultHandshakeTimeout), func(rank int) error {
				if rank != parent {
					return fmt.Errorf("rank %d is not rank %d's relay parent (rank %d)", rank, c.rank, parent)
				}
				return nil
			})
			// Stopped before the link is handed on: adopting it ends ctx,
			// which must not touch the adopted link's deadline.
			if stop() && err == nil && conn.SetDeadline(time.Time{}) == nil {
				select {
				case out <- conn:
					return
				default: // the parent is already linked
				}
			}
			conn.Close()
		}()
	}
}

// adoptParent makes p the link from the relay parent: the listener closes
// and what p carries is read from now on.
func (c *Client) adoptParent(p net.Conn) {
	c.links.Lock()
	defer c.links.Unlock()
	if c.closed.Load() {
		p.Close()
		return
	}
	c.ln.Close()
	c.stopAccepting()
	c.parent, c.ln, c.accepted = p, nil, nil
	c.fromParent = make(chan frameResult)
	go c.readLoop(p, c.fromParent)
}

// parentErr describes a failure while waiting for the relay parent.
func (c *Client) parentErr(what string, err error) error {
	p := relayParent(c.rank)
	c.links.Lock()
	linked := c.parent != nil
	c.links.Unlock()
	switch {
	case !linked:
		return fmt.Errorf("bootstrap: rank %d %s: waiting for the root at %s (or a link from relay rank %d): %w", c.rank, what, c.rootAddr, p, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("bootstrap: rank %d %s: waiting for the table from relay rank %d: %w", c.rank, what, p, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("bootstrap: rank %d %s: %w: relay rank %d closed its link to this rank", c.rank, what, ErrRankLeft, p)
	default:
		return fmt.Errorf("bootstrap: rank %d %s: %w: lost relay rank %d: %w", c.rank, what, ErrRankLeft, p, err)
	}
}

// source names where this rank's tables come from.
func (c *Client) source() string {
	c.links.Lock()
	defer c.links.Unlock()
	if c.parent != nil {
		return fmt.Sprintf("relay rank %d", relayParent(c.rank))
	}
	return "root at " + c.rootAddr
}

// relay takes the relays frame f: it dials this rank's children and sends
// them f. A child that cannot be reached is left out: it reports its
// missing parent, and the root the rounds it misses.
func (c *Client) relay(ctx context.Context, f []byte, what string) error {
	addrs, err := decodeRelays(f)
	if err == nil && len(addrs) != c.nranks {
		err = fmt.Errorf("%d relay addresses for %d ranks", len(addrs), c.nranks)
	}
	if err != nil {
		return fmt.Errorf("bootstrap: rank %d %s: %s sent bad relays: %v", c.rank, what, c.source(), err)
	}
	kids := relayChildren(c.rank, c.nranks)
	conns := make([]net.Conn, len(kids))
	var wg sync.WaitGroup
	for i, k := range kids {
		wg.Go(func() {
			conn, err := c.dialChild(ctx, k, addrs[k])
			if err != nil {
				return
			}
			conn.SetWriteDeadline(time.Now().Add(writeTimeout))
			if writeFrame(conn, f) != nil {
				conn.Close()
				return
			}
			conn.SetWriteDeadline(time.Time{})
			conns[i] = conn
		})
	}
	wg.Wait()
	c.links.Lock()
	defer c.links.Unlock()
	c.children = map[int]net.Conn{}
	for i, conn := range conns {
		switch {
		case conn == nil:
		case c.closed.Load():
			conn.Close()
		default:
			c.children[kids[i]] = conn
		}
	}
	return nil
}

// dialChild connects to relay child k at addr and authenticates it,
// retrying until the handshake timeout or ctx ends.
func (c *Client) dialChild(ctx context.Context, k int, addr string) (net.Conn, error) {
	deadline := time.Now().Add(tcp.DefaultHandshakeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	backoff := 10 * time.Millisecond
	for {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			var peer int
			stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
			peer, err = tcp.ClientHandshake(conn, c.secret, bootstrapTag, c.rank, deadline)
			if !stop() {
				err = ctx.Err()
			}
			if err == nil && peer != k {
				err = fmt.Errorf("%w: rank %d answered at %s, not rank %d", tcp.ErrRefused, peer, addr, k)
			}
			if err == nil && conn.SetDeadline(time.Time{}) == nil {
				return conn, nil
			}
			conn.Close()
			if errors.Is(err, tcp.ErrAuth) || errors.Is(err, tcp.ErrRefused) {
				return nil, err
			}
		}
		select {
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
			backoff = min(2*backoff, time.Second)
		case <-ctx.Done():
			return nil, err
		}
	}
}

// forward sends frame f, as it came, to the children; a child that does
// not take it within writeTimeout is dropped (it then reports this rank).
func (c *Client) forward(f []byte) {
	c.links.Lock()
	var kids []int
	var conns []net.Conn
	for k, conn := range c.children {
		kids, conns = append(kids, k), append(conns, conn)
	}
	c.links.Unlock()
	failed := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() {
			conn.SetWriteDeadline(time.Now().Add(writeTimeout))
			err := writeFrame(conn, f)
			conn.SetWriteDeadline(time.Time{})
			if err != nil {
				conn.Close()
				failed[i] = true
			}
		})
	}
	wg.Wait()
	c.links.Lock()
	defer c.links.Unlock()
	for i, k := range kids {
		if failed[i] {
			delete(c.children, k)
		}
	}
}

// failChildren tells the children why this rank's round failed (their
// errors then name this relay and the cause) and closes their links.
func (c *Client) failChildren(err error) {
	cause := error(nil)
	for _, e := range causes {
		if e != nil && errors.Is(err, e) {
			cause = e
			break
		}
	}
	c.forward(errorReply(cause, fmt.Sprintf("relay rank %d: %v", c.rank, err)))
	c.links.Lock()
	defer c.links.Unlock()
	for _, conn := range c.children {
		conn.Close()
	}
	c.children = nil
}

// closeLinks closes the relay listener and links.
func (c *Client) closeLinks() {
	c.links.Lock()
	defer c.links.Unlock()
	if c.ln != nil {
		c.ln.Close()
	}
	if c.parent != nil {
		c.parent.Close()
	}
	for _, conn := range c.children {
		conn.Close()
	}
	c.children = nil
}
