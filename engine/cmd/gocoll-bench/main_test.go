package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/proctest"
)

// The -procs test re-executes this test binary as the ranks; they carry
// childEnv and run the benchmark instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(proctest.RunInTempDir(m))
}

// bench runs gocoll-bench in this process and returns its exit status,
// standard output and standard error.
func bench(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	rc := benchMain(args, &out, &errOut)
	return rc, out.String(), errOut.String()
}

// results parses -json output, failing the test on anything else.
func results(t *testing.T, out string) []result {
	t.Helper()
	var rs []result
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("not a JSON result line: %q: %v", sc.Text(), err)
		}
		rs = append(rs, r)
	}
	return rs
}

// sane checks one result line of a checked run for nranks ranks whose
// nominal sizes are at most maxBytes.
func sane(t *testing.T, r result, nranks int, dt engine.DataType, iters int, maxBytes int64) {
	t.Helper()
	what := fmt.Sprintf("%s %s %d bytes", r.Op, r.Type, r.Bytes)
	switch {
	case r.Wrong != 0:
		t.Errorf("%s: %d wrong elements", what, r.Wrong)
	case r.Ranks != nranks || r.Type != dt.String() || r.Iters != iters:
		t.Errorf("%s: ranks %d type %s iters %d, want %d %s %d", what, r.Ranks, r.Type, r.Iters, nranks, dt, iters)
	case r.Bytes <= 0 || r.Bytes > maxBytes || int64(r.Count*dt.Size()) != r.Bytes:
		t.Errorf("%s: size %d / count %d inconsistent (max %d)", what, r.Bytes, r.Count, maxBytes)
	case !(r.P50us > 0) || r.P99us < r.P50us || r.MinUs > r.P50us || !(r.B2BUs > 0):
		t.Errorf("%s: times p50 %g p99 %g min %g b2b %g", what, r.P50us, r.P99us, r.MinUs, r.B2BUs)
	case !(r.AlgBW > 0) || r.BusBW < 0 || r.BusBW > r.AlgBW*2:
		t.Errorf("%s: algbw %g busbw %g", what, r.AlgBW, r.BusBW)
	}
	wantBus := r.AlgBW * busFactor(r.Op, nranks)
	if d := r.BusBW - wantBus; d > 1e-9*wantBus || d < -1e-9*wantBus {
		t.Errorf("%s: busbw %g, want algbw×factor %g", what, r.BusBW, wantBus)
	}
}

// TestReductionsChecked: every datatype × reduction op through allreduce,
// reduce (root = last rank) and reducescatter at 2, 3 and 4 goroutine ranks,
// sizes that are and are not multiples of the rank count; the pairs the
// kernels do not define are refused before anything runs.
func TestReductionsChecked(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		for _, dt := range kernel.AllDataTypes() {
			for _, op := range kernel.AllRedOps() {
				t.Run(fmt.Sprintf("np=%d/%s/%s", n, dt, op), func(t *testing.T) {
					rc, out, errOut := bench(t, "-np", strconv.Itoa(n), "-op", "allreduce,reduce,reducescatter",
						"-d", dt.String(), "-o", op.String(), "-root", strconv.Itoa(n-1),
						"-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "-c", "-json")
					if kernel.CheckOp(dt, op) != nil { // bitwise on floats, avg on bool: refused up front
						if rc != 2 || !strings.Contains(errOut, "is not defined on "+dt.String()) {
							t.Fatalf("exit %d, want 2 with the reason\n%s%s", rc, out, errOut)
						}
						return
					}
					if rc != 0 {
						t.Fatalf("exit %d\n%s%s", rc, out, errOut)
					}
					rs := results(t, out)
					seen := map[string]int{}
					for _, r := range rs {
						sane(t, r, n, dt, 2, 4096)
						if r.Redop != op.String() {
							t.Errorf("%s: redop %s, want %s", r.Op, r.Redop, op)
						}
						seen[r.Op]++
					}
					for _, o := range []string{"allreduce", "reduce", "reducescatter"} {
						if seen[o] < 2 {
							t.Errorf("%s: %d lines, want at least 2 sizes\n%s", o, seen[o], out)
						}
					}
				})
			}
		}
	}
}

