package cost

import (
	"fmt"
	"math"
	"sort"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
)

// Sample is one measured run the model is held to: a collective and
// algorithm on H hosts of R ranks joined by NICs of NIC bytes/s, a vector
// of Bytes (nccl-tests size), and the measured median time.
type Sample struct {
	Coll     sched.Coll
	Algo     string
	Hosts    int
	PerHost  int
	NIC      float64 // bytes/s; 0 for one host
	Bytes    int
	Measured float64 // seconds
}

// Figures are everything the model is calibrated with.
type Figures struct {
	Links topology.Params
	Rates Rates
}

// DefaultFigures are the calibrated defaults.
func DefaultFigures() Figures { return Figures{topology.DefaultParams(), DefaultRates()} }

// Model is the model of g with f's rates (g's links are the caller's:
// built with f.Links, or another graph priced at these rates).
func (f Figures) Model(g *topology.Graph) *Model {
	r := f.Rates
	return &Model{Graph: g, ReduceRate: r.ReduceRate, CopyRate: r.CopyRate, Call: r.Call, Message: r.Message}
}

// Result is a sample with its prediction.
type Result struct {
	Sample
	Predicted float64
}

// Error is predicted/measured - 1.
func (r Result) Error() float64 { return r.Predicted/r.Measured - 1 }

// Evaluate predicts every sample with f, building each sample's schedule
// from the entry of schedules with its name (engine.Schedules).
func Evaluate(samples []Sample, f Figures, schedules []sched.Entry) ([]Result, error) {
	out := make([]Result, 0, len(samples))
	for _, s := range samples {
		p := f.Links
		if s.NIC > 0 {
			p.NICBandwidth = s.NIC
		}
		hosts := make([][]int, s.Hosts)
		for h := range hosts {
			for l := 0; l < s.PerHost; l++ {
				hosts[h] = append(hosts[h], h*s.PerHost+l)
			}
		}
		g, err := topology.ForPlacement(hosts, p)
		if err != nil {
			return nil, err
		}
		e, err := sched.Find(schedules, s.Coll, s.Algo)
		if err != nil {
			return nil, err
		}
		n := s.Hosts * s.PerHost
		count := s.Bytes / 4
		if s.Coll == sched.AllGather || s.Coll == sched.ReduceScatter || s.Coll == sched.AllToAll {
			count /= n
		}
		params := sched.Params{Coll: s.Coll, N: n, ElemSize: 4, Count: count}
		if e.Hosts {
			params.Hosts = hosts
		}
		sch, err := e.Build(params)
		if err != nil {
			return nil, err
		}
		pr, err := f.Model(g).Predict(sch)
		if err != nil {
			return nil, err
		}
		out = append(out, Result{s, pr.Seconds})
	}
	return out, nil
}

// Summary is the spread of the model's error over a set of results: the
// median and the 90th percentile of |error|, and the worst.
type Summary struct {
	Median, P90, Worst float64
	N                  int
}

// Summarize reports the error spread of rs.
func Summarize(rs []Result) Summary {
	var e []float64
	for _, r := range rs {
		e = append(e, math.Abs(r.Error()))
	}
	if len(e) == 0 {
		return Summary{}
	}
	sort.Float64s(e)
	return Summary{Median: e[len(e)/2], P90: e[min(len(e)-1, len(e)*9/10)], Worst: e[len(e)-1], N: len(e)}
}

// Fit adjusts the shared-memory and network latencies and bandwidths, the
// core's rates and the software costs to the samples, by coordinate
// descent on the mean squared log error (so a 4 KiB sample counts as much
// as a 16 MiB one), building each sample's schedule as Evaluate does. The
// NIC bandwidth of each sample is what its links were limited to and is
// not fitted.
func Fit(samples []Sample, start Figures, schedules []sched.Entry) (Figures, error) {
	loss := func(f Figures) float64 {
		rs, err := Evaluate(samples, f, schedules)
		if err != nil {
			return math.Inf(1)
		}
		s := 0.0
		for _, r := range rs {
			d := math.Log(r.Predicted / r.Measured)
			s += d * d
		}
		return s / float64(len(rs))
	}
	knobs := []*float64{}
	f := start
	knobs = append(knobs, &f.Links.ShmBandwidth, &f.Links.ShmLatency, &f.Links.NICLatency,
		&f.Rates.ReduceRate, &f.Rates.CopyRate, &f.Rates.Call, &f.Rates.Message)
	best := loss(f)
	if math.IsInf(best, 1) {
		_, err := Evaluate(samples, f, schedules)
		return start, err
	}
	for step := 0.5; step > 0.01; step /= 2 {
		for improved := true; improved; {
			improved = false
			for _, k := range knobs {
				for _, mult := range []float64{1 + step, 1 / (1 + step)} {
					old := *k
					*k = old * mult
					if l := loss(f); l < best {
						best, improved = l, true
					} else {
						*k = old
					}
				}
			}
		}
	}
	return f, nil
}

// String shows a result.
func (r Result) String() string {
	return fmt.Sprintf("%s %s %dx%d %d B: measured %.1f µs, predicted %.1f µs (%+.0f%%)", r.Coll, r.Algo, r.Hosts, r.PerHost, r.Bytes, r.Measured*1e6, r.Predicted*1e6, r.Error()*100)
}
