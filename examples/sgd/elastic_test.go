package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	hashLine = regexp.MustCompile(`(?m)^weights sha256 ([0-9a-f]{64})$`)
	pidLine  = regexp.MustCompile(`^sgd: rank (\d+) is pid (\d+)$`)
	stepLine = regexp.MustCompile(`^(?:\[rank \d+\] )?step (\d+) loss`)
)

// elasticArgs is a short synthetic run of 8 virtual devices.
var elasticArgs = []string{"-virtual", "8", "-synthetic", "-train-limit", "4096", "-test-limit", "512", "-hidden", "64",
	"-epochs", "3", "-report=", "-log-every", "1"}

// runKilling runs the launcher with args and SIGKILLs rank victim's
// process (from outside, by its pid) once rank 0 logged step killAt
// (victim < 0: no kill). It returns the output and the exit error.
func runKilling(t *testing.T, bin string, victim, killAt int, args ...string) (string, error) {
	var kills []kill
	if victim >= 0 {
		kills = []kill{{victim, killAt, 0}}
	}
	return runKills(t, bin, kills, args...)
}

// kill is a rank to SIGKILL once rank 0 logged step at, after waiting
// delay (from the kill before, or from that step's line).
type kill struct {
	rank, at int
	delay    time.Duration
}

// runKills is runKilling with several kills, in order.
func runKills(t *testing.T, bin string, kills []kill, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = cleanEnv(os.Environ())
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { err := cmd.Wait(); pw.Close(); done <- err }()
	var out strings.Builder
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		pids := map[int]int{}
		next := 0
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			out.WriteString(line + "\n")
			if m := pidLine.FindStringSubmatch(line); m != nil {
				r, _ := strconv.Atoi(m[1])
				pids[r], _ = strconv.Atoi(m[2])
			}
			m := stepLine.FindStringSubmatch(line)
			for m != nil && next < len(kills) {
				k := kills[next]
				if s, _ := strconv.Atoi(m[1]); s < k.at || pids[k.rank] == 0 {
					break
				}
				time.Sleep(k.delay)
				syscall.Kill(pids[k.rank], syscall.SIGKILL) // a child of the launcher, by its pid
				next++
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case err := <-done:
		<-scanned
		return out.String(), err
	case <-time.After(120 * time.Second):
		cmd.Process.Kill()
		<-done
		<-scanned
		t.Fatalf("%v did not finish in 120s; output:\n%s", args, out.String())
		return "", nil
	}
}

// uninterrupted runs the training on np processes without a kill and
// returns its weights hash.
func uninterrupted(t *testing.T, bin string, np int, args ...string) string {
	t.Helper()
	out, err := runKilling(t, bin, -1, 0, append([]string{"-np", strconv.Itoa(np)}, args...)...)
	want := hashLine.FindStringSubmatch(out)
	if err != nil || want == nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, out)
	}
	return want[1]
}

// sameHash fails the test unless the run (what) exited 0 with the weights
// hash want.
func sameHash(t *testing.T, what, out string, err error, want string) {
	t.Helper()
	got := hashLine.FindStringSubmatch(out)
	if err != nil || got == nil || got[1] != want {
		t.Fatalf("%s: %v, hash %v, want %s\n%s", what, err, got, want, out)
	}
}

// TestElasticKill: SIGKILL one rank process of -np 4 -virtual 8 -elastic
// (rank 2 early, rank 0 in the middle, rank 3 near the end); the job exits
// 0 and prints the weights hash of the uninterrupted run.
func TestElasticKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the training several times")
	}
	bin := sgdBinary(t)
	want := uninterrupted(t, bin, 2, elasticArgs...)
	for _, tc := range []struct{ victim, at int }{{2, 3}, {0, 40}, {3, 85}} {
		out, err := runKilling(t, bin, tc.victim, tc.at, append([]string{"-np", "4", "-elastic"}, elasticArgs...)...)
		sameHash(t, fmt.Sprintf("rank %d killed at step %d", tc.victim, tc.at), out, err, want)
		if !strings.Contains(out, "rank "+strconv.Itoa(tc.victim)+" died") || !strings.Contains(out, "lost rank(s)") {
			t.Fatalf("rank %d killed at step %d: no death or recovery reported\n%s", tc.victim, tc.at, out)
		}
		if last := lastLineOf(out); !lastLine.MatchString(last) {
			t.Fatalf("last line %q", last)
		}
		t.Logf("rank %d killed at step %d: %s", tc.victim, tc.at, regexp.MustCompile(`(?m)^.*lost rank\(s\).*$`).FindString(out))
	}
}

// TestElasticRespawn: with -respawn the launcher starts a replacement for
// the killed rank, which joins at a step boundary and receives devices:
// 4 processes at the end, the hash of the uninterrupted run.
func TestElasticRespawn(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the training twice")
	}
	bin := sgdBinary(t)
	args := slices.Clone(elasticArgs)
	args[slices.Index(args, "-epochs")+1] = "5" // room for the replacement to start and join
	want := uninterrupted(t, bin, 1, args...)
	out, err := runKilling(t, bin, 1, 3, append([]string{"-np", "4", "-elastic", "-respawn"}, args...)...)
	sameHash(t, "rank 1 killed, respawned", out, err, want)
	if !strings.Contains(out, "admitted 1 joining process(es); 4 processes go on") ||
		!regexp.MustCompile(`(?m)^epoch 5/5  8 virtual devices on 4 processes`).MatchString(out) {
		t.Fatalf("the replacement was not admitted, or the job did not end on 4 processes\n%s", out)
	}
}

// TestElasticDoubleKill: a second rank is SIGKILLed while the survivors
// of the first recover (the shrink then connects without it, or runs a
// second round): the two left finish with the uninterrupted run's hash.
func TestElasticDoubleKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the training twice")
	}
	bin := sgdBinary(t)
	want := uninterrupted(t, bin, 1, elasticArgs...)
	for _, delay := range []time.Duration{20 * time.Millisecond, 60 * time.Millisecond} {
		out, err := runKills(t, bin, []kill{{3, 10, 0}, {1, 10, delay}}, append([]string{"-np", "4", "-elastic"}, elasticArgs...)...)
		sameHash(t, fmt.Sprintf("ranks 3 and 1 killed %v apart", delay), out, err, want)
		if !regexp.MustCompile(`(?m)^epoch 3/3  8 virtual devices on 2 processes`).MatchString(out) {
			t.Fatalf("the job did not end on 2 processes\n%s", out)
		}
	}
}

// TestElasticKillDuringMigration: with -migrate-at 40 -migrate-to 2, rank
// 1 (which keeps devices) is SIGKILLed as the migration starts; the
// survivors recover, migrate again onto 2 processes and end with the
// hash of the uninterrupted run.
func TestElasticKillDuringMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the training twice")
	}
	bin := sgdBinary(t)
	want := uninterrupted(t, bin, 1, elasticArgs...)
	out, err := runKilling(t, bin, 1, 40, append([]string{"-np", "4", "-elastic", "-migrate-at", "40", "-migrate-to", "2"}, elasticArgs...)...)
	sameHash(t, "rank 1 killed at the migration", out, err, want)
	if !strings.Contains(out, "rank 1 died") || !regexp.MustCompile(`(?m)migrated 8 virtual devices from \d to 2 processes`).MatchString(out) {
		t.Fatalf("no death or no migration reported\n%s", out)
	}
	t.Log(regexp.MustCompile(`(?m)^.*(lost rank\(s\)|migrated).*$`).FindAllString(out, -1))
}
