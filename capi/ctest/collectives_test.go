package ctest

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/capi/ctest/harness"
)

const nranks = 4

// checkOK verifies that every rank printed its "OK rank r of n" line.
func checkOK(t *testing.T, out string, n int) {
	t.Helper()
	for r := 0; r < n; r++ {
		if !strings.Contains(out, fmt.Sprintf("OK rank %d of %d", r, n)) {
			t.Errorf("rank %d did not report OK", r)
		}
	}
}

// TestCollectivesTorchrunEnv starts 4 ranks with the variables torchrun
// sets, as torchrun --nproc_per_node 4 --no_python would.
func TestCollectivesTorchrunEnv(t *testing.T) {
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	procs := harness.RunRanks(t, nranks, 90*time.Second, func(r int) []string {
		return harness.Env(harness.TorchrunEnv(r, nranks, port)...)
	}, bin["collectives"], "env")
	var all strings.Builder
	for _, p := range procs {
		all.WriteString(p.Stdout())
	}
	checkOK(t, all.String(), nranks)
}

// TestCollectivesMPI starts 4 ranks with Open MPI's mpirun; gocoll finds
// rank, size and a rendezvous port from OMPI_* variables alone.
func TestCollectivesMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun not found: install Open MPI (apt-get install openmpi-bin) to run this test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpirun, "--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(nranks),
		"-x", "GODEBUG", "-x", "GOCOLL_TIMEOUT", bin["collectives"], "env")
	cmd.Env = harness.Env("OMPI_MCA_btl_vader_single_copy_mechanism=none", "OMPI_MCA_rmaps_base_oversubscribe=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	if err != nil || testing.Verbose() {
		t.Logf("mpirun output:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("mpirun: %v", err)
	}
	checkOK(t, out.String(), nranks)
}

// TestCollectivesUniqueID joins through gocollGetUniqueId on rank 0: the
// test reads the id rank 0 prints and writes it to the other ranks' stdin.
// It also forces TCP between the ranks, the ring algorithms and the
// aggregated all-to-alls (alltoallw under the control tree), so the same
// checks run over the other transport and algorithms.
func TestCollectivesUniqueID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	env := harness.Env("GOCOLL_TRANSPORT=tcp", "GOCOLL_ALGO=allreduce=ring,reducescatter=ring,alltoall=bruck,alltoallv=aggregate,alltoallw=aggregate-tree")
	root, err := harness.Start(ctx, "rank 0", env, nil, bin["collectives"], "uid", "0", strconv.Itoa(nranks))
	if err != nil {
		t.Fatal(err)
	}
	procs := []*harness.Proc{root}
	line, err := root.WaitLine(ctx, "UID ")
	if err != nil {
		cancel()
		harness.WaitAll(t, procs)
		t.Fatal(err)
	}
	if len(line) != 4+2*128 {
		t.Errorf("unique id line has %d characters, want %d", len(line), 4+2*128)
	}
	for r := 1; r < nranks; r++ {
		p, err := harness.Start(ctx, fmt.Sprintf("rank %d", r), env, strings.NewReader(line+"\n"),
			bin["collectives"], "uid", strconv.Itoa(r), strconv.Itoa(nranks))
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	harness.WaitAll(t, procs)
	var all strings.Builder
	for _, p := range procs {
		all.WriteString(p.Stdout())
	}
	checkOK(t, all.String(), nranks)
}

// TestBadInput runs the bad-input table on one rank.
func TestBadInput(t *testing.T) {
	procs := harness.RunRanks(t, 1, 60*time.Second, func(int) []string { return harness.Env() }, bin["badinput"])
	if !strings.Contains(procs[0].Stdout(), "OK badinput") {
		t.Errorf("badinput did not finish:\n%s", procs[0].Output())
	}
}

// TestInitFromEnvAfterSetenv: the launcher variables are set with setenv()
// after the library (and its Go runtime, which copies the environment at
// load time) was loaded, as Python code does with os.environ before init.
func TestInitFromEnvAfterSetenv(t *testing.T) {
	const n = 2
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var procs []*harness.Proc
	for r := range n {
		p, err := harness.Start(ctx, fmt.Sprintf("rank %d", r), harness.Env(), nil, bin["collectives"],
			"setenv", strconv.Itoa(r), strconv.Itoa(n), strconv.Itoa(port))
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	harness.WaitAll(t, procs)
	var all strings.Builder
	for _, p := range procs {
		all.WriteString(p.Stdout())
	}
	checkOK(t, all.String(), n)
}

// TestRedistribute runs plans from gocoll.h across processes: the
// block-cyclic case with an affine loop and two 2-D resource maps.
func TestRedistribute(t *testing.T) {
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	procs := harness.RunRanks(t, 3, 90*time.Second, func(r int) []string {
		return harness.Env(harness.TorchrunEnv(r, 3, port)...)
	}, bin["redist"], "env")
	var all strings.Builder
	for _, p := range procs {
		all.WriteString(p.Stdout())
	}
	checkOK(t, all.String(), 3)
}

// TestVirtualDevices runs virtual communicators from gocoll.h across 4
// processes: collectives bitwise equal to the fold in device order, the
// routing tables, and a migration onto 2 of the processes.
func TestVirtualDevices(t *testing.T) {
	port, err := harness.FreePortPair()
	if err != nil {
		t.Fatal(err)
	}
	procs := harness.RunRanks(t, 4, 90*time.Second, func(r int) []string {
		return harness.Env(harness.TorchrunEnv(r, 4, port)...)
	}, bin["vcomm"], "env")
	var all strings.Builder
	for _, p := range procs {
		all.WriteString(p.Stdout())
	}
	checkOK(t, all.String(), 4)
}