// TestDataMovementChecked: broadcast (root 1), allgather, alltoall,
// alltoallv and sendrecv for a few datatypes at 2, 3, 4 goroutine ranks.
func TestDataMovementChecked(t *testing.T) {
	ops := []string{"broadcast", "allgather", "alltoall", "alltoallv", "sendrecv"}
	for _, n := range []int{2, 3, 4} {
		for _, dt := range []engine.DataType{engine.Float32, engine.Bfloat16, engine.Int8, engine.Float64, engine.Uint32} {
			t.Run(fmt.Sprintf("np=%d/%s", n, dt), func(t *testing.T) {
				rc, out, errOut := bench(t, "-np", strconv.Itoa(n), "-op", strings.Join(ops, ","), "-d", dt.String(),
					"-root", "1", "-b", "16", "-e", "64K", "-f", "16", "-n", "3", "-w", "1", "-c", "-json")
				if rc != 0 {
					t.Fatalf("exit %d\n%s%s", rc, out, errOut)
				}
				seen := map[string]int{}
				for _, r := range results(t, out) {
					sane(t, r, n, dt, 3, 64<<10)
					seen[r.Op]++
				}
				for _, o := range ops {
					if seen[o] < 3 {
						t.Errorf("%s: %d lines, want at least 3 sizes\n%s", o, seen[o], out)
					}
				}
			})
		}
	}
}

// TestAlgoOverrideAndTransports: forced algorithms, and goroutine ranks
// joined through the real rendezvous (shared memory, TCP).
func TestAlgoOverrideAndTransports(t *testing.T) {
	for _, c := range []struct{ n, algo, tr string }{
		{"4", "ring", ""}, {"4", "hd", ""}, {"4", "rd", ""}, {"3", "allreduce=ring,alltoall=bruck", ""}, {"5", "alltoall=aggregate", "tcp"},
		{"2", "", "auto"}, {"3", "", "tcp"},
	} {
		t.Run(c.n+"/"+c.algo+"/"+c.tr, func(t *testing.T) {
			args := []string{"-np", c.n, "-op", "allreduce,alltoall,allgather", "-b", "64", "-e", "256K", "-f", "64",
				"-n", "2", "-w", "0", "-c", "-json"}
			if c.algo != "" {
				args = append(args, "-algo", c.algo)
			}
			if c.tr != "" {
				args = append(args, "-transport", c.tr)
			}
			rc, out, errOut := bench(t, args...)
			if rc != 0 {
				t.Fatalf("exit %d\n%s%s", rc, out, errOut)
			}
			n, _ := strconv.Atoi(c.n)
			rs := results(t, out)
			if len(rs) != 9 {
				t.Errorf("%d result lines, want 9\n%s", len(rs), out)
			}
			for _, r := range rs {
				sane(t, r, n, engine.Float32, 2, 256<<10)
				if c.algo != "" && r.Algo != c.algo {
					t.Errorf("algo %q, want %q", r.Algo, c.algo)
				}
			}
		})
	}
}

// TestAggregateChecked: alltoall and alltoallv through aggregation, static
// and under the control tree (the bare name reaches both collectives), over
// TCP, with no wrong element.
func TestAggregateChecked(t *testing.T) {
	for _, algo := range []string{"aggregate", "aggregate-tree"} {
		t.Run(algo, func(t *testing.T) {
			rc, out, errOut := bench(t, "-np", "5", "-op", "alltoall,alltoallv", "-b", "8", "-e", "64K", "-f", "8",
				"-n", "2", "-w", "0", "-c", "-json", "-algo", algo, "-transport", "tcp")
			if rc != 0 {
				t.Fatalf("exit %d\n%s%s", rc, out, errOut)
			}
			seen := map[string]int{}
			for _, r := range results(t, out) {
				sane(t, r, 5, engine.Float32, 2, 64<<10)
				if r.Algo != algo {
					t.Errorf("algo %q, want %q", r.Algo, algo)
				}
				seen[r.Op]++
			}
			if seen["alltoall"] < 4 || seen["alltoallv"] < 3 {
				t.Errorf("lines per op: %v\n%s", seen, out)
			}
		})
	}
}

