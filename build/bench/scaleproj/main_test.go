package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A small projection end to end: tables (projected points), the
// figure, and the models' tables from a -models file.
func TestRunSmall(t *testing.T) {
	dir := t.TempDir()
	models := filepath.Join(dir, "measured.json")
	data, err := json.Marshal(modelFile{Init: ptr(setupParams()),
		Shrink: &ShrinkParams{Detect: 1, Hop: 10e-6, PerMessage: 5e-6, PerID: 10e-9, Setup: setupParams()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(models, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "proj")
	o, err := parseFlags([]string{"-ranks", "16,32", "-per-host", "8", "-bytes", "4K", "-algos", "ring,dbtree,hier",
		"-direct-max", "16", "-models", models, "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(o, io.Discard); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(out + ".md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"`go run ./build/bench/scaleproj -ranks 16,32 ", "**8 ranks per host, 4 KiB**", "| 32 | 4 |", " †", "**Setup**", "**Shrink by one rank**", "| 32 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	if st, err := os.Stat(out + ".png"); err != nil || st.Size() == 0 {
		t.Errorf("figure: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-ranks", "1000", "-per-host", "16"}, // hosts not filled
		{"-bytes", "4X"},
		{"-ranks", "0"},
		{"-nic", "fast"},
		{"-direct-max", "0"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	o, err := parseFlags([]string{"-bytes", "4K,1M,2G"})
	if err != nil || o.bytes[0] != 4096 || o.bytes[1] != 1<<20 || o.bytes[2] != 2<<30 {
		t.Errorf("sizes %v, %v", o.bytes, err)
	}
}
