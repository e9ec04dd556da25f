package main

import (
	"fmt"
	"io"
	"math"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
	G "gorgonia.org/gorgonia"
)

// Config is one training run's hyper-parameters; every rank uses the same.
type Config struct {
	Hidden      []int   // hidden layer widths
	Batch       int     // global minibatch size (split evenly over the ranks)
	Epochs      int     // passes over the training set
	LR          float64 // learning rate
	Momentum    float64 // 0: plain SGD
	Seed        uint64  // model initialisation and batch order
	BucketBytes int     // gradient bucket size (0: DefaultBucketBytes)
	EvalBatch   int     // forward batch for evaluation (0: 500)
	SkipEval    bool    // no test-set evaluation (reference runs of -check)
	Profile     bool    // print a per-step breakdown of rank 0's time (-profile)
}

// EpochStats describe one epoch, identical on every rank except the timings
// (rank 0's are reported).
type EpochStats struct {
	Epoch         int     `json:"epoch"`
	Samples       int     `json:"samples"`    // training examples seen so far
	TrainLoss     float64 `json:"train_loss"` // mean of the epoch's global-batch losses
	TestLoss      float64 `json:"test_loss"`
	TestAcc       float64 `json:"test_acc"`
	Seconds       float64 `json:"seconds"` // training wall time (no evaluation)
	SamplesPerSec float64 `json:"samples_per_sec"`
	CommSeconds   float64 `json:"comm_seconds"`    // gradient synchronisation not hidden by overlap
	ComputeSecs   float64 `json:"compute_seconds"` // forward/backward, batch loading, solver update
}

// CurvePoint is the loss of one global minibatch.
type CurvePoint struct {
	Samples int     `json:"samples"` // examples seen including this batch
	Loss    float64 `json:"loss"`
	Seconds float64 `json:"t"` // training time so far (evaluation excluded)
}

// RunResult is what rank 0 knows at the end of a run.
type RunResult struct {
	Ranks         int          `json:"ranks"`
	Mode          string       `json:"mode"` // goroutines, processes, launcher
	Transport     string       `json:"transport"`
	Data          string       `json:"data"`
	Algo          string       `json:"algo"`
	Hidden        []int        `json:"hidden"`
	Batch         int          `json:"batch"`
	LR            float64      `json:"lr"`
	Momentum      float64      `json:"momentum"`
	Seed          uint64       `json:"seed"`
	TrainN        int          `json:"train_examples"`
	TestN         int          `json:"test_examples"`
	Params        int          `json:"params"`
	Buckets       int          `json:"buckets"`
	Epochs        []EpochStats `json:"epochs"`
	Curve         []CurvePoint `json:"curve"`
	TestAcc       float64      `json:"test_acc"`
	TestLoss      float64      `json:"test_loss"`
	TrainSeconds  float64      `json:"train_seconds"`
	SamplesPerSec float64      `json:"samples_per_sec"`
	CommShare     float64      `json:"comm_share"` // share of step time spent synchronising gradients
	Stats         struct {
		ComputeSec  float64 `json:"compute_sec"`
		PackSec     float64 `json:"pack_sec"`
		WaitSec     float64 `json:"wait_sec"`
		UnpackSec   float64 `json:"unpack_sec"`
		UpdateSec   float64 `json:"update_sec"`
		InFlightSec float64 `json:"inflight_sec"`
		Steps       int     `json:"steps"`
		MBPerStep   float64 `json:"mb_per_step"`
	} `json:"stats"`
	Check string `json:"check,omitempty"` // outcome of -check
	// Virtual devices (-virtual): how many, and the migration if any.
	Virtual   int        `json:"virtual,omitempty"`
	Migration *Migration `json:"migration,omitempty"`

	// -elastic: the recoveries from lost ranks, as rank 0 at the end saw them.
	Recoveries []Recovery `json:"recoveries,omitempty"`
	// The sha256 of the final parameters (weightsHash).
	WeightsSHA256 string `json:"weights_sha256"`

	params [][]float64  // final parameters (not serialised)
	final  *engine.Comm // the communicator the run ended on (-elastic: after shrinks)
}

func (cfg Config) sizes(d *Dataset) []int {
	s := []int{d.Features}
	s = append(s, cfg.Hidden...)
	return append(s, d.Classes)
}

