package shmsync

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// DefaultSleep is the longest single futex sleep of a Policy whose Sleep is
// zero. It bounds how late a sleeping waiter notices a cancelled context or
// anything its check function watches when nobody wakes it.
const DefaultSleep = 20 * time.Millisecond

// Policy says how a waiter spends the time until a counter moves: first
// Polls plain loads, then polling for up to Spin, then yielding the core
// until Yield has passed, then sleeping on the futex for at most Sleep at a
// time. The zero Policy goes to sleep at once (with DefaultSleep slices).
type Policy struct {
	Polls  int           // loads of the counter before anything else
	Spin   time.Duration // then keep polling this long (0: not at all)
	Yields int           // then yield (sched_yield, and Gosched with Goroutines) at least this often
	Yield  time.Duration // and for at least this long
	Sleep  time.Duration // then futex sleeps of at most this long each; 0 means DefaultSleep

	// Goroutines makes a yield let this process's other goroutines run
	// too (runtime.Gosched): those waited for, when ranks are goroutines,
	// and any other work of the program. Leave it off when the waiter is
	// a goroutine locked to its thread, as every call that enters Go from
	// C is: there Gosched parks the thread and passes the goroutine back
	// through another one, several times the cost of a sched_yield
	// (figures: docs/performance.md, "Figures behind the defaults").
	Goroutines bool

	// Colocation, when Coloc is set too, watches for the waiter sharing a
	// core with the rank it waits for and breaks it up (see Coloc). Not
	// with Goroutines. PolicyFor sets it when each rank has a core.
	Colocation bool
	Coloc      *Coloc // the waiter's state across its waits; nil: not watched
}

// Coloc is one waiter's record, across its waits, of whether the ranks it
// waits for keep arriving while it yields: the sign that it shares a core
// with them although the machine has a core per rank.
//
// Two ranks that wait on each other with sched_yield can end up on one
// core while the other stays idle (a wake-up placed the waker's peer next
// to it, say), and then stay there: each yield hands the core to the
// other, both run every few µs, so the scheduler's balancer finds both
// cache-hot and moves neither. Every wait then costs two context switches.
// perf sched_switch showed it on the 2-vCPU VM (2 ranks, 4 KiB
// allgather): runs that spent all their time so, every call an order of
// magnitude slower. A yield that returns
// after more than colocYield with the peer arrived is the sign. After
// colocStreak of them in a row the waiter moves its thread off its CPU
// (moveOff: the affinity mask narrowed and restored, so the kernel
// migrates it; a sleep on the futex instead, tried first, did not end it:
// one run stayed on one core throughout, with 376 such sleeps per rank).
// A thread allowed only its CPU sleeps once instead. Only for waiters
// locked to their thread (not Goroutines), as every call from C is.
type Coloc struct {
	streak int         // waits in a row that ended after a long yield
	sleep  bool        // the next wait goes from polling straight to the futex
	move   func() bool // moveOff, or a test's stand-in
}

const (
	colocYield  = 2 * time.Microsecond // a sched_yield that ran someone else
	colocStreak = 3
)

// yielded records how a wait that yielded ended: the peer's arrival seen
// after a yield of d.
func (c *Coloc) yielded(d time.Duration) {
	if d < colocYield {
		c.streak = 0
		return
	}
	if c.streak++; c.streak >= colocStreak {
		c.streak = 0
		move := c.move
		if move == nil {
			move = moveOff
		}
		c.sleep = !move()
	}
}

// lockedKey marks a context whose waits run on a goroutine locked to its
// thread (WithLocked).
type lockedKey struct{}

// WithLocked marks ctx as belonging to a caller whose goroutine is locked to
// its thread, as every call from C through cgo is: waits under it should
// leave Policy.Goroutines off.
func WithLocked(ctx context.Context) context.Context {
	return context.WithValue(ctx, lockedKey{}, true)
}

// IsLocked says whether ctx was marked by WithLocked.
func IsLocked(ctx context.Context) bool {
	v, _ := ctx.Value(lockedKey{}).(bool)
	return v
}

// PolicyFor returns the policy for ranks processes (or goroutines) that
// wait on each other on this host.
//
// When each has a core (runtime.NumCPU() >= ranks): 2048 polls,
// then 16 yields and at least 100 µs of yielding before the futex: a yield
// returns at once when nothing else wants the core, so this keeps polling
// politely, and hands the core over when the machine is busy. When ranks
// share cores: 16 polls, then at least 100 yields and 200 µs (a waiting
// rank gives its core to a rank that has work; cheaper than a futex sleep
// and wake), then the futex. Both bounds count: when the others compute, a
// yield can take a whole time slice, and the time bound alone sent a
// 4-rank Gorgonia training run (asynchronous allreduces overlapping
// compute) to the futex often enough to cost it throughput.
//
// Goroutines is on; callers on locked threads turn it off.
//
// Measured with 2 ranks (C ABI, processes), a futex sleep after only a
// few bare sched_yields made small allreduces many times slower, since a
// futex wake plus the sleeper's reschedule costs more than the whole call;
// with 4 ranks on 2 cores the length of the yielding phase made no
// difference. No time-based spin: on a busy machine a spin before
// yielding made a small allreduce many times slower (the spinner burnt the
// slice the descheduled peer needed). Figures: docs/performance.md.
func PolicyFor(ranks int) Policy {
	if !oversubscribed(ranks) {
		return Policy{Polls: 2048, Yields: 16, Yield: 100 * time.Microsecond, Goroutines: true, Colocation: true}
	}
	return Policy{Polls: 16, Yields: 100, Yield: 200 * time.Microsecond, Goroutines: true}
}

