package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeRun writes a two-round 2x1 run: gocoll's busbw twice Gloo's, then
// 1.6 times, links measured before each round.
func writeRun(t *testing.T, dir string) (raw, links, meta string) {
	t.Helper()
	raw = filepath.Join(dir, "raw.csv")
	links = filepath.Join(dir, "links.csv")
	meta = filepath.Join(dir, "meta.txt")
	rows := "2x1,1,gocoll,allreduce,2,16777216,10,16000,15000,17000,16000,1.0,1.0,ok\n" +
		"2x1,1,gloo,allreduce,2,16777216,10,32000,30000,34000,32000,0.5,0.5,ok\n" +
		"2x1,2,gocoll,allreduce,2,16777216,10,20000,19000,21000,20000,0.8,0.8,ok\n" +
		"2x1,2,gloo,allreduce,2,16777216,10,32000,30000,34000,32000,0.5,0.5,ok\n"
	linkRows := "config,link,bytes_per_s\n2x1,0,2000000000\n2x1,1,1800000000\n2x1,0,1600000000\n2x1,1,1400000000\n"
	for p, s := range map[string]string{raw: rows, links: linkRows, meta: "Machine: test CPU.\n2x1: load average (1 min) 0.50 at start, 0.70 at end.\n"} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return raw, links, meta
}

// report runs hostsreport and returns its results.md.
func report(t *testing.T, raw, links, rate, meta, dir string) string {
	t.Helper()
	if err := run(raw, links, rate, meta, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReportUnlimited(t *testing.T) {
	dir := t.TempDir()
	raw, links, meta := writeRun(t, dir)
	md := report(t, raw, links, "unlimited", meta, dir)
	for _, want := range []string{
		"not limited (no tc)",
		"measured before every round",
		"- Machine: test CPU.",
		"- 2x1: load average (1 min) 0.50 at start, 0.70 at end.",
		// L is the median of the four measurements; gocoll's median
		// busbw 0.9 is 1.8x Gloo's and 0.53 of L.
		"L = 1.7000 GB/s",
		"| allreduce | 16 MiB | 0.5000 (32.0 ms) | 0.9000 (18.0 ms) | 1.80 | 0.53 | 0.53 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "tc tbf") {
		t.Errorf("an unlimited run's report speaks of tbf:\n%s", md)
	}
}

func TestReportLimited(t *testing.T) {
	dir := t.TempDir()
	raw, links, _ := writeRun(t, dir)
	if md := report(t, raw, links, "250mbit", "", dir); !strings.Contains(md, "limited to 250mbit each way with `tc tbf`") || strings.Contains(md, "not limited") {
		t.Errorf("a limited run's report does not name its rate:\n%s", md)
	}
}

// TestReportBase: with a gocoll-base label the report gives gocoll / base
// per cell and flags a cell slower beyond the spread, not one within it.
func TestReportBase(t *testing.T) {
	dir := t.TempDir()
	raw, links, meta := writeRun(t, dir)
	// 16 MiB: the base's times within gocoll's spread (not flagged);
	// 1 MiB: gocoll's twice the base's (flagged).
	rows := "2x1,1,gocoll-base,allreduce,2,16777216,10,17000,16000,18000,17000,0.95,0.95,ok\n" +
		"2x1,2,gocoll-base,allreduce,2,16777216,10,19000,18000,20000,19000,0.85,0.85,ok\n" +
		"2x1,1,gocoll,allreduce,2,1048576,10,2000,1900,2100,2000,0.5,0.5,ok\n" +
		"2x1,2,gocoll,allreduce,2,1048576,10,2100,2000,2200,2100,0.48,0.48,ok\n" +
		"2x1,1,gocoll-base,allreduce,2,1048576,10,1000,900,1100,1000,1.0,1.0,ok\n" +
		"2x1,2,gocoll-base,allreduce,2,1048576,10,1100,1000,1200,1100,0.95,0.95,ok\n"
	f, err := os.OpenFile(raw, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(rows); err != nil {
		t.Fatal(err)
	}
	f.Close()
	md := report(t, raw, links, "unlimited", meta, dir)
	for _, want := range []string{
		"gocoll / base |",
		"| 1.00 |\n",    // 16 MiB: 0.9 / 0.9, not flagged
		"| 0.50 ** |\n", // 1 MiB: 0.49 / 0.975, flagged
		"Slower than the base beyond the spread: 2x1 allreduce 1 MiB 0.50×.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
}
