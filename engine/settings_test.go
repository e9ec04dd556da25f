package engine

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite docs/settings.md from the settings table")

// TestSettingsParse: each per-communicator variable, given as the
// environment's, sets its Options field to this value, or is refused
// naming the variable. Every such variable has a case that it accepts.
func TestSettingsParse(t *testing.T) {
	ok := []struct {
		v, value, field string
		want            any
	}{
		{"GOCOLL_TIMEOUT", "90", "Timeout", 90 * time.Second},
		{"GOCOLL_TIMEOUT", "0.5", "Timeout", 500 * time.Millisecond},
		{"GOCOLL_TIMEOUT", "1m30s", "Timeout", 90 * time.Second},
		{"GOCOLL_ALGO", "allreduce=hd,alltoall=bruck", "Algo", "allreduce=hd,alltoall=bruck"},
		{"GOCOLL_ALGO", "RING", "Algo", "RING"}, // names are matched in any case; the text is kept
		{"GOCOLL_BRUCK_RADIX", "4", "BruckRadix", 4},
		{"GOCOLL_BRUCK_RADIX", "+3", "BruckRadix", 3},
		{"GOCOLL_HD_SEGMENTS", "1", "Segments", 1},
		{"GOCOLL_FLIGHT_RECORDS", "1048576", "FlightRecords", 1 << 20},
		{"GOCOLL_FLIGHT_RECORDS", "0", "FlightRecords", -1}, // off
		{"GOCOLL_DUMP_DIR", "/some/dir", "DumpDir", "/some/dir"},
		{"GOCOLL_NET_BANDWIDTH", "250mbit", "NetBandwidth", 250e6 / 8},
		{"GOCOLL_NET_BANDWIDTH", "1.25GB", "NetBandwidth", 1.25e9},
		{"GOCOLL_SOCKET_IFNAME", "eth", "SocketIfname", "eth"},
		{"GOCOLL_TRANSPORT", "TCP", "Transport", "tcp"},
		{"GOCOLL_TRANSPORT", "auto", "Transport", "auto"},
		{"GOCOLL_SHRINK_QUORUM", "Majority", "ShrinkQuorum", "majority"},
		{"GOCOLL_SHRINK_QUORUM", "live", "ShrinkQuorum", "live"},
		{"GOCOLL_TUNE", "Redo", "Tune", "redo"},
		{"GOCOLL_TUNE", "off", "Tune", "off"},
		{"GOCOLL_TUNE", "auto", "Tune", ""},
		{"GOCOLL_CONNECT", "ALL", "Connect", "all"},
		{"GOCOLL_CONNECT", "lazy", "Connect", ""},
		{"GOCOLL_CMA", "0", "NoCMA", true},
		{"GOCOLL_CMA", "no", "NoCMA", true},
		{"GOCOLL_CMA", "On", "NoCMA", false},
		{"GOCOLL_DEBUG", "info", "Logger", slog.LevelInfo},
		{"GOCOLL_DEBUG", "ERROR", "Logger", slog.LevelError},
		{"GOCOLL_DEBUG", "off", "Logger", slog.Level(100)}, // nothing enabled
		{"GOCOLL_DEBUG_FILE", filepath.Join(t.TempDir(), "x.%p.log"), "Logger", slog.LevelWarn},
	}
	bad := []struct{ v, value string }{
		{"GOCOLL_TIMEOUT", "0"}, {"GOCOLL_TIMEOUT", "-1s"}, {"GOCOLL_TIMEOUT", "soon"},
		{"GOCOLL_ALGO", "allreduce=nope"}, {"GOCOLL_ALGO", "nope"},
		{"GOCOLL_BRUCK_RADIX", "1"}, {"GOCOLL_BRUCK_RADIX", "2.5"},
		{"GOCOLL_HD_SEGMENTS", "0"},
		{"GOCOLL_FLIGHT_RECORDS", "-1"}, {"GOCOLL_FLIGHT_RECORDS", "1048577"},
		{"GOCOLL_NET_BANDWIDTH", "fast"},
		{"GOCOLL_TRANSPORT", "rdma"},
		{"GOCOLL_SHRINK_QUORUM", "half"},
		{"GOCOLL_CMA", "2"}, {"GOCOLL_CMA", "maybe"},
		{"GOCOLL_TUNE", "on"}, {"GOCOLL_TUNE", "/tmp/x"},
		{"GOCOLL_CONNECT", "eager"},
		{"GOCOLL_DEBUG", "loud"},
		{"GOCOLL_DEBUG_FILE", filepath.Join(t.TempDir(), "missing", "x.log")},
	}
	tested := map[string]bool{}
	for _, c := range ok {
		tested[c.v] = true
		o, err := OptionsFromEnv(func(k string) string { return map[string]string{c.v: c.value}[k] })
		if err != nil {
			t.Errorf("%s=%q: %v", c.v, c.value, err)
			continue
		}
		if got := optionField(o, c.field); got != c.want {
			t.Errorf("%s=%q: %s = %v, want %v", c.v, c.value, c.field, got, c.want)
		}
	}
	for _, c := range bad {
		_, err := OptionsFromEnv(func(k string) string { return map[string]string{c.v: c.value}[k] })
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.v+"=") {
			t.Errorf("%s=%q: error %v, want ErrInvalidArgument naming %s", c.v, c.value, err, c.v)
		}
	}
	for _, s := range settings {
		if s.Scope == scopeComm && !tested[s.Var] {
			t.Errorf("%s: no case here", s.Var)
		}
	}
}

