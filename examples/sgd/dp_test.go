package main

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/gocoll/gocoll/engine"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// trainLocal trains with n goroutine ranks and returns every rank's result.
func trainLocal(t *testing.T, n int, opts engine.Options, train, test *Dataset, cfg Config) []*RunResult {
	t.Helper()
	comms, err := engine.NewLocalComms(n, opts)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]*RunResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r], errs[r] = Train(c, train, test, cfg, nil)
			if errs[r] != nil {
				c.Abort()
			}
		}()
	}
	wg.Wait()
	for _, c := range comms {
		c.Destroy()
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%d ranks: %v", n, err)
	}
	return res
}

// assertEquivalent checks the two properties of data parallelism: all ranks
// hold bitwise-identical parameters, and they match the 1-rank run within
// tol relative.
func assertEquivalent(t *testing.T, multi []*RunResult, single *RunResult, tol float64) {
	t.Helper()
	for r := 1; r < len(multi); r++ {
		for k := range multi[0].params {
			for i, v := range multi[r].params[k] {
				if math.Float64bits(v) != math.Float64bits(multi[0].params[k][i]) {
					t.Fatalf("rank %d parameter %d[%d] = %v, rank 0 has %v: replicas diverged", r, k, i, v, multi[0].params[k][i])
				}
			}
		}
	}
	d, err := relDiff(multi[0].params, single.params)
	if err != nil {
		t.Fatal(err)
	}
	steps := multi[0].Stats.Steps
	t.Logf("%d ranks vs 1 rank after %d steps: max relative parameter difference %.3g", len(multi), steps, d)
	if steps < 50 {
		t.Fatalf("only %d steps; the test wants at least 50", steps)
	}
	if !(d <= tol) {
		t.Fatalf("%d ranks differ from 1 rank by %.3g relative (> %g)", len(multi), d, tol)
	}
	if ld, _ := curveDiff(single.Curve, multi[0].Curve); ld > 1e-9 {
		t.Fatalf("global-batch losses differ by %g", ld)
	}
	// The parameters moved: the test would pass trivially otherwise.
	if first, last := single.Curve[0].Loss, single.Curve[len(single.Curve)-1].Loss; !(last < 0.7*first) {
		t.Fatalf("loss went from %g to %g: not learning", first, last)
	}
}

func TestDataParallelMatchesOneRankSynthetic(t *testing.T) {
	all := Synthetic(2048+512, 24, 5, 7)
	train, test := all.Slice(0, 2048), all.Slice(2048, 2560)
	cases := []struct {
		name   string
		ranks  int
		batch  int
		algo   string
		bucket int
	}{
		{"4ranks", 4, 64, "", 0},
		{"4ranks/ring/small-buckets", 4, 64, "allreduce=ring", 1 << 10}, // buckets cut across tensors
		{"4ranks/hd", 4, 64, "allreduce=hd", 1 << 10},
		{"4ranks/rd", 4, 64, "allreduce=rd", 0},
		{"3ranks", 3, 96, "", 512},
		{"2ranks", 2, 64, "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Hidden: []int{16}, Batch: tc.batch, Epochs: 2, LR: 0.05, Momentum: 0.9, Seed: 3, BucketBytes: tc.bucket}
			if steps := cfg.Epochs * train.N / cfg.Batch; steps < 50 {
				cfg.Epochs = (50*cfg.Batch + train.N - 1) / train.N
			}
			single := trainLocal(t, 1, engine.Options{}, train, test, cfg)[0]
			multi := trainLocal(t, tc.ranks, engine.Options{Algo: tc.algo}, train, test, cfg)
			if tc.bucket > 0 && multi[0].Buckets < 3 {
				t.Fatalf("%d buckets; the case wants several", multi[0].Buckets)
			}
			assertEquivalent(t, multi, single, 1e-5)
			if multi[0].TestAcc != single.TestAcc {
				t.Errorf("test accuracy %v on %d ranks, %v on 1", multi[0].TestAcc, tc.ranks, single.TestAcc)
			}
		})
	}
}

func TestDataParallelMatchesOneRankFashionMNIST(t *testing.T) {
	if err := probeFashionMNIST(DefaultDataDir); err != nil {
		t.Skipf("Fashion-MNIST is not installed, skipping the real-data case (apt-get install -y dataset-fashion-mnist): %v", err)
	}
	train, err := LoadFashionMNIST(DefaultDataDir, "train", 3200)
	if err != nil {
		t.Fatal(err)
	}
	test, err := LoadFashionMNIST(DefaultDataDir, "test", 1000)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Hidden: []int{32}, Batch: 64, Epochs: 1, LR: 0.05, Momentum: 0.9, Seed: 1}
	single := trainLocal(t, 1, engine.Options{}, train, test, cfg)[0]
	multi := trainLocal(t, 4, engine.Options{}, train, test, cfg)
	assertEquivalent(t, multi, single, 1e-5)
	if single.TestAcc < 0.6 {
		t.Errorf("test accuracy %.3f after %d steps; want ≥ 0.6", single.TestAcc, single.Stats.Steps)
	}
}