// TestProcs: two processes started by -procs (this test binary re-executed).
func TestProcs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	rc, out, errOut := bench(t, "-procs", "2", "-op", "all", "-d", "float16", "-o", "max",
		"-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "-c", "-json", "-launch-timeout", "2m")
	if rc != 0 {
		t.Fatalf("exit %d\n%s%s", rc, out, errOut)
	}
	rs := results(t, out)
	if len(rs) != 3*len(allOps) {
		t.Errorf("%d result lines, want %d\n%s", len(rs), 3*len(allOps), out)
	}
	for _, r := range rs {
		sane(t, r, 2, engine.Float16, 3, 64<<10)
		if !strings.Contains(r.Mode, "processes") {
			t.Errorf("mode %q", r.Mode)
		}
	}
}

// TestEnvLaunch: one rank of a launched (single-rank) job, through the
// launcher variables and engine.NewCommFromEnv.
func TestEnvLaunch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	t.Setenv("GOCOLL_RANK", "0")
	t.Setenv("GOCOLL_SIZE", "1")
	t.Setenv("GOCOLL_ROOT_ADDR", "127.0.0.1:"+strconv.Itoa(port))
	rc, out, errOut := bench(t, "-op", "allreduce,broadcast,alltoall", "-b", "4K", "-e", "4K", "-n", "2", "-w", "0", "-c", "-json")
	if rc != 0 {
		t.Fatalf("exit %d\n%s%s", rc, out, errOut)
	}
	rs := results(t, out)
	if len(rs) != 3 {
		t.Fatalf("%d lines, want 3\n%s", len(rs), out)
	}
	for _, r := range rs {
		if r.Ranks != 1 || r.Wrong != 0 || !strings.Contains(r.Mode, "launcher") {
			t.Errorf("%+v", r)
		}
	}
}

// TestBrokenExpectation: the checker must report wrong elements when the
// expectation is wrong (-break-check corrupts one expected element on every
// rank that checks), and the run must fail.
func TestBrokenExpectation(t *testing.T) {
	for _, dt := range []string{"float32", "bfloat16", "int8", "uint64"} {
		rc, out, errOut := bench(t, "-np", "3", "-op", "allreduce,reduce,alltoall", "-d", dt, "-b", "1K", "-e", "8K", "-f", "8",
			"-n", "1", "-w", "0", "-c", "-break-check", "-json")
		if rc != 1 {
			t.Errorf("%s: exit %d, want 1\n%s", dt, rc, errOut)
		}
		rs := results(t, out)
		if len(rs) != 6 {
			t.Fatalf("%d lines, want 6", len(rs))
		}
		for _, r := range rs {
			want := int64(3) // one per rank
			if r.Op == "reduce" {
				want = 1 // only the root checks
			}
			if r.Wrong != want {
				t.Errorf("%s %s %d bytes: %d wrong, want %d", dt, r.Op, r.Bytes, r.Wrong, want)
			}
		}
		if !strings.Contains(errOut, "expected") {
			t.Errorf("no mismatch report on stderr: %q", errOut)
		}
	}
	rc, out, _ := bench(t, "-np", "2", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "-c", "-break-check")
	if rc != 1 || !strings.Contains(out, "Out of bounds values : 2 FAILED") {
		t.Errorf("text output of a failed check (exit %d):\n%s", rc, out)
	}
}

