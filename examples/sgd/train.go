package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu/elastic"
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
	Recoveries []elastic.Recovery `json:"recoveries,omitempty"`
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
	t, err := newTrainer(c, train, test, cfg)
	if err != nil {
		return nil, err
	}
	defer t.close()
	for e := 0; e < cfg.Epochs; e++ {
		st, err := t.epoch(e)
		if err != nil {
			return nil, err
		}
		t.res.Epochs = append(t.res.Epochs, st)
		fmt.Fprintf(log, "epoch %d/%d  ranks %d  train loss %.4f  test loss %.4f  test acc %.4f  %6.0f samples/s  comm %.2fs  compute %.2fs (%.0f%% of the step in allreduce)\n",
			st.Epoch, cfg.Epochs, ranks, st.TrainLoss, st.TestLoss, st.TestAcc, st.SamplesPerSec,
			st.CommSeconds, st.ComputeSecs, 100*st.CommSeconds/math.Max(st.Seconds, 1e-9))
	}
	t.prof.Write(log, fmt.Sprintf("plain data parallelism on %d processes", ranks))
	res, ds := t.res, t.dp.Stats
	res.Stats.ComputeSec = (t.compute + ds.Update).Seconds()
	res.Stats.PackSec, res.Stats.WaitSec, res.Stats.UnpackSec = ds.Pack.Seconds(), ds.Wait.Seconds(), ds.Unpack.Seconds()
	res.Stats.UpdateSec, res.Stats.InFlightSec = ds.Update.Seconds(), ds.InFlight.Seconds()
	res.Stats.Steps = ds.Steps
	if ds.Steps > 0 {
		res.Stats.MBPerStep = float64(ds.Bytes) / float64(ds.Steps) / 1e6
	}
	res.Buckets = len(t.dp.buckets)
	res.summarize(t.seen, ds.Comm(), t.model.ParamData())
	return res, nil
}

// summarize fills in a run's totals once its epochs are done: training time
// and throughput over the epochs, the share of it that comm (the gradient
// synchronisation not hidden by overlap) took, the last epoch's test
// figures, and a copy of the final parameters.
func (res *RunResult) summarize(seen int, comm time.Duration, params [][]float64) {
	res.TrainSeconds = 0
	for _, st := range res.Epochs {
		res.TrainSeconds += st.Seconds
	}
	if res.TrainSeconds > 0 {
		res.SamplesPerSec = float64(seen) / res.TrainSeconds
		res.CommShare = comm.Seconds() / res.TrainSeconds
	}
	if n := len(res.Epochs); n > 0 {
		res.TestAcc, res.TestLoss = res.Epochs[n-1].TestAcc, res.Epochs[n-1].TestLoss
	}
	for _, p := range params {
		res.params = append(res.params, slices.Clone(p))
	}
}

// trainer is one rank's plain data-parallel training under way: the model,
// the solver that averages the gradients, the pass that computes them, and
// the running totals.
type trainer struct {
	c           *engine.Comm
	train, test *Dataset
	cfg         Config
	model       *MLP
	dp          *DataParallel
	eval        *Evaluator // nil: no evaluation
	pass        *Pass
	sched       Schedule
	learn       []G.ValueGrad // the solver's view of the model
	grads       [][][]float64 // the pass's gradient outputs (the solver's tensors)
	losses      []float64     // the pass's shard loss
	compute     time.Duration // forward/backward and batch loading
	prof        *Profile
	seen        int     // training examples so far
	clock       float64 // training seconds before this epoch
	res         *RunResult
	undo        []func() // what close releases, in the order newTrainer made it
}

