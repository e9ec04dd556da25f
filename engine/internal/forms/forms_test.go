package forms

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite engine/forms.go")

// TestForms: engine/forms.go holds the public forms of every constructor
// marked //gocoll:forms, as Generate writes them. After adding or
// changing such a constructor: go generate ./engine.
func TestForms(t *testing.T) {
	const dir = "../.."
	src, err := Generate(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, File)
	if *update {
		if err := os.WriteFile(path, src, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(old, src) {
		t.Errorf("%s is stale (%v): run go generate ./engine", path, err)
	}
}
