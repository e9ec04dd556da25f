package main

import (
	"fmt"
	"math"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// writeTables writes one table per hosts' size and message size: a row
// per rank count, a column per algorithm, time and bus bandwidth, the
// fastest in bold.
func (o *options) writeTables(md *strings.Builder, pts []point) {
	f := o.figures()
	fmt.Fprintf(md, "Allreduce (float32 sum) projected by the cost model. Network: one NIC per host of %s, %s latency, to a non-blocking switch. ", o.nicName, seconds(o.nicLatency))
	fmt.Fprintf(md, "Calibrated on this machine (topology.DefaultParams, cost.DefaultRates): shared memory %.1f GB/s and %s a message, %s software per message, folds %.0f GB/s, copies %.0f GB/s.\n\n",
		f.Links.ShmBandwidth/1e9, seconds(f.Links.ShmLatency), seconds(f.Rates.Message), f.Rates.ReduceRate/1e9, f.Rates.CopyRate/1e9)
	fmt.Fprintf(md, "Each cell: time (bus bandwidth GB/s); **bold**: the fastest; †: beyond %d ranks, projected from small clusters as the engine's choice predicts (cost.Projector, topology/cost/project.go); otherwise the walk of the whole schedule.\n\n", o.directMax)
	for _, r := range o.perHost {
		for _, b := range o.bytes {
			fmt.Fprintf(md, "**%d ranks per host, %s**\n\n| ranks | hosts |", r, size(b))
			for _, a := range o.algos {
				fmt.Fprintf(md, " %s |", a)
			}
			fmt.Fprintf(md, "\n|---:|---:|%s\n", strings.Repeat("---:|", len(o.algos)))
			for _, n := range o.ranks {
				row := make([]point, 0, len(o.algos))
				for _, p := range pts {
					if p.PerHost == r && p.Bytes == b && p.Ranks == n {
						row = append(row, p)
					}
				}
				best := 0
				for i := range row {
					if row[i].Seconds < row[best].Seconds {
						best = i
					}
				}
				fmt.Fprintf(md, "| %s | %s |", thousands(n), thousands(n/r))
				for i, p := range row {
					cell := fmt.Sprintf("%s (%s)", seconds(p.Seconds), gbps(p.BusBW))
					if p.Projected {
						cell += " †"
					}
					if i == best {
						cell = "**" + cell + "**"
					}
					fmt.Fprintf(md, " %s |", cell)
				}
				md.WriteString("\n")
			}
			md.WriteString("\n")
		}
	}
}

// writeModels writes the setup and shrink models' projections when
// measured figures were given: per variant, its note and its tables.
func writeModels(md *strings.Builder, ranks []int, m modelFile) error {
	vs, err := m.variants()
	if err != nil {
		return err
	}
	if len(vs) == 0 {
		md.WriteString("Setup and shrink: no measured figures given (-models FILE).\n")
		return nil
	}
	for _, v := range vs {
		name := ""
		if v.Name != "" {
			name = ", " + v.Name
			fmt.Fprintf(md, "### %s\n\n", v.Name)
		}
		if v.Note != "" {
			fmt.Fprintf(md, "%s\n\n", v.Note)
		}
		if err := writeVariant(md, ranks, v, name); err != nil {
			return fmt.Errorf("%s: %w", strings.TrimPrefix(name, ", "), err)
		}
	}
	return nil
}

func writeVariant(md *strings.Builder, ranks []int, v modelVariant, name string) error {
	if v.Init != nil {
		fmt.Fprintf(md, "**Setup%s** (model.go, Init)\n\n| ranks | gather | spread | connect | total |\n|---:|---:|---:|---:|---:|\n", name)
		for _, n := range ranks {
			t, err := Init(n, *v.Init)
			if err != nil {
				return err
			}
			fmt.Fprintf(md, "| %s | %s | %s | %s | %s |\n", thousands(n), seconds(t.Gather), seconds(t.Spread), seconds(t.Connect), seconds(t.Total))
		}
		md.WriteString("\n")
	}
	if v.Shrink != nil {
		fmt.Fprintf(md, "**Shrink by one rank%s** (model.go, Shrink)\n\n| ranks | detect | agree | setup | total | ballots | round trips |\n|---:|---:|---:|---:|---:|---:|---:|\n", name)
		for _, n := range ranks {
			t, err := Shrink(n, *v.Shrink)
			if err != nil {
				return err
			}
			fmt.Fprintf(md, "| %s | %s | %s | %s | %s | %d | %.1f |\n", thousands(n), seconds(t.Detect), seconds(t.Agree), seconds(t.Setup), seconds(t.Total), t.Ballots, t.RoundTrips)
		}
		md.WriteString("\n")
	}
	return nil
}

// plotModels draws the models' projections against ranks, log-log: a
// panel for setup (Init) and one for a shrink by one rank (Shrink), a
// line per variant that has that part.
func plotModels(ranks []int, m modelFile, path string) error {
	vs, err := m.variants()
	if err != nil {
		return err
	}
	var ticks []plot.Tick
	for _, n := range ranks {
		ticks = append(ticks, plot.Tick{Value: float64(n), Label: thousands(n)})
	}
	panel := func(title string, total func(n int, v modelVariant) (float64, bool, error)) (*plot.Plot, error) {
		pl := plot.New()
		pl.Title.Text = title
		pl.X.Label.Text = "ranks"
		pl.Y.Label.Text = "projected time (s)"
		pl.X.Scale, pl.Y.Scale = plot.LogScale{}, plot.LogScale{}
		pl.X.Tick.Marker, pl.Y.Tick.Marker = plot.ConstantTicks(ticks), plot.LogTicks{Prec: -1}
		for k, v := range vs {
			var xy plotter.XYs
			for _, n := range ranks {
				y, ok, err := total(n, v)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", v.Name, err)
				}
				if ok {
					xy = append(xy, plotter.XY{X: float64(n), Y: y})
				}
			}
			if len(xy) == 0 {
				continue
			}
			l, ps, err := plotter.NewLinePoints(xy)
			if err != nil {
				return nil, err
			}
			l.Color, ps.Color, ps.Shape = plotutil.Color(k), plotutil.Color(k), plotutil.Shape(k)
			pl.Add(l, ps)
			pl.Legend.Add(v.Name, l, ps)
		}
		pl.Legend.Top, pl.Legend.Left = true, true
		pl.Y.Max *= 1000 // room above the lines for the legend (log scale)
		return pl, nil
	}
	setup, err := panel("setup (Init)", func(n int, v modelVariant) (float64, bool, error) {
		if v.Init == nil {
			return 0, false, nil
		}
		t, err := Init(n, *v.Init)
		return t.Total, true, err
	})
	if err != nil {
		return err
	}
	shrink, err := panel("shrink by one rank", func(n int, v modelVariant) (float64, bool, error) {
		if v.Shrink == nil {
			return 0, false, nil
		}
		t, err := Shrink(n, *v.Shrink)
		return t.Total, true, err
	})
	if err != nil {
		return err
	}
	const w, h = 5.5 * vg.Inch, 4.2 * vg.Inch
	img := vgimg.New(2*w, h)
	rows := [][]*plot.Plot{{setup, shrink}}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(rows, tiles, draw.New(img))
	setup.Draw(canvases[0][0])
	shrink.Draw(canvases[0][1])
	return writePNG(img, path)
}

