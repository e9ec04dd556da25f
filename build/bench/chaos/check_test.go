package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A run's log as the harness writes it, from lines "src|text" (times
// count up by 10 ms).
func runLog(t *testing.T, lines ...string) *Record {
	t.Helper()
	var b strings.Builder
	for i, l := range lines {
		src, text, ok := strings.Cut(l, "|")
		if !ok {
			t.Fatalf("line %q: want src|text", l)
		}
		fmt.Fprintf(&b, "%9.3f [%s] %s\n", float64(i)*0.01, src, text)
	}
	path := filepath.Join(t.TempDir(), "run.log")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	rec, err := recordFromLog(path)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// slogLine is a line of the engine's log at INFO.
func slogLine(pid, rank, nranks int, comm, msg, extra string) string {
	if strings.Contains(msg, " ") {
		msg = `"` + msg + `"`
	}
	return fmt.Sprintf("time=2026-12-02T01:37:02.779Z level=INFO msg=%s host=vm pid=%d rank=%d nranks=%d comm=%s %s", msg, pid, rank, nranks, comm, extra)
}

const hashA = "ad2136cd999e6f5a062bb605d52ee1f2125c762423fcec4543c5e1fc4322ec96"

// sgdRun is an sgd -np 4 run in which rank 3 is killed and the three
// others shrink (shrunk gives each survivor's outcome) and end on comm
// "c1"; then the launcher prints hash and exits with exit.
func sgdRun(shrunk [3]string, hash, exit string, extra ...string) []string {
	ls := []string{
		"harness|chaos: run seed=7 workload=sgd transport=auto scenario=kill timeout=5s want=" + hashA,
		"launcher|sgd: rank 0 is pid 100", "launcher|sgd: rank 1 is pid 101",
		"launcher|sgd: rank 2 is pid 102", "launcher|sgd: rank 3 is pid 103",
	}
	for r := range 4 {
		ls = append(ls, fmt.Sprintf("launcher|[rank %d] ", r)+slogLine(100+r, r, 4, "c0", "algorithm chosen", "op=allreduce algo=virtual-shm bytes=19296"))
	}
	ls = append(ls, "harness|chaos: fault 1 (kill member#3 at step 97 +15ms): SIGKILL rank 3 (pid 103, rank 3 now)",
		"launcher|sgd: rank 3 died or was left out (signal: killed); the job goes on without it")
	for r := range 3 {
		ls = append(ls, fmt.Sprintf("launcher|[rank %d] ", r)+slogLine(100+r, r, 4, "c0", "shrunk", shrunk[r]))
	}
	for r := range 3 {
		ls = append(ls, fmt.Sprintf("launcher|[rank %d] ", r)+slogLine(100+r, r, 3, "c1", "algorithm chosen", "op=allgather algo=shm bytes=64"))
	}
	ls = append(ls, extra...)
	if hash != "" {
		ls = append(ls, "launcher|weights sha256 "+hash)
	}
	return append(ls, "launcher|chaos: launcher exited: "+exit, "harness|chaos: the job had a /dev/shm of its own", "harness|chaos: ended after 4.2s")
}

func agreed(n int) [3]string {
	var s [3]string
	for r := range 3 {
		s[r] = fmt.Sprintf("new_rank=%d new_size=3 left_out=[3] attempts=1", r)
	}
	_ = n
	return s
}

func invariants(vs []Violation) string {
	var names []string
	for _, v := range vs {
		names = append(names, v.Invariant)
	}
	return strings.Join(dedup(names), ", ")
}

func TestCheck(t *testing.T) {
	split := agreed(3)
	split[0] = `new_rank=0 new_size=1 left_out="[1 2 3]" attempts=1`
	for _, tc := range []struct {
		name  string
		lines []string
		want  string // the invariants broken, in check's order
		what  string // and a piece of the first one's description
	}{
		{"a clean recovery", sgdRun(agreed(3), hashA, "0"), "", ""},
		{"other weights", sgdRun(agreed(3), strings.Repeat("0", 64), "0"), InvHash, "weights 0000000000000000"},
		{"no weights", sgdRun(agreed(3), "", "exit status 1", "launcher|sgd: -np 4: rank 3: signal: killed"), InvHash + ", " + InvExit, "did not finish"},
		{"survivors of one communicator split", sgdRun(split, hashA, "0"), InvOneView + ", " + InvHealthy, "split: 1 rank(s) went on as 1 ranks leaving out [1 2 3]; 2 rank(s) went on as 3 ranks leaving out [3]"},
		{"a healthy rank failed", sgdRun(agreed(3), hashA, "exit status 1", "launcher|sgd: -np 4: rank 2: exit status 1"), InvHealthy + ", " + InvExit, "rank 2 (pid 102, exit: exit status 1)"},
		{"a replacement that gave up", sgdRun(agreed(3), hashA, "0", "launcher|sgd: replacement 0 for rank 3 is pid 104",
			"launcher|sgd: replacement 0 failed (exit status 1); the job goes on without it"), InvHealthy, "new 0 (pid 104, exit: exit status 1)"},
		{"a replacement not admitted before the end", sgdRun(agreed(3), hashA, "0", "launcher|sgd: replacement 0 for rank 3 is pid 104",
			"launcher|sgd: replacement 0 failed (signal: killed); the job goes on without it"), "", ""},
		{"a hang", append(sgdRun(agreed(3), "", "signal: killed"), "harness|chaos: the job did not end within 1m0s: dumping stacks and killing it"), InvBounded, "still running after 1m0s"},
		{"leftovers", append(sgdRun(agreed(3), hashA, "0"), "harness|chaos: left in /dev/shm: /x/shm/gocoll-1 (4096 bytes)", "harness|chaos: left behind: pid 104 (state S): sgd"),
			InvLeftover + ", " + InvShm, "1 process(es)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := check(runLog(t, tc.lines...))
			if got := invariants(vs); got != tc.want {
				t.Fatalf("violated %q, want %q: %+v", got, tc.want, vs)
			}
			if tc.what != "" && !strings.Contains(vs[0].What, tc.what) {
				t.Errorf("first violation %q, want it to say %q", vs[0].What, tc.what)
			}
			if tc.want != "" && vs[0].Invariant != InvHash && len(vs[0].Evidence) == 0 {
				t.Errorf("%s: no evidence", vs[0].Invariant)
			}
		})
	}
}

