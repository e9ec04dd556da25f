package ctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// headerFunctions lists the functions gocoll.h declares.
func headerFunctions(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(lib.IncludeDir(), "gocoll.h"))
	if err != nil {
		t.Fatal(err)
	}
	// Strip comments, then find "name(" after a return type.
	src := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(b), "")
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^(?:const\s+)?\w+\*?\s+\*?(gocoll\w+)\(`).FindAllStringSubmatch(src, -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return names
}

// TestExportedSymbols checks that the library exports exactly the functions
// of gocoll.h (plus the version node of the version script), nothing of the
// Go runtime or of the capi_* glue, and carries the right SONAME.
func TestExportedSymbols(t *testing.T) {
	so := filepath.Join(lib.LibDir(), "libgocoll.so")
	out, err := exec.Command("nm", "-D", "--defined-only", so).CombinedOutput()
	if err != nil {
		t.Fatalf("nm: %v\n%s", err, out)
	}
	var exported []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("unexpected nm line %q", line)
		}
		typ, name := f[1], f[2]
		if typ == "A" && name == "GOCOLL_0.1" { // the version node
			continue
		}
		name, _, _ = strings.Cut(name, "@")
		if typ != "T" {
			t.Errorf("exported %s symbol %s: only functions (T) should be exported", typ, name)
		}
		exported = append(exported, name)
	}
	slices.Sort(exported)
	want := headerFunctions(t)
	if len(want) < 36 {
		t.Fatalf("found only %d functions in gocoll.h: %v", len(want), want)
	}
	if !slices.Equal(exported, want) {
		t.Errorf("exported symbols differ from gocoll.h\nexported: %v\nheader:   %v", exported, want)
	}
	t.Logf("%d exported symbols: %s", len(exported), strings.Join(exported, " "))

	dyn, err := exec.Command("readelf", "-d", so).CombinedOutput()
	if err != nil {
		t.Fatalf("readelf: %v\n%s", err, dyn)
	}
	if !strings.Contains(string(dyn), "Library soname: [libgocoll.so.0]") {
		t.Errorf("SONAME is not libgocoll.so.0:\n%s", dyn)
	}
	for link, target := range map[string]string{"libgocoll.so": "libgocoll.so.0", "libgocoll.so.0": "libgocoll.so.0.1.0"} {
		got, err := os.Readlink(filepath.Join(lib.LibDir(), link))
		if err != nil || got != target {
			t.Errorf("%s -> %q (%v), want -> %s", link, got, err, target)
		}
	}
}

// TestHeader compiles gocoll.h strictly as C89/C99/C11 and C++, and checks
// the enum numbering against DESIGN.md.
func TestHeader(t *testing.T) {
	dir := t.TempDir()
	check := filepath.Join(dir, "check.c")
	// DESIGN.md's numbering, checked at compile time, one assertion a line.
	enums := []string{
		"gocollSuccess", "gocollUnhandledError", "gocollSystemError", "gocollInternalError", "gocollInvalidArgument",
		"gocollInvalidUsage", "gocollRemoteError", "gocollInProgress", "gocollTimeout", "gocollRevoked", "gocollExcluded", "gocollNoQuorum", "",
		"gocollInt8", "gocollUint8", "gocollInt32", "gocollUint32", "gocollInt64", "gocollUint64",
		"gocollFloat16", "gocollFloat32", "gocollFloat64", "gocollBfloat16", "",
		"gocollSum", "gocollProd", "gocollMax", "gocollMin", "gocollAvg", "",
	}
	var b strings.Builder
	b.WriteString("#include <gocoll.h>\n#define A2(c, l) typedef char assert_line_##l[(c) ? 1 : -1];\n#define A1(c, l) A2(c, l)\n#define CHECK(c) A1(c, __LINE__)\n")
	v := 0
	for _, e := range enums {
		if e == "" {
			v = 0
			continue
		}
		fmt.Fprintf(&b, "CHECK(%s == %d)\n", e, v)
		v++
	}
	b.WriteString("CHECK(sizeof(gocollUniqueId) == 128)\nint main(void) { return 0; }\n")
	src := b.String()
	if err := os.WriteFile(check, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"gcc", "-std=c89", "-pedantic"},
		{"gcc", "-std=c99", "-pedantic"},
		{"gcc", "-std=c11", "-pedantic"},
		{"g++", "-x", "c++", "-std=c++11", "-pedantic"},
	} {
		args := append(c[1:], "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I", lib.IncludeDir(), check)
		if out, err := exec.Command(c[0], args...).CombinedOutput(); err != nil {
			t.Errorf("%s %v: %v\n%s", c[0], args, err, out)
		}
	}
}

// TestPkgConfig builds a program the documented way: pkg-config with
// PKG_CONFIG_PATH pointing into the build.
func TestPkgConfig(t *testing.T) {
	if _, err := exec.LookPath("pkg-config"); err != nil {
		t.Skip("pkg-config is not installed")
	}
	env := append(os.Environ(), "PKG_CONFIG_PATH="+lib.PkgConfigPath())
	pc := func(args ...string) string {
		cmd := exec.Command("pkg-config", args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pkg-config %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if v := pc("--modversion", "gocoll"); v != "0.1.0" {
		t.Errorf("pkg-config version %q, want 0.1.0", v)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "v.c")
	os.WriteFile(src, []byte(`#include <stdio.h>
#include <gocoll.h>
int main(void) { int v = 0; if (gocollGetVersion(&v) != gocollSuccess) return 1; printf("%d\n", v); return v != GOCOLL_VERSION_CODE; }
`), 0o644)
	exe := filepath.Join(dir, "v")
	args := append([]string{"-o", exe, src}, strings.Fields(pc("--cflags", "--libs", "gocoll"))...)
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, out)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib.LibDir())
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "100" {
		t.Errorf("version program: %v, output %q", err, out)
	}
}