// newTrainer sets a rank up to train: the model (its initial parameters
// broadcast from rank 0), the solver, the evaluator and the pass.
func newTrainer(c *engine.Comm, train, test *Dataset, cfg Config) (_ *trainer, err error) {
	ranks := c.Size()
	t := &trainer{c: c, train: train, test: test, cfg: cfg, prof: newProfile(cfg.Profile),
		sched: Schedule{N: train.N, Batch: cfg.Batch, Seed: cfg.Seed}}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	if t.model, err = NewMLP(cfg.sizes(train), cfg.Batch/ranks, cfg.Seed); err != nil {
		return nil, err
	}
	t.undo = append(t.undo, t.model.Close)
	// Same seed, same weights; the broadcast makes it so even if a rank
	// was started with another seed, as DistributedDataParallel does.
	for _, p := range t.model.ParamData() {
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
	t.dp = NewDataParallel(c, inner, WithBucketBytes(bucket))
	t.undo = append(t.undo, func() { t.dp.Close() })
	t.dp.Aux = []float64{0} // the shard loss rides along with the gradients
	if t.eval, err = cfg.evaluator(t.model, test); err != nil {
		return nil, err
	}
	if t.eval != nil {
		t.undo = append(t.undo, t.eval.Close)
	}
	t.res = newResult(c, cfg, t.model, train, test)
	// The pass computes what the graph would, into the solver's gradient
	// tensors.
	var gd [][]float64
	t.learn, gd = t.model.Slots()
	if t.pass, err = NewPass(cfg.sizes(train), cfg.Batch/ranks, 1); err != nil {
		return nil, err
	}
	t.grads, t.losses = [][][]float64{gd}, []float64{0}
	return t, nil
}

// close releases what newTrainer made, last made first.
func (t *trainer) close() {
	for i := len(t.undo) - 1; i >= 0; i-- {
		t.undo[i]()
	}
}

// epoch trains epoch e: each step computes this rank's shard's gradients,
// starts their allreduce, loads the next shard while it is in flight, then
// lets the solver update. Then it evaluates on the test set.
func (t *trainer) epoch(e int) (EpochStats, error) {
	rank, ranks, dp, pass, prof := t.c.Rank(), t.c.Size(), t.dp, t.pass, t.prof
	steps := t.sched.StepsPerEpoch()
	epochStart, stats0, compute0 := time.Now(), dp.Stats, t.compute
	perm := t.sched.Epoch(e)
	lossSum := 0.0
	start := time.Now()
	prof.Start()
	pass.Load(t.train, 0, t.sched.Shard(perm, 0, rank, ranks))
	prof.Mark(phaseLoad)
	for s := 0; s < steps; s++ {
		if err := pass.Run(t.model.ParamData(), t.grads, t.losses); err != nil {
			return EpochStats{}, err
		}
		dp.Aux[0] = t.losses[0]
		t.compute += time.Since(start)
		prof.Mark(phaseBackward)
		if err := dp.Start(t.learn); err != nil {
			return EpochStats{}, err
		}
		prof.Mark(phasePack)
		// While the gradients are in flight, load the next shard: the
		// input tensors are no longer needed by this step.
		start = time.Now()
		if s+1 < steps {
			pass.Load(t.train, 0, t.sched.Shard(perm, s+1, rank, ranks))
		}
		t.compute += time.Since(start)
		prof.Mark(phaseLoad)
		before := dp.Stats
		if err := dp.Finish(); err != nil {
			return EpochStats{}, err
		}
		prof.Add(phaseAllReduce, dp.Stats.Wait-before.Wait)
		prof.Add(phaseUnpack, dp.Stats.Unpack-before.Unpack)
		prof.Add(phaseUpdate, dp.Stats.Update-before.Update)
		prof.Step()
		prof.Start()
		start = time.Now()
		t.seen += t.cfg.Batch
		lossSum += dp.Aux[0]
		t.res.Curve = append(t.res.Curve, CurvePoint{Samples: t.seen, Loss: dp.Aux[0], Seconds: t.clock + time.Since(epochStart).Seconds()})
	}
	secs := time.Since(epochStart).Seconds()
	t.clock += secs
	ds := dp.Stats
	st := EpochStats{
		Epoch: e + 1, Samples: t.seen, TrainLoss: lossSum / float64(steps),
		Seconds: secs, SamplesPerSec: float64(steps*t.cfg.Batch) / secs,
		CommSeconds: (ds.Comm() - stats0.Comm()).Seconds(),
		ComputeSecs: (t.compute - compute0 + ds.Update - stats0.Update).Seconds(),
	}
	if t.eval != nil {
		var err error
		if st.TestLoss, st.TestAcc, err = evaluate(t.c, t.eval, t.test); err != nil {
			return EpochStats{}, err
		}
	}
	return st, nil
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
