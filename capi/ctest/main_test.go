// Package ctest tests libgocoll from C: TestMain builds the library with
// build/build.sh into a temporary prefix and compiles the programs in c/
// against its installed header; the tests run them as separate processes
// (one per rank), under torchrun-style variables, under mpirun, and with a
// unique id passed between processes.
package ctest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

var (
	lib *harness.Lib
	bin = map[string]string{} // program name → executable
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "gocoll-ctest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	// The ranks' flight-recorder dumps (gocollCommDumpState, failures in
	// the fault tests) go to their temp dir: keep them inside this run's
	// directory (harness.Env drops GOCOLL_ variables, not TMPDIR).
	os.Setenv("TMPDIR", tmp)
	if lib, err = harness.Build(filepath.Join(tmp, "prefix")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, name := range []string{"collectives", "badinput", "faults", "redist", "vcomm", "types", "config", "hygiene", "elastic"} {
		out := filepath.Join(tmp, name)
		if err := lib.Compile("gcc", out, []string{filepath.Join("c", name+".c")}, "-std=gnu11"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		bin[name] = out
	}
	return m.Run()
}
