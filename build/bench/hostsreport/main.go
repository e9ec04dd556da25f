// Command hostsreport turns build/hosts' raw rows into results.md and
// results.png: per configuration (hosts × ranks), op and size, the median
// over rounds of every library's busbw, gocoll's ratio to Gloo, and
// gocoll's busbw as a fraction of the bounds the measured links set.
//
// raw.csv rows: config,round,label,op,np,bytes,iters,med_us,min_us,p90_us,b2b_us,algbw,busbw,check
// (the reference benchmarks' CSV with the configuration and round in front).
// links.csv rows: config,link,bytes_per_s.
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

func main() {
	raw := flag.String("raw", "", "raw.csv")
	links := flag.String("links", "", "links.csv")
	rate := flag.String("rate", "", "the tbf rate of every link (for the report; unlimited or 0: no tc)")
	meta := flag.String("meta", "", "file of lines about the run (machine, load) for the report")
	out := flag.String("out", ".", "output directory")
	flag.Parse()
	if err := run(*raw, *links, *rate, *meta, *out); err != nil {
		fmt.Fprintln(os.Stderr, "hostsreport:", err)
		os.Exit(1)
	}
}

type cell struct {
	config, op string
	bytes      int
}

func readCSV(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	return r.ReadAll()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func run(rawPath, linksPath, rate, metaPath, out string) error {
	sum, err := readRaw(rawPath)
	if err != nil {
		return err
	}
	linkRates, err := readLinks(linksPath)
	if err != nil {
		return err
	}
	var md strings.Builder
	if err := intro(&md, rate, metaPath); err != nil {
		return err
	}
	var flagged []string
	configs := []string{}
	for _, c := range sum.cells {
		if !slices.Contains(configs, c.config) {
			configs = append(configs, c.config)
		}
	}
	for _, cfg := range configs {
		flagged = append(flagged, sum.configTable(&md, cfg, median(linkRates[cfg]), linkRates[cfg])...)
	}
	if slices.Contains(sum.labels, baseLabel) {
		fmt.Fprintf(&md, "gocoll / base: busbw of this tree over that of `%s` (BASE=, the before of a before/after run, same rounds). `**`: slower than the base beyond the run-to-run spread (gocoll's median time above the base's by more than the larger of the two spreads over rounds, max/min − 1; by more than 20%% with one round).\n\n", baseLabel)
		if len(flagged) == 0 {
			fmt.Fprintf(&md, "Slower than the base beyond the spread: none.\n")
		} else {
			fmt.Fprintf(&md, "Slower than the base beyond the spread: %s.\n", strings.Join(flagged, "; "))
		}
	}
	if err := os.WriteFile(filepath.Join(out, "results.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	return plotAll(filepath.Join(out, "results.png"), configs, sum.cells, sum.labels, func(c cell, lb string) float64 { return median(sum.vals[key{c, lb}]) }, linkRates)
}

// key is one library's cell.
type key struct {
	cell
	label string
}

// summary is the raw rows gathered by cell and library, over rounds.
type summary struct {
	vals, times map[key][]float64 // busbw, median time (µs): one per round
	bad         map[key]bool      // a round's check failed
	labels      []string          // the libraries, sorted
	cells       []cell            // sorted by configuration, op, size
}

// readRaw reads build/hosts' raw.csv into a summary.
func readRaw(path string) (*summary, error) {
	recs, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	sum := &summary{vals: map[key][]float64{}, times: map[key][]float64{}, bad: map[key]bool{}}
	for _, r := range recs {
		if len(r) < 14 || r[13] == "UNSUPPORTED" {
			continue
		}
		bytes, _ := strconv.Atoi(r[5])
		med, _ := strconv.ParseFloat(r[7], 64)
		bus, _ := strconv.ParseFloat(r[12], 64)
		k := key{cell{r[0], r[3], bytes}, r[2]}
		sum.vals[k] = append(sum.vals[k], bus)
		sum.times[k] = append(sum.times[k], med)
		sum.bad[k] = sum.bad[k] || r[13] == "FAIL"
		if !slices.Contains(sum.labels, k.label) {
			sum.labels = append(sum.labels, k.label)
		}
		if !slices.Contains(sum.cells, k.cell) {
			sum.cells = append(sum.cells, k.cell)
		}
	}
	sort.Slice(sum.cells, func(i, j int) bool {
		a, b := sum.cells[i], sum.cells[j]
		if a.config != b.config {
			return a.config < b.config
		}
		if a.op != b.op {
			return a.op < b.op
		}
		return a.bytes < b.bytes
	})
	sort.Strings(sum.labels)
	return sum, nil
}

// readLinks reads links.csv: each configuration's measured link rates, GB/s.
func readLinks(path string) (map[string][]float64, error) {
	lrecs, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	rates := map[string][]float64{}
	for _, r := range lrecs[1:] {
		if v, err := strconv.ParseFloat(r[2], 64); err == nil && v > 0 {
			rates[r[0]] = append(rates[r[0]], v/1e9)
		}
	}
	return rates, nil
}

// intro writes what the report measured, and how.
func intro(md *strings.Builder, rate, metaPath string) error {
	fmt.Fprintf(md, "# gocoll vs Gloo across emulated hosts (build/hosts)\n\n")
	unlimited := rate == "unlimited" || rate == "0"
	links := fmt.Sprintf("every host link is limited to %s each way with `tc tbf`", rate)
	if unlimited {
		links = "the host links are not limited (no tc): each veth carries what the cores can push, so the CPU, not the link, is the limit"
	}
	fmt.Fprintf(md, "Hosts are network namespaces joined by a bridge; %s; ranks of one host share a tmpfs on /dev/shm, hosts share only TCP. Cells: busbw GB/s, median over rounds of each run's median iteration (barrier, then one op; the max over ranks). Float32, sum.\n\n", links)
	if unlimited {
		fmt.Fprintf(md, "Link rate L: measured before every round with every host streaming TCP to the next at once (`build/bench/tcpstream`, 1 MiB writes); L is the median over links and rounds. A CPU-bound rate drifts with the machine's load, hence the measurement per round.\n\n")
	} else {
		fmt.Fprintf(md, "Link rate L: measured in the same run with every host streaming TCP to the next at once (median over links).\n\n")
	}
	if metaPath != "" {
		b, err := os.ReadFile(metaPath)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l != "" {
				fmt.Fprintf(md, "- %s\n", l)
			}
		}
		fmt.Fprintln(md)
	}
	fmt.Fprintf(md, "Bounds: ring = L (one rank per host, or a flat ring's busiest link); hierarchical = L·(2(n−1)/n)/(2(H−1)/H) for allreduce, L·((n−1)/n)/((H−1)/H) for allgather and reduce-scatter (each host sends and receives the data once), L for broadcast.\n\n")
	return nil
}

// configTable writes one configuration's table (link rate l, measured as
// rates) and returns its cells slower than the base.
func (sum *summary) configTable(md *strings.Builder, cfg string, l float64, rates []float64) (flagged []string) {
	var h, r int
	fmt.Sscanf(cfg, "%dx%d", &h, &r)
	n := h * r
	fmt.Fprintf(md, "## %d hosts × %d ranks (n = %d), L = %.4f GB/s (links: %s)\n\n", h, r, n, l, fmtList(rates))
	fmt.Fprintf(md, "| op | size |")
	for _, lb := range sum.labels {
		fmt.Fprintf(md, " %s |", lb)
	}
	withBase := slices.Contains(sum.labels, baseLabel)
	fmt.Fprintf(md, " gocoll / Gloo | gocoll / ring bound | gocoll / hierarchical bound |")
	if withBase {
		fmt.Fprintf(md, " gocoll / base |")
	}
	fmt.Fprintf(md, "\n|---|---:|")
	for range sum.labels {
		fmt.Fprintf(md, "---:|")
	}
	fmt.Fprintf(md, "---:|---:|---:|")
	if withBase {
		fmt.Fprintf(md, "---:|")
	}
	fmt.Fprintln(md)
	for _, c := range sum.cells {
		if c.config != cfg {
			continue
		}
		fmt.Fprintf(md, "| %s | %s |", c.op, size(c.bytes))
		for _, lb := range sum.labels {
			k := key{c, lb}
			mark := ""
			if sum.bad[k] {
				mark = " (check failed)"
			}
			fmt.Fprintf(md, " %.4f (%s)%s |", median(sum.vals[k]), us(median(sum.times[k])), mark)
		}
		g := median(sum.vals[key{c, "gocoll"}])
		fmt.Fprintf(md, " %s | %s | %s |", ratio(g, median(sum.vals[key{c, "gloo"}])), ratio(g, l), ratio(g, hierBound(c.op, l, h, n)))
		if withBase {
			rb := ratio(g, median(sum.vals[key{c, baseLabel}]))
			if slower(sum.times[key{c, "gocoll"}], sum.times[key{c, baseLabel}]) {
				rb += " **"
				flagged = append(flagged, fmt.Sprintf("%s %s %s %s×", cfg, c.op, size(c.bytes), ratio(g, median(sum.vals[key{c, baseLabel}]))))
			}
			fmt.Fprintf(md, " %s |", rb)
		}
		fmt.Fprintln(md)
	}
	fmt.Fprintln(md)
	return flagged
}

// baseLabel is the label build/hosts gives the BASE= build of gocoll.
const baseLabel = "gocoll-base"

// slower says whether the times now (one median per round) are above the
// base's beyond the run-to-run spread: by more than the larger of the two
// spreads (max/min − 1), or 20 % when either has a single round.
func slower(now, base []float64) bool {
	if len(now) == 0 || len(base) == 0 {
		return false
	}
	tol := 0.2
	if len(now) > 1 && len(base) > 1 {
		tol = max(spread(now), spread(base))
	}
	return median(now) > median(base)*(1+tol)
}

func spread(v []float64) float64 {
	lo, hi := slices.Min(v), slices.Max(v)
	if lo <= 0 {
		return math.Inf(1)
	}
	return hi/lo - 1
}

func hierBound(op string, l float64, h, n int) float64 {
	if h < 2 {
		return math.NaN()
	}
	switch op {
	case "allreduce":
		return l * (2 * float64(n-1) / float64(n)) / (2 * float64(h-1) / float64(h))
	case "allgather", "reduce_scatter":
		return l * (float64(n-1) / float64(n)) / (float64(h-1) / float64(h))
	}
	return l
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func fmtList(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.4f", x))
	}
	return strings.Join(s, ", ")
}

func us(t float64) string {
	switch {
	case math.IsNaN(t):
		return "-"
	case t >= 1e6:
		return fmt.Sprintf("%.2f s", t/1e6)
	case t >= 1e3:
		return fmt.Sprintf("%.1f ms", t/1e3)
	}
	return fmt.Sprintf("%.0f µs", t)
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

// plotAll draws busbw against size, one panel per configuration and op:
// every library, and the two bounds as dashed lines.
func plotAll(path string, configs []string, cells []cell, labels []string, val func(cell, string) float64, links map[string][]float64) error {
	type panel struct{ config, op string }
	var panels []panel
	for _, c := range cells {
		p := panel{c.config, c.op}
		if !slices.Contains(panels, p) {
			panels = append(panels, p)
		}
	}
	const w, h = 6 * vg.Inch, 3.6 * vg.Inch
	var plots [][]*plot.Plot
	for _, p := range panels {
		pl := plot.New()
		pl.Title.Text = fmt.Sprintf("%s, %s hosts×ranks", p.op, p.config)
		pl.X.Label.Text = "size (bytes)"
		pl.Y.Label.Text = "busbw (GB/s)"
		pl.X.Scale = plot.LogScale{}
		pl.X.Tick.Marker = plot.LogTicks{Prec: -1}
		var hh, r int
		fmt.Sscanf(p.config, "%dx%d", &hh, &r)
		var xs []float64
		for k, lb := range labels {
			var pts plotter.XYs
			for _, c := range cells {
				if c.config == p.config && c.op == p.op {
					if v := val(c, lb); !math.IsNaN(v) {
						pts = append(pts, plotter.XY{X: float64(c.bytes), Y: v})
						xs = append(xs, float64(c.bytes))
					}
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = plotutil.Color(k), plotutil.Color(k)
			points.Shape = plotutil.Shape(k)
			pl.Add(line, points)
			pl.Legend.Add(lb, line, points)
		}
		l := median(links[p.config])
		if len(xs) > 0 && !math.IsNaN(l) {
			lo, hi := slices.Min(xs), slices.Max(xs)
			for j, b := range []struct {
				name string
				v    float64
			}{{"ring bound (link rate)", l}, {"hierarchical bound", hierBound(p.op, l, hh, hh*r)}} {
				if math.IsNaN(b.v) || (j == 1 && b.v == l) {
					continue
				}
				bl, err := plotter.NewLine(plotter.XYs{{X: lo, Y: b.v}, {X: hi, Y: b.v}})
				if err != nil {
					return err
				}
				bl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
				bl.Color = color.Gray{Y: uint8(60 + 80*j)}
				pl.Add(bl)
				pl.Legend.Add(b.name, bl)
			}
		}
		pl.Legend.Top = false
		pl.Legend.Left = false
		pl.Y.Min = 0
		plots = append(plots, []*plot.Plot{pl})
	}
	if len(plots) == 0 {
		return nil
	}
	img := vgimg.New(w, h*vg.Length(len(plots)))
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, draw.New(img))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}
