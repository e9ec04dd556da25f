package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WriteReport writes report.md, loss.svg, loss-time.svg and results.json into dir for the
// runs (one per rank count) and returns the path of report.md.
func WriteReport(dir string, runs []*RunResult, cmdline string, elapsed time.Duration) (string, error) {
	if len(runs) == 0 {
		return "", fmt.Errorf("report: no runs")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	for _, f := range []struct {
		name, title, xlabel string
		x                   func(CurvePoint) float64
	}{
		{"loss.svg", "Training loss (global minibatch) against samples seen", "samples seen",
			func(p CurvePoint) float64 { return float64(p.Samples) }},
		{"loss-time.svg", "Training loss against training time (rank 0's clock)", "seconds",
			func(p CurvePoint) float64 { return p.Seconds }},
	} {
		svg, err := lossSVG(runs, f.title, f.xlabel, f.x)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(svg), 0o644); err != nil {
			return "", fmt.Errorf("report: %w", err)
		}
	}
	js, err := json.Marshal(runs)
	if err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644); err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	path := filepath.Join(dir, "report.md")
	if err := os.WriteFile(path, []byte(reportMarkdown(runs, cmdline, elapsed)), 0o644); err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	return path, nil
}

func reportMarkdown(runs []*RunResult, cmdline string, elapsed time.Duration) string {
	var b strings.Builder
	r0 := runs[0]
	fmt.Fprintf(&b, "# Data-parallel minibatch SGD with gocoll\n\n")
	fmt.Fprintf(&b, "`%s` — %s, total %s.\n\n", cmdline, time.Now().Format("2006-01-02 15:04"), elapsed.Round(time.Second))
	fmt.Fprintf(&b, "Model: MLP with hidden layers %v (%d float64 parameters), defined as a Gorgonia v0.9.18 graph, gradients by a hand-written pass equal to it bit for bit; "+
		"momentum SGD (learning rate %g, momentum %g) through the `DataParallel` solver wrapper; global batch %d; seed %d; "+
		"%d training and %d test examples of %s. Every rank computes the gradient of the mean loss over its equal shard of each global batch; "+
		"gocoll averages the shards' gradients (allreduce, in buckets, overlapped with packing and with loading the next batch), so each step "+
		"applies the gradient of the mean loss over the whole global batch, whatever the number of ranks.\n\n",
		r0.Hidden, r0.Params, r0.LR, r0.Momentum, r0.Batch, r0.Seed, r0.TrainN, r0.TestN, r0.Data)
	oversub := false
	for _, r := range runs {
		oversub = oversub || r.Ranks > runtime.NumCPU()
	}
	fmt.Fprintf(&b, "Machine: %d CPUs, %s/%s, %s.", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	if oversub {
		fmt.Fprintf(&b, " Runs with more ranks than CPUs oversubscribe the machine: there, extra ranks cannot add compute, and the samples/s show the cost of synchronisation rather than a speed-up.")
	}
	b.WriteString("\n\n## Summary\n\n")
	b.WriteString("| ranks | ranks are | transport | final test accuracy | final test loss | samples/s | vs 1 rank | allreduce share of step | allreduce in flight | MB allreduced per step | buckets |\n")
	b.WriteString("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var base *RunResult
	for _, r := range runs {
		if r.Ranks == 1 {
			base = r
		}
	}
	for _, r := range runs {
		speed := "—"
		if base != nil && base.SamplesPerSec > 0 {
			speed = fmt.Sprintf("%.2f×", r.SamplesPerSec/base.SamplesPerSec)
		}
		inflight := 0.0
		if r.TrainSeconds > 0 {
			inflight = r.Stats.InFlightSec / r.TrainSeconds
		}
		transport := r.Transport
		if r.Ranks == 1 {
			transport = "" // nothing to talk to
		}
		who := strconv.Itoa(r.Ranks)
		if r.Virtual > 0 {
			who = r.short()
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.4f | %.4f | %.0f | %s | %.1f%% | %.1f%% | %.2f | %d |\n",
			who, r.Mode, orDash(transport), r.TestAcc, r.TestLoss, r.SamplesPerSec, speed,
			100*r.CommShare, 100*inflight, r.Stats.MBPerStep, r.Buckets)
	}
	b.WriteString("\n*allreduce share of step*: time a rank spent packing gradients, waiting for the allreduce and unpacking, " +
		"over its training time. *allreduce in flight*: time from issuing the first bucket to finishing the last, " +
		"over the training time (the part above the share was hidden behind other work).\n")

	b.WriteString("\n## Same result, different speed\n\n![loss against samples seen](loss.svg)\n\n" +
		"Against samples seen the runs draw one curve: each step applies the same global-batch gradient whatever the rank count. " +
		"Against time they differ only in speed:\n\n![loss against training time](loss-time.svg)\n\n")
	if base != nil {
		for _, r := range runs {
			if r == base {
				continue
			}
			d, n := curveDiff(base.Curve, r.Curve)
			fmt.Fprintf(&b, "- %d ranks: the global-batch loss of each of %d steps differs from the 1-rank run's by at most %.2g; "+
				"final test accuracy %+.4f.\n", r.Ranks, n, d, r.TestAcc-base.TestAcc)
		}
	}
	for _, r := range runs {
		if r.Check != "" {
			fmt.Fprintf(&b, "- -check, %d ranks: %s\n", r.Ranks, r.Check)
		}
	}
	b.WriteString(virtualSection(runs))
	b.WriteString("\n## Per epoch\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "\n### %s (%s)\n\n", r.short(), r.Mode)
		b.WriteString("| epoch | samples seen | train loss | test loss | test accuracy | seconds | samples/s | communication s | compute s |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, e := range r.Epochs {
			fmt.Fprintf(&b, "| %d | %d | %.4f | %.4f | %.4f | %.2f | %.0f | %.2f | %.2f |\n",
				e.Epoch, e.Samples, e.TrainLoss, e.TestLoss, e.TestAcc, e.Seconds, e.SamplesPerSec, e.CommSeconds, e.ComputeSecs)
		}
		s := r.Stats
		fmt.Fprintf(&b, "\nRank 0 over %d steps: compute %.2fs (of which solver update %.2fs), pack+issue %.2fs, wait %.2fs, unpack %.2fs; allreduce in flight %.2fs.\n",
			s.Steps, s.ComputeSec, s.UpdateSec, s.PackSec, s.WaitSec, s.UnpackSec, s.InFlightSec)
	}
	return b.String()
}

// curveDiff is the largest difference between the losses of the same step.
func curveDiff(a, b []CurvePoint) (float64, int) {
	n := min(len(a), len(b))
	d := 0.0
	for i := 0; i < n; i++ {
		d = math.Max(d, math.Abs(a[i].Loss-b[i].Loss))
	}
	return d, n
}

// short names a run in legends: "4 ranks", or "8 virt. on 4→2".
func (r *RunResult) short() string {
	switch {
	case r.Virtual == 0:
		return fmt.Sprintf("%d rank%s", r.Ranks, plural(r.Ranks))
	case r.Migration != nil:
		return fmt.Sprintf("%d virt. on %d→%d", r.Virtual, r.Migration.From, r.Migration.To)
	}
	return fmt.Sprintf("%d virt. on %d", r.Virtual, r.Ranks)
}

// virtualSection compares runs on virtual devices: their losses must agree
// to the bit whatever the placement, migration or not.
func virtualSection(runs []*RunResult) string {
	var vs []*RunResult
	for _, r := range runs {
		if r.Virtual > 0 {
			vs = append(vs, r)
		}
	}
	if len(vs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n## Virtual devices\n\n")
	fmt.Fprintf(&b, "Each run trains on %d virtual devices (vppu), each with its own parameters and momentum and its own shard of every global batch; "+
		"the virtual allreduce folds the devices' gradients in device order, so the numbers do not depend on how many processes host the devices.\n\n", vs[0].Virtual)
	base := vs[0]
	for _, r := range vs {
		if m := r.Migration; m != nil {
			fmt.Fprintf(&b, "- %s: before step %d (after %d samples) the devices moved from %d to %d processes in %.1f ms, carrying %.2f MB of parameters and momentum; the processes left without devices exited.\n",
				r.short(), m.Step, m.Step*r.Batch, m.From, m.To, 1e3*m.Seconds, float64(m.Bytes)/1e6)
		}
		if r == base {
			continue
		}
		same := 0
		for i := range min(len(r.Curve), len(base.Curve)) {
			if r.Curve[i].Loss == base.Curve[i].Loss {
				same++
			}
		}
		verdict := "identical to the bit"
		if same != len(base.Curve) || len(r.Curve) != len(base.Curve) || r.TestAcc != base.TestAcc || r.TestLoss != base.TestLoss {
			verdict = "NOT identical"
		}
		fmt.Fprintf(&b, "- %s against %s: %d of %d step losses equal bit for bit; final test loss %.17g vs %.17g, accuracy %.4f vs %.4f: %s.\n",
			r.short(), base.short(), same, len(base.Curve), r.TestLoss, base.TestLoss, r.TestAcc, base.TestAcc, verdict)
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// lossSVG plots the global-batch loss (averaged over bins of steps) against
// x for every run, one line per run, with a dashed marker where a run
// migrated. Runs that train identically draw on top of one another, so the
// earlier lines are wider and fainter to stay visible underneath.
func lossSVG(runs []*RunResult, title, xlabel string, xof func(CurvePoint) float64) (string, error) {
	pl := plot.New()
	pl.Title.Text = title
	pl.X.Label.Text = xlabel
	pl.Y.Label.Text = "loss"
	pl.X.Min, pl.Y.Min = 0, 0
	pl.Add(plotter.NewGrid())
	pl.Legend.Top = true
	for i, r := range runs {
		var pts plotter.XYs
		bin := max(1, (len(r.Curve)+119)/120)
		for k := 0; k < len(r.Curve); k += bin {
			j := min(k+bin, len(r.Curve))
			sum := 0.0
			for _, p := range r.Curve[k:j] {
				sum += p.Loss
			}
			pts = append(pts, plotter.XY{X: xof(r.Curve[j-1]), Y: sum / float64(j-k)})
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return "", fmt.Errorf("report: %s: %w", r.short(), err)
		}
		c := plotutil.Color(i)
		alpha := math.Min(1, 0.35+0.3*float64(i))
		r8, g8, b8, _ := c.RGBA()
		l.Color = color.NRGBA{uint8(r8 >> 8), uint8(g8 >> 8), uint8(b8 >> 8), uint8(255 * alpha)}
		l.Width = vg.Points(math.Max(1.2, 7-2.2*float64(i)))
		if i >= 2 {
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
		}
		pl.Add(l)
		pl.Legend.Add(r.short(), l)
	}
	for _, r := range runs {
		if m := r.Migration; m != nil && m.Step > 0 && m.Step <= len(r.Curve) {
			x := xof(r.Curve[m.Step-1])
			vline, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: yMax(runs)}})
			if err != nil {
				return "", err
			}
			vline.Color = plotutil.Color(3)
			vline.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
			label, err := plotter.NewLabels(plotter.XYLabels{
				XYs:    []plotter.XY{{X: x, Y: yMax(runs)}},
				Labels: []string{fmt.Sprintf(" migration %d→%d", m.From, m.To)},
			})
			if err != nil {
				return "", err
			}
			label.TextStyle[0].Color = vline.Color
			pl.Add(vline, label)
		}
	}
	var b bytes.Buffer
	c := vgsvg.New(7.6*vg.Inch, 4.4*vg.Inch)
	pl.Draw(draw.New(c))
	if _, err := c.WriteTo(&b); err != nil {
		return "", fmt.Errorf("report: %w", err)
	}
	return b.String(), nil
}

// yMax is the highest loss any run recorded: the top of the migration marker.
func yMax(runs []*RunResult) float64 {
	y := 0.0
	for _, r := range runs {
		for _, p := range r.Curve {
			y = math.Max(y, p.Loss)
		}
	}
	return y
}
