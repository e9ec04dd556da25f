// Command compareplot draws build/compare's plot with gonum.org/v1/plot: one
// log-log panel (busbw against size) per op × rank count, one line per
// library, laid out in a grid.
//
//	go run ./build/bench/compareplot plotdata.json results.png
//
// plotdata.json is written by build/bench/compare_report.py:
//
//	{"title": "...", "cols": 2, "xlabel": "size (bytes)", "ylabel": "busbw GB/s",
//	 "panels": [{"title": "allreduce np=2",
//	   "series": [{"name": "gocoll", "points": [[4096, 0.08], ...]}, ...]}, ...]}
package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type series struct {
	Name   string       `json:"name"`
	Points [][2]float64 `json:"points"`
}

type panel struct {
	Title  string   `json:"title"`
	Series []series `json:"series"`
}

type plotData struct {
	Title  string  `json:"title"`
	Cols   int     `json:"cols"`
	XLabel string  `json:"xlabel"`
	YLabel string  `json:"ylabel"`
	Panels []panel `json:"panels"`
}

// style keeps a library's colour and marker the same in every panel and
// every report, so plots of different runs can be compared by eye.
type style struct {
	color  color.Color
	shape  int
	dashed bool
}

var libStyle = map[string]style{
	"gocoll":            {plotutil.Color(0), 0, false},
	"gocoll (MemAlloc)": {plotutil.Color(0), 1, true},
	"Gloo":              {plotutil.Color(1), 2, false},
	"Open MPI":          {plotutil.Color(2), 3, false},
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: compareplot plotdata.json out.png")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "compareplot:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var d plotData
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if len(d.Panels) == 0 {
		return fmt.Errorf("%s: no panels", in)
	}
	cols := max(d.Cols, 1)
	rows := (len(d.Panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for r := range grid {
		grid[r] = make([]*plot.Plot, cols)
	}
	for i, p := range d.Panels {
		pl, err := drawPanel(p, d.XLabel, d.YLabel)
		if err != nil {
			return fmt.Errorf("panel %q: %w", p.Title, err)
		}
		grid[i/cols][i%cols] = pl
	}
	// Empty cells of the last row stay blank: plot.Align skips nil plots.
	const w, h = 5.5 * vg.Inch, 3.4 * vg.Inch
	const head = 0.4 * vg.Inch
	img := vgimg.New(w*vg.Length(cols), h*vg.Length(rows)+head)
	dc := draw.New(img)
	title := draw.TextStyle{Color: color.Black, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler,
		XAlign: draw.XCenter, YAlign: draw.YTop}
	title.Font.Size = vg.Points(12)
	dc.FillText(title, vg.Point{X: dc.Max.X / 2, Y: dc.Max.Y - vg.Millimeter*2}, d.Title)
	body := draw.Crop(dc, 0, 0, 0, -head)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, body)
	for r := range grid {
		for c, pl := range grid[r] {
			if pl != nil {
				pl.Draw(canvases[r][c])
			}
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func drawPanel(p panel, xlabel, ylabel string) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = xlabel
	pl.Y.Label.Text = ylabel
	pl.X.Scale, pl.Y.Scale = plot.LogScale{}, plot.LogScale{}
	pl.X.Tick.Marker = sizeTicks{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	pl.Add(plotter.NewGrid())
	extra := len(libStyle)
	for _, s := range p.Series {
		var pts plotter.XYs
		for _, xy := range s.Points {
			// A log axis cannot show zero or negative values; compare_report
			// leaves them out already, this keeps a hand-edited file drawable.
			if xy[0] > 0 && xy[1] > 0 {
				pts = append(pts, plotter.XY{X: xy[0], Y: xy[1]})
			}
		}
		if len(pts) == 0 {
			continue
		}
		st, ok := libStyle[s.Name]
		if !ok {
			st = style{plotutil.Color(extra), extra, false}
			extra++
		}
		l, ps, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		l.Color, ps.Color, ps.Shape = st.color, st.color, plotutil.Shape(st.shape)
		if st.dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		pl.Add(l, ps)
		pl.Legend.Add(s.Name, l, ps)
	}
	pl.Legend.Top = false
	pl.Legend.Left = true
	pl.Legend.TextStyle.Font.Size = vg.Points(8)
	return pl, nil
}

// sizeTicks labels a byte axis at powers of 4 (4 KiB, 16 KiB, ... 64 MiB),
// the sizes build/compare measures, in binary units.
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log2(lo)); e <= math.Ceil(math.Log2(hi)); e++ {
		v := math.Exp2(e)
		if v < lo || v > hi {
			continue
		}
		t := plot.Tick{Value: v}
		if int(e)%2 == 0 {
			t.Label = humanBytes(v)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

func humanBytes(v float64) string {
	switch {
	case v >= 1<<30:
		return fmt.Sprintf("%gG", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%gM", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%gK", v/(1<<10))
	}
	return fmt.Sprintf("%g", v)
}
