package main

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Dataset is a classification data set held in memory: N examples of
// Features values with labels in [0, Classes). Images are kept as bytes (a
// 60,000-image training set is 47 MB instead of 376 MB of float64) and
// scaled to [0, 1] when a batch is filled.
type Dataset struct {
	N, Features, Classes int
	Labels               []uint8

	pixels []byte    // N×Features bytes (IDX images), or
	values []float64 // N×Features values (synthetic data)
}

// Row writes the features of example i into dst (len Features).
func (d *Dataset) Row(i int, dst []float64) {
	if d.values != nil {
		copy(dst, d.values[i*d.Features:(i+1)*d.Features])
		return
	}
	const scale = 1.0 / 255
	for j, p := range d.pixels[i*d.Features : (i+1)*d.Features] {
		dst[j] = float64(p) * scale
	}
}

// Synthetic returns n examples of a classification problem with some
// overlap between classes (a linear model gets roughly 80% right): one
// Gaussian blob per class around a random centre. Tests use it so the
// data-parallel logic needs no data files.
func Synthetic(n, features, classes int, seed uint64) *Dataset {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	centres := make([]float64, classes*features)
	spread := 2.5 / math.Sqrt(float64(features)) // centres about 3.5 noise σ apart
	for i := range centres {
		centres[i] = spread * rng.NormFloat64()
	}
	d := &Dataset{N: n, Features: features, Classes: classes, Labels: make([]uint8, n), values: make([]float64, n*features)}
	for i := 0; i < n; i++ {
		c := rng.IntN(classes)
		d.Labels[i] = uint8(c)
		for j := 0; j < features; j++ {
			d.values[i*features+j] = centres[c*features+j] + rng.NormFloat64()
		}
	}
	return d
}

// Schedule says which examples make up every global minibatch: the same on
// every rank, and the same whatever the number of ranks, so an N-rank run
// and a 1-rank run see exactly the same batches.
type Schedule struct {
	N, Batch int
	Seed     uint64
}

// StepsPerEpoch is the number of full global batches in one pass; the last
// partial batch is dropped so every shard has the same size.
func (s Schedule) StepsPerEpoch() int { return s.N / s.Batch }

// Epoch returns the order of the examples in epoch e.
func (s Schedule) Epoch(e int) []int {
	rng := rand.New(rand.NewPCG(s.Seed, uint64(e)+1))
	return rng.Perm(s.N)
}

// Shard returns rank's part of global batch step of the epoch order perm.
func (s Schedule) Shard(perm []int, step, rank, ranks int) []int {
	per := s.Batch / ranks
	start := step*s.Batch + rank*per
	return perm[start : start+per]
}

// checkShards rejects a global batch that ranks cannot split evenly: with
// equal shards, the average of the shard-mean gradients is exactly the
// gradient of the global-batch mean loss.
func checkShards(batch, ranks, n int) error {
	if ranks < 1 {
		return fmt.Errorf("rank count %d < 1", ranks)
	}
	if batch < ranks || batch%ranks != 0 {
		return fmt.Errorf("global batch %d does not split evenly over %d ranks; pick a multiple of %d", batch, ranks, ranks)
	}
	if n < batch {
		return fmt.Errorf("%d training examples are fewer than one global batch of %d", n, batch)
	}
	return nil
}

// initUniform fills w with Glorot/Xavier-uniform values from its own seeded
// stream, so every rank (and every rank count) starts from the same model.
func initUniform(w []float64, fanIn, fanOut int, seed, stream uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x1a7e+stream))
	limit := math.Sqrt(6 / float64(fanIn+fanOut))
	for i := range w {
		w[i] = (2*rng.Float64() - 1) * limit
	}
}

// Slice returns examples [lo, hi) as a dataset sharing d's memory.
func (d *Dataset) Slice(lo, hi int) *Dataset {
	s := &Dataset{N: hi - lo, Features: d.Features, Classes: d.Classes, Labels: d.Labels[lo:hi]}
	if d.values != nil {
		s.values = d.values[lo*d.Features : hi*d.Features]
	} else {
		s.pixels = d.pixels[lo*d.Features : hi*d.Features]
	}
	return s
}
