package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun draws a two-panel grid and reads the PNG back: one row of two
// 5.5-inch panels at gonum's default 96 dpi, plus the title band.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "plotdata.json")
	data := `{"title": "t", "cols": 2, "xlabel": "size (bytes)", "ylabel": "busbw GB/s", "panels": [
	 {"title": "allreduce np=2", "series": [{"name": "gocoll", "points": [[4096, 0.5], [65536, 4], [1048576, 9]]},
	                                        {"name": "someone else", "points": [[4096, 0.2], [65536, 0]]}]},
	 {"title": "allreduce np=4", "series": [{"name": "Open MPI", "points": [[4096, 0.1], [1048576, 2]]}]}]}`
	if err := os.WriteFile(in, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results.png")
	if err := run(in, out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Width != 2*528 || cfg.Height <= 326 {
		t.Errorf("image is %d×%d, want 1056 wide and taller than one panel", cfg.Width, cfg.Height)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"garbage": "{", "empty": `{"panels": []}`} {
		in := filepath.Join(dir, name+".json")
		if err := os.WriteFile(in, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		err := run(in, filepath.Join(dir, name+".png"))
		if err == nil || !strings.Contains(err.Error(), in) {
			t.Errorf("%s: err = %v, want an error naming %s", name, err, in)
		}
	}
}
