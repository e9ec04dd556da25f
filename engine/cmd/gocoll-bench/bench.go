package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/engine"
)

// config is what the flags say; the same on every rank.
type config struct {
	ops        []string
	minBytes   int64
	maxBytes   int64
	factor     int64
	iters      int
	warmup     int
	check      bool
	dt         engine.DataType
	redop      engine.RedOp
	root       int
	algo       string
	json       bool
	memalloc   bool
	breakCheck bool
	csvPath    string
	label      string
	mode       string        // how the ranks run, for the header
	setup      time.Duration // how long the communicator took to create (rank 0's; every rank's, as goroutines)
}

// sizes lists the nominal sizes -b, -b*f, ... up to -e.
func (cfg *config) sizes() []int64 {
	var out []int64
	for s := cfg.minBytes; s <= cfg.maxBytes; s *= cfg.factor {
		out = append(out, s)
		if cfg.factor <= 1 {
			break
		}
	}
	return out
}

// result is one output line (and one JSON object with -json).
type result struct {
	Op       string  `json:"op"`
	Ranks    int     `json:"ranks"`
	Mode     string  `json:"mode"`
	Bytes    int64   `json:"bytes"`
	Count    int     `json:"count"`
	Type     string  `json:"type"`
	Redop    string  `json:"redop"`
	Root     int     `json:"root"`
	Algo     string  `json:"algo"`
	Iters    int     `json:"iters"`
	P50us    float64 `json:"p50_us"`
	P90us    float64 `json:"p90_us"`
	P99us    float64 `json:"p99_us"`
	MinUs    float64 `json:"min_us"`
	MeanUs   float64 `json:"mean_us"`
	AlgBW    float64 `json:"algbw_GBps"`
	BusBW    float64 `json:"busbw_GBps"`
	B2BUs    float64 `json:"b2b_us"`
	B2BBusBW float64 `json:"b2b_busbw_GBps"`
	Wrong    int64   `json:"wrong"` // -1: not checked
}

// runRank runs the whole benchmark on one rank. Only rank 0 writes to out
// (and the CSV file). It returns the number of wrong elements over all ranks.
func runRank(c *engine.Comm, cfg *config, out, errOut io.Writer) (totalWrong int64, err error) {
	rank, n := c.Rank(), c.Size()
	if cfg.root < 0 || cfg.root >= n {
		return 0, fmt.Errorf("-root %d out of range for %d ranks", cfg.root, n)
	}
	var maxBuf int64
	for _, s := range cfg.sizes() {
		maxBuf = max(maxBuf, s)
	}
	send, recv, free, err := buffers(c, cfg, int(maxBuf))
	if err != nil {
		return 0, err
	}
	defer free()
	var csv *os.File
	if rank == 0 && cfg.csvPath != "" {
		if csv, err = os.OpenFile(cfg.csvPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
			return 0, err
		}
		defer csv.Close()
	}
	for _, op := range cfg.ops {
		if rank == 0 && !cfg.json {
			header(out, cfg, op, n)
		}
		var busSum float64
		var lines int
		var opWrong int64
		for _, nominal := range cfg.sizes() {
			cs, ok, err := newCase(c, cfg, op, nominal, send, recv)
			if err != nil {
				return totalWrong, err
			}
			if !ok {
				continue
			}
			res, err := measure(c, cfg, cs, errOut)
			if err != nil {
				return totalWrong, fmt.Errorf("%s %d bytes: %w", op, cs.bytes, err)
			}
			if res.Wrong > 0 {
				opWrong += res.Wrong
			}
			if rank != 0 {
				continue
			}
			busSum += res.BusBW
			lines++
			if cfg.json {
				b, _ := json.Marshal(res)
				fmt.Fprintf(out, "%s\n", b)
			} else {
				line(out, res)
			}
			if csv != nil {
				check := "ok"
				if res.Wrong > 0 {
					check = "FAIL"
				} else if res.Wrong < 0 {
					check = "unchecked"
				}
				fmt.Fprintf(csv, "%s,%s,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%s\n", cfg.label, csvOpName(op), n,
					res.Bytes, res.Iters, res.P50us, res.MinUs, res.P90us, res.B2BUs, res.AlgBW, res.BusBW, check)
			}
		}
		totalWrong += opWrong
		if rank == 0 && !cfg.json {
			status := "OK"
			if opWrong > 0 {
				status = "FAILED"
			}
			wrongText := fmt.Sprint(opWrong)
			if !cfg.check {
				wrongText, status = "N/A", "(not checked, use -c)"
			}
			fmt.Fprintf(out, "# Out of bounds values : %s %s\n", wrongText, status)
			avg := 0.0
			if lines > 0 {
				avg = busSum / float64(lines)
			}
			fmt.Fprintf(out, "# Avg bus bandwidth    : %.4g GB/s\n#\n", avg)
		}
	}
	return totalWrong, nil
}