// cRun is a C client run of 4 ranks: the harness pauses rank 0 for
// pause, and the three others shrink; then each rank prints its DONE
// line (dones[r], "" for none) and exits (exits[r]).
func cRun(pause string, dones, exits [4]string) []string {
	ls := []string{"harness|chaos: run seed=2 workload=c transport=tcp scenario=stop-past-timeout timeout=5s want="}
	for r := range 4 {
		ls = append(ls, fmt.Sprintf("launcher|chaos: rank %d is pid %d", r, 200+r))
	}
	for r := range 4 {
		ls = append(ls, fmt.Sprintf("rank %d|VIEW gen=0 size=4 rank=%d pids=200,201,202,203", r, r))
	}
	ls = append(ls, "harness|chaos: fault 1 (stop coordinator at step 45 +11ms for "+pause+"): SIGSTOP rank 0 (pid 200, rank 0 now) for "+pause)
	for r := range 4 {
		if dones[r] != "" {
			ls = append(ls, fmt.Sprintf("rank %d|%s", r, dones[r]))
		}
	}
	for r := range 4 {
		ls = append(ls, fmt.Sprintf("launcher|chaos: rank %d (pid %d) exited: %s", r, 200+r, exits[r]))
	}
	return append(ls, "harness|chaos: ended after 9s")
}

func TestCheckViews(t *testing.T) {
	three := "DONE gen=2 size=3 rank=%d pids=201,202,203"
	for _, tc := range []struct {
		name         string
		pause        string
		dones, exits [4]string
		want, what   string
	}{
		{"paused past the timeout and excluded", "9.9s",
			[4]string{"", fmt.Sprintf(three, 0), fmt.Sprintf(three, 1), fmt.Sprintf(three, 2)},
			[4]string{"exit status 4", "0", "0", "0"}, "", ""},
		{"a zombie that goes on alone", "9.9s",
			[4]string{"DONE gen=2 size=1 rank=0 pids=200", fmt.Sprintf(three, 0), fmt.Sprintf(three, 1), fmt.Sprintf(three, 2)},
			[4]string{"0", "0", "0", "0"}, InvOneView, "2 live views at the end"},
		{"a short pause excluded", "900ms",
			[4]string{"", fmt.Sprintf(three, 0), fmt.Sprintf(three, 1), fmt.Sprintf(three, 2)},
			[4]string{"exit status 4", "0", "0", "0"}, InvHealthy, "rank 0 (pid 200, exit: exit status 4)"},
		{"a split after a grow", "900ms",
			[4]string{"DONE gen=2 size=3 rank=0 pids=200,202,203", "DONE gen=2 size=1 rank=0 pids=201",
				"DONE gen=2 size=3 rank=1 pids=200,202,203", "DONE gen=2 size=3 rank=2 pids=200,202,203"},
			[4]string{"0", "0", "0", "0"}, InvOneView, "pids [201] ended in a view of size 1: pids [201]; pids [200 202 203] ended in a view of size 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := check(runLog(t, cRun(tc.pause, tc.dones, tc.exits)...))
			if got := invariants(vs); got != tc.want {
				t.Fatalf("violated %q, want %q: %+v", got, tc.want, vs)
			}
			if tc.what != "" && !strings.Contains(vs[0].What, tc.what) {
				t.Errorf("first violation %q, want it to say %q", vs[0].What, tc.what)
			}
		})
	}
}