// optionField is o's field by name; for the Logger, the lowest level it
// enables (100: none).
func optionField(o Options, name string) any {
	if name == "Logger" {
		for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
			if o.Logger.Enabled(context.Background(), l) {
				return l
			}
		}
		return slog.Level(100)
	}
	return reflect.ValueOf(o).FieldByName(name).Interface()
}

// TestSettingsIntForm: a setting given as an int (gocollConfig_t's int
// fields, IntSetting) means what its variable's text means: the same field
// value, or a refusal, which names the setting's field.
func TestSettingsIntForm(t *testing.T) {
	for _, s := range settings {
		if s.num == nil {
			continue
		}
		for _, n := range []int{-1, 0, 1, 2, 3, 90, 256, 1 << 20, 1<<20 + 1} {
			text := strconv.Itoa(n)
			if s.Var == "GOCOLL_TIMEOUT" {
				text += "ms"
			}
			want, wantErr := OptionsFromEnv(func(k string) string { return map[string]string{s.Var: text}[k] })
			got, err := OptionsFromSettings(func(string) string { return "" }, IntSetting(s.Var, n, "config."+s.Config))
			if (err != nil) != (wantErr != nil) {
				t.Errorf("%s: %d: error %v; as text %q: %v", s.Var, n, err, text, wantErr)
				continue
			}
			if err != nil {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "config."+s.Config+"=") {
					t.Errorf("%s: %d: error %v, want ErrInvalidArgument naming config.%s", s.Var, n, err, s.Config)
				}
				continue
			}
			if g, w := optionField(got, s.Field), optionField(want, s.Field); g != w {
				t.Errorf("%s: %d: %s = %v; as text %q: %v", s.Var, n, s.Field, g, text, w)
			}
		}
	}
	if _, err := OptionsFromSettings(nil, IntSetting("GOCOLL_ALGO", 1, "config.algo")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("an int for GOCOLL_ALGO: %v, want ErrInvalidArgument", err)
	}
}

// TestSettingsTable: the table is whole. A per-communicator setting names
// an Options field, a config field and a parser; a variable read elsewhere
// has none of them; each says what unset means (a default value that
// parses to what withDefaults gives, or a sentence), and its values.
func TestSettingsTable(t *testing.T) {
	vars, configs := map[string]bool{}, map[string]bool{}
	zero := Options{}.withDefaults()
	for _, s := range settings {
		if vars[s.Var] || (s.Config != "" && configs[s.Config]) {
			t.Errorf("%s: variable or config field %q twice", s.Var, s.Config)
		}
		vars[s.Var], configs[s.Config] = true, true
		if s.Range == "" || s.Doc == "" || (s.Default == "") == (s.Unset == "") {
			t.Errorf("%s: want Range, Doc, and one of Default and Unset", s.Var)
		}
		switch s.Scope {
		case scopeComm:
			if _, ok := reflect.TypeOf(Options{}).FieldByName(s.Field); !ok || s.Config == "" || (s.parse == nil && s.num == nil) {
				t.Errorf("%s: Options field %q, config field %q, parser %v", s.Var, s.Field, s.Config, s.parse != nil || s.num != nil)
				continue
			}
		case scopeLaunch, scopeProcess, scopePython:
			if s.Field != "" || s.Config != "" || s.parse != nil || s.num != nil {
				t.Errorf("%s: read outside OptionsFromSettings, but has a field or parser", s.Var)
			}
			continue
		default:
			t.Errorf("%s: scope %q", s.Var, s.Scope)
			continue
		}
		p := parsed{logLevel: slog.LevelWarn}
		if s.Default == "" {
			p.Options = Options{}
		} else if err := s.set(&p, s.Default); err != nil {
			t.Errorf("%s: default %q: %v", s.Var, s.Default, err)
			continue
		}
		if s.Field == "Logger" {
			if p.logOff || p.logLevel != slog.LevelWarn || p.logOut != nil {
				t.Errorf("%s: default %q is not the unset log (WARN, stderr)", s.Var, s.Default)
			}
			continue
		}
		if got, want := optionField(p.Options.withDefaults(), s.Field), optionField(zero, s.Field); got != want {
			t.Errorf("%s: default %q gives %s = %v; unset gives %v", s.Var, s.Default, s.Field, got, want)
		}
	}
}