// plot draws time against ranks, log-log: a row of panels per hosts'
// size, a panel per message size, a line per algorithm.
func (o *options) plot(pts []point, path string) error {
	var rows [][]*plot.Plot
	for _, r := range o.perHost {
		var row []*plot.Plot
		for _, b := range o.bytes {
			pl := plot.New()
			pl.Title.Text = fmt.Sprintf("allreduce %s, %d ranks per host", size(b), r)
			pl.X.Label.Text = "ranks"
			pl.Y.Label.Text = "projected time (s)"
			pl.X.Scale, pl.Y.Scale = plot.LogScale{}, plot.LogScale{}
			var ticks []plot.Tick
			for _, n := range o.ranks {
				ticks = append(ticks, plot.Tick{Value: float64(n), Label: thousands(n)})
			}
			pl.X.Tick.Marker, pl.Y.Tick.Marker = plot.ConstantTicks(ticks), plot.LogTicks{Prec: -1}
			for k, a := range o.algos {
				var xy plotter.XYs
				for _, p := range pts {
					if p.Algo == a && p.PerHost == r && p.Bytes == b {
						xy = append(xy, plotter.XY{X: float64(p.Ranks), Y: p.Seconds})
					}
				}
				l, ps, err := plotter.NewLinePoints(xy)
				if err != nil {
					return err
				}
				l.Color, ps.Color, ps.Shape = plotutil.Color(k), plotutil.Color(k), plotutil.Shape(k)
				pl.Add(l, ps)
				pl.Legend.Add(a, l, ps)
			}
			pl.Legend.Top, pl.Legend.Left = true, true
			pl.Y.Max *= 100 // room above the lines for the legend (log scale)
			row = append(row, pl)
		}
		rows = append(rows, row)
	}
	const w, h = 4.2 * vg.Inch, 3.4 * vg.Inch
	img := vgimg.New(w*vg.Length(len(o.bytes)), h*vg.Length(len(o.perHost)))
	tiles := draw.Tiles{Rows: len(rows), Cols: len(o.bytes), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(rows, tiles, draw.New(img))
	for i := range rows {
		for j := range rows[i] {
			rows[i][j].Draw(canvases[i][j])
		}
	}
	return writePNG(img, path)
}

func size(b int) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}

func seconds(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.1f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

// gbps shows a bus bandwidth in GB/s with three significant digits.
func gbps(v float64) string {
	if v <= 0 || math.IsNaN(v) {
		return "0"
	}
	d := max(0, 2-int(math.Floor(math.Log10(v))))
	return fmt.Sprintf("%.*f", d, v)
}

func writePNG(img *vgimg.Canvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// thousands writes n with commas (65,536).
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