// recorder is a Solver that keeps the gradients it was given.
type recorder struct{ grads [][]float64 }

func (r *recorder) Step(model []G.ValueGrad) error {
	gs, err := gradData(model)
	for _, g := range gs {
		r.grads = append(r.grads, append([]float64(nil), g...))
	}
	return err
}

// param is a ValueGrad with given gradient values.
func param(grad []float64) G.ValueGrad {
	g := G.NewGraph()
	n := G.NewVector(g, tensor.Float64, G.WithShape(len(grad)), G.WithValue(tensor.New(tensor.WithShape(len(grad)), tensor.WithBacking(make([]float64, len(grad))))))
	return &fixedGrad{n: n, grad: tensor.New(tensor.WithShape(len(grad)), tensor.WithBacking(grad))}
}

type fixedGrad struct {
	n    *G.Node
	grad *tensor.Dense
}

func (f *fixedGrad) Value() G.Value         { return f.n.Value() }
func (f *fixedGrad) Grad() (G.Value, error) { return f.grad, nil }

// The wrapper hands the wrapped solver the average of the ranks' gradients,
// with buckets cut across tensor boundaries, and reduces Aux along.
func TestDataParallelAveragesGradients(t *testing.T) {
	const n = 3
	sizes := []int{5, 1, 17, 9}
	comms, err := engine.NewLocalComms(n, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	recs := make([]*recorder, n)
	aux := make([][]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var model []G.ValueGrad
			for k, sz := range sizes {
				g := make([]float64, sz)
				for i := range g {
					g[i] = float64(100*r + 10*k + i)
				}
				model = append(model, param(g))
			}
			recs[r] = &recorder{}
			dp := NewDataParallel(c, recs[r], WithBucketBytes(7*8))
			defer dp.Close()
			dp.Aux = []float64{float64(r), 1}
			errs[r] = dp.Step(model)
			aux[r] = dp.Aux
			if errs[r] == nil && len(dp.buckets) != 5 {
				errs[r] = fmt.Errorf("%d buckets for 32 values of 7 per bucket, want 5", len(dp.buckets))
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range recs {
		for k, sz := range sizes {
			for i := 0; i < sz; i++ {
				want := float64(100*(n-1)/2 + 10*k + i) // mean over ranks of 100r + 10k + i
				if got := recs[r].grads[k][i]; math.Abs(got-want) > 1e-12 {
					t.Fatalf("rank %d: gradient %d[%d] = %v, want %v", r, k, i, got, want)
				}
			}
		}
		if aux[r][0] != 1 || aux[r][1] != 1 {
			t.Fatalf("rank %d: Aux = %v, want [1 1] (mean of 0,1,2 and of 1,1,1)", r, aux[r])
		}
	}
}

// Gorgonia's gradient of the model's loss agrees with finite differences.
func TestModelGradientFiniteDifference(t *testing.T) {
	d := Synthetic(8, 6, 3, 2)
	m, err := NewMLP([]int{6, 5, 3}, 8, 9)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	idx := []int{0, 1, 2, 3, 4, 5, 6, 7}
	m.Load(d, idx)
	if _, err := m.Backward(); err != nil {
		t.Fatal(err)
	}
	grads, err := gradData(m.Learnables())
	if err != nil {
		t.Fatal(err)
	}
	analytic := make([][]float64, len(grads))
	for k, g := range grads {
		analytic[k] = append([]float64(nil), g...)
	}
	const h = 1e-6
	for k, p := range m.ParamData() {
		for _, i := range []int{0, len(p) / 2, len(p) - 1} {
			old := p[i]
			p[i] = old + h
			lp, err := m.Backward()
			if err != nil {
				t.Fatal(err)
			}
			p[i] = old - h
			lm, err := m.Backward()
			if err != nil {
				t.Fatal(err)
			}
			p[i] = old
			num := (lp - lm) / (2 * h)
			if math.Abs(num-analytic[k][i]) > 1e-6*math.Max(1, math.Abs(num)) {
				t.Errorf("%s[%d]: gradient %v, finite difference %v", m.ParamNames()[k], i, analytic[k][i], num)
			}
		}
	}
}

func TestScheduleShards(t *testing.T) {
	s := Schedule{N: 100, Batch: 12, Seed: 5}
	perm := s.Epoch(0)
	for step := 0; step < s.StepsPerEpoch(); step++ {
		var joined []int
		for r := 0; r < 4; r++ {
			joined = append(joined, s.Shard(perm, step, r, 4)...)
		}
		want := perm[step*12 : step*12+12]
		for i := range want {
			if joined[i] != want[i] {
				t.Fatalf("step %d: 4 shards give %v, the 1-rank batch is %v", step, joined, want)
			}
		}
	}
	if err := checkShards(10, 4, 100); err == nil {
		t.Fatal("batch 10 over 4 ranks accepted")
	}
}
