// Command predictplot draws gocoll-topo's predictions: busbw against rank
// count, one line per algorithm, one panel per input file (an op on a
// family of built-ins), and writes the same numbers as a Markdown table.
//
//	predictplot -out build/perf/predict allreduce-cluster.json alltoall-fattree.json …
//
// Each input is the output of `gocoll-topo -predict OP -ranks … -json`.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type prediction struct {
	Ranks    int     `json:"ranks"`
	Topology string  `json:"topology"`
	Algo     string  `json:"algo"`
	Seconds  float64 `json:"seconds"`
	BusBW    float64 `json:"busbw"`
	Best     bool    `json:"best"`
}

type input struct {
	Op          string       `json:"op"`
	Bytes       int          `json:"bytes"`
	Predictions []prediction `json:"predictions"`
	title       string
}

func main() {
	out := flag.String("out", "predict", "output path without extension (.png and .md are written)")
	flag.Parse()
	if err := run(*out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "predictplot:", err)
		os.Exit(1)
	}
}

func run(out string, files []string) error {
	var ins []input
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var in input
		if err := json.Unmarshal(data, &in); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if len(in.Predictions) == 0 {
			return fmt.Errorf("%s: no predictions", f)
		}
		family, _, _ := strings.Cut(in.Predictions[0].Topology, ":")
		in.title = fmt.Sprintf("%s of %s on %s", in.Op, size(in.Bytes), family)
		ins = append(ins, in)
	}
	var md strings.Builder
	var plots [][]*plot.Plot
	for _, in := range ins {
		fmt.Fprintf(&md, "**%s** (predicted busbw GB/s; * fastest)\n\n", in.title)
		var algos []string
		var ranks []int
		for _, p := range in.Predictions {
			if !slices.Contains(algos, p.Algo) {
				algos = append(algos, p.Algo)
			}
			if !slices.Contains(ranks, p.Ranks) {
				ranks = append(ranks, p.Ranks)
			}
		}
		fmt.Fprintf(&md, "| ranks | topology |")
		for _, a := range algos {
			fmt.Fprintf(&md, " %s |", a)
		}
		fmt.Fprintf(&md, "\n|---:|---|%s\n", strings.Repeat("---:|", len(algos)))
		for _, r := range ranks {
			topo := ""
			cells := make([]string, len(algos))
			for i := range cells {
				cells[i] = "–"
			}
			for _, p := range in.Predictions {
				if p.Ranks == r {
					topo = p.Topology
					mark := ""
					if p.Best {
						mark = " *"
					}
					cells[slices.Index(algos, p.Algo)] = fmt.Sprintf("%.3f%s", p.BusBW, mark)
				}
			}
			fmt.Fprintf(&md, "| %d | %s | %s |\n", r, topo, strings.Join(cells, " | "))
		}
		fmt.Fprintln(&md)
		pl := plot.New()
		pl.Title.Text = in.title
		pl.X.Label.Text = "ranks"
		pl.Y.Label.Text = "predicted busbw (GB/s)"
		pl.X.Scale = plot.LogScale{}
		pl.X.Tick.Marker = plot.LogTicks{Prec: -1}
		for k, a := range algos {
			var pts plotter.XYs
			for _, p := range in.Predictions {
				if p.Algo == a {
					pts = append(pts, plotter.XY{X: float64(p.Ranks), Y: p.BusBW})
				}
			}
			l, ps, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			l.Color, ps.Color, ps.Shape = plotutil.Color(k), plotutil.Color(k), plotutil.Shape(k)
			pl.Add(l, ps)
			pl.Legend.Add(a, l, ps)
		}
		pl.Legend.Top = true
		pl.Y.Min = 0
		plots = append(plots, []*plot.Plot{pl})
	}
	if err := os.WriteFile(out+".md", []byte(md.String()), 0o644); err != nil {
		return err
	}
	const w, h = 6 * vg.Inch, 3.4 * vg.Inch
	img := vgimg.New(w, h*vg.Length(len(plots)))
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, draw.New(img))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(out + ".png")
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}

func size(b int) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<10:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}
