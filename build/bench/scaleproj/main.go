// Command scaleproj projects gocoll beyond the machines at hand: the
// allreduce time of every message algorithm (ring, halving–doubling,
// recursive doubling, double binary tree, hierarchical) from 1,024 to
// 65,536 ranks on clusters of H hosts × R ranks, by the cost model
// (topology/cost) with the figures calibrated on this machine
// (topology.DefaultParams, cost.DefaultRates) and a given network link;
// and, given measured figures, the setup and shrink times of the models
// in model.go. It writes OUT.md (tables) and OUT.png (time against
// ranks, one panel per hosts' size and message size).
//
//	scaleproj -out build/perf/scale-sim [-ranks 1024,4096,16384,65536]
//	    [-per-host 8,16] [-bytes 4K,1M,64M] [-nic 10gbit] [-nic-latency 10us]
//	    [-models measured.json] [-allreduce=false]
//
// Beyond -direct-max ranks every algorithm is projected from small
// clusters by the way it grows, as the engine's choice predicts it
// (topology/cost/project.go, cost.Projector), marked † in the tables;
// up to there, the cost model's walk of the whole schedule.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/topology/cost"
)

type options struct {
	ranks, perHost, bytes []int
	algos                 []string
	nic, nicLatency       float64
	nicName               string
	directMax             int
	out, models           string
	jobs                  int
	allreduce             bool     // project the allreduce (else the models only)
	args                  []string // as given, for the report
}

