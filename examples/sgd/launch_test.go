package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/proctest"
)

var lastLine = regexp.MustCompile(`(?m)\Atest accuracy: 0\.\d{4}\z`)

func lastLineOf(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	return lines[len(lines)-1]
}

// The binary buildBinary makes (35 MB) and the flight dumps of the runs
// that fail on purpose go to a temp dir removed when the tests end.
func TestMain(m *testing.M) { os.Exit(proctest.RunInTempDir(m)) }

// buildBinary builds this program once per test run.
var buildBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sgd-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "sgd")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", &buildError{out: string(out), err: err}
	}
	return bin, nil
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

func sgdBinary(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build the binary")
	}
	bin, err := buildBinary()
	if err != nil {
		t.Fatalf("go build: %v", err)
	}
	return bin
}

func runBinary(t *testing.T, bin string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(os.Environ()), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not finish in 90s; output:\n%s", args, out.String())
		return "", nil
	}
}

// The multi-process path: the built binary re-executes itself as two rank
// processes that join over GOCOLL_* variables, checks itself, and reports.
func TestBinaryNP2(t *testing.T) {
	bin := sgdBinary(t)
	report := t.TempDir()
	out, err := runBinary(t, bin, nil, "-np", "2", "-synthetic", "-train-limit", "1600", "-test-limit", "400",
		"-hidden", "16", "-batch", "32", "-epochs", "1", "-check", "-report", report)
	if err != nil {
		t.Fatalf("sgd -np 2: %v\n%s", err, out)
	}
	t.Logf("output:\n%s", out)
	if l := lastLineOf(out); !lastLine.MatchString(l) {
		t.Fatalf("last line %q, want \"test accuracy: 0.xxxx\"", l)
	}
	if !strings.Contains(out, "check: all 2 ranks hold bitwise-identical parameters") {
		t.Fatalf("no -check verdict in the output")
	}
	md, err := os.ReadFile(filepath.Join(report, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 2 | processes |", "loss.svg", "### 2 ranks"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	for _, f := range []string{"loss.svg", "loss-time.svg", "results.json"} {
		if _, err := os.Stat(filepath.Join(report, f)); err != nil {
			t.Error(err)
		}
	}
}

// Virtual devices across real processes: 4 devices on 1 and 4 processes,
// and on 4 processes migrating to 2 mid-epoch; every step's loss and the
// final figures agree to the bit, and the report says where the migration
// happened.
func TestBinaryVirtualMigration(t *testing.T) {
	bin := sgdBinary(t)
	report := t.TempDir()
	out, err := runBinary(t, bin, nil, "-virtual", "4", "-migrate-at", "15", "-compare", "1,4,4:2", "-synthetic",
		"-train-limit", "1280", "-test-limit", "320", "-hidden", "16", "-batch", "32", "-epochs", "1", "-report", report)
	if err != nil {
		t.Fatalf("sgd -virtual: %v\n%s", err, out)
	}
	if !strings.Contains(out, "step 15: migrated 4 virtual devices from 4 to 2 processes") {
		t.Fatalf("no migration line:\n%s", out)
	}
	md, err := os.ReadFile(filepath.Join(report, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(md, []byte("40 of 40 step losses equal bit for bit")) != 2 || bytes.Contains(md, []byte("NOT identical")) ||
		!bytes.Contains(md, []byte("before step 15 (after 480 samples) the devices moved from 4 to 2 processes")) {
		t.Fatalf("report.md:\n%s", md)
	}
	svg, err := os.ReadFile(filepath.Join(report, "loss.svg"))
	if err != nil || !bytes.Contains(svg, []byte("migration 4→2")) {
		t.Fatalf("loss.svg lacks the migration marker (%v)", err)
	}
}

// A rank that fails makes the parent fail, promptly.
func TestBinaryNPFailure(t *testing.T) {
	bin := sgdBinary(t)
	start := time.Now()
	out, err := runBinary(t, bin, nil, "-np", "2", "-synthetic", "-train-limit", "64", "-batch", "33", "-report=")
	if err == nil {
		t.Fatalf("batch 33 over 2 ranks succeeded:\n%s", out)
	}
	if !strings.Contains(out, "does not split evenly over 2 ranks") || !strings.Contains(out, "[rank 1]") {
		t.Fatalf("output does not explain the failure per rank:\n%s", out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("failure took %v", d)
	}
}

func TestBinaryMissingDataset(t *testing.T) {
	bin := sgdBinary(t)
	out, err := runBinary(t, bin, nil, "-np", "2", "-data", t.TempDir())
	if err == nil || !strings.Contains(out, "apt-get install -y dataset-fashion-mnist") {
		t.Fatalf("err %v, output:\n%s", err, out)
	}
}

// The in-process paths of run: -compare over goroutine ranks with a report.
func TestRunCompareGoroutines(t *testing.T) {
	report := t.TempDir()
	var out bytes.Buffer
	err := run([]string{"-compare", "1,2", "-goroutines", "-synthetic", "-train-limit", "640", "-test-limit", "160",
		"-hidden", "8", "-batch", "32", "-epochs", "1", "-report", report}, &out, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if l := lastLineOf(out.String()); !lastLine.MatchString(l) {
		t.Fatalf("last line %q", l)
	}
	md, err := os.ReadFile(filepath.Join(report, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(md, []byte("| 1 | goroutines |")) || !bytes.Contains(md, []byte("| 2 | goroutines |")) ||
		!bytes.Contains(md, []byte("2 ranks: the global-batch loss of each of 20 steps differs")) {
		t.Fatalf("report.md:\n%s", md)
	}
}

// TestCleanEnv: the children of -np see no launcher variable of the job
// the parent runs in (which launcher a process belongs to is
// bootstrap.Launcher's, tested there).
func TestCleanEnv(t *testing.T) {
	env := cleanEnv([]string{"PATH=/bin", "RANK=1", "GOCOLL_RANK=2", "GOCOLL_ALGO=ring", "OMPI_COMM_WORLD_RANK=0", "SLURM_STEP_ID=3"})
	if strings.Join(env, " ") != "PATH=/bin GOCOLL_ALGO=ring" {
		t.Errorf("cleanEnv kept %v", env)
	}
}

func TestPrefixWriter(t *testing.T) {
	var b bytes.Buffer
	w := &prefixWriter{mu: &sync.Mutex{}, w: &b, prefix: "[rank 1] "}
	w.Write([]byte("a\nb"))
	w.Write([]byte("c\n\nd"))
	w.Flush()
	if got, want := b.String(), "[rank 1] a\n[rank 1] bc\n[rank 1] \n[rank 1] d\n"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
