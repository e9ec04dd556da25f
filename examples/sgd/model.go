package main

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// MLP is a multi-layer perceptron classifier (ReLU hidden layers, softmax
// output, cross-entropy loss) built as a Gorgonia graph for one rank's shard
// of every global minibatch. Its loss is the mean over the shard, so the
// average of the ranks' gradients (equal shards) is the gradient of the mean
// over the global batch.
type MLP struct {
	Sizes []int // input, hidden…, classes

	g       *G.ExprGraph
	params  G.Nodes // w0, b0, w1, b1, …: the learnables
	loss    *G.Node
	lossVal G.Value
	vm      G.VM

	batch      int
	xBuf, yBuf []float64 // backing arrays of the input and one-hot label tensors
}

// NewMLP builds the training graph for shards of batch examples. Weights are
// Glorot-uniform from seed, biases zero: every rank builds the same model.
func NewMLP(sizes []int, batch int, seed uint64) (*MLP, error) {
	if len(sizes) < 2 || batch < 1 {
		return nil, fmt.Errorf("model: need at least input and output sizes and a batch ≥ 1 (sizes %v, batch %d)", sizes, batch)
	}
	m := &MLP{Sizes: append([]int(nil), sizes...), g: G.NewGraph(), batch: batch}
	for l := 0; l+1 < len(sizes); l++ {
		in, out := sizes[l], sizes[l+1]
		w := make([]float64, in*out)
		initUniform(w, in, out, seed, uint64(l))
		m.params = append(m.params,
			G.NewMatrix(m.g, tensor.Float64, G.WithShape(in, out), G.WithName(fmt.Sprintf("w%d", l)),
				G.WithValue(tensor.New(tensor.WithShape(in, out), tensor.WithBacking(w)))),
			G.NewVector(m.g, tensor.Float64, G.WithShape(out), G.WithName(fmt.Sprintf("b%d", l)),
				G.WithValue(tensor.New(tensor.WithShape(out), tensor.WithBacking(make([]float64, out))))))
	}
	classes := sizes[len(sizes)-1]
	m.xBuf = make([]float64, batch*sizes[0])
	m.yBuf = make([]float64, batch*classes)
	x := G.NewMatrix(m.g, tensor.Float64, G.WithShape(batch, sizes[0]), G.WithName("x"),
		G.WithValue(tensor.New(tensor.WithShape(batch, sizes[0]), tensor.WithBacking(m.xBuf))))
	y := G.NewMatrix(m.g, tensor.Float64, G.WithShape(batch, classes), G.WithName("y"),
		G.WithValue(tensor.New(tensor.WithShape(batch, classes), tensor.WithBacking(m.yBuf))))

	logits, err := forward(x, m.params)
	if err != nil {
		return nil, err
	}
	// loss = -Σ y·log softmax(logits) / batch
	logp, err := G.LogSoftMax(logits)
	if err != nil {
		return nil, fmt.Errorf("model: log-softmax: %w", err)
	}
	picked, err := G.HadamardProd(logp, y)
	if err != nil {
		return nil, fmt.Errorf("model: loss: %w", err)
	}
	total, err := G.Sum(picked)
	if err != nil {
		return nil, fmt.Errorf("model: loss: %w", err)
	}
	if m.loss, err = G.Mul(total, G.NewConstant(-1/float64(batch))); err != nil {
		return nil, fmt.Errorf("model: loss: %w", err)
	}
	G.Read(m.loss, &m.lossVal)
	if _, err := G.Grad(m.loss, m.params...); err != nil {
		return nil, fmt.Errorf("model: gradients: %w", err)
	}
	m.vm = G.NewTapeMachine(m.g, G.BindDualValues(m.params...))
	return m, nil
}

// forward appends the layers to x's graph and returns the logits.
func forward(x *G.Node, params G.Nodes) (*G.Node, error) {
	h := x
	for l := 0; l < len(params); l += 2 {
		z, err := G.Mul(h, params[l])
		if err != nil {
			return nil, fmt.Errorf("model: layer %d: %w", l/2, err)
		}
		if z, err = G.BroadcastAdd(z, params[l+1], nil, []byte{0}); err != nil {
			return nil, fmt.Errorf("model: layer %d bias: %w", l/2, err)
		}
		if l+2 < len(params) {
			if z, err = G.Rectify(z); err != nil {
				return nil, fmt.Errorf("model: layer %d relu: %w", l/2, err)
			}
		}
		h = z
	}
	return h, nil
}

// Load copies the examples idx of d into the input tensors (for Backward).
func (m *MLP) Load(d *Dataset, idx []int) {
	in, classes := m.Sizes[0], m.Sizes[len(m.Sizes)-1]
	clear(m.yBuf)
	for i, ex := range idx {
		d.Row(ex, m.xBuf[i*in:(i+1)*in])
		m.yBuf[i*classes+int(d.Labels[ex])] = 1
	}
}

// Backward runs the graph's own forward and backward pass on the loaded
// shard and returns the shard's mean loss; the gradients are added to the
// learnables'. Training runs Pass instead, which computes the same bits
// without the tape (TestPassMatchesGraph holds it to this one).
func (m *MLP) Backward() (float64, error) {
	m.vm.Reset()
	if err := m.vm.RunAll(); err != nil {
		return 0, fmt.Errorf("model: forward/backward: %w", err)
	}
	return scalar(m.lossVal)
}