// TestSettingsDoc: docs/settings.md is what the table generates. After a
// change to the table: go generate ./engine.
func TestSettingsDoc(t *testing.T) {
	const path = "../docs/settings.md"
	doc := settingsDoc()
	if *update {
		if err := os.WriteFile(path, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(old, doc) {
		t.Errorf("%s is stale (%v): run go generate ./engine", path, err)
	}
}

// TestSettingsEverywhere: every GOCOLL_* variable that the library's code
// names (engine, the C library, the Python package; not their tests and
// tools, nor gocoll.h's macros) is in the table, and every variable of the
// table is named there: one added or dropped in the code alone fails here.
func TestSettingsEverywhere(t *testing.T) {
	macros := map[string]bool{}
	h, err := os.ReadFile("../capi/gocoll.h")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^#define (GOCOLL_\w+)`).FindAllStringSubmatch(string(h), -1) {
		macros[m[1]] = true
	}
	named := map[string]string{} // variable -> a file naming it
	word := regexp.MustCompile(`GOCOLL_[A-Z][A-Z0-9_]*[A-Z0-9]`)
	scan := func(path string) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range word.FindAllString(string(b), -1) {
			if !macros[v] && named[v] == "" {
				named[v] = path
			}
		}
	}
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (path == "cmd" || strings.HasSuffix(d.Name(), "test")):
			return filepath.SkipDir // tools, and helpers for tests
		case !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") && path != "settings.go":
			scan(path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, glob := range []string{"../capi/*.go", "../bridge/python/gocoll/*.py", "../bridge/python/setup.py"} {
		files, _ := filepath.Glob(glob)
		if len(files) == 0 {
			t.Fatalf("no files %s", glob)
		}
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				scan(f)
			}
		}
	}
	for v, path := range named {
		if settingByVar(v) == nil {
			t.Errorf("%s (named in %s) is not in the settings table (engine/settings.go)", v, path)
		}
	}
	for _, s := range settings {
		if named[s.Var] == "" {
			t.Errorf("%s is in the settings table but no code reads it", s.Var)
		}
	}
}

// settingsDoc is docs/settings.md.
func settingsDoc() []byte {
	var b bytes.Buffer
	b.WriteString(`# Settings

<!-- Generated from the table in engine/settings.go by "go generate ./engine"; do not edit. -->

gocoll reads its settings from ` + "`GOCOLL_*`" + ` environment variables. A value it
cannot take makes the call that reads it (creating a communicator or a unique
id) fail with an invalid-argument error naming the variable.

`)
	sections := []struct{ scope, title, intro string }{
		{scopeComm, "Per communicator", `Read when a communicator is created. Each can also be given to one
communicator, winning over the variable for it only: in Go, the ` + "`Options`" + ` field,
or ` + "`engine.OptionsFromSettings`" + ` with an ` + "`engine.Setting`" + `; in C, the field of
` + "`gocollConfig_t`" + ` (` + "`gocollCommInitRankConfig`" + `; an unset int field is
` + "`GOCOLL_CONFIG_UNDEF_INT`" + `, an unset string NULL); in Python, the same field of
` + "`gocoll._lib.Config`" + `, or ` + "`gocoll.init(timeout=, algo=, debug=)`" + ` for the three
most used. The value and its checks are the same in every form.`},
		{scopeLaunch, "Launch", `Read when a communicator joins from the launcher's environment
(` + "`engine.NewCommFromEnv`, `gocollCommInitFromEnv`, `gocoll.init()`" + `); torchrun, Open MPI and
Slurm set their own variables, which these complete or replace.`},
		{scopeProcess, "Process", `Read once per process by the C library (and so Python).`},
		{scopePython, "Python", `Read by the Python package.`},
	}
	for _, sec := range sections {
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", sec.title, sec.intro)
		for _, s := range settings {
			if s.Scope != sec.scope {
				continue
			}
			fmt.Fprintf(&b, "### `%s`\n\n", s.Var)
			if s.Default != "" {
				fmt.Fprintf(&b, "- Default: `%s`\n", s.Default)
			} else {
				fmt.Fprintf(&b, "- Unset: %s\n", s.Unset)
			}
			fmt.Fprintf(&b, "- Values: %s\n", s.Range)
			if s.Config != "" {
				kind := "string"
				if s.num != nil {
					kind = "int"
				}
				fmt.Fprintf(&b, "- Go: `Options.%s`; C and Python: `gocollConfig_t.%s` (%s)\n", s.Field, s.Config, kind)
			}
			fmt.Fprintf(&b, "\n%s\n\n", s.Doc)
		}
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
