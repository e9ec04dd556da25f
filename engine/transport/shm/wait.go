//go:build linux

package shm

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine/transport"
)

const (
	futexWaitOp = 0 // FUTEX_WAIT, process-shared form (no FUTEX_PRIVATE_FLAG)
	futexWakeOp = 1 // FUTEX_WAKE, process-shared form

	// futexTimeout bounds one sleep so that a waiter re-checks its
	// deadline, abort state and the peer's liveness.
	futexTimeout = 50 * time.Millisecond
	// livenessEvery is how often a waiter checks that the peer's process
	// still exists.
	livenessEvery = 100 * time.Millisecond

	// Polls of the counter before yielding: a few dozen when every local
	// rank has a core, almost none when ranks share cores (spinning then
	// only delays the peer that has to run).
	spinUndersubscribed = 64
	spinOversubscribed  = 4
	// Gosched+sched_yield rounds before sleeping on the futex (a wake costs
	// ~14 µs on a small VM; a yield with nothing else runnable ~1 µs).
	yieldsUnder = 8
	yieldsOver  = 3
)

// lowHalf is the offset of the low 32 bits inside a 64-bit word: the futex
// word of a counter.
var lowHalf = func() uintptr {
	x := uint64(1)
	if *(*byte)(unsafe.Pointer(&x)) == 1 {
		return 0
	}
	return 4
}()

// futexWait sleeps while the low 32 bits of *w equal val, for at most d.
// Spurious returns are fine: callers re-check.
func futexWait(w *atomic.Uint64, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w))+lowHalf, futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every process sleeping on *w.
func futexWake(w *atomic.Uint64) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w))+lowHalf, futexWakeOp, math.MaxInt32, 0, 0, 0)
}

func osYield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

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
	for i := 0; i < t.spin; i++ {
		if w.Load() != old {
			return nil
		}
	}
	for i := 0; i < t.yields; i++ {
		runtime.Gosched() // other goroutines of this process (in-process ranks)
		if w.Load() != old {
			return nil
		}
		osYield() // other processes on this core
		if w.Load() != old {
			return nil
		}
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
		if err := p.remoteErr(); err != nil {
			if k == waitData && w.Load() != old {
				return nil
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
				if !processAlive(p.seg.pid, p.seg.start) {
					if k == waitData && w.Load() != old {
						return nil
					}
					t.log.Warn("shm: peer process gone", "rank", t.rank, "peer", p.rank, "pid", p.seg.pid)
					return fmt.Errorf("shm: %v rank %d: %w (process %d exited)", k, p.rank, transport.ErrPeerLost, p.seg.pid)
				}
			}
		}
	}
}

// remoteErr reports a peer that closed or aborted, from the state word in its
// segment.
func (p *peerConn) remoteErr() error {
	switch p.seg.state() {
	case stateClosed:
		return fmt.Errorf("shm: rank %d: %w (it closed its transport)", p.rank, transport.ErrPeerLost)
	case stateAborted:
		return &transport.RemoteAbortError{Peer: p.rank, Reason: p.seg.reason()}
	}
	return nil
}
