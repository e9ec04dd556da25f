package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
)

// TestOptionsFromEnv: every GOCOLL_* setting is parsed or refused with
// ErrInvalidArgument naming the variable.
func TestOptionsFromEnv(t *testing.T) {
	for _, c := range []struct {
		env   map[string]string
		check func(Options) bool
		bad   string // a refused value names this variable
	}{
		{env: nil, check: func(o Options) bool { return !o.NoCMA && o.Timeout == 0 && o.Transport == "" }},
		{env: map[string]string{"GOCOLL_TIMEOUT": "90"}, check: func(o Options) bool { return o.Timeout == 90*time.Second }},
		{env: map[string]string{"GOCOLL_TIMEOUT": "1m"}, check: func(o Options) bool { return o.Timeout == time.Minute }},
		{env: map[string]string{"GOCOLL_TIMEOUT": "-1"}, bad: "GOCOLL_TIMEOUT"},
		{env: map[string]string{"GOCOLL_CMA": "0"}, check: func(o Options) bool { return o.NoCMA }},
		{env: map[string]string{"GOCOLL_CMA": "off"}, check: func(o Options) bool { return o.NoCMA }},
		{env: map[string]string{"GOCOLL_CMA": "1"}, check: func(o Options) bool { return !o.NoCMA }},
		{env: map[string]string{"GOCOLL_CMA": "maybe"}, bad: "GOCOLL_CMA"},
		{env: map[string]string{"GOCOLL_TRANSPORT": "TCP"}, check: func(o Options) bool { return o.Transport == "tcp" }},
		{env: map[string]string{"GOCOLL_TRANSPORT": "rdma"}, bad: "GOCOLL_TRANSPORT"},
		{env: map[string]string{"GOCOLL_BRUCK_RADIX": "1"}, bad: "GOCOLL_BRUCK_RADIX"},
		{env: map[string]string{"GOCOLL_ALGO": "allreduce=nope"}, bad: "GOCOLL_ALGO"},
		{env: map[string]string{"GOCOLL_DEBUG": "loud"}, bad: "GOCOLL_DEBUG"},
		// Warnings are printed unless asked not to: unset means WARN.
		{env: nil, check: func(o Options) bool {
			return o.Logger != nil && o.Logger.Enabled(context.Background(), slog.LevelWarn) && !o.Logger.Enabled(context.Background(), slog.LevelInfo)
		}},
		{env: map[string]string{"GOCOLL_DEBUG": "off"}, check: func(o Options) bool {
			return o.Logger != nil && !o.Logger.Enabled(context.Background(), slog.LevelError)
		}},
		{env: map[string]string{"GOCOLL_DEBUG": "info"}, check: func(o Options) bool { return o.Logger.Enabled(context.Background(), slog.LevelInfo) }},
	} {
		o, err := OptionsFromEnv(func(k string) string { return c.env[k] })
		if c.bad != "" {
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("%v: error %v, want ErrInvalidArgument naming %s", c.env, err, c.bad)
			}
			continue
		}
		if err != nil || !c.check(o) {
			t.Errorf("%v: %+v, %v", c.env, o, err)
		}
	}
}

// TestLockedCallersReachWaits: an operation run for a locked caller tells
// the shared-memory collectives, which wait on the caller's goroutine, not
// to yield to goroutines (Call.Locked), and leaves the transports' context
// unmarked: the executor's goroutines wait on them, and those are not
// locked (see execCtx.context).
func TestLockedCallersReachWaits(t *testing.T) {
	for _, locked := range []bool{false, true} {
		x := &execCtx{c: &Comm{abortCtx: context.Background(), epoch: time.Now()}, locked: locked, deadline: time.Minute}
		if x.call().Locked != locked || shmsync.IsLocked(x.context()) {
			t.Errorf("locked %v: Call.Locked %v, context marked %v", locked, x.call().Locked, shmsync.IsLocked(x.context()))
		}
		x.cancel()
	}
}

// GOCOLL_DEBUG_FILE: %h and %p become host and pid, every line carries
// host, pid, rank and the communicator, INFO names the algorithm a
// communicator first uses for a collective (once), and a second
// communicator of the process writes to the same open file.
func TestDebugFile(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"GOCOLL_DEBUG": "INFO", "GOCOLL_DEBUG_FILE": filepath.Join(dir, "gocoll.%h.%p.log")}
	opts, err := OptionsFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	again, err := OptionsFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{opts, again} {
		comms := newLocal(t, 2, o)
		mustRanks(t, comms, func(c *Comm) error {
			b := make([]byte, 64)
			for range 3 {
				if err := c.AllReduce(b, b, 16, Float32, Sum); err != nil {
					return err
				}
			}
			return nil
		})
	}
	host, _ := os.Hostname()
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	want := filepath.Join(dir, fmt.Sprintf("gocoll.%s.%d.log", host, os.Getpid()))
	if len(files) != 1 || files[0] != want {
		t.Fatalf("log files %v, want %s", files, want)
	}
	text, _ := os.ReadFile(want)
	chosen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(text)), "\n") {
		if !strings.Contains(line, "host="+host) || !strings.Contains(line, fmt.Sprintf("pid=%d", os.Getpid())) {
			t.Errorf("line without host and pid: %s", line)
		}
		if strings.Contains(line, "algorithm chosen") {
			chosen++
			if !strings.Contains(line, "rank=") || !strings.Contains(line, "comm=") || !strings.Contains(line, "op=allreduce") {
				t.Errorf("algorithm line without rank, communicator or op: %s", line)
			}
		}
	}
	if chosen != 4 { // 2 communicators × 2 ranks, once each
		t.Errorf("%d algorithm lines, want 4:\n%s", chosen, text)
	}
}

