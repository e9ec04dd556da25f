package main

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
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
	for name, svg := range map[string]string{
		"loss.svg": lossSVG(runs, "Training loss (global minibatch) against samples seen", "samples seen",
			func(p CurvePoint) float64 { return float64(p.Samples) }),
		"loss-time.svg": lossSVG(runs, "Training loss against training time (rank 0's clock)", "seconds",
			func(p CurvePoint) float64 { return p.Seconds }),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(svg), 0o644); err != nil {
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
	fmt.Fprintf(&b, "Model: MLP with hidden layers %v (%d float64 parameters), built and differentiated with Gorgonia v0.9.18; "+
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
// the samples seen, one line per run. The lines lie on top of each other
// when data parallelism changes nothing but the speed, so they are drawn
// from wide and pale to thin and dashed.
func lossSVG(runs []*RunResult, title, xlabel string, xof func(CurvePoint) float64) string {
	const W, H = 760, 440
	const left, right, top, bottom = 70, 170, 40, 60
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	type series struct {
		label string
		xs    []float64
		ys    []float64
	}
	var all []series
	xmax, ymax, ymin := 1.0, 0.0, math.Inf(1)
	for _, r := range runs {
		s := series{label: r.short()}
		bin := max(1, (len(r.Curve)+119)/120)
		for i := 0; i < len(r.Curve); i += bin {
			j := min(i+bin, len(r.Curve))
			sum := 0.0
			for _, p := range r.Curve[i:j] {
				sum += p.Loss
			}
			x, y := xof(r.Curve[j-1]), sum/float64(j-i)
			s.xs, s.ys = append(s.xs, x), append(s.ys, y)
			xmax, ymax, ymin = math.Max(xmax, x), math.Max(ymax, y), math.Min(ymin, y)
		}
		all = append(all, s)
	}
	if math.IsInf(ymin, 1) {
		ymin, ymax = 0, 1
	}
	ymin = math.Max(0, ymin-0.05*(ymax-ymin))
	if ymax <= ymin {
		ymax = ymin + 1
	}
	px := func(x float64) float64 { return float64(left) + x/xmax*pw }
	py := func(y float64) float64 { return float64(top) + (1-(y-ymin)/(ymax-ymin))*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", left, html.EscapeString(title))
	for _, t := range niceTicks(0, xmax, 6) {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e5e5e5"/>`+"\n", x, top, x, H-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, H-bottom+18, tickLabel(t))
	}
	for _, t := range niceTicks(ymin, ymax, 6) {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, y, W-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, tickLabel(t))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#444"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(left)+pw/2, H-18, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">loss</text>`+"\n", float64(top)+ph/2, float64(top)+ph/2)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"}
	for i, s := range all {
		width := math.Max(1.2, 7-2.2*float64(i))
		opacity := math.Min(1, 0.35+0.3*float64(i))
		dash := ""
		if i >= 2 {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for k := range s.xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[k]), py(s.ys[k])))
		}
		c := colors[i%len(colors)]
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" stroke-opacity="%.2f" stroke-linejoin="round"%s points="%s"/>`+"\n",
			c, width, opacity, dash, strings.Join(pts, " "))
		ly := top + 20 + 22*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%.1f" stroke-opacity="%.2f"%s/>`+"\n",
			W-right+14, ly, W-right+44, ly, c, width, opacity, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", W-right+50, ly+4, html.EscapeString(s.label))
	}
	// Where a migration happened, on the x axis of this plot.
	for _, r := range runs {
		if m := r.Migration; m != nil && m.Step > 0 && m.Step <= len(r.Curve) {
			x := px(xof(r.Curve[m.Step-1]))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d62728" stroke-dasharray="3 3"/>`+"\n", x, top, x, H-bottom)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#d62728">migration %d→%d</text>`+"\n", x+4, top+14, m.From, m.To)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceTicks returns about n round values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	span := hi - lo
	if span <= 0 || n < 1 {
		return []float64{lo}
	}
	step := math.Pow(10, math.Floor(math.Log10(span/float64(n))))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if span/(step*m) <= float64(n) {
			step *= m
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, t)
	}
	return out
}

func tickLabel(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
