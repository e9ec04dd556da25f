package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// tuned makes ranks that pretend to sit on hosts and runs their
// calibration on every rank at once, as a new communicator does.
func tuned(t *testing.T, hosts [][]int, opts ...Options) []*Comm {
	t.Helper()
	n := 0
	for _, h := range hosts {
		n += len(h)
	}
	o := Options{Timeout: time.Minute}
	if len(opts) > 0 {
		o = opts[0]
	}
	comms := newPlaced(t, mem.NewWorld(n), hosts, o)
	for i, c := range comms {
		if i < len(opts) {
			c.opts.Tune = opts[i].Tune
			if opts[i].Algo != "" {
				spec, err := parseAlgoSpec(opts[i].Algo)
				if err != nil {
					t.Fatal(err)
				}
				c.choice.Overrides = spec
			}
		}
	}
	// A smaller budget than a job's: the test is about the protocol, the
	// cache and the agreement, not about timing the large sizes.
	budget := 100 * time.Millisecond
	if raceEnabled {
		budget = 20 * time.Millisecond
	}
	mustRanks(t, comms, func(c *Comm) error { return c.tuneWithin(budget) })
	return comms
}

// table is a communicator's calibrated table in words ("" for none).
func table(c *Comm) string {
	if c.choice.Measured == nil {
		return ""
	}
	out := ""
	for k, a := range c.choice.Measured.AllReduce {
		name := "-"
		if a != nil {
			name = a.Name
		}
		out += fmt.Sprintf("%d:%s ", choose.TuneSizes[k], name)
	}
	return out
}

// sameTable fails unless every rank holds one table, and returns it.
func sameTable(t *testing.T, comms []*Comm) string {
	t.Helper()
	want := table(comms[0])
	for _, c := range comms[1:] {
		if got := table(c); got != want {
			t.Fatalf("rank %d's table %q, rank 0's %q", c.Rank(), got, want)
		}
	}
	return want
}

// TestTune: ranks on (pretended) hosts time their contenders together and
// keep one table, every entry one of its size's contenders; rank 0 caches
// it, and the next communicator on the same placement takes it from the
// cache, even a table the timing would not give (a wrong or stale table
// costs time, never correctness: the suite passes under it); a corrupt
// cache is measured again; redo on any rank measures again; off or a
// forced allreduce on any rank turns it off on all.
func TestTune(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	placements := [][][]int{{{0}, {1}}, {{0, 1}, {2, 3}}, {{0}, {1}, {2}}}
	if raceEnabled {
		placements = placements[1:2] // each path once under the race detector
	}
	for _, hosts := range placements {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			comms := tuned(t, hosts)
			got := sameTable(t, comms)
			if got == "" {
				t.Fatal("no table")
			}
			shape := choose.Shape{N: comms[0].size, Hosts: len(hosts), Even: comms[0].layout.evenHosts}
			for k, a := range comms[0].choice.Measured.AllReduce {
				if a != nil && !slices.Contains(comms[0].choice.Contenders(choose.TuneSizes[k], shape), a) {
					t.Errorf("%d bytes: %s is not a contender", choose.TuneSizes[k], a.Name)
				}
			}
			key, _ := comms[0].tuneKey()
			path := filepath.Join(cache, "gocoll", "tune-"+key+".json")
			var f TuneTable
			if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &f) != nil || f.Key != key {
				t.Fatalf("cache %s: %v", path, err)
			}

			// A table the timing did not make: dbtree at every timed size.
			for size := range f.AllReduce {
				f.AllReduce[size] = "dbtree"
			}
			f.Made = "by the test"
			if err := writeTune(path, f); err != nil {
				t.Fatal(err)
			}
			cached := tuned(t, hosts)
			want := ""
			for k := range choose.TuneSizes {
				name := "-"
				if _, ok := f.AllReduce[fmt.Sprint(choose.TuneSizes[k])]; ok {
					name = "dbtree"
				}
				want += fmt.Sprintf("%d:%s ", choose.TuneSizes[k], name)
			}
			if got := sameTable(t, cached); got != want {
				t.Errorf("from the cache: %q, want %q", got, want)
			}
			timed := len(f.AllReduce) > 0
			if k := 1; timed && f.AllReduce[fmt.Sprint(choose.TuneSizes[k])] == "dbtree" {
				if a := cached[0].choose(sched.AllReduce, choose.TuneSizes[k]); a.name != "dbtree" {
					t.Errorf("a call of %d bytes runs %s under a table of dbtree", choose.TuneSizes[k], a.name)
				}
			}
			s := suite{dtypes: []DataType{Float32}, ops: []RedOp{Sum}, counts: []int{7, 1 << 16, 1 << 18}}
			if raceEnabled {
				s.counts = s.counts[:1]
			}
			mustRanks(t, cached, func(c *Comm) error { return conformance(c, s) })

			// Redo on one rank: measured again and cached again.
			opts := make([]Options, len(comms))
			for i := range opts {
				opts[i].Timeout = time.Minute
			}
			opts[len(opts)-1].Tune = "redo"
			sameTable(t, tuned(t, hosts, opts...))
			rewritten := func(what string) {
				t.Helper()
				var again TuneTable
				if b, _ := os.ReadFile(path); json.Unmarshal(b, &again) != nil || again.Key != key || again.Made == "by the test" {
					t.Errorf("%s: the cache was not measured again and rewritten: %s", what, b)
				}
			}
			rewritten("redo")

			// A corrupt cache: measured again.
			os.WriteFile(path, []byte("{"), 0o644)
			if got := sameTable(t, tuned(t, hosts)); got == "" {
				t.Errorf("after a corrupt cache: no table")
			}
			rewritten("a corrupt cache")

			// Off, or the allreduce forced, on one rank: off everywhere.
			for _, o := range []Options{{Tune: "off"}, {Algo: "allreduce=ring"}} {
				opts := make([]Options, len(comms))
				for i := range opts {
					opts[i].Timeout = time.Minute
				}
				opts[len(opts)-1].Tune, opts[len(opts)-1].Algo = o.Tune, o.Algo
				if got := sameTable(t, tuned(t, hosts, opts...)); got != "" {
					t.Errorf("%+v on the last rank: table %q", o, got)
				}
			}
		})
	}
}

// On one host there is nothing to time and no collective is called.
func TestTuneOneHost(t *testing.T) {
	comms := newPlaced(t, mem.NewWorld(2), nil, Options{Timeout: time.Minute})
	if err := comms[0].tune(); err != nil || comms[0].choice.Measured != nil {
		t.Errorf("one host: %v, %v", err, comms[0].choice.Measured)
	}
}