// csvOpName uses the reference benches' names (../shared/bench).
func csvOpName(op string) string {
	if op == "reducescatter" {
		return "reduce_scatter"
	}
	return op
}

func buffers(c *engine.Comm, cfg *config, n int) (send, recv []byte, free func(), err error) {
	n = max(n, 64)
	if !cfg.memalloc {
		return make([]byte, n), make([]byte, n), func() {}, nil
	}
	if send, err = c.MemAlloc(n); err != nil {
		return nil, nil, nil, err
	}
	if recv, err = c.MemAlloc(n); err != nil {
		c.MemFree(send)
		return nil, nil, nil, err
	}
	return send, recv, func() { c.MemFree(send); c.MemFree(recv) }, nil
}

// measure checks (with -c) and times one case. Timing follows the
// reference benches: per iteration a barrier, then one op timed on every
// rank; the iteration's time is the maximum over ranks (an AllReduce Max
// of the per-rank float64 times), p50/p99 over iterations. Then the same
// number of iterations back to back after one barrier: elapsed/iters, max
// over ranks (nccl-tests' figure).
func measure(c *engine.Comm, cfg *config, cs *opCase, errOut io.Writer) (*result, error) {
	n := c.Size()
	res := &result{Op: cs.op, Ranks: n, Mode: cfg.mode, Bytes: cs.bytes, Count: cs.count, Type: cfg.dt.String(),
		Redop: "none", Root: -1, Algo: cfg.algo, Iters: cfg.iters, Wrong: -1}
	if usesRedop(cs.op) {
		res.Redop = cfg.redop.String()
	}
	if usesRoot(cs.op) {
		res.Root = cfg.root
	}
	if res.Algo == "" {
		res.Algo = "auto"
	}
	if cfg.check {
		k := &checker{dt: cfg.dt, rank: c.Rank(), what: fmt.Sprintf("%s %d bytes", cs.op, cs.bytes), log: errOut, breakExpect: cfg.breakCheck}
		wrong, err := cs.check(k)
		if err != nil {
			return nil, err
		}
		w := make([]byte, 8)
		binary.NativeEndian.PutUint64(w, uint64(wrong))
		if err := c.AllReduce(w, w, 1, engine.Int64, engine.Sum); err != nil {
			return nil, err
		}
		res.Wrong = int64(binary.NativeEndian.Uint64(w))
	}
	for i := 0; i < cfg.warmup; i++ {
		if err := cs.run(); err != nil {
			return nil, err
		}
	}
	iters := cfg.iters
	times := make([]byte, 8*iters)
	for i := 0; i < iters; i++ {
		if err := c.Barrier(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := cs.run(); err != nil {
			return nil, err
		}
		putF64(times, i, time.Since(t0).Seconds())
	}
	if err := c.AllReduce(times, times, iters, engine.Float64, engine.Max); err != nil {
		return nil, err
	}
	if err := c.Barrier(); err != nil {
		return nil, err
	}
	t0 := time.Now()
	for i := 0; i < iters; i++ {
		if err := cs.run(); err != nil {
			return nil, err
		}
	}
	b2b := make([]byte, 8)
	putF64(b2b, 0, time.Since(t0).Seconds()/float64(iters))
	if err := c.AllReduce(b2b, b2b, 1, engine.Float64, engine.Max); err != nil {
		return nil, err
	}
	v := make([]float64, iters)
	var sum float64
	for i := range v {
		v[i] = getF64(times, i)
		sum += v[i]
	}
	sort.Float64s(v)
	p50 := v[iters/2]
	if iters%2 == 0 {
		p50 = (v[iters/2-1] + v[iters/2]) / 2
	}
	res.P50us = p50 * 1e6
	res.P90us = percentile(v, 0.90) * 1e6
	res.P99us = percentile(v, 0.99) * 1e6
	res.MinUs = v[0] * 1e6
	res.MeanUs = sum / float64(iters) * 1e6
	res.B2BUs = getF64(b2b, 0) * 1e6
	if p50 > 0 {
		res.AlgBW = float64(cs.bytes) / p50 / 1e9
		res.BusBW = res.AlgBW * cs.factor
	}
	if res.B2BUs > 0 {
		res.B2BBusBW = float64(cs.bytes) / (res.B2BUs / 1e6) / 1e9 * cs.factor
	}
	return res, nil
}

// percentile: nearest rank on sorted v.
func percentile(v []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(v)))) - 1
	return v[min(max(i, 0), len(v)-1)]
}

