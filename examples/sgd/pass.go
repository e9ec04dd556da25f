package main

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Pass is the MLP's forward and backward pass written out by hand for
// Devices shards of Shard examples each, with every buffer kept across
// steps. It computes bit for bit what the Gorgonia graph of NewMLP computes
// for each shard alone (TestPassMatchesGraph), so a run's numbers do not
// depend on which of the two computed them, nor on how many shards share
// one pass:
//
//   - The forward pass runs once over all the shards' rows: each row of a
//     product A·W is the same k-ordered sum whatever the other rows are
//     (gonum's Dgemm keeps the order of k for A·W, blocked or not), and the
//     bias, ReLU and softmax act row by row.
//   - Everything that sums over rows (each weight gradient Aᵀ·dZ, each bias
//     gradient, the loss) or whose blocking in gonum depends on the number
//     of rows (dZ·Wᵀ with a k above gonum's block size) runs per shard, with
//     the shapes and operand order of the graph's own instructions.
//   - Log-softmax takes as its starting maximum the first logit of the
//     shard, as the tensor package's kernel does for the whole tensor it is
//     given.
//
// Against the graph it saves what the graph computes and nobody reads (the
// gradient of the input), the tape's allocations, a goroutine per row of
// the softmax, and the copy of the gradients out of the learnables: Run
// writes each shard's gradient where the caller wants it (for -virtual: the
// allreduce's send view).
type Pass struct {
	Sizes   []int // input, hidden…, classes
	Shard   int   // examples per shard
	Devices int   // shards per pass

	X []float64 // Devices·Shard rows of Sizes[0] inputs (Load fills them)
	Y []float64 // the one-hot labels, Devices·Shard rows of classes

	z  [][]float64 // per layer: pre-activations (the last layer: logits)
	h  [][]float64 // per hidden layer: ReLU(z)
	m  [][]float64 // per hidden layer: the ReLU mask (1 where z ≥ 0), then dZ
	lp []float64   // log-softmax of the logits
	dz []float64   // one shard's gradient of the logits
	dh [][]float64 // per hidden layer: one shard's gradient of its output
	gl []float64   // one shard's gradient of the log-softmax
}

var blas64 = gonum.Implementation{}

// NewPass allocates the buffers of a pass over devices shards of shard
// examples.
func NewPass(sizes []int, shard, devices int) (*Pass, error) {
	if len(sizes) < 2 || shard < 1 || devices < 1 {
		return nil, fmt.Errorf("pass: need at least input and output sizes, a shard ≥ 1 and devices ≥ 1 (sizes %v, shard %d, devices %d)", sizes, shard, devices)
	}
	rows := shard * devices
	layers := len(sizes) - 1
	classes := sizes[layers]
	p := &Pass{Sizes: append([]int(nil), sizes...), Shard: shard, Devices: devices,
		X: make([]float64, rows*sizes[0]), Y: make([]float64, rows*classes),
		lp: make([]float64, rows*classes), dz: make([]float64, shard*classes), gl: make([]float64, shard*classes)}
	for l := 0; l < layers; l++ {
		p.z = append(p.z, make([]float64, rows*sizes[l+1]))
		if l+1 < layers {
			p.h = append(p.h, make([]float64, rows*sizes[l+1]))
			p.m = append(p.m, make([]float64, rows*sizes[l+1]))
			p.dh = append(p.dh, make([]float64, shard*sizes[l+1]))
		}
	}
	return p, nil
}

// NumParams is the length of a gradient: the parameters w0, b0, w1, b1, …
// end to end.
func (p *Pass) NumParams() int {
	n := 0
	for l := 0; l+1 < len(p.Sizes); l++ {
		n += (p.Sizes[l] + 1) * p.Sizes[l+1]
	}
	return n
}

// Load copies the examples idx of d into shard dev's rows.
func (p *Pass) Load(d *Dataset, dev int, idx []int) {
	in, classes := p.Sizes[0], p.Sizes[len(p.Sizes)-1]
	x := p.X[dev*p.Shard*in : (dev+1)*p.Shard*in]
	y := p.Y[dev*p.Shard*classes : (dev+1)*p.Shard*classes]
	clear(y)
	for i, ex := range idx {
		d.Row(ex, x[i*in:(i+1)*in])
		y[i*classes+int(d.Labels[ex])] = 1
	}
}

