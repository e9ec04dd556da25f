// Package cpptest tests the C++ data-parallel trainer in ../trainer.cpp,
// which links libgocoll: it builds the library and the trainer and checks
// that 4 ranks reach the weights 1 rank reaches on the whole batch. (The
// test lives in its own directory: Go refuses C++ files in a package
// directory that does not use cgo.)
package cpptest

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

// buildTrainer builds libgocoll and the trainer the way the Makefile does:
// flags from pkg-config.
func buildTrainer(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("pkg-config"); err != nil {
		t.Skip("pkg-config is not installed")
	}
	dir := t.TempDir()
	lib, err := harness.Build(filepath.Join(dir, "prefix"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("pkg-config", "--cflags", "--libs", "gocoll")
	cmd.Env = append(os.Environ(), "PKG_CONFIG_PATH="+lib.PkgConfigPath())
	flags, err := cmd.Output()
	if err != nil {
		t.Fatalf("pkg-config: %v", err)
	}
	exe := filepath.Join(dir, "trainer")
	args := []string{"-O2", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-o", exe, filepath.Join("..", "trainer.cpp")}
	args = append(args, strings.Fields(string(flags))...)
	args = append(args, "-Wl,-rpath,"+lib.LibDir())
	if out, err := exec.Command("g++", args...).CombinedOutput(); err != nil {
		t.Fatalf("g++ %v: %v\n%s", args, err, out)
	}
	return exe
}

// train runs n ranks of the trainer and returns every rank's final weights.
func train(t *testing.T, exe string, n int, args ...string) [][]float64 {
	t.Helper()
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	procs := harness.RunRanks(t, n, 90*time.Second, func(r int) []string {
		return harness.Env(harness.TorchrunEnv(r, n, port)...)
	}, exe, args...)
	if t.Failed() {
		t.FailNow()
	}
	weights := make([][]float64, n)
	for r, p := range procs {
		prefix := fmt.Sprintf("rank %d weights ", r)
		for _, line := range strings.Split(p.Stdout(), "\n") {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				for _, f := range strings.Fields(rest) {
					v, err := strconv.ParseFloat(f, 64)
					if err != nil {
						t.Fatalf("rank %d: bad weight %q", r, f)
					}
					weights[r] = append(weights[r], v)
				}
			}
		}
		if weights[r] == nil {
			t.Fatalf("rank %d printed no weights:\n%s", r, p.Output())
		}
	}
	if n > 0 {
		t.Logf("%d rank(s): %s", n, strings.TrimSpace(strings.SplitN(procs[0].Stdout(), "rank 0 weights", 2)[0]))
	}
	return weights
}

func TestDataParallelMatchesSingleRank(t *testing.T) {
	exe := buildTrainer(t)
	args := []string{"200", "4096", "16"}
	one := train(t, exe, 1, args...)[0]
	four := train(t, exe, 4, args...)
	for r, w := range four {
		if len(w) != len(one) {
			t.Fatalf("rank %d has %d weights, 1 rank has %d", r, len(w), len(one))
		}
		for j := range w {
			if w[j] != four[0][j] {
				t.Errorf("rank %d weight %d = %v differs from rank 0's %v: ranks must agree exactly", r, j, w[j], four[0][j])
			}
			if d := math.Abs(w[j] - one[j]); d > 1e-6*math.Max(math.Abs(one[j]), 1e-12) {
				t.Errorf("weight %d: 4 ranks %.17g, 1 rank %.17g (relative difference %.3g > 1e-6)", j, w[j], one[j], d/math.Abs(one[j]))
			}
		}
	}
	// The model learned something: the first true weight is +1.5.
	if one[0] < 0.5 {
		t.Errorf("weight 0 = %v after training, want clearly positive", one[0])
	}
	t.Logf("1 rank: %v", one)
}