// A coordinator paused past the timeout after a kill: the others go on
// without it, and it learns it was left out and exits 3, which sgd's
// launcher reports as a rank gone ("died or was left out"): one view (a
// run of the harness once counted it as a second one).
func TestCheckPausedCoordinatorLeftOut(t *testing.T) {
	ls := sgdRun([3]string{}, "", "")[:9] // the run line, the pids, c0
	ls = append(ls, "harness|chaos: fault 1 (kill non-coordinator#3 at step 97 +2ms): SIGKILL rank 3 (pid 103, rank 3 now)",
		"launcher|sgd: rank 3 died or was left out (signal: killed); the job goes on without it",
		"harness|chaos: fault 2 (stop coordinator on failed +8ms for 11.1s): SIGSTOP rank 0 (pid 100, rank 0 now) for 11.1s")
	for r := 1; r < 3; r++ {
		ls = append(ls, fmt.Sprintf("launcher|[rank %d] ", r)+slogLine(100+r, r, 4, "c0", "shrunk", fmt.Sprintf("new_rank=%d new_size=2 left_out=\"[0 3]\" attempts=1", r-1)))
	}
	for r := 1; r < 3; r++ {
		ls = append(ls, fmt.Sprintf("launcher|[rank %d] ", r)+slogLine(100+r, r-1, 2, "c1", "algorithm chosen", "op=allreduce algo=virtual-shm bytes=19296"))
	}
	ls = append(ls, "launcher|[rank 0] sgd: rank 0: shrinking after step 97: gocoll: shrink on rank 0: excluded by the surviving members (suspected of having failed)",
		"launcher|sgd: rank 0 died or was left out (exit status 3); the job goes on without it",
		"launcher|weights sha256 "+hashA, "launcher|chaos: launcher exited: 0", "harness|chaos: ended after 13.3s")
	if vs := check(runLog(t, ls...)); len(vs) > 0 {
		t.Fatalf("violations: %+v", vs)
	}
}

// The split brain, as the engine logged it in a run of this
// harness: the paused coordinator's shrink leaves everyone else out.
func TestCheckRealShrinkSplit(t *testing.T) {
	rec := runLog(t,
		"harness|chaos: run seed=12 workload=sgd transport=auto scenario=stop-past-timeout timeout=5s want="+hashA,
		"launcher|sgd: rank 0 is pid 15188", "launcher|sgd: rank 1 is pid 15190",
		`launcher|[rank 1] time=2026-12-02T01:37:02.779Z level=INFO msg=shrunk host=vm pid=15190 rank=1 nranks=8 comm=396d4fff07fb1670 new_rank=0 new_size=7 left_out=[0] attempts=1 agreed_ms=5005.173 total_ms=5423.15`,
		`launcher|[rank 0] time=2026-12-02T01:37:04.991Z level=INFO msg=shrunk host=vm pid=15188 rank=0 nranks=8 comm=396d4fff07fb1670 new_rank=0 new_size=1 left_out="[1 2 3 4 5 6 7]" attempts=1 agreed_ms=16.509 total_ms=17.312`,
	)
	vs := checkShrinks(rec)
	if len(vs) != 1 || !strings.Contains(vs[0].What, "1 rank(s) went on as 1 ranks leaving out [1 2 3 4 5 6 7]") || len(vs[0].Evidence) != 2 {
		t.Fatalf("got %+v", vs)
	}
}

func TestFields(t *testing.T) {
	f := fields(`[rank 0] time=2026-12-02T01:37:04.991Z level=WARN msg="communicator failed" host=vm pid=15188 rank=0 nranks=8 comm=39 err="gocoll: \"x\" y" left_out="[1 2]" rank=9`)
	want := map[string]string{"msg": "communicator failed", "pid": "15188", "rank": "0", "err": `gocoll: "x" y`, "left_out": "[1 2]", "comm": "39"}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("%s=%q, want %q", k, f[k], v)
		}
	}
	if fmt.Sprint(ints(f["left_out"])) != "[1 2]" || fields("step 4 loss 2.3") != nil {
		t.Errorf("ints %v; a plain line parsed as %v", ints(f["left_out"]), fields("step 4 loss 2.3"))
	}
}

// The report names each failing seed, its replay command, the invariant
// and the evidence.
func TestReport(t *testing.T) {
	split := agreed(3)
	split[0] = `new_rank=0 new_size=1 left_out="[1 2 3]" attempts=1`
	ok, bad := runLog(t, sgdRun(agreed(3), hashA, "0")...), runLog(t, sgdRun(split, hashA, "0")...)
	bad.Schedule.Seed = 8
	results := []result{{ok, check(ok)}, {bad, check(bad)}}
	path := filepath.Join(t.TempDir(), "r.md")
	m := runMeta{cfg: &Config{NP: 4, Timeout: 5e9, Epochs: 8, Calls: 800}, workload: "any", transport: "any"}
	if err := writeReport(path, m, map[string]*Record{}, results); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	for _, want := range []string{"**2 runs, 1 with violations**", "| kill | 2 runs, 1 violated |", "### Seed 8: sgd over auto, kill",
		"Replay: `build/chaos -seed 8 -np 4 -timeout 5s`", "- **one view**: the survivors of communicator c0 split", `left_out="[1 2 3]"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the report lacks %q:\n%s", want, b)
		}
	}
}