// Run computes every shard's mean loss and gradient with the parameters
// params (w0, b0, w1, b1, …: Parts' layout). Shard k's gradient goes to
// grads[k] (the same layout; overwritten), its loss to losses[k].
func (p *Pass) Run(params [][]float64, grads [][][]float64, losses []float64) error {
	if err := p.check("parameters", params); err != nil {
		return err
	}
	if len(grads) != p.Devices || len(losses) != p.Devices {
		return fmt.Errorf("pass: %d gradients and %d losses for %d shards", len(grads), len(losses), p.Devices)
	}
	for k, g := range grads {
		if err := p.check(fmt.Sprintf("gradient %d", k), g); err != nil {
			return err
		}
	}
	p.forward(params)
	for k := range grads {
		losses[k] = p.backward(k, params, grads[k])
	}
	return nil
}

// check rejects parts that are not w0, b0, w1, b1, … of the model's sizes.
func (p *Pass) check(what string, parts [][]float64) error {
	if len(parts) != 2*(len(p.Sizes)-1) {
		return fmt.Errorf("pass: %s in %d parts; want %d", what, len(parts), 2*(len(p.Sizes)-1))
	}
	for l := 0; l+1 < len(p.Sizes); l++ {
		if len(parts[2*l]) != p.Sizes[l]*p.Sizes[l+1] || len(parts[2*l+1]) != p.Sizes[l+1] {
			return fmt.Errorf("pass: %s: layer %d has %d weights and %d biases; want %d and %d", what, l,
				len(parts[2*l]), len(parts[2*l+1]), p.Sizes[l]*p.Sizes[l+1], p.Sizes[l+1])
		}
	}
	return nil
}

// Parts cuts a flat vector of NumParams elements into the layers' weights
// and biases (views): w0, b0, w1, b1, …
func (p *Pass) Parts(flat []float64) [][]float64 {
	var parts [][]float64
	off := 0
	for l := 0; l+1 < len(p.Sizes); l++ {
		in, out := p.Sizes[l], p.Sizes[l+1]
		parts = append(parts, flat[off:off+in*out:off+in*out], flat[off+in*out:off+(in+1)*out:off+(in+1)*out])
		off += (in + 1) * out
	}
	return parts
}

// forward runs every layer over all rows: z = a·w (+ b per row), then for
// hidden layers mask = (z ≥ 0) and h = z ⊙ mask, as the graph's Rectify
// does (a negative z gives −0, not +0); the logits' log-softmax last.
func (p *Pass) forward(params [][]float64) {
	rows := p.Shard * p.Devices
	a := p.X
	layers := len(p.Sizes) - 1
	for l := 0; l < layers; l++ {
		in, out := p.Sizes[l], p.Sizes[l+1]
		z := p.z[l]
		blas64.Dgemm(blas.NoTrans, blas.NoTrans, rows, out, in, 1, a, in, params[2*l], out, 0, z, out)
		bl := params[2*l+1]
		for r := 0; r < rows; r++ {
			zr := z[r*out : (r+1)*out]
			for j := range zr {
				zr[j] = zr[j] + bl[j]
			}
		}
		if l+1 == layers {
			break
		}
		m, h := p.m[l], p.h[l]
		for i, v := range z {
			mk := 0.0
			if v >= 0 {
				mk = 1
			}
			m[i] = mk
			h[i] = v * mk
		}
		a = h
	}
	classes := p.Sizes[len(p.Sizes)-1]
	logits := p.z[len(p.z)-1]
	n := p.Shard * classes
	for k := 0; k < p.Devices; k++ {
		logSoftMax(logits[k*n:(k+1)*n], p.lp[k*n:(k+1)*n], classes)
	}
}

// logSoftMax is the tensor package's float64 log-softmax over rows of dim
// (gorgonia.org/tensor StdEng.softMaxLastDimF64), operation for operation:
// every row's maximum starts from x[0], the first element of the whole
// tensor, and compares the row's elements from its second on.
func logSoftMax(x, out []float64, dim int) {
	for r := 0; r < len(x)/dim; r++ {
		row, o := x[r*dim:(r+1)*dim], out[r*dim:(r+1)*dim]
		mx := x[0]
		for j := 1; j < dim; j++ {
			if row[j] > mx {
				mx = row[j]
			}
		}
		sum := float64(0.0)
		for j, v := range row {
			z := v - mx
			e := math.Exp(z)
			o[j] = z
			sum += e
		}
		for j := range o {
			o[j] -= math.Log(sum)
		}
	}
}

