package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/flight"
)

func doctor(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	if errOut.Len() > 0 {
		t.Logf("stderr: %s", errOut.String())
	}
	return out.String(), code
}

// Hand-made dumps (testdata/): a rank that died without a dump, and a
// rank that is alive but never issued the collective the others wait in.
func TestDoctorTestdata(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		want []string
	}{
		{"testdata/lost-rank", []string{
			"Communicator 77 (4 ranks): rank 1 did not arrive at allreduce #7",
			"rank 1 left no dump",
			"Ranks 0, 2 and 3 were waiting for it.",
			"rank 3 (h1 pid 13) was in allreduce #7 (4096 B float32, ring) for 500µs, waiting for rank 1",
			// The sub-communicator's dump is judged on its own, after.
			"\n\nCommunicator 88 (2 ranks): no rank was in or failed in a collective",
		}},
		{"testdata/straggler", []string{
			"rank 2 did not arrive at broadcast #5",
			"Ranks 0 and 1 were waiting for it",
			"rank 2 (hostB pid 200) completed allreduce #4",
		}},
	} {
		out, code := doctor(t, tc.dir)
		if code != 0 {
			t.Errorf("%s: exit %d", tc.dir, code)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.dir, w, out)
			}
		}
		if strings.Contains(tc.dir, "straggler") && strings.Contains(out, "left no dump") {
			t.Errorf("%s: blames a missing dump:\n%s", tc.dir, out)
		}
	}
}

func TestDoctorJSON(t *testing.T) {
	out, code := doctor(t, "-json", "testdata/lost-rank")
	var vs []flight.Verdict
	if err := json.Unmarshal([]byte(out), &vs); err != nil || code != 0 {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	v := vs[0]
	if v.Comm != "77" || v.Op != "allreduce" || v.Seq != 7 || len(v.Absent) != 1 || v.Absent[0] != 1 || len(v.NoDump) != 1 || len(v.Waiting) != 3 || len(v.Last) != 3 {
		t.Errorf("%+v", v)
	}
}

func TestDoctorNoDumps(t *testing.T) {
	if _, code := doctor(t, t.TempDir()); code != 2 {
		t.Errorf("exit %d on an empty directory, want 2", code)
	}
	if _, code := doctor(t); code != 2 {
		t.Errorf("exit %d without a directory, want 2", code)
	}
}

// Real dumps: three in-process ranks, rank 1 skips the third allreduce;
// the others time out and dump, rank 1 is asked to dump too.
func TestDoctorRealDumps(t *testing.T) {
	dir := t.TempDir()
	cs, err := engine.NewLocalComms(3, engine.Options{Timeout: 300 * time.Millisecond, DumpDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			b := make([]byte, 256)
			n := 3
			if c.Rank() == 1 {
				n = 2
			}
			for i := 0; i < n; i++ {
				if c.AllReduce(b, b, 64, engine.Float32, engine.Sum) != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if _, err := cs[1].DumpStateFile(); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		c.Destroy()
	}
	out, code := doctor(t, dir)
	if code != 0 || !strings.Contains(out, "rank 1 did not arrive at allreduce #2 (256 B float32") ||
		!strings.Contains(out, "Ranks 0 and 2 were waiting for it") || !strings.Contains(out, "rank 1 (") || strings.Contains(out, "no dump") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	t.Log(out)
}
