//go:build linux

package shm

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

const (
	// futexTimeout bounds one sleep so that a waiter re-checks its
	// deadline, abort state and the peer's liveness.
	futexTimeout = 50 * time.Millisecond
	// livenessEvery is how often a waiter checks that the peer's process
	// still exists.
	livenessEvery = 100 * time.Millisecond
)

// futexWait sleeps while the low 32 bits of *w equal val, for at most d.
// Spurious returns are fine: callers re-check.
func futexWait(w *atomic.Uint64, val uint32, d time.Duration) {
	shmsync.FutexWait(shmsync.Low32(w), val, d)
}

// futexWake wakes every process sleeping on *w.
func futexWake(w *atomic.Uint64) { shmsync.WakeAll(w) }

type waitKind int

const (
	waitData  waitKind = iota // Recv: the ring is empty, wait for tail to move
	waitSpace                 // Send: the ring is full, wait for head to move
)

func (k waitKind) String() string {
	if k == waitData {
		return "recv from"
	}
	return "send to"
}

// await blocks until *w differs from old. w is the counter the other side
// advances (tail for waitData, head for waitSpace); flag is this side's
// waiter flag in shared memory, which tells the other side to FUTEX_WAKE.
//
// Before reporting that the peer went away or aborted, a waitData wait
// re-checks the ring so that what the peer sent before is still delivered.
func (t *Transport) await(ctx context.Context, p *peerConn, k waitKind, w *atomic.Uint64, old uint64, flag *atomic.Uint64) error {
	pol := p.policy
	pol.Goroutines = !shmsync.IsLocked(ctx)
	if pol.Busy(w, old) {
		return nil
	}
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	lastLive := time.Now()
	for {
		if err := t.localErr(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			if err == context.DeadlineExceeded {
				return fmt.Errorf("shm: %v rank %d: %w", k, p.rank, err)
			}
			return err
		}
		if err, failed := p.remoteErr(); err != nil {
			if k == waitData && w.Load() != old {
				return nil
			}
			if failed {
				err = t.fail(err)
			}
			return err
		}
		if stop == nil && ctx.Done() != nil {
			stop = context.AfterFunc(ctx, func() { futexWake(w) })
		}
		d := futexTimeout
		if dl, ok := ctx.Deadline(); ok {
			if r := time.Until(dl); r < d {
				d = max(r, 20*time.Microsecond)
			}
		}
		flag.Store(1)
		if w.Load() != old {
			flag.Store(0)
			return nil
		}
		futexWait(w, uint32(old), d)
		flag.Store(0)
		if w.Load() != old {
			return nil
		}
		if p.remote {
			if now := time.Now(); now.Sub(lastLive) >= livenessEvery {
				lastLive = now
				if !p.seg.proc.Alive() {
					if k == waitData && w.Load() != old {
						return nil
					}
					if p.seg.state() == shmseg.StateClosed {
						return p.closedErr()
					}
					t.log.Warn("shm: peer process gone", "rank", t.rank, "peer", p.rank, "pid", p.seg.proc.Pid)
					return t.fail(fmt.Errorf("shm: %v rank %d: %w", k, p.rank, p.lostErr()))
				}
			}
		}
	}
}

// remoteErr reports a peer that closed or aborted, from the state word in its
// segment. failed tells an abort (or a failure the peer relays: a
// *transport.RemoteAbortError or *transport.PeerLostError naming the rank
// where it started) from an orderly close.
func (p *peerConn) remoteErr() (err error, failed bool) {
	switch p.seg.state() {
	case shmseg.StateClosed:
		return p.closedErr(), false
	case shmseg.StateAborted:
		return p.seg.failure().Err(), true
	}
	return nil, false
}

func (p *peerConn) closedErr() error {
	return fmt.Errorf("shm: %w", &transport.PeerLostError{Peer: p.rank, Reason: "closed its communicator"})
}

func (p *peerConn) lostErr() error {
	return &transport.PeerLostError{Peer: p.rank, Reason: fmt.Sprintf("process %d exited", p.seg.proc.Pid), Dead: true}
}

// watchEvery is how often the watcher looks at every peer's state word; it
// checks the peers' processes every livenessEvery. unreadGrace is how long
// it lets a failed peer's unread messages wait for a Recv (which delivers
// them first) before failing this transport anyway.
const (
	watchEvery  = 50 * time.Millisecond
	unreadGrace = 250 * time.Millisecond
)

