package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// The -rings -json shape the issue fixes: devices, links with numeric
// bandwidth and latency, rings of hops that close.
func TestRingsJSON(t *testing.T) {
	out, errOut, code := runCmd(t, "-builtin", "hybrid-cube-mesh", "-rings", "-json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Devices []int `json:"devices"`
		Links   []struct {
			ID        string  `json:"id"`
			A         int     `json:"a"`
			B         int     `json:"b"`
			Kind      string  `json:"kind"`
			Bandwidth float64 `json:"bandwidth"`
			Latency   float64 `json:"latency"`
		} `json:"links"`
		Rings [][]struct {
			From int    `json:"from"`
			To   int    `json:"to"`
			Link string `json:"link"`
		} `json:"rings"`
		Proved bool `json:"proved"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(got.Devices) != 8 || len(got.Links) != 28 || len(got.Rings) != 2 || !got.Proved {
		t.Fatalf("devices %d, links %d, rings %d, proved %v", len(got.Devices), len(got.Links), len(got.Rings), got.Proved)
	}
	ids := map[string]bool{}
	for _, l := range got.Links {
		ids[l.ID] = true
		if l.Bandwidth <= 0 || l.Kind != "dev" || l.A == l.B {
			t.Fatalf("link %+v", l)
		}
	}
	for _, r := range got.Rings {
		if len(r) != 8 || r[len(r)-1].To != r[0].From {
			t.Fatalf("ring %+v does not close over 8 devices", r)
		}
		for _, h := range r {
			if !ids[h.Link] {
				t.Fatalf("hop over unknown link %q", h.Link)
			}
		}
	}
}

func TestPredict(t *testing.T) {
	out, errOut, code := runCmd(t, "-predict", "allreduce", "-builtin", "cluster", "-per-host", "2", "-ranks", "4,8", "-bytes", "16M", "-json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Op          string `json:"op"`
		Predictions []struct {
			Ranks   int     `json:"ranks"`
			Algo    string  `json:"algo"`
			Seconds float64 `json:"seconds"`
			Best    bool    `json:"best"`
		} `json:"predictions"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	best := map[int]string{}
	for _, p := range got.Predictions {
		if p.Seconds <= 0 {
			t.Fatalf("%+v", p)
		}
		if p.Best {
			best[p.Ranks] = p.Algo
		}
	}
	if got.Op != "allreduce" || best[4] == "" || best[8] == "" {
		t.Fatalf("%s", out)
	}
	text, _, code := runCmd(t, "-predict", "alltoall", "-builtin", "torus", "-ranks", "16", "-bytes", "1M")
	if code != 0 || !strings.Contains(text, "pairwise") || !strings.Contains(text, "bruck") {
		t.Fatalf("exit %d:\n%s", code, text)
	}
}

func TestInputsAndErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"name":"two","nodes":[{"id":0,"kind":"device"},{"id":1,"kind":"device"}],
		"links":[{"id":"a","kind":"dev","a":0,"b":1,"bandwidth":1e9,"latency":1e-6},{"id":"b","kind":"dev","a":0,"b":1,"bandwidth":1e9,"latency":1e-6}]}`), 0o644)
	out, errOut, code := runCmd(t, "-file", good, "-rings")
	if code != 0 || !strings.Contains(out, "1 link-disjoint rings") {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"nodes":[{"id":0,"kind":"device"}],"links":[{"id":"x","kind":"net","a":0,"b":7,"bandwidth":1,"latency":0}]}`), 0o644)
	if _, errOut, code := runCmd(t, "-file", bad); code == 0 || !strings.Contains(errOut, "node 7, which does not exist") {
		t.Fatalf("bad file: exit %d: %s", code, errOut)
	}
	if _, errOut, code := runCmd(t, "-builtin", "ring:4", "-detect"); code == 0 || !strings.Contains(errOut, "exactly one") {
		t.Fatalf("two sources: exit %d: %s", code, errOut)
	}
	if out, _, code := runCmd(t, "-detect"); code != 0 || !strings.Contains(out, "cores") {
		t.Fatalf("-detect: exit %d: %s", code, out)
	}
	if out, _, code := runCmd(t, "-builtin", "cluster:2x2", "-rings"); code != 0 || !strings.Contains(out, "keeps hosts together: [0 1 2 3]") {
		t.Fatalf("switched rings: exit %d: %s", code, out)
	}
}

// -tuned lists the tables GOCOLL_TUNE cached, sizes in order, and says
// where it looked when there is none.
func TestTuned(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	out, errOut, code := runCmd(t, "-tuned")
	if code != 0 || !strings.Contains(out, "no table cached in "+filepath.Join(cache, "gocoll")) {
		t.Fatalf("no table: exit %d: %s%s", code, out, errOut)
	}
	os.MkdirAll(filepath.Join(cache, "gocoll"), 0o755)
	table := `{"key":"k1","made":"2026-11-29T00:00:00Z","placement":"host0:1 host1:1","cpu":"AMD EPYC",
		"allreduce":{"16777216":"ring","1048576":"hd"},
		"times":{"1048576":{"ring":0.0021,"hd":0.0015},"16777216":{"ring":0.012,"hd":0.013}}}`
	os.WriteFile(filepath.Join(cache, "gocoll", "tune-k1.json"), []byte(table), 0o644)
	os.WriteFile(filepath.Join(cache, "gocoll", "tune-bad.json"), []byte("{"), 0o644)
	out, errOut, code = runCmd(t, "-tuned")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	one := strings.Index(out, "allreduce   1MiB: hd     (hd 1.500 ms, ring 2.100 ms)")
	sixteen := strings.Index(out, "allreduce  16MiB: ring   (hd 13.000 ms, ring 12.000 ms)")
	if one < 0 || sixteen < one || !strings.Contains(out, `on "AMD EPYC", hosts:ranks host0:1 host1:1`) || strings.Contains(out, "tune-bad") {
		t.Errorf("-tuned:\n%s", out)
	}
	out, _, _ = runCmd(t, "-tuned", "-json")
	var got []struct {
		Key       string            `json:"key"`
		AllReduce map[string]string `json:"allreduce"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 1 || got[0].AllReduce["1048576"] != "hd" {
		t.Errorf("-tuned -json: %v\n%s", err, out)
	}
}
