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

// Named variants side by side, without the allreduce: each variant's
// heading, note and tables, and the models' figure; a variant without a name or
// figures, or no -models at all, is an error.
func TestRunModelsOnly(t *testing.T) {
	dir := t.TempDir()
	star := setupParams()
	star.Roots, star.FanOut = 1, 1<<20
	write := func(m modelFile) string {
		data, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "m.json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	models := write(modelFile{Variants: []modelVariant{
		{Name: "star, as built", Note: "from the bootstrap benchmark", Init: &star},
		{Name: "tree, a design", Init: ptr(setupParams()), Shrink: &ShrinkParams{Hop: 10e-6, PerMessage: 5e-6, Setup: setupParams()}},
	}})
	out := filepath.Join(dir, "proj")
	o, err := parseFlags([]string{"-ranks", "1024,65536", "-allreduce=false", "-models", models, "-out", out})
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
	for _, want := range []string{"### star, as built\n\nfrom the bootstrap benchmark", "**Setup, star, as built**", "### tree, a design",
		"**Setup, tree, a design**", "**Shrink by one rank, tree, a design**", "| 65,536 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "Allreduce") || strings.Count(string(md), "**Setup") != 2 {
		t.Errorf("want the two setup tables and no allreduce:\n%s", md)
	}
	if st, err := os.Stat(out + ".png"); err != nil || st.Size() == 0 {
		t.Errorf("the models' figure: %v", err)
	}
	o.models = write(modelFile{Variants: []modelVariant{{Name: "empty"}}})
	if err := run(o, io.Discard); err == nil || !strings.Contains(err.Error(), "variant 0") {
		t.Errorf("a variant without figures: %v", err)
	}
	if _, err := parseFlags([]string{"-allreduce=false"}); err == nil {
		t.Error("-allreduce=false without -models: no error")
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
