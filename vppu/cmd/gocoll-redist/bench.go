package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu/redist"
)

// The benchmark (-bench) runs as one rank of a launched job (build/redistbench
// starts the ranks): for every layout pair and size, the plan's CSS
// schedule, one all-to-allv, and the naive order, interleaved round by
// round, each timed as (barrier; one redistribution), the max over ranks,
// median over the rounds. Rank 0 prints a Markdown table.

type benchCase struct {
	src, dst redist.Cyclic
}

func parseCases(s string) ([]benchCase, error) {
	var out []benchCase
	for _, c := range strings.Fields(strings.ReplaceAll(s, ",", " ")) {
		a, b, ok := strings.Cut(c, ">")
		if !ok {
			return nil, fmt.Errorf("-cases %q: want Q:y>P:x entries", c)
		}
		var bc benchCase
		var err error
		if bc.src.Procs, bc.src.Block, err = pair("cases", a); err != nil {
			return nil, err
		}
		if bc.dst.Procs, bc.dst.Block, err = pair("cases", b); err != nil {
			return nil, err
		}
		out = append(out, bc)
	}
	return out, nil
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.ToUpper(strings.TrimSpace(f))
		mult := 1
		for suf, m := range map[string]int{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30} {
			if v, ok := strings.CutSuffix(f, suf); ok {
				f, mult = v, m
			}
		}
		v, err := strconv.Atoi(f)
		if err != nil || v*mult < 4 {
			return nil, fmt.Errorf("-sizes: %q", f)
		}
		out = append(out, v*mult)
	}
	return out, nil
}

type strategy struct {
	name string
	run  func(c *engine.Comm, p *redist.Plan, src, dst []byte, dt engine.DataType) error
}

var strategies = []strategy{
	{"css", func(c *engine.Comm, p *redist.Plan, src, dst []byte, dt engine.DataType) error {
		return redist.Redistribute(c, p, src, dst, dt)
	}},
	{"alltoallv", func(c *engine.Comm, p *redist.Plan, src, dst []byte, dt engine.DataType) error {
		return redist.RedistributeAllToAllv(c, p, src, dst, dt)
	}},
	{"naive", func(c *engine.Comm, p *redist.Plan, src, dst []byte, dt engine.DataType) error {
		return redist.RedistributeNaive(c, p, src, dst, dt)
	}},
}

// maxOver is the largest of every rank's v.
func maxOver(c *engine.Comm, v float64) (float64, error) {
	b := make([]byte, 8)
	binary.NativeEndian.PutUint64(b, math.Float64bits(v))
	if err := c.AllReduce(b, b, 1, engine.Float64, engine.Max); err != nil {
		return 0, err
	}
	return math.Float64frombits(binary.NativeEndian.Uint64(b)), nil
}

func runBench(w io.Writer, cases []benchCase, sizes []int, rounds int) error {
	opts, err := engine.OptionsFromEnv(nil)
	if err != nil {
		return err
	}
	c, err := engine.NewCommFromEnv(opts)
	if err != nil {
		return err
	}
	defer c.Destroy()
	if c.Rank() == 0 {
		fmt.Fprintf(w, "| layouts (B → A) | size | method | steps (bound) | CSS | alltoallv | naive | CSS vs alltoallv | CSS vs naive |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
	}
	for _, bc := range cases {
		for _, size := range sizes {
			n := size / 4
			plan, err := redist.PlanAffine(redist.Affine{Src: bc.src, Dst: bc.dst, SrcIndex: redist.Access{A: 1}, DstIndex: redist.Access{A: 1}, N: n})
			if err != nil {
				return err
			}
			if max(plan.P, plan.Q) > c.Size() {
				return fmt.Errorf("%v → %v needs %d ranks, the job has %d", bc.src, bc.dst, max(plan.P, plan.Q), c.Size())
			}
			ns, nd := plan.Counts(c.Rank())
			src := make([]byte, 4*ns)
			for k := 0; k < ns; k++ {
				g := (k/bc.src.Block*bc.src.Procs+c.Rank())*bc.src.Block + k%bc.src.Block
				binary.NativeEndian.PutUint32(src[4*k:], uint32(g))
			}
			dst := make([]byte, 4*nd)
			times := make([][]float64, len(strategies))
			for round := 0; round < rounds+1; round++ { // round 0 warms up and checks
				for k := range strategies {
					s := strategies[(k+round)%len(strategies)]
					clear(dst)
					if err := c.Barrier(); err != nil {
						return err
					}
					t0 := time.Now()
					if err := s.run(c, plan, src, dst, engine.Float32); err != nil {
						return fmt.Errorf("%s: %w", s.name, err)
					}
					t, err := maxOver(c, time.Since(t0).Seconds())
					if err != nil {
						return err
					}
					if round == 0 {
						for q := 0; q < nd; q++ {
							g := (q/bc.dst.Block*bc.dst.Procs+c.Rank())*bc.dst.Block + q%bc.dst.Block
							if got := binary.NativeEndian.Uint32(dst[4*q:]); got != uint32(g) {
								return fmt.Errorf("%s: element %d arrived as %d", s.name, g, got)
							}
						}
						continue
					}
					times[(k+round)%len(strategies)] = append(times[(k+round)%len(strategies)], t)
				}
			}
			if c.Rank() == 0 {
				med := make([]float64, len(times))
				for i, ts := range times {
					sort.Float64s(ts)
					med[i] = ts[len(ts)/2]
				}
				fmt.Fprintf(w, "| cyclic(%d) on %d → cyclic(%d) on %d | %s | %s | %d (%d) | %.2f ms | %.2f ms | %.2f ms | %.2f× | %.2f× |\n",
					bc.src.Block, bc.src.Procs, bc.dst.Block, bc.dst.Procs, sizeText(size), plan.Method, len(plan.Steps), plan.LowerBound,
					med[0]*1e3, med[1]*1e3, med[2]*1e3, med[1]/med[0], med[2]/med[0])
			}
		}
	}
	return nil
}

func sizeText(b int) string {
	if b >= 1<<20 {
		return fmt.Sprintf("%d MiB", b>>20)
	}
	return fmt.Sprintf("%d KiB", b>>10)
}
