package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// both the shared-memory collectives (Call.Locked) and the transports (the
// context mark) not to yield to goroutines.
func TestLockedCallersReachWaits(t *testing.T) {
	for _, locked := range []bool{false, true} {
		x := &execCtx{c: &Comm{abortCtx: context.Background()}, locked: locked, deadline: time.Now().Add(time.Minute)}
		if x.call().Locked != locked || shmsync.IsLocked(x.context()) != locked {
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
