package engine

import (
	"context"
	"errors"
	"log/slog"
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