// backward computes shard k's loss and writes its gradient to g. The loss
// is Σ(logp ⊙ y)·(−1/shard), summed from 0 in row-major order; the graph's
// gradient of the log-softmax is y ⊙ (−1/shard), and its backward is the
// tensor package's (sum of the row from its first element, then
// g − exp(logp)·sum).
func (p *Pass) backward(k int, params, g [][]float64) float64 {
	layers := len(p.Sizes) - 1
	classes := p.Sizes[layers]
	shard := p.Shard
	c := -1 / float64(shard)
	n := shard * classes
	lp, y := p.lp[k*n:(k+1)*n], p.Y[k*n:(k+1)*n]
	total := 0.0
	for i, v := range lp {
		total += v * y[i]
	}
	loss := total * c
	for i, v := range y {
		p.gl[i] = v * c
	}
	for r := 0; r < shard; r++ {
		gr, or, dr := p.gl[r*classes:(r+1)*classes], lp[r*classes:(r+1)*classes], p.dz[r*classes:(r+1)*classes]
		sum := gr[0]
		for j := 1; j < classes; j++ {
			sum += gr[j]
		}
		for j := range dr {
			dr[j] = gr[j] - (math.Exp(or[j]) * sum)
		}
	}
	dz := p.dz
	for l := layers - 1; l >= 0; l-- {
		in, out := p.Sizes[l], p.Sizes[l+1]
		var a []float64
		if l == 0 {
			a = p.X[k*shard*in : (k+1)*shard*in]
		} else {
			a = p.h[l-1][k*shard*in : (k+1)*shard*in]
		}
		// The bias gradient: the rows' sum from the first row, as the
		// tensor package's reduction along axis 0; the learnable receives
		// 0 + it (a −0 becomes +0).
		bg := g[2*l+1]
		copy(bg, dz[:out])
		for r := 1; r < shard; r++ {
			dr := dz[r*out : (r+1)*out]
			for j := range bg {
				bg[j] = bg[j] + dr[j]
			}
		}
		for j, v := range bg {
			if v == 0 {
				bg[j] = 0
			}
		}
		// Aᵀ·dZ from a zeroed result: never −0, so 0 + it is itself.
		weightGrad(in, out, shard, a, dz, g[2*l])
		if l == 0 {
			break // the graph also computes the input's gradient; nobody reads it
		}
		dh := p.dh[l-1]
		blas64.Dgemm(blas.NoTrans, blas.Trans, shard, in, out, 1, dz, out, params[2*l], out, 0, dh, in)
		m := p.m[l-1][k*shard*in : (k+1)*shard*in]
		for i, v := range dh {
			m[i] = m[i] * v
		}
		dz = m
	}
	return loss
}

// weightRows is how many rows of a weight gradient weightGrad computes at
// once: a block of them stays in the cache from its zeroing to its last
// update.
const weightRows = 64

// weightGrad sets c (m×n) to aᵀ·b for a (k×m) and b (k×n), a block of
// weightRows rows of c at a time. Every element is the same as in one
// Dgemm over all of c: gonum's Aᵀ·B zeroes the element, then adds
// a[l][i]·b[l][j] for l = 0, 1, …, k−1 in that order (skipping a zero
// a[l][i]) whether it runs serially or in blocks, so cutting c's rows
// changes only when each element is computed. One Dgemm zeroes all of c
// first, which for a 784×128 gradient sends it out of the cache before
// the sums read it back; per device, with 4 devices a process, that is
// 3 MB more memory traffic a step.
func weightGrad(m, n, k int, a, b, c []float64) {
	for i := 0; i < m; i += weightRows {
		rows := min(weightRows, m-i)
		blas64.Dgemm(blas.Trans, blas.NoTrans, rows, n, k, 1, a[i:], m, b, n, 0, c[i*n:(i+rows)*n], n)
	}
}