// Learnables are the parameter nodes, in graph order (w0, b0, w1, b1, …),
// as a Solver takes them.
func (m *MLP) Learnables() []G.ValueGrad { return G.NodesToValueGrads(m.params) }

// Slots pairs each parameter (in Learnables' order) with a zero gradient
// tensor of its own, for a Solver, and returns those gradients' backing
// arrays: Pass writes a step's gradients there, and Gorgonia's solvers zero
// them after each step, so they are what the graph's dual values would hold
// (0 + the pass's gradient).
func (m *MLP) Slots() ([]G.ValueGrad, [][]float64) {
	vg := make([]G.ValueGrad, len(m.params))
	data := make([][]float64, len(m.params))
	for i, p := range m.params {
		data[i] = make([]float64, p.Shape().TotalSize())
		vg[i] = &slot{v: p.Value(), g: tensor.New(tensor.WithShape(p.Shape().Clone()...), tensor.WithBacking(data[i]))}
	}
	return vg, data
}

// slot is a parameter and its gradient, as a Solver takes them.
type slot struct {
	v G.Value
	g *tensor.Dense
}

func (s *slot) Value() G.Value         { return s.v }
func (s *slot) Grad() (G.Value, error) { return s.g, nil }

// ParamData returns the backing arrays of the parameters (live, not copies).
func (m *MLP) ParamData() [][]float64 {
	out := make([][]float64, len(m.params))
	for i, p := range m.params {
		out[i] = p.Value().Data().([]float64)
	}
	return out
}

// ParamNames names the parameters as ParamData orders them.
func (m *MLP) ParamNames() []string {
	out := make([]string, len(m.params))
	for i, p := range m.params {
		out[i] = p.Name()
	}
	return out
}

// NumParams is the number of scalar parameters.
func (m *MLP) NumParams() int {
	n := 0
	for _, p := range m.ParamData() {
		n += len(p)
	}
	return n
}

// Close releases the machine.
func (m *MLP) Close() { m.vm.Close() }

func scalar(v G.Value) (float64, error) {
	switch s := v.(type) {
	case *G.F64:
		return float64(*s), nil
	case tensor.Tensor:
		if f, ok := s.Data().(float64); ok {
			return f, nil
		}
		if f, ok := s.Data().([]float64); ok && len(f) == 1 {
			return f[0], nil
		}
	}
	return 0, fmt.Errorf("model: loss value %T is not a float64 scalar", v)
}

// Evaluator computes loss and accuracy with the model's current weights on a
// forward-only graph that shares the weight tensors.
type Evaluator struct {
	m      *MLP
	batch  int
	g      *G.ExprGraph
	vm     G.VM
	logits G.Value
	xBuf   []float64
}

// NewEvaluator builds a forward graph for batches of up to batch examples.
func (m *MLP) NewEvaluator(batch int) (*Evaluator, error) {
	e := &Evaluator{m: m, batch: batch, g: G.NewGraph()}
	in := m.Sizes[0]
	e.xBuf = make([]float64, batch*in)
	x := G.NewMatrix(e.g, tensor.Float64, G.WithShape(batch, in), G.WithName("x"),
		G.WithValue(tensor.New(tensor.WithShape(batch, in), tensor.WithBacking(e.xBuf))))
	params := make(G.Nodes, len(m.params))
	for i, p := range m.params {
		// The same tensor: the solver's in-place updates show here too.
		v := p.Value().(*tensor.Dense)
		if v.Dims() == 2 {
			params[i] = G.NewMatrix(e.g, tensor.Float64, G.WithShape(v.Shape()...), G.WithName(p.Name()), G.WithValue(v))
		} else {
			params[i] = G.NewVector(e.g, tensor.Float64, G.WithShape(v.Shape()...), G.WithName(p.Name()), G.WithValue(v))
		}
	}
	logits, err := forward(x, params)
	if err != nil {
		return nil, err
	}
	G.Read(logits, &e.logits)
	e.vm = G.NewTapeMachine(e.g)
	return e, nil
}

// Eval returns the summed cross-entropy loss and the number of correct
// predictions over the examples idx of d.
func (e *Evaluator) Eval(d *Dataset, idx []int) (lossSum float64, correct int, err error) {
	in, classes := e.m.Sizes[0], e.m.Sizes[len(e.m.Sizes)-1]
	for start := 0; start < len(idx); start += e.batch {
		part := idx[start:min(start+e.batch, len(idx))]
		for i, ex := range part {
			d.Row(ex, e.xBuf[i*in:(i+1)*in])
		}
		clear(e.xBuf[len(part)*in:])
		e.vm.Reset()
		if err := e.vm.RunAll(); err != nil {
			return 0, 0, fmt.Errorf("model: evaluation: %w", err)
		}
		out := e.logits.Data().([]float64)
		for i, ex := range part {
			row := out[i*classes : (i+1)*classes]
			best, mx := 0, row[0]
			for k, v := range row {
				if v > mx {
					best, mx = k, v
				}
			}
			s := 0.0
			for _, v := range row {
				s += math.Exp(v - mx)
			}
			lossSum += mx + math.Log(s) - row[d.Labels[ex]]
			if best == int(d.Labels[ex]) {
				correct++
			}
		}
	}
	return lossSum, correct, nil
}

// Close releases the machine.
func (e *Evaluator) Close() { e.vm.Close() }
