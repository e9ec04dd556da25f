package ctest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

// TestShrinkAfterKill: 4 C ranks allreduce, one is SIGKILLed; the
// survivors gocollCommShrink(comm, NULL, 0, &newcomm, NULL,
// GOCOLL_SHRINK_ABORT) to 3 ranks with correct sums, then admit a
// replacement process (gocollCommJoin / gocollCommGrow) and allreduce
// correctly as 4 again (elastic.c). Over shared memory and TCP.
func TestShrinkAfterKill(t *testing.T) {
	for _, tr := range []string{"auto", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			const victim = 1
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			port, err := harness.FreePortPair()
			if err != nil {
				t.Fatal(err)
			}
			joinfile := filepath.Join(t.TempDir(), "join")
			common := []string{"GOCOLL_TIMEOUT=10s", "GOCOLL_SECRET=ctest-elastic", "GOCOLL_TRANSPORT=" + tr,
				"GOCOLL_TEST_JOINFILE=" + joinfile, fmt.Sprintf("GOCOLL_TEST_VICTIM=%d", victim)}
			procs := make([]*harness.Proc, 4)
			for r := range procs {
				env := harness.Env(append(harness.TorchrunEnv(r, 4, port), common...)...)
				if procs[r], err = harness.Start(ctx, fmt.Sprintf("rank %d", r), env, nil, bin["elastic"], "shrink"); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range procs {
				if _, err := p.WaitLine(ctx, "READY"); err != nil {
					cancel()
					harness.WaitAll(t, procs)
					t.Fatal(err)
				}
			}
			if err := procs[victim].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			joiner, err := harness.Start(ctx, "joiner", harness.Env(common...), nil, bin["elastic"], "join")
			if err != nil {
				t.Fatal(err)
			}
			all := append(procs, joiner)
			failed := false
			for r, p := range all {
				err := p.Wait()
				if r == victim {
					continue
				}
				if err != nil || !strings.Contains(p.Stdout(), "SUMS OK") {
					t.Errorf("%s: %v", []string{"rank 0", "rank 1", "rank 2", "rank 3", "joiner"}[r], err)
					failed = true
				}
			}
			for r, p := range all {
				if failed || testing.Verbose() {
					t.Logf("%d:\n%s", r, p.Output())
				}
			}
		})
	}
}