// Train runs data-parallel minibatch SGD on rank c.Rank() of c.Size(). Each
// rank computes the gradient of its shard of every global batch with a
// Pass (bit for bit the model's Gorgonia graph); the DataParallel solver
// averages them with gocoll and applies the same update everywhere. test may be nil. Progress lines go to log on
// rank 0 (log may be nil).
func Train(c *engine.Comm, train, test *Dataset, cfg Config, log io.Writer) (*RunResult, error) {
	rank, ranks := c.Rank(), c.Size()
	if err := checkShards(cfg.Batch, ranks, train.N); err != nil {
		return nil, err
	}
	if log == nil || rank != 0 {
		log = io.Discard
	}
	model, err := NewMLP(cfg.sizes(train), cfg.Batch/ranks, cfg.Seed)
	if err != nil {
		return nil, err
	}
	defer model.Close()
	// Same seed, same weights; the broadcast makes it so even if a rank
	// was started with another seed, as DistributedDataParallel does.
	for _, p := range model.ParamData() {
		if err := c.Broadcast(f64Bytes(p), f64Bytes(p), len(p), engine.Float64, 0); err != nil {
			return nil, fmt.Errorf("broadcast of the initial parameters: %w", err)
		}
	}

	var inner G.Solver
	if cfg.Momentum != 0 {
		inner = G.NewMomentum(G.WithLearnRate(cfg.LR), G.WithMomentum(cfg.Momentum))
	} else {
		inner = G.NewVanillaSolver(G.WithLearnRate(cfg.LR))
	}
	bucket := cfg.BucketBytes
	if bucket <= 0 {
		bucket = DefaultBucketBytes
	}
	dp := NewDataParallel(c, inner, WithBucketBytes(bucket))
	defer dp.Close()
	dp.Aux = []float64{0} // the shard loss rides along with the gradients

	eval, err := cfg.evaluator(model, test)
	if err != nil {
		return nil, err
	}
	if eval != nil {
		defer eval.Close()
	}

	res := newResult(c, cfg, model, train, test)
	sched := Schedule{N: train.N, Batch: cfg.Batch, Seed: cfg.Seed}
	steps := sched.StepsPerEpoch()
	// The pass computes what the graph would, into the solver's gradient
	// tensors.
	learn, gd := model.Slots()
	pass, err := NewPass(cfg.sizes(train), cfg.Batch/ranks, 1)
	if err != nil {
		return nil, err
	}
	grads, losses := [][][]float64{gd}, []float64{0}
	var compute time.Duration
	prof := newProfile(cfg.Profile)
	seen := 0
	clock := 0.0 // training seconds before this epoch
	for e := 0; e < cfg.Epochs; e++ {
		epochStart, stats0, compute0 := time.Now(), dp.Stats, compute
		perm := sched.Epoch(e)
		lossSum := 0.0
		t := time.Now()
		prof.Start()
		pass.Load(train, 0, sched.Shard(perm, 0, rank, ranks))
		prof.Mark(phaseLoad)
		for s := 0; s < steps; s++ {
			if err := pass.Run(model.ParamData(), grads, losses); err != nil {
				return nil, err
			}
			dp.Aux[0] = losses[0]
			compute += time.Since(t)
			prof.Mark(phaseBackward)
			if err := dp.Start(learn); err != nil {
				return nil, err
			}
			prof.Mark(phasePack)
			// While the gradients are in flight, load the next shard: the
			// input tensors are no longer needed by this step.
			t = time.Now()
			if s+1 < steps {
				pass.Load(train, 0, sched.Shard(perm, s+1, rank, ranks))
			}
			compute += time.Since(t)
			prof.Mark(phaseLoad)
			before := dp.Stats
			if err := dp.Finish(); err != nil {
				return nil, err
			}
			prof.Add(phaseAllReduce, dp.Stats.Wait-before.Wait)
			prof.Add(phaseUnpack, dp.Stats.Unpack-before.Unpack)
			prof.Add(phaseUpdate, dp.Stats.Update-before.Update)
			prof.Step()
			prof.Start()
			t = time.Now()
			seen += cfg.Batch
			lossSum += dp.Aux[0]
			res.Curve = append(res.Curve, CurvePoint{Samples: seen, Loss: dp.Aux[0], Seconds: clock + time.Since(epochStart).Seconds()})
		}
		secs := time.Since(epochStart).Seconds()
		clock += secs
		ds := dp.Stats
		st := EpochStats{
			Epoch: e + 1, Samples: seen, TrainLoss: lossSum / float64(steps),
			Seconds: secs, SamplesPerSec: float64(steps*cfg.Batch) / secs,
			CommSeconds: (ds.Comm() - stats0.Comm()).Seconds(),
			ComputeSecs: (compute - compute0 + ds.Update - stats0.Update).Seconds(),
		}
		if eval != nil {
			if st.TestLoss, st.TestAcc, err = evaluate(c, eval, test); err != nil {
				return nil, err
			}
		}
		res.Epochs = append(res.Epochs, st)
		fmt.Fprintf(log, "epoch %d/%d  ranks %d  train loss %.4f  test loss %.4f  test acc %.4f  %6.0f samples/s  comm %.2fs  compute %.2fs (%.0f%% of the step in allreduce)\n",
			st.Epoch, cfg.Epochs, ranks, st.TrainLoss, st.TestLoss, st.TestAcc, st.SamplesPerSec,
			st.CommSeconds, st.ComputeSecs, 100*st.CommSeconds/math.Max(secs, 1e-9))
	}
	prof.Write(log, fmt.Sprintf("plain data parallelism on %d processes", ranks))
	res.TrainSeconds = 0
	for _, st := range res.Epochs {
		res.TrainSeconds += st.Seconds
	}
	if res.TrainSeconds > 0 {
		res.SamplesPerSec = float64(seen) / res.TrainSeconds
	}
	ds := dp.Stats
	res.Stats.ComputeSec = (compute + ds.Update).Seconds()
	res.Stats.PackSec, res.Stats.WaitSec, res.Stats.UnpackSec = ds.Pack.Seconds(), ds.Wait.Seconds(), ds.Unpack.Seconds()
	res.Stats.UpdateSec, res.Stats.InFlightSec = ds.Update.Seconds(), ds.InFlight.Seconds()
	res.Stats.Steps = ds.Steps
	if ds.Steps > 0 {
		res.Stats.MBPerStep = float64(ds.Bytes) / float64(ds.Steps) / 1e6
	}
	if res.TrainSeconds > 0 {
		res.CommShare = ds.Comm().Seconds() / res.TrainSeconds
	}
	res.Buckets = len(dp.buckets)
	if n := len(res.Epochs); n > 0 {
		res.TestAcc, res.TestLoss = res.Epochs[n-1].TestAcc, res.Epochs[n-1].TestLoss
	}
	for _, p := range model.ParamData() {
		res.params = append(res.params, append([]float64(nil), p...))
	}
	return res, nil
}

