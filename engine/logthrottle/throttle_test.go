package logthrottle

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/proctest"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func lines(b *bytes.Buffer) []string {
	s := strings.TrimSpace(b.String())
	b.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestLimiter: 5 lines per window in full, then one summary with the count.
func TestLimiter(t *testing.T) {
	var buf bytes.Buffer
	clk := &clock{t: time.Unix(1000, 0)}
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "refused connections", 0, 0, clk.now)
	for i := range 100 {
		l.Warn("refused connection", "i", i)
	}
	got := lines(&buf)
	if len(got) != DefaultBurst {
		t.Fatalf("%d lines in the first window, want %d:\n%s", len(got), DefaultBurst, strings.Join(got, "\n"))
	}
	clk.t = clk.t.Add(DefaultWindow - time.Nanosecond)
	l.Warn("refused connection")
	if got := lines(&buf); len(got) != 0 {
		t.Fatalf("logged inside the window: %q", got)
	}
	clk.t = clk.t.Add(time.Nanosecond)
	l.Warn("refused connection", "i", "next")
	got = lines(&buf)
	if len(got) != 2 || !strings.Contains(got[0], "count=96") || !strings.Contains(got[1], "i=next") {
		t.Fatalf("after the window: want a summary of 96 then the line, got:\n%s", strings.Join(got, "\n"))
	}
	for range 7 {
		l.Warn("refused connection")
	}
	lines(&buf)
	l.Flush()
	got = lines(&buf)
	if len(got) != 1 || !strings.Contains(got[0], "count=3") {
		t.Fatalf("flush: %q, want one summary of 3", got)
	}
	l.Flush()
	if got := lines(&buf); len(got) != 0 {
		t.Fatalf("second flush logged %q", got)
	}
}

// TestLimitersIndependent: one limiter's flood does not silence another's.
func TestLimitersIndependent(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	clk := &clock{t: time.Unix(1000, 0)}
	a := New(logger, "x", 0, 0, clk.now)
	b := New(logger, "x", 0, 0, clk.now)
	for range 50 {
		a.Warn("a")
	}
	lines(&buf)
	b.Warn("b")
	if got := lines(&buf); len(got) != 1 {
		t.Fatalf("second limiter: %q", got)
	}
}

// TestSummaryWithoutLaterEvents: the count of a window's suppressed lines
// is logged at the window's end even when no event follows (a server that
// never stops would otherwise keep it forever).
func TestSummaryWithoutLaterEvents(t *testing.T) {
	var buf proctest.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "refused connections", 1, 20*time.Millisecond, nil)
	for range 4 {
		l.Warn("refused connection")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "count=3") {
		if time.Now().After(deadline) {
			t.Fatalf("no summary of the 3 suppressed lines without a later event:\n%s", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.Flush()
	if n := strings.Count(buf.String(), "not logged"); n != 1 {
		t.Errorf("%d summaries, want 1:\n%s", n, buf.String())
	}
}