func putF64(b []byte, i int, f float64) {
	binary.NativeEndian.PutUint64(b[8*i:], math.Float64bits(f))
}

func getF64(b []byte, i int) float64 {
	return math.Float64frombits(binary.NativeEndian.Uint64(b[8*i:]))
}

func header(w io.Writer, cfg *config, op string, n int) {
	algo := cfg.algo
	if algo == "" {
		algo = "auto"
	}
	bufs := "Go heap"
	if cfg.memalloc {
		bufs = "Comm.MemAlloc"
	}
	check := "off"
	if cfg.check {
		check = "on"
	}
	fmt.Fprintf(w, "# gocoll-bench %s: %d ranks (%s), type %s", op, n, cfg.mode, cfg.dt)
	if usesRedop(op) {
		fmt.Fprintf(w, ", redop %s", cfg.redop)
	}
	if usesRoot(op) {
		fmt.Fprintf(w, ", root %d", cfg.root)
	}
	fmt.Fprintf(w, "\n# iters %d, warmup %d, check %s, algo %s, buffers %s\n", cfg.iters, cfg.warmup, check, algo, bufs)
	if cfg.setup > 0 {
		fmt.Fprintf(w, "# setup: %.3f s (creating the communicator)\n", cfg.setup.Seconds())
	}
	fmt.Fprintf(w, "# time: p50/p99 over iterations of (barrier; one op), iteration = max over ranks; b2b: back-to-back average\n")
	fmt.Fprintf(w, "# size = %s\n#\n", sizeMeaning(op))
	fmt.Fprintf(w, "#%11s %11s %9s %6s %5s %10s %10s %11s %11s %7s %10s %11s\n",
		"size(B)", "count", "type", "redop", "root", "p50(us)", "p99(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "b2b(us)", "b2b-busbw")
}

func sizeMeaning(op string) string {
	switch op {
	case "allgather":
		return "gathered output bytes"
	case "reducescatter":
		return "input bytes per rank"
	case "alltoall", "alltoallv":
		return "send buffer bytes per rank"
	}
	return "buffer bytes"
}

func line(w io.Writer, r *result) {
	wrong := "N/A"
	if r.Wrong >= 0 {
		wrong = fmt.Sprint(r.Wrong)
	}
	fmt.Fprintf(w, " %11d %11d %9s %6s %5d %10.1f %10.1f %11.3f %11.3f %7s %10.1f %11.3f\n",
		r.Bytes, r.Count, r.Type, r.Redop, r.Root, r.P50us, r.P99us, r.AlgBW, r.BusBW, wrong, r.B2BUs, r.B2BBusBW)
}

// parseSize accepts 4096, 4K, 64KiB, 1M, 1MB, 2G (binary multiples).
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q (want e.g. 4096, 64K, 1M)", s)
	}
	return int64(v * float64(mult)), nil
}