// TestCheckerFindsCorruption exercises the checker on hand-made outputs.
func TestCheckerFindsCorruption(t *testing.T) {
	const n, cnt = 3, 100
	for _, dt := range kernel.AllDataTypes() {
		es := dt.Size()
		p := newPattern(dt, engine.Sum, false, n, 7)
		// a correct allgather output
		out := make([]byte, n*cnt*es)
		for r := 0; r < n; r++ {
			p.fill(out[r*cnt*es:], r, 0, cnt)
		}
		expect := func(i int, dst []byte) { p.put(dst, i/cnt, i%cnt) }
		k := &checker{dt: dt}
		if w := k.verify(out, n*cnt, expect); w != 0 {
			t.Fatalf("%s: %d wrong in a correct output", dt, w)
		}
		bad := bytes.Clone(out)
		bad[5*es] ^= 0x40
		if w := k.verify(bad, n*cnt, expect); w != 1 {
			t.Errorf("%s: one corrupted element: %d wrong", dt, w)
		}
		// blocks of ranks 0 and 1 swapped
		bad = bytes.Clone(out)
		copy(bad, out[cnt*es:2*cnt*es])
		copy(bad[cnt*es:], out[:cnt*es])
		if w := k.verify(bad, n*cnt, expect); w < cnt {
			t.Errorf("%s: swapped blocks: only %d wrong", dt, w)
		}
		// a reduction output computed for one rank too few (for bool an
		// xor, which the missing rank changes wherever it holds true; an or
		// of the others is mostly true already)
		op := engine.Sum
		if dt == engine.Bool {
			op = engine.Bxor
		}
		red := newPattern(dt, op, true, n, 9)
		short := newPattern(dt, op, true, n-1, 9)
		short.seeds = red.seeds[:n-1]
		got := make([]byte, cnt*es)
		for i := 0; i < cnt; i++ {
			short.putReduced(got[i*es:(i+1)*es], i)
		}
		if w := k.verify(got, cnt, func(i int, dst []byte) { red.putReduced(dst, i) }); w < cnt/2 {
			t.Errorf("%s: %v over %d of %d ranks: only %d wrong", dt, op, n-1, n, w)
		}
	}
}

// TestTextOutput: the nccl-tests-like table.
func TestTextOutput(t *testing.T) {
	rc, out, errOut := bench(t, "-np", "2", "-op", "allreduce,allgather", "-b", "4K", "-e", "16K", "-f", "4", "-n", "2", "-w", "0", "-c")
	if rc != 0 {
		t.Fatalf("exit %d\n%s%s", rc, out, errOut)
	}
	var data [][]string
	for _, l := range strings.Split(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		data = append(data, strings.Fields(l))
	}
	if len(data) != 4 {
		t.Fatalf("%d data lines, want 4:\n%s", len(data), out)
	}
	for _, f := range data {
		if len(f) != 12 || f[2] != "float32" || f[9] != "0" {
			t.Errorf("data line %q", f)
		}
	}
	for _, want := range []string{"size(B)", "p50(us)", "p99(us)", "busbw(GB/s)", "#wrong", "Out of bounds values : 0 OK", "Avg bus bandwidth"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if data[0][0] != "4096" || data[1][0] != "16384" || data[0][3] != "sum" || data[2][3] != "none" {
		t.Errorf("unexpected rows %q", data)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-op", "gather"}, {"-d", "float8"}, {"-o", "xor"}, {"-np", "2", "-algo", "nonsense"},
		{"-c", "1"}, {"-b", "1M", "-e", "4K"}, {"-np", "2", "-procs", "2"}, {"-np", "2", "-root", "5"},
		{"-np", "1", "-op", "sendrecv"},
	} {
		if rc, _, errOut := bench(t, append([]string{"-n", "1", "-w", "0", "-b", "64", "-e", "64"}, args...)...); rc != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, rc, errOut)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "4K": 4096, "64KiB": 64 << 10, "1M": 1 << 20, "1MB": 1 << 20, "2g": 2 << 30, "0.5K": 512} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "x", "-1", "1X"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

// TestTooFewDescriptors: 96 goroutine ranks over TCP in a process whose
// open-file limit is far below what they need end with an error naming
// the limit and the count, within the timeout, instead of hanging on
// connections that cannot be made.
func TestTooFewDescriptors(t *testing.T) {
	if testing.Short() {
		t.Skip("a child process of 96 ranks")
	}
	cmd := exec.Command("sh", "-c", `ulimit -n 256 && exec "$0" "$@"`, os.Args[0],
		"-np", "96", "-transport", "tcp", "-op", "allreduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")
	cmd.Env = append(os.Environ(), childEnv+"=1", "GOCOLL_TIMEOUT=10s")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() {
		out, err = cmd.CombinedOutput()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("no end after 2 minutes:\n%s", lastLines(string(out), 10))
	}
	if err == nil || !strings.Contains(string(out), "RLIMIT_NOFILE 256") {
		t.Fatalf("exit %v, want an error naming the open-file limit:\n%s", err, lastLines(string(out), 10))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
