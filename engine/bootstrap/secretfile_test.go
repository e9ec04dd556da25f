package bootstrap

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestSecretFile(t *testing.T) {
	base := t.TempDir()
	env := func(k string) string {
		if k == "TMPDIR" {
			return base
		}
		return ""
	}
	s1, path, err := SecretFile(env, "job A")
	if err != nil {
		t.Fatal(err)
	}
	s2, path2, err := SecretFile(env, "job A")
	if err != nil || path2 != path || !bytes.Equal(s1, s2) || len(s1) != 32 {
		t.Fatalf("second rank: %x %s %v, first %x %s", s2, path2, err, s1, path)
	}
	other, _, err := SecretFile(env, "job B")
	if err != nil || bytes.Equal(other, s1) {
		t.Fatalf("another job: %x, %v", other, err)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if st, err := os.Lstat(p); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %v", p, st.Mode(), err, want)
		}
	}
	// A file whose writer is gone is replaced with a new secret.
	if err := os.WriteFile(path, []byte(fmt.Sprintf("%d %x\n", 1<<30, s1)), 0o600); err != nil {
		t.Fatal(err)
	}
	s3, _, err := SecretFile(env, "job A")
	if err != nil || bytes.Equal(s3, s1) {
		t.Fatalf("stale file: %x, %v", s3, err)
	}
	// A file others may read is refused, and so is a symbolic link.
	os.Chmod(path, 0o644)
	if _, _, err := SecretFile(env, "job A"); err == nil {
		t.Error("a group/world-readable secret file was accepted")
	}
	os.Remove(path)
	os.Symlink(filepath.Join(base, "elsewhere"), path)
	if _, _, err := SecretFile(env, "job A"); err == nil {
		t.Error("a symbolic link was followed")
	}
	os.Remove(path)
	os.Chmod(filepath.Dir(path), 0o755)
	if _, _, err := SecretFile(env, "job A"); err == nil {
		t.Error("a directory others can enter was accepted")
	}
	os.Chmod(filepath.Dir(path), 0o700)
	RemoveSecretFile(path)
	if ents, _ := os.ReadDir(base); len(ents) != 2-1 { // job B's directory remains
		t.Errorf("after removal: %v", ents)
	}
}