// point is one projected allreduce.
type point struct {
	Algo      string  `json:"algo"`
	Ranks     int     `json:"ranks"`
	PerHost   int     `json:"per_host"`
	Bytes     int     `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	BusBW     float64 `json:"busbw_GBps"`
	Projected bool    `json:"projected"`
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "scaleproj:", err)
		os.Exit(2)
	}
	if err := run(o, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "scaleproj:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("scaleproj", flag.ContinueOnError)
	ranks := fs.String("ranks", "1024,4096,16384,65536", "rank counts")
	perHost := fs.String("per-host", "8,16", "ranks per host")
	bytes := fs.String("bytes", "4K,1M,64M", "allreduce sizes (K, M suffixes)")
	algos := fs.String("algos", "ring,hd,rd,dbtree,hier", "registry allreduce algorithms")
	nic := fs.String("nic", "10gbit", "inter-host link bandwidth (per host)")
	lat := fs.Duration("nic-latency", 10*time.Microsecond, "inter-host link latency, on top of the calibrated per-message software cost")
	o := &options{args: args}
	fs.IntVar(&o.directMax, "direct-max", 1024, "beyond this many ranks the schedules are projected from small clusters, not walked whole")
	fs.StringVar(&o.out, "out", "scale-sim", "output path without extension (.md and .png are written)")
	fs.StringVar(&o.models, "models", "", `JSON file of measured figures: {"init": InitParams, "shrink": ShrinkParams}, or {"variants": [{"name", "note", "init", "shrink"}, …]} (model.go)`)
	fs.IntVar(&o.jobs, "j", 1, "predictions run at once")
	fs.BoolVar(&o.allreduce, "allreduce", true, "project the allreduce; false: only the models' tables (needs -models), no figure")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if o.ranks, err = ints(*ranks, false); err != nil {
		return nil, fmt.Errorf("-ranks: %w", err)
	}
	if o.perHost, err = ints(*perHost, false); err != nil {
		return nil, fmt.Errorf("-per-host: %w", err)
	}
	if o.bytes, err = ints(*bytes, true); err != nil {
		return nil, fmt.Errorf("-bytes: %w", err)
	}
	for _, n := range o.ranks {
		for _, r := range o.perHost {
			if n%r != 0 {
				return nil, fmt.Errorf("%d ranks do not fill hosts of %d", n, r)
			}
		}
	}
	if o.nic, err = topology.ParseRate(*nic); err != nil {
		return nil, fmt.Errorf("-nic: %w", err)
	}
	o.nicName, o.nicLatency = *nic, lat.Seconds()
	o.algos = strings.Split(*algos, ",")
	if o.jobs < 1 || o.directMax < 1 {
		return nil, fmt.Errorf("-j %d, -direct-max %d: want ≥ 1, ≥ 1", o.jobs, o.directMax)
	}
	if !o.allreduce && o.models == "" {
		return nil, errors.New("-allreduce=false leaves nothing to project without -models")
	}
	return o, nil
}

// ints reads a comma-separated list of positive integers (with K, M, G
// suffixes of 1024 when sized).
func ints(s string, sized bool) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := 1
		if sized && f != "" {
			switch f[len(f)-1] {
			case 'K', 'k':
				mult = 1 << 10
			case 'M', 'm':
				mult = 1 << 20
			case 'G', 'g':
				mult = 1 << 30
			}
			if mult > 1 {
				f = f[:len(f)-1]
			}
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q: want positive integers", s)
		}
		out = append(out, v*mult)
	}
	return out, nil
}

func (o *options) figures() cost.Figures {
	f := cost.DefaultFigures()
	f.Links.NICBandwidth, f.Links.NICLatency = o.nic, o.nicLatency
	return f
}

// project computes every point, o.jobs at a time.
func (o *options) project(log io.Writer) ([]point, error) {
	var pts []point
	for _, r := range o.perHost {
		for _, b := range o.bytes {
			for _, n := range o.ranks {
				for _, a := range o.algos {
					pts = append(pts, point{Algo: a, Ranks: n, PerHost: r, Bytes: b})
				}
			}
		}
	}
	f := o.figures()
	errs := make([]error, len(pts))
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range o.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				p := &pts[i]
				c := cluster{cost.Cluster{Hosts: p.Ranks / p.PerHost, PerHost: p.PerHost}, f}
				t0 := time.Now()
				var err error
				p.Projected = p.Ranks > o.directMax
				p.Seconds, err = c.predict(p.Algo, p.Bytes, p.Projected)
				if err != nil {
					errs[i] = err
					continue
				}
				p.BusBW = busBW(p.Bytes, p.Ranks, p.Seconds) / 1e9
				mu.Lock()
				fmt.Fprintf(log, "%s %d×%d %s: %s (%.1fs)\n", p.Algo, c.Hosts, c.PerHost, size(p.Bytes), seconds(p.Seconds), time.Since(t0).Seconds())
				mu.Unlock()
			}
		}()
	}
	for i := range pts {
		work <- i
	}
	close(work)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return pts, nil
}

// modelFile is the -models file: one set of figures (init, shrink), or
// several side by side (variants), e.g. the setup as built and a design.
type modelFile struct {
	Init     *InitParams    `json:"init,omitempty"`
	Shrink   *ShrinkParams  `json:"shrink,omitempty"`
	Variants []modelVariant `json:"variants,omitempty"`
}

// modelVariant is one named set of figures; Note says where they came
// from, and is printed with its tables.
type modelVariant struct {
	Name   string        `json:"name"`
	Note   string        `json:"note,omitempty"`
	Init   *InitParams   `json:"init,omitempty"`
	Shrink *ShrinkParams `json:"shrink,omitempty"`
}

// variants are the file's sets of figures, the unnamed one first.
func (m modelFile) variants() ([]modelVariant, error) {
	var vs []modelVariant
	if m.Init != nil || m.Shrink != nil {
		vs = append(vs, modelVariant{Init: m.Init, Shrink: m.Shrink})
	}
	for i, v := range m.Variants {
		if v.Name == "" || v.Init == nil && v.Shrink == nil {
			return nil, fmt.Errorf("variant %d (%q): want a name and init or shrink figures", i, v.Name)
		}
		vs = append(vs, v)
	}
	return vs, nil
}

func run(o *options, log io.Writer) error {
	var models modelFile
	if o.models != "" {
		data, err := os.ReadFile(o.models)
		if err != nil {
			return err
		}
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&models); err != nil {
			return fmt.Errorf("%s: %w", o.models, err)
		}
	}
	var md strings.Builder
	fmt.Fprintf(&md, "`go run ./build/bench/scaleproj %s`\n\n", strings.Join(o.args, " "))
	var pts []point
	if o.allreduce {
		var err error
		if pts, err = o.project(log); err != nil {
			return err
		}
		o.writeTables(&md, pts)
	}
	if err := writeModels(&md, o.ranks, models); err != nil {
		return err
	}
	if err := os.WriteFile(o.out+".md", []byte(md.String()), 0o644); err != nil {
		return err
	}
	if !o.allreduce {
		// The models' figure alone (with the allreduce, that one is
		// out.png and the models are in the tables only).
		if err := plotModels(o.ranks, models, o.out+".png"); err != nil {
			return err
		}
		fmt.Fprintf(log, "wrote %s.md and %s.png\n", o.out, o.out)
		return nil
	}
	if err := o.plot(pts, o.out+".png"); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s.md and %s.png\n", o.out, o.out)
	return nil
}
