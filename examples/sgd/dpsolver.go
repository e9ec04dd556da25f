package main

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// DefaultBucketBytes is the default size of one gradient bucket: small
// enough that packing the next bucket overlaps the allreduce of this one,
// large enough that each allreduce is bandwidth-bound.
const DefaultBucketBytes = 256 << 10

// DataParallel is a Gorgonia Solver for data-parallel training: Step
// averages every gradient over the ranks of a gocoll communicator, then lets
// the wrapped solver step. Every rank ends the step with the same gradients,
// so the same update keeps the replicas bitwise identical.
//
// Gradients travel in a few flat buckets rather than one message per
// tensor. Bucket k is allreduced (non-blocking) while bucket k+1 is packed,
// and unpacked while later ones are still in flight. Start and Finish split
// a step in two so the caller can do other work (load the next minibatch)
// while the allreduces run; Step is Start followed by Finish.
type DataParallel struct {
	comm  *engine.Comm
	inner G.Solver
	op    engine.RedOp

	// Aux values are reduced with the same operation as the gradients, in
	// the last bucket of the next step (the training loop puts the loss here
	// and gets the global-batch loss for free). Set its length before the
	// first Start; it must be the same on every rank.
	Aux []float64

	bucketElems int
	buckets     []bucket
	planned     bool
	segs        []segment // where each gradient lies in the flat vector
	gradLen     int       // gradient elements
	total       int       // flat length: gradients then Aux
	model       []G.ValueGrad
	reqs        []*engine.Request
	issued      time.Time

	Stats SyncStats
}

// SyncStats add up where a rank's gradient synchronisation time went.
type SyncStats struct {
	Steps  int
	Bytes  int64         // bytes allreduced by this rank
	Pack   time.Duration // copying gradients into buckets and issuing allreduces
	Wait   time.Duration // blocked waiting for allreduces
	Unpack time.Duration // copying averaged gradients back
	Update time.Duration // the wrapped solver's step
	// InFlight is the wall time from issuing the first bucket to finishing
	// the last: the allreduce latency whether hidden by overlap or not.
	InFlight time.Duration
}

// Comm is the time the caller spent on synchronisation (not hidden by overlap).
func (s SyncStats) Comm() time.Duration { return s.Pack + s.Wait + s.Unpack }

type bucket struct {
	lo, hi int       // range of the flat vector
	data   []float64 // hi-lo elements
	raw    []byte    // the same memory as bytes
	owned  bool      // raw came from MemAlloc
}

type segment struct {
	param  int // index in the model
	off, n int // place in the flat vector
}

// DPOption configures a DataParallel.
type DPOption func(*DataParallel)

// WithBucketBytes sets the bucket size in bytes (default DefaultBucketBytes).
func WithBucketBytes(b int) DPOption {
	return func(d *DataParallel) { d.bucketElems = max(1, b/8) }
}

// WithReduceOp sets the reduction (default engine.Avg: the gradient of the
// mean loss over equal shards; engine.Sum when each rank's loss is already
// divided by the global batch size).
func WithReduceOp(op engine.RedOp) DPOption {
	return func(d *DataParallel) { d.op = op }
}

// NewDataParallel wraps inner so that it steps on gradients averaged over c.
func NewDataParallel(c *engine.Comm, inner G.Solver, opts ...DPOption) *DataParallel {
	d := &DataParallel{comm: c, inner: inner, op: engine.Avg, bucketElems: DefaultBucketBytes / 8}
	for _, o := range opts {
		o(d)
	}
	return d
}

// Step implements gorgonia.Solver.
func (d *DataParallel) Step(model []G.ValueGrad) error {
	if err := d.Start(model); err != nil {
		return err
	}
	return d.Finish()
}

// Start packs the gradients of model into buckets and starts their
// allreduces. The gradients must not change until Finish returns.
func (d *DataParallel) Start(model []G.ValueGrad) error {
	if d.model != nil {
		return errors.New("dp solver: Start called twice without Finish")
	}
	grads, err := gradData(model)
	if err != nil {
		return err
	}
	if !d.planned {
		d.plan(grads)
	} else if err := d.checkPlan(grads); err != nil {
		return err
	}
	d.model = model
	if d.comm.Size() == 1 {
		return nil // nothing to average
	}
	t0 := time.Now()
	d.issued = t0
	d.reqs = d.reqs[:0]
	for i := range d.buckets {
		b := &d.buckets[i]
		d.copyFlat(grads, b, true)
		req, err := d.comm.IAllReduce(b.raw, b.raw, len(b.data), engine.Float64, d.op)
		if err != nil {
			d.abandon()
			return fmt.Errorf("dp solver: allreduce of bucket %d: %w", i, err)
		}
		d.reqs = append(d.reqs, req)
		d.Stats.Bytes += int64(len(b.raw))
	}
	d.Stats.Pack += time.Since(t0)
	return nil
}

