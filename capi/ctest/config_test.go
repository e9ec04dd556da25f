package ctest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

// TestTypesAndBitwiseOps runs c/types.c: int16, bool and the bitwise ops
// through every reducing collective against C arithmetic, and the refused
// pairs; over shared memory at 3 ranks and over TCP with the ring at 2.
func TestTypesAndBitwiseOps(t *testing.T) {
	for _, c := range []struct {
		n   int
		env []string
	}{
		{3, nil},
		{2, []string{"GOCOLL_TRANSPORT=tcp", "GOCOLL_ALGO=allreduce=ring,reducescatter=ring,reduce=tree"}},
	} {
		t.Run(fmt.Sprintf("n=%d%v", c.n, c.env), func(t *testing.T) {
			port, err := harness.FreePortPair()
			if err != nil {
				t.Fatal(err)
			}
			procs := harness.RunRanks(t, c.n, 90*time.Second, func(r int) []string {
				return harness.Env(append(harness.TorchrunEnv(r, c.n, port), c.env...)...)
			}, bin["types"], "env")
			var all strings.Builder
			for _, p := range procs {
				all.WriteString(p.Stdout())
			}
			checkOK(t, all.String(), c.n)
		})
	}
}

// TestConfig runs c/config.c on 2 ranks: a bad gocollConfig_t is refused
// naming what is wrong, and two communicators of one process keep their own
// timeouts (the 300 ms one times out, the 10-minute one, waiting through
// it, completes), algorithm and dump directory. GOCOLL_TIMEOUT=30s stays in
// the environment: were the configs ignored, both would share it.
func TestConfig(t *testing.T) {
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // B's dumpDir (the file names carry the rank)
	procs := harness.RunRanks(t, 2, 90*time.Second, func(r int) []string {
		return harness.Env(harness.TorchrunEnv(r, 2, port)...)
	}, bin["config"], "env", dir)
	var all strings.Builder
	for _, p := range procs {
		all.WriteString(p.Stdout())
	}
	checkOK(t, all.String(), 2)
}