// watch runs from Connect until the transport stops: it fails this
// transport, and wakes its waiters, when any peer aborted (or announces a
// failure it heard of) or a watched peer's process died, so that a rank
// waiting on another peer, or in no call at all, stops too. A peer that
// closed in order is not a failure. The watched peers are the hot ones
// (all of them in small jobs): a cold peer's death is announced by the
// ranks that watch it, in their segments' state, which this rank reads.
//
// Watched remote peers with a pidfd are polled every tick (one system call
// for all: pfds, polled maps a rank to its index there); the others are
// looked up in /proc every livenessEvery. Connect builds pfds: the watcher
// reads no pidfd outside opMu, under which shutdown closes them.
func (t *Transport) watch(pfds []pollFd, polled map[int]int) {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	w := &watcher{pfds: pfds, polled: polled, lastLive: time.Now(), pending: make(map[int]unread)}
	for {
		select {
		case <-t.quit:
			return
		case <-tick.C:
		}
		if !t.watchOnce(w) {
			return
		}
	}
}

// watcher is what the watcher remembers from one look to the next.
type watcher struct {
	pfds     []pollFd
	polled   map[int]int
	lastLive time.Time
	pending  map[int]unread // failed peers whose messages wait unread
}

type unread struct {
	since time.Time
	head  uint64
}

// watchOnce looks at every peer once (their processes too when
// livenessEvery passed since the last time), failing the transport when a
// peer failed; it returns false once the transport stopped.
func (t *Transport) watchOnce(w *watcher) bool {
	t.opMu.RLock()
	defer t.opMu.RUnlock()
	if t.localErr() != nil {
		return false
	}
	now := time.Now()
	live := now.Sub(w.lastLive) >= livenessEvery
	if live {
		w.lastLive = now
	}
	if !pollExited(w.pfds) {
		w.pfds, w.polled = nil, nil // fall back to /proc
	}
	var failure error
	for _, p := range t.conns {
		if p == nil {
			continue
		}
		// Liveness before state: a peer that closed, then exited, is
		// seen closed.
		var dead bool
		if i, ok := w.polled[p.rank]; ok {
			dead = w.pfds[i].revents != 0
		} else {
			dead = live && p.remote && p.watched && !p.seg.proc.Alive()
		}
		var err error
		switch p.seg.state() {
		case shmseg.StateAborted:
			err = p.seg.failure().Err()
		case shmseg.StateClosed:
			continue
		default:
			if _, ok := w.pending[p.rank]; !ok && !dead {
				continue
			}
			err = fmt.Errorf("shm: rank %d watching rank %d: %w", t.rank, p.rank, p.lostErr())
		}
		if head := p.in.head.Load(); p.in.tail.Load() != head {
			if ferr := t.abortAtFront(p); ferr != nil {
				failure = ferr // nothing unread before the abort message
				break
			}
			u, ok := w.pending[p.rank]
			if !ok || u.head != head {
				w.pending[p.rank] = unread{now, head} // a Recv is taking them
				continue
			}
			if now.Sub(u.since) < unreadGrace {
				continue
			}
		}
		failure = err
		break
	}
	if failure != nil {
		t.fail(failure)
		return false
	}
	return true
}

// abortAtFront returns the failure announced by the abort message at the
// front of the ring from p, when no Recv from p is in progress and the
// stream is in step: the peer sent nothing else that waits to be read.
func (t *Transport) abortAtFront(p *peerConn) error {
	if !p.recvMu.TryLock() {
		return nil // a Recv is taking the messages: it reaches the abort itself
	}
	defer p.recvMu.Unlock()
	r := &p.in
	head := p.inHead
	avail := r.tail.Load() - head
	if p.recvErr != nil || avail < transport.HeaderSize {
		return nil
	}
	var hb [transport.HeaderSize]byte
	peekRing(r, head, hb[:])
	h, err := transport.DecodeHeader(hb[:])
	if err != nil || h.Kind != transport.KindAbort || h.Len > maxAbortPayload || avail < transport.HeaderSize+h.Len {
		return nil
	}
	reason := make([]byte, h.Len)
	peekRing(r, head+transport.HeaderSize, reason)
	return transport.FailureFrom(p.rank, h, string(reason)).Err()
}

// peekRing copies len(dst) bytes at stream position pos out of r without
// consuming them.
func peekRing(r *ring, pos uint64, dst []byte) {
	off := pos & r.mask
	k := copy(dst, r.data[off:])
	copy(dst[k:], r.data)
}