// Finish waits for the allreduces, writes the averaged gradients (and Aux)
// back, and steps the wrapped solver.
func (d *DataParallel) Finish() error {
	if d.model == nil {
		return errors.New("dp solver: Finish called without Start")
	}
	model := d.model
	defer func() { d.model = nil }()
	if d.comm.Size() > 1 {
		grads, err := gradData(model)
		if err != nil {
			d.abandon()
			return err
		}
		for i, req := range d.reqs {
			t0 := time.Now()
			err := req.Wait()
			t1 := time.Now()
			d.Stats.Wait += t1.Sub(t0)
			if err != nil {
				d.abandon()
				return fmt.Errorf("dp solver: allreduce of bucket %d: %w", i, err)
			}
			d.copyFlat(grads, &d.buckets[i], false)
			d.Stats.Unpack += time.Since(t1)
		}
		d.Stats.InFlight += time.Since(d.issued)
		d.reqs = d.reqs[:0]
	}
	t0 := time.Now()
	err := d.inner.Step(model)
	d.Stats.Update += time.Since(t0)
	d.Stats.Steps++
	if err != nil {
		return fmt.Errorf("dp solver: wrapped solver: %w", err)
	}
	return nil
}

// abandon waits for requests already issued so no allreduce still writes
// into a bucket after an error is returned.
func (d *DataParallel) abandon() {
	for _, r := range d.reqs {
		_ = r.Wait()
	}
	d.reqs = d.reqs[:0]
	d.model = nil
}

// plan lays the gradients and Aux out end to end and cuts the flat vector
// into buckets.
func (d *DataParallel) plan(grads [][]float64) {
	d.planned = true
	off := 0
	for i, g := range grads {
		d.segs = append(d.segs, segment{param: i, off: off, n: len(g)})
		off += len(g)
	}
	d.gradLen, d.total = off, off+len(d.Aux)
	if d.comm.Size() == 1 {
		return
	}
	for lo := 0; lo < d.total; lo += d.bucketElems {
		hi := min(lo+d.bucketElems, d.total)
		b := bucket{lo: lo, hi: hi}
		if raw, err := d.comm.MemAlloc((hi - lo) * 8); err == nil {
			b.raw, b.owned = raw, true
		} else {
			// Go memory works too; MemAlloc only saves the shared-memory
			// path a copy.
			b.raw = unsafe.Slice((*byte)(unsafe.Pointer(&make([]float64, hi-lo)[0])), (hi-lo)*8)
		}
		b.data = unsafe.Slice((*float64)(unsafe.Pointer(&b.raw[0])), hi-lo)
		d.buckets = append(d.buckets, b)
	}
}

// checkPlan rejects a model whose shape changed since the first step.
func (d *DataParallel) checkPlan(grads [][]float64) error {
	if len(grads) != len(d.segs) {
		return fmt.Errorf("dp solver: model has %d parameters, was %d", len(grads), len(d.segs))
	}
	for i, g := range grads {
		if len(g) != d.segs[i].n {
			return fmt.Errorf("dp solver: gradient %d has %d elements, was %d", i, len(g), d.segs[i].n)
		}
	}
	if d.gradLen+len(d.Aux) != d.total {
		return errors.New("dp solver: len(Aux) changed after the first step")
	}
	return nil
}

// copyFlat copies the part of the flat vector (gradients, then Aux) that
// bucket b covers: into the bucket when pack, out of it otherwise.
func (d *DataParallel) copyFlat(grads [][]float64, b *bucket, pack bool) {
	move := func(src []float64, off int) {
		lo, hi := max(b.lo, off), min(b.hi, off+len(src))
		if lo >= hi {
			return
		}
		if pack {
			copy(b.data[lo-b.lo:hi-b.lo], src[lo-off:hi-off])
		} else {
			copy(src[lo-off:hi-off], b.data[lo-b.lo:hi-b.lo])
		}
	}
	for _, s := range d.segs {
		if s.off >= b.hi {
			break
		}
		move(grads[s.param], s.off)
	}
	move(d.Aux, d.gradLen)
}

// Close frees the buckets. The communicator must still be open.
func (d *DataParallel) Close() error {
	var err error
	for _, b := range d.buckets {
		if b.owned {
			err = errors.Join(err, d.comm.MemFree(b.raw))
		}
	}
	d.buckets = nil
	return err
}

// gradData returns the float64 backing arrays of model's gradients.
func gradData(model []G.ValueGrad) ([][]float64, error) {
	out := make([][]float64, len(model))
	for i, n := range model {
		g, err := n.Grad()
		if err != nil {
			return nil, fmt.Errorf("dp solver: parameter %d has no gradient: %w", i, err)
		}
		t, ok := g.(tensor.Tensor)
		if !ok {
			return nil, fmt.Errorf("dp solver: gradient %d is a %T; want a tensor", i, g)
		}
		f, ok := t.Data().([]float64)
		if !ok {
			return nil, fmt.Errorf("dp solver: gradient %d holds %T; only float64 is supported", i, t.Data())
		}
		out[i] = f
	}
	return out, nil
}