// oversubscribed: more ranks than cores.
func oversubscribed(ranks int) bool { return ranks > runtime.NumCPU() }

// lowHalf is the offset of the low 32 bits inside a 64-bit word.
var lowHalf = func() uintptr {
	x := uint64(1)
	if *(*byte)(unsafe.Pointer(&x)) == 1 {
		return 0
	}
	return 4
}()

// Low32 returns the address of the low 32 bits of w: the futex word of a
// 64-bit counter. Waiting on it with the low half of the counter's value
// works as long as the counter does not advance by a multiple of 2^32
// between a load and the sleep.
func Low32(w *atomic.Uint64) *uint32 {
	return (*uint32)(unsafe.Add(unsafe.Pointer(w), lowHalf))
}

// Await blocks until word.Load() != old and then returns nil, even if ctx
// is done or check would fail by then. Otherwise it returns:
//
//   - ctx.Err() when ctx is cancelled (noticed within p.Sleep) or
//     context.DeadlineExceeded once ctx's deadline has passed (the sleeps
//     are cut to end at the deadline), unwrapped: the caller says what it
//     waited for;
//   - the error of check, which runs before every sleep (not while
//     spinning or yielding, so it may be slow: a liveness probe, say).
//
// waiters is the counter's waiter count in shared memory: Await increments
// it around each sleep so that Notify knows to wake. Await allocates
// nothing (check may be a closure that does not escape).
func (p *Policy) Await(ctx context.Context, word, waiters *atomic.Uint64, old uint64, check func() error) error {
	if p.Busy(word, old) {
		return nil
	}
	return p.sleep(ctx, word, waiters, old, check)
}

// Busy runs the policy's polling and yielding phases: it reports true as
// soon as word.Load() != old, false when it is time to sleep. For waiters
// whose sleep is their own (Await's is the usual one).
func (p *Policy) Busy(word *atomic.Uint64, old uint64) bool {
	for i := 0; i < p.Polls; i++ {
		if word.Load() != old {
			return true
		}
	}
	if p.Spin > 0 {
		start := time.Now()
		for {
			for i := 0; i < 64; i++ {
				if word.Load() != old {
					return true
				}
			}
			if time.Since(start) >= p.Spin {
				break
			}
		}
	}
	if p.Yield > 0 || p.Yields > 0 {
		// With Goroutines, the Go scheduler's own threads run in the
		// yields (a Gosched wakes them), which drowns the sign.
		coloc := p.Coloc
		if !p.Colocation || p.Goroutines {
			coloc = nil
		}
		if coloc != nil && coloc.sleep {
			coloc.sleep = false
			return false
		}
		start := time.Now()
		for i := 1; ; i++ {
			if p.Goroutines {
				runtime.Gosched()
				if word.Load() != old {
					return true
				}
			}
			var before time.Duration
			if coloc != nil {
				before = time.Since(start)
			}
			Yield()
			if word.Load() != old {
				if coloc != nil {
					coloc.yielded(time.Since(start) - before)
				}
				return true
			}
			if i >= p.Yields && time.Since(start) >= p.Yield {
				break
			}
		}
	}
	return false
}

func (p *Policy) sleep(ctx context.Context, word, waiters *atomic.Uint64, old uint64, check func() error) error {
	futex := Low32(word)
	for {
		if word.Load() != old {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		d := p.Sleep
		if d <= 0 {
			d = DefaultSleep
		}
		if dl, ok := ctx.Deadline(); ok {
			r := time.Until(dl)
			if r <= 0 {
				return context.DeadlineExceeded
			}
			d = min(d, r)
		}
		if check != nil {
			if err := check(); err != nil {
				if word.Load() != old {
					return nil
				}
				return err
			}
		}
		waiters.Add(1)
		if word.Load() != old {
			waiters.Add(^uint64(0))
			return nil
		}
		FutexWait(futex, uint32(old), d)
		waiters.Add(^uint64(0))
		if word.Load() != old {
			return nil
		}
	}
}

// Notify wakes the waiters sleeping on word, if any registered in waiters.
// Call it after storing word's new value (Publish does both).
func Notify(word, waiters *atomic.Uint64) {
	if waiters.Load() != 0 {
		FutexWake(Low32(word))
	}
}

// Publish stores v into word and wakes its sleeping waiters, if any.
func Publish(word, waiters *atomic.Uint64, v uint64) {
	word.Store(v)
	Notify(word, waiters)
}

// WakeAll wakes every sleeper on word whether or not it registered (for
// shutdown paths, where a spurious wake is harmless).
func WakeAll(word *atomic.Uint64) { FutexWake(Low32(word)) }