// evaluator builds the test-set evaluator (nil when there is nothing to
// evaluate).
func (cfg Config) evaluator(model *MLP, test *Dataset) (*Evaluator, error) {
	if test == nil || cfg.SkipEval {
		return nil, nil
	}
	eb := cfg.EvalBatch
	if eb <= 0 {
		eb = 500
	}
	return model.NewEvaluator(eb)
}

// newResult is a run's result before training: what every run records.
func newResult(c *engine.Comm, cfg Config, model *MLP, train, test *Dataset) *RunResult {
	res := &RunResult{
		Ranks: c.Size(), Hidden: cfg.Hidden, Batch: cfg.Batch, LR: cfg.LR, Momentum: cfg.Momentum, Seed: cfg.Seed,
		TrainN: train.N, Params: model.NumParams(), Algo: c.Options().Algo, Transport: c.Options().Transport,
	}
	if test != nil {
		res.TestN = test.N
	}
	return res
}

// evaluate splits the test set over the ranks and sums loss and hits with
// an allreduce, so every rank gets the same figures.
func evaluate(c *engine.Comm, eval *Evaluator, test *Dataset) (loss, acc float64, err error) {
	lo, hi := c.Rank()*test.N/c.Size(), (c.Rank()+1)*test.N/c.Size()
	idx := make([]int, hi-lo)
	for i := range idx {
		idx[i] = lo + i
	}
	l, hits, err := eval.Eval(test, idx)
	if err != nil {
		return 0, 0, err
	}
	sums := []float64{l, float64(hits)}
	if err := c.AllReduce(f64Bytes(sums), f64Bytes(sums), len(sums), engine.Float64, engine.Sum); err != nil {
		return 0, 0, fmt.Errorf("allreduce of the test metrics: %w", err)
	}
	return sums[0] / float64(test.N), sums[1] / float64(test.N), nil
}

// f64Bytes views a float64 slice as bytes, for the engine's byte API.
func f64Bytes(f []float64) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*8)
}
