package main

import (
	"fmt"
	"math"

	"github.com/gocoll/gocoll/engine"
)

// DefaultTolerance bounds how far the parameters of an N-rank run may drift
// from a 1-rank run over the same global batches: the two differ only in
// the order of floating-point additions.
const DefaultTolerance = 1e-5

// replicaMismatch returns, on every rank, the largest number of parameters
// in which any rank differs bitwise from rank 0.
func replicaMismatch(c *engine.Comm, params [][]float64) (int, error) {
	bad := 0
	for _, p := range params {
		ref := append([]float64(nil), p...)
		if err := c.Broadcast(f64Bytes(ref), f64Bytes(ref), len(ref), engine.Float64, 0); err != nil {
			return 0, fmt.Errorf("check: broadcast of rank 0's parameters: %w", err)
		}
		for i := range p {
			if math.Float64bits(p[i]) != math.Float64bits(ref[i]) {
				bad++
			}
		}
	}
	n := []float64{float64(bad)}
	if err := c.AllReduce(f64Bytes(n), f64Bytes(n), 1, engine.Float64, engine.Max); err != nil {
		return 0, fmt.Errorf("check: allreduce: %w", err)
	}
	return int(n[0]), nil
}

// relDiff is the largest difference between two parameter sets, each
// tensor's measured relative to that tensor's largest magnitude in want
// (so parameters near zero do not inflate it).
func relDiff(got, want [][]float64) (float64, error) {
	if len(got) != len(want) {
		return 0, fmt.Errorf("%d parameter tensors against %d", len(got), len(want))
	}
	worst := 0.0
	for k := range got {
		if len(got[k]) != len(want[k]) {
			return 0, fmt.Errorf("parameter %d: %d values against %d", k, len(got[k]), len(want[k]))
		}
		scale := 0.0
		for _, v := range want[k] {
			scale = math.Max(scale, math.Abs(v))
		}
		scale = math.Max(scale, 1e-12)
		for i := range got[k] {
			d := math.Abs(got[k][i]-want[k][i]) / scale
			if math.IsNaN(d) {
				return math.Inf(1), nil
			}
			worst = math.Max(worst, d)
		}
	}
	return worst, nil
}

// referenceRun trains the same model on one rank over the same global
// batches (no evaluation) and returns its final parameters.
func referenceRun(train *Dataset, cfg Config, opts engine.Options) ([][]float64, error) {
	comms, err := engine.NewLocalComms(1, opts)
	if err != nil {
		return nil, err
	}
	defer comms[0].Destroy()
	cfg.SkipEval = true
	res, err := Train(comms[0], train, nil, cfg, nil)
	if err != nil {
		return nil, fmt.Errorf("check: 1-rank reference run: %w", err)
	}
	return res.params, nil
}

// checkRun is -check: every rank must hold bitwise-identical parameters,
// and rank 0 compares them with a 1-rank reference run. It returns a
// one-line verdict (on rank 0) and an error when either test fails.
func checkRun(c *engine.Comm, res *RunResult, train *Dataset, cfg Config, opts engine.Options, tol float64) (string, error) {
	bad, err := replicaMismatch(c, res.params)
	if err != nil {
		return "", err
	}
	if bad > 0 {
		return "", fmt.Errorf("check failed: the ranks' parameters differ from rank 0's in up to %d values", bad)
	}
	if c.Rank() != 0 {
		return "", nil
	}
	if c.Size() == 1 {
		return "1 rank: nothing to compare with", nil
	}
	ref, err := referenceRun(train, cfg, opts)
	if err != nil {
		return "", err
	}
	d, err := relDiff(res.params, ref)
	if err != nil {
		return "", fmt.Errorf("check: %w", err)
	}
	verdict := fmt.Sprintf("all %d ranks hold bitwise-identical parameters; after %d steps they differ from a 1-rank run over the same global batches by at most %.3g relative (tolerance %g)",
		c.Size(), res.Stats.Steps, d, tol)
	if !(d <= tol) {
		return verdict, fmt.Errorf("check failed: %s", verdict)
	}
	return verdict, nil
}
