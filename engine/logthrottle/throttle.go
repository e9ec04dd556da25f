// Package logthrottle limits a stream of similar log lines (refused
// connections) so that a flood of hostile or misdirected connections cannot
// flood the operator's log: the first few of each window are logged in
// full, the rest are counted and reported in one summary line.
//
// A Limiter belongs to one object (a rendezvous root, a transport, the C
// library's metrics endpoint): there is no process-wide state, so two
// communicators never throttle each other.
package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults: 5 lines per 10 s in full.
const (
	DefaultBurst  = 5
	DefaultWindow = 10 * time.Second
)

// Limiter throttles one kind of WARN line.
type Limiter struct {
	logger *slog.Logger
	what   string // names the events in the summary line ("refused connections")
	burst  int
	window time.Duration
	now    func() time.Time

	mu         sync.Mutex
	start      time.Time // the current window's start; zero before the first event
	logged     int       // lines logged in full in this window
	suppressed int       // lines dropped in this window
	timer      *time.Timer
}

// New returns a Limiter logging to logger at WARN: burst lines per window
// in full, then a count. now is the clock (time.Now when nil; tests inject
// their own). burst or window ≤ 0 take the defaults.
func New(logger *slog.Logger, what string, burst int, window time.Duration, now func() time.Time) *Limiter {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	if window <= 0 {
		window = DefaultWindow
	}
	if now == nil {
		now = time.Now
	}
	return &Limiter{logger: logger, what: what, burst: burst, window: window, now: now}
}

// Warn logs msg with args at WARN unless this window's burst is spent;
// the first event after a window with suppressed lines logs their count
// first, and so does a timer at the end of that window if no event comes
// (an owner that never stops, such as a server for the process's life,
// loses no count either).
func (l *Limiter) Warn(msg string, args ...any) {
	l.mu.Lock()
	t := l.now()
	if l.start.IsZero() || t.Sub(l.start) >= l.window {
		l.summaryLocked()
		l.start, l.logged = t, 0
	}
	full := l.logged < l.burst
	if full {
		l.logged++
	} else {
		l.suppressed++
		if l.timer == nil {
			l.timer = time.AfterFunc(l.window-t.Sub(l.start), l.Flush)
		}
	}
	l.mu.Unlock()
	if full {
		l.logger.Log(context.Background(), slog.LevelWarn, msg, args...)
	}
}

// Flush logs the count of lines suppressed since the last summary, if any
// (call it when the owner stops, so the count is never lost).
func (l *Limiter) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.summaryLocked()
}

func (l *Limiter) summaryLocked() {
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if l.suppressed == 0 {
		return
	}
	l.logger.Warn("more "+l.what+" not logged", "count", l.suppressed, "window", l.window, "logged_in_full", l.burst)
	l.suppressed = 0
}
