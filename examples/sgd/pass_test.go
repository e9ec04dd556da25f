package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// graphShard runs NewMLP's Gorgonia graph on one shard (x, y rows) with
// the parameters params and returns its loss and gradient, flat, as the
// learnables hold it after the pass (0 + the pass's gradient).
func graphShard(t *testing.T, m *MLP, params, x, y []float64) (float64, []float64) {
	t.Helper()
	unflatten(m.ParamData(), params)
	copy(m.xBuf, x)
	copy(m.yBuf, y)
	loss, err := m.Backward()
	if err != nil {
		t.Fatal(err)
	}
	gd, err := gradData(m.Learnables())
	if err != nil {
		t.Fatal(err)
	}
	g := flatten(gd, len(params))
	for _, x := range gd {
		clear(x)
	}
	return loss, g
}

// randomInputs fills the pass's rows: inputs in [0, 1) with a third of
// them zero (as the images' background), one-hot labels.
func randomInputs(p *Pass, rng *rand.Rand) {
	for i := range p.X {
		if rng.IntN(3) > 0 {
			p.X[i] = rng.Float64()
		} else {
			p.X[i] = 0
		}
	}
	classes := p.Sizes[len(p.Sizes)-1]
	clear(p.Y)
	for r := 0; r < len(p.Y)/classes; r++ {
		p.Y[r*classes+rng.IntN(classes)] = 1
	}
}

func sameBits(a, b []float64) int {
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestPassMatchesGraph: every shard's loss and gradient from one batched
// pass equal, bit for bit, those of the Gorgonia graph run on that shard
// alone, for the demo's model and for deeper ones whose hidden widths
// exceed gonum's block size (where a product's blocking could depend on
// the number of rows), over several steps of changing parameters.
func TestPassMatchesGraph(t *testing.T) {
	cases := []struct {
		sizes          []int
		shard, devices int
	}{
		{[]int{784, 128, 10}, 16, 4},
		{[]int{784, 128, 10}, 64, 1},
		{[]int{784, 128, 10}, 8, 8},
		{[]int{784, 128, 10}, 16, 8}, // 128 rows: gonum's A·W runs in parallel blocks
		{[]int{100, 70, 130, 10}, 5, 3},
		{[]int{30, 200, 7}, 32, 2},
	}
	for _, tc := range cases {
		rng := rand.New(rand.NewPCG(uint64(tc.shard), uint64(tc.devices)))
		p, err := NewPass(tc.sizes, tc.shard, tc.devices)
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewMLP(tc.sizes, tc.shard, 7)
		if err != nil {
			t.Fatal(err)
		}
		np := p.NumParams()
		if np != m.NumParams() {
			t.Fatalf("%v: pass has %d parameters, graph %d", tc.sizes, np, m.NumParams())
		}
		params := flatten(m.ParamData(), np)
		grads := make([][]float64, tc.devices)
		for k := range grads {
			grads[k] = make([]float64, np)
		}
		losses := make([]float64, tc.devices)
		in, classes := tc.sizes[0], tc.sizes[len(tc.sizes)-1]
		for step := 0; step < 4; step++ {
			randomInputs(p, rng)
			gparts := make([][][]float64, tc.devices)
			for k := range gparts {
				gparts[k] = p.Parts(grads[k])
			}
			if err := p.Run(p.Parts(params), gparts, losses); err != nil {
				t.Fatal(err)
			}
			for k := 0; k < tc.devices; k++ {
				x := p.X[k*tc.shard*in : (k+1)*tc.shard*in]
				y := p.Y[k*tc.shard*classes : (k+1)*tc.shard*classes]
				loss, want := graphShard(t, m, params, x, y)
				if math.Float64bits(loss) != math.Float64bits(losses[k]) {
					t.Fatalf("%v step %d shard %d: loss %v, graph %v", tc.sizes, step, k, losses[k], loss)
				}
				if i := sameBits(grads[k], want); i >= 0 {
					t.Fatalf("%v step %d shard %d: gradient element %d is %v (%#x), graph %v (%#x)", tc.sizes, step, k, i,
						grads[k][i], math.Float64bits(grads[k][i]), want[i], math.Float64bits(want[i]))
				}
			}
			// A plain SGD step, so the next step's parameters differ.
			for i := range params {
				params[i] -= 0.1 * grads[0][i]
			}
		}
		m.Close()
	}
}

// TestPassRejectsBadShapes: wrong lengths are errors, not panics.
func TestPassRejectsBadShapes(t *testing.T) {
	if _, err := NewPass([]int{3}, 1, 1); err == nil {
		t.Error("one size accepted")
	}
	if _, err := NewPass([]int{3, 2}, 0, 1); err == nil {
		t.Error("shard 0 accepted")
	}
	p, err := NewPass([]int{3, 2}, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	np := p.NumParams()
	vec := func() [][]float64 { return p.Parts(make([]float64, np)) }
	good := [][][]float64{vec(), vec()}
	if err := p.Run(vec()[:1], good, make([]float64, 2)); err == nil {
		t.Error("parameters without biases accepted")
	}
	if err := p.Run([][]float64{make([]float64, 5), make([]float64, 2)}, good, make([]float64, 2)); err == nil {
		t.Error("short weights accepted")
	}
	if err := p.Run(vec(), good[:1], make([]float64, 2)); err == nil {
		t.Error("one gradient for two shards accepted")
	}
	if err := p.Run(vec(), good, make([]float64, 1)); err == nil {
		t.Error("one loss for two shards accepted")
	}
	if err := p.Run(vec(), [][][]float64{good[0], {make([]float64, 6), make([]float64, 1)}}, make([]float64, 2)); err == nil {
		t.Error("short bias gradient accepted")
	}
	if err := p.Run(vec(), good, make([]float64, 2)); err != nil {
		t.Errorf("good shapes: %v", err)
	}
}

// BenchmarkPass: one step's pass over 64 examples as one shard (plain data
// parallelism at 2 processes) and as 4 shards of 16 (-virtual 8 there).
func BenchmarkPass(b *testing.B) {
	for _, shards := range []int{1, 4} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			p, err := NewPass([]int{784, 128, 10}, 64/shards, shards)
			if err != nil {
				b.Fatal(err)
			}
			randomInputs(p, rand.New(rand.NewPCG(1, 2)))
			np := p.NumParams()
			params := make([]float64, np)
			for i := range params {
				params[i] = float64(i%7-3) / 100
			}
			grads := make([][][]float64, shards)
			for k := range grads {
				grads[k] = p.Parts(make([]float64, np))
			}
			losses := make([]float64, shards)
			for i := 0; i < b.N; i++ {
				if err := p.Run(p.Parts(params), grads, losses); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