// TestOptionsFromSettings: a communicator's own settings win over the
// environment, an empty one leaves the environment's value, and a bad
// value is refused naming the setting rather than the variable.
func TestOptionsFromSettings(t *testing.T) {
	env := map[string]string{"GOCOLL_TIMEOUT": "90", "GOCOLL_ALGO": "ring", "GOCOLL_CMA": "0"}
	getenv := func(k string) string { return env[k] }
	o, err := OptionsFromSettings(getenv,
		Setting{Var: "GOCOLL_TIMEOUT", Value: "1500ms", Field: "config.timeout"},
		Setting{Var: "GOCOLL_ALGO", Value: "", Field: "config.algo"},
		Setting{Var: "GOCOLL_TRANSPORT", Value: "tcp", Field: "config.transport"},
		Setting{Var: "GOCOLL_DEBUG", Value: "off", Field: "config.debug"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Timeout != 1500*time.Millisecond || o.Algo != "ring" || !o.NoCMA || o.Transport != "tcp" ||
		o.Logger.Enabled(context.Background(), slog.LevelError) {
		t.Errorf("settings over the environment: %+v", o)
	}
	for _, st := range []Setting{
		{Var: "GOCOLL_TIMEOUT", Value: "-1s", Field: "config.timeout"},
		{Var: "GOCOLL_ALGO", Value: "allreduce=nope", Field: "config.algo"},
		{Var: "GOCOLL_DEBUG", Value: "loud", Field: "config.debug"},
		{Var: "GOCOLL_BRUCK_RADIX", Value: "1", Field: "config.bruckRadix"},
		{Var: "GOCOLL_RANK", Value: "1", Field: "config.rank"}, // not a communicator's setting
	} {
		_, err := OptionsFromSettings(getenv, st)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), st.Field) || strings.Contains(err.Error(), st.Var+"=") {
			t.Errorf("%+v: error %v, want ErrInvalidArgument naming %s", st, err, st.Field)
		}
	}
	// The environment's own bad value is still reported as the variable.
	env["GOCOLL_ALGO"] = "nope"
	if _, err := OptionsFromSettings(getenv); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "GOCOLL_ALGO") {
		t.Errorf("bad GOCOLL_ALGO: %v", err)
	}
	if _, err := OptionsFromSettings(getenv, Setting{Var: "GOCOLL_ALGO", Value: "hd", Field: "config.algo"}); err != nil {
		t.Errorf("a setting replaces a bad variable: %v", err)
	}
}

// TestTimeoutPerCommunicator: two communicators of one process with their
// own deadlines. The short one times out while rank 1 stays away; the long
// one, whose rank 0 has been waiting all that time too, still completes
// when rank 1 then joins.
func TestTimeoutPerCommunicator(t *testing.T) {
	short := newLocal(t, 2, Options{Timeout: 100 * time.Millisecond})
	long := newLocal(t, 2, Options{Timeout: 10 * time.Minute})
	in := [2][]byte{make([]byte, 4), make([]byte, 4)}
	putF32(in[0], 1)
	putF32(in[1], 2)
	req, err := long[0].IAllReduce(in[0], in[0], 1, Float32, Sum)
	if err != nil {
		t.Fatal(err)
	}
	err = short[0].AllReduce(make([]byte, 4), make([]byte, 4), 1, Float32, Sum)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("short communicator: %v, want ErrTimeout", err)
	}
	if err := long[1].AllReduce(in[1], in[1], 1, Float32, Sum); err != nil {
		t.Fatalf("long communicator, rank 1: %v", err)
	}
	if err := req.Wait(); err != nil {
		t.Fatalf("long communicator, rank 0: %v", err)
	}
	want := make([]byte, 4)
	putF32(want, 3)
	for r, b := range in {
		if !bytes.Equal(b, want) {
			t.Errorf("rank %d: % x, want 3.0", r, b)
		}
	}
}

// The largest Duration as the timeout means "never": the deadline
// saturates instead of wrapping into the past, on the transports' path
// (a context) and on the shared-memory collectives' (lightCtx).
func TestTimeoutNever(t *testing.T) {
	for name, comms := range map[string][]*Comm{
		"in-process":    newLocal(t, 2, Options{Timeout: math.MaxInt64}),
		"shared memory": newJoined(t, 2, Options{Timeout: math.MaxInt64, Transport: "auto"}),
	} {
		mustRanks(t, comms, func(c *Comm) error {
			b := make([]byte, 4<<10)
			if err := c.AllReduce(b, b, len(b)/4, Float32, Sum); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
}
