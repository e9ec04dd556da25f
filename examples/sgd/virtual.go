package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu"
	"github.com/gocoll/gocoll/vppu/elastic"
)

// VirtualConfig trains on virtual devices (vppu) instead of one shard per
// rank: Devices devices split each global batch, placed in blocks over the
// ranks; at global step MigrateAt (0: never) they move onto the first
// MigrateTo ranks, and the other ranks leave the job.
type VirtualConfig struct {
	Devices   int
	MigrateAt int
	MigrateTo int
	Elastic   bool   // survive lost rank processes (see elastic.go)
	MinRanks  int    // with Elastic: the fewest processes to go on with
	Respawn   bool   // with Elastic: admit processes that join at a step boundary
	JobFile   string // with Elastic: rank 0 keeps the job's JoinInfo here
	Joining   bool   // this process joins a running job (engine.Join done)
	// JoinedView is the view a joining process joined through (the job
	// file's, elastic.JoinJob).
	JoinedView string
	LogEvery   int // print the loss every this many steps (0: never)
}

// Migration describes the move of a run's virtual devices.
type Migration struct {
	Step    int     `json:"step"` // global step before which it happened
	From    int     `json:"from"` // processes hosting devices before
	To      int     `json:"to"`   // and after
	Seconds float64 `json:"seconds"`
	Bytes   int64   `json:"bytes"` // registered buffers that changed process
}

// TrainVirtual is Train on cfg.Devices virtual devices. Each device
// computes the gradient of its shard of every global batch; the virtual
// allreduce averages the devices' gradients in device order, so the
// numbers do not depend on how many processes host the devices, nor on a
// migration. Every device holds the same parameters and momentum, updated
// alike (classical momentum, v ← μv + g, w ← w − ηv) from the same
// average: a process keeps one copy of them ("params", "velocity" and the
// step counter "step", registered shared with its devices, so a migration
// hands them to a process that hosts devices for the first time) and
// updates it once per step. With vc.Elastic the loop runs under the
// elastic runner (vppu/elastic), which recovers from lost ranks and
// admits joiners. A rank left without devices by the migration returns
// (nil, nil).
func TrainVirtual(c *engine.Comm, train, test *Dataset, cfg Config, vc VirtualConfig, log io.Writer) (*RunResult, error) {
	t, err := newVirtualRun(c, train, test, cfg, vc, log)
	if err != nil {
		return nil, err
	}
	defer t.close()
	if vc.Elastic {
		err = t.s.Run(t.run)
	} else {
		err = t.run(t.s)
	}
	if err != nil {
		t.s.Close()
		if errors.Is(err, errLeft) {
			return nil, nil
		}
		return nil, err
	}
	return t.finish(), nil
}

// errLeft: this rank was left without devices by the migration.
var errLeft = errors.New("left the job in the migration")

// vrun is one rank's training on virtual devices under way: what it
// trains, the elastic state (communicator, devices, steps done) and the
// running totals.
type vrun struct {
	cfg         Config
	vc          VirtualConfig
	train, test *Dataset
	model       *MLP
	eval        *Evaluator
	res         *RunResult
	sched       Schedule
	out         io.Writer // the log, written by rank 0 of the communicator of the moment
	prof        *Profile
	s           *elastic.State
	m, np       int
	width       int // elements of a device's allreduce: gradient, loss (and -respawn's joiner count)
	steps       int // per epoch
	total       int

	avg             []float64 // the allreduce's result, every device's alike
	comm, compute   time.Duration
	comm0, compute0 time.Duration // at the epoch's start
	epochStart      time.Time
	clock           float64 // seconds of the epochs before this one
	lossSum         float64
	perm            []int
	permEpoch       int
	joiners         int // waiting to join, as the last step's allreduce said
	flushed         int // epochs ended (recorded, evaluated, printed)
}

// newVirtualRun checks the configuration and starts the devices: a new
// virtual communicator with the state registered, or, for a joining
// process, the members' (the state arrives with the devices).
func newVirtualRun(c *engine.Comm, train, test *Dataset, cfg Config, vc VirtualConfig, log io.Writer) (*vrun, error) {
	m := vc.Devices
	if err := checkShards(cfg.Batch, m, train.N); err != nil {
		return nil, err
	}
	if vc.MigrateAt > 0 && (vc.MigrateTo < 1 || vc.MigrateTo > c.Size()) {
		return nil, fmt.Errorf("-migrate-to %d: want 1..%d processes", vc.MigrateTo, c.Size())
	}
	if log == nil {
		log = io.Discard
	}
	model, err := NewMLP(cfg.sizes(train), cfg.Batch/m, cfg.Seed)
	if err != nil {
		return nil, err
	}
	sched := Schedule{N: train.N, Batch: cfg.Batch, Seed: cfg.Seed}
	t := &vrun{cfg: cfg, vc: vc, train: train, test: test, model: model, sched: sched, out: log, prof: newProfile(cfg.Profile),
		m: m, np: model.NumParams(), steps: sched.StepsPerEpoch(), total: cfg.Epochs * sched.StepsPerEpoch(), permEpoch: -1}
	// With -respawn each step's allreduce carries one more element: rank
	// 0's count of waiting joiners (on its first device, times M so that
	// the average is the count), so every rank decides alike to grow.
	t.width = t.np + 1
	if vc.Respawn {
		t.width++
	}
	t.avg = make([]float64, t.width)
	if t.s, err = t.start(c); err != nil {
		model.Close()
		return nil, err
	}
	if t.eval, err = cfg.evaluator(model, test); err != nil {
		t.close()
		return nil, err
	}
	t.res = newResult(c, cfg, model, train, test)
	t.res.Virtual = m
	t.flushed = int(t.s.Step) / t.steps // a joiner's epochs before it joined are the members'
	t.epochStart = time.Now()
	return t, nil
}

// start makes the devices and the elastic state.
func (t *vrun) start(c *engine.Comm) (*elastic.State, error) {
	logical, err := vppu.ParseLogical("ring", t.m)
	if err != nil {
		return nil, err
	}
	opts := elastic.Options{MinRanks: t.vc.MinRanks, Log: t.out}
	if t.vc.Elastic {
		opts.JobFile = t.vc.JobFile
	}
	if t.vc.Joining {
		// A replacement process: the members' Grow admitted it; its
		// devices and their state come with the members' Recover.
		s, err := elastic.Join(c, t.vc.JoinedView, logical, opts)
		if err == nil && len(s.V.Local()) == 0 {
			s.V.Destroy()
			s.Close()
			err = fmt.Errorf("rank %d joined but was given no virtual device", c.Rank())
		}
		return s, err
	}
	v, err := vppu.New(c, logical, vppu.Block(t.m, c.Size()))
	if err != nil {
		return nil, err
	}
	// The global steps done: a process that receives devices checks that
	// the state it got is that of the step it is at.
	for name, b := range map[string][]byte{"params": f64Bytes(flatten(t.model.ParamData(), t.np)), "velocity": make([]byte, 8*t.np), "step": make([]byte, 8)} {
		if err := v.RegisterShared(name, b); err != nil {
			v.Destroy()
			return nil, err
		}
	}
	s, err := elastic.New(c, v, opts)
	if err != nil {
		v.Destroy()
	}
	return s, err
}

func (t *vrun) close() {
	if t.eval != nil {
		t.eval.Close()
	}
	t.s.V.Destroy()
	t.model.Close()
}

// log is the progress log on rank 0 of the communicator the job is on
// now, nowhere on the other ranks.
func (t *vrun) log() io.Writer {
	if t.s.Comm.Rank() == 0 {
		return t.out
	}
	return io.Discard
}

// run is the training loop, from the step s is at: the elastic runner
// calls it again after a recovery, with the communicator and the
// devices it left.
func (t *vrun) run(s *elastic.State) error {
	if err := t.endEpoch(); err != nil { // an epoch a failure interrupted in its evaluation
		return err
	}
	var b *stepBufs
	for int(s.Step) < t.total {
		switch {
		case t.joiners > 0:
			n := t.joiners
			t.joiners = 0
			if err := s.Grow(n); err != nil {
				return err
			}
			b = nil
			continue
		case t.vc.MigrateAt > 0 && int(s.Step) == t.vc.MigrateAt && t.res.Migration == nil:
			if err := t.migrate(); err != nil {
				return err
			}
			if len(s.V.Local()) == 0 {
				return errLeft
			}
			b = nil
		}
		if n := len(s.V.Local()); b == nil || len(b.grads) != n {
			var err error
			if b, err = t.buffers(n); err != nil {
				return err
			}
		}
		if err := t.step(b); err != nil {
			return err
		}
		if err := t.endEpoch(); err != nil {
			return err
		}
	}
	return nil
}

// stepBufs are a step's buffers for n local devices: per device its
// gradient, then its shard's loss, as views of one array (which the
// virtual allreduce reads in place); avgs are the average, every
// device's alike, written once. One pass computes all the local
// devices' gradients, each straight into its view.
type stepBufs struct {
	grads, avgs [][]byte
	pass        *Pass
	gparts      [][][]float64
	losses      []float64
}

func (t *vrun) buffers(n int) (*stepBufs, error) {
	pass, err := NewPass(t.cfg.sizes(t.train), t.cfg.Batch/t.m, n)
	if err != nil {
		return nil, err
	}
	all := make([]byte, 8*t.width*n)
	b := &stepBufs{grads: make([][]byte, n), avgs: make([][]byte, n), pass: pass, gparts: make([][][]float64, n), losses: make([]float64, n)}
	for k := range n {
		b.grads[k] = all[8*t.width*k : 8*t.width*(k+1)]
		b.avgs[k] = f64Bytes(t.avg)
		b.gparts[k] = pass.Parts(f64s(b.grads[k])[:t.np])
	}
	return b, nil
}

// step runs global step s.Step: every local device's gradient of its
// shard, the virtual allreduce (the average, in device order), the
// update of the shared state, and Commit.
func (t *vrun) step(b *stepBufs) error {
	s, step := t.s, int(t.s.Step)
	if e := step / t.steps; e != t.permEpoch {
		t.perm, t.permEpoch = t.sched.Epoch(e), e
	}
	start := time.Now()
	t.prof.Start()
	local := s.V.Local()
	params, velocity := deviceVec(s.V, local[0], "params"), deviceVec(s.V, local[0], "velocity")
	for k, d := range local {
		b.pass.Load(t.train, k, t.sched.Shard(t.perm, step%t.steps, d, t.m))
	}
	t.prof.Mark(phaseLoad)
	if err := b.pass.Run(b.pass.Parts(params), b.gparts, b.losses); err != nil {
		return err
	}
	for k, loss := range b.losses {
		f64s(b.grads[k])[t.np] = loss
	}
	t.prof.Mark(phaseBackward)
	t1 := time.Now()
	t.compute += t1.Sub(start)
	if t.vc.Respawn {
		g := f64s(b.grads[0])
		g[t.np+1] = 0
		if s.Comm.Rank() == 0 {
			g[t.np+1] = float64(s.Joiners() * t.m)
		}
	}
	if err := s.V.AllReduce(b.grads, b.avgs, t.width, engine.Float64, engine.Avg); err != nil {
		return fmt.Errorf("rank %d step %d: allreduce of the gradients: %w", s.Comm.Rank(), step, err)
	}
	t2 := time.Now()
	t.comm += t2.Sub(t1)
	t.prof.Mark(phaseAllReduce)
	update(params, velocity, t.avg[:t.np], t.cfg.LR, t.cfg.Momentum)
	if sb, _ := s.V.Buffer(local[0], "step"); len(sb) == 8 {
		binary.LittleEndian.PutUint64(sb, uint64(step+1))
	}
	t.compute += time.Since(t2)
	t.prof.Mark(phaseUpdate)
	t.prof.Step()
	loss := t.avg[t.np]
	if t.vc.Respawn {
		t.joiners = int(t.avg[t.np+1])
	}
	s.Commit()
	t.lossSum += loss
	t.res.Curve = append(t.res.Curve, CurvePoint{Samples: (step + 1) * t.cfg.Batch, Loss: loss, Seconds: t.clock + time.Since(t.epochStart).Seconds()})
	if t.vc.LogEvery > 0 && (step+1)%t.vc.LogEvery == 0 {
		fmt.Fprintf(t.log(), "step %d loss %.4f\n", step+1, loss)
	}
	return nil
}

// endEpoch ends the epoch that the step count just completed, if not
// done yet: its figures, its evaluation (with -elastic only after the
// last epoch: a recovery then has one kind of collective to settle, the
// step's) and its line. Every rank is at the same step after a
// recovery, so all evaluate alike.
func (t *vrun) endEpoch() error {
	s, step := t.s, int(t.s.Step)
	if step%t.steps != 0 || step/t.steps <= t.flushed {
		return nil
	}
	secs := time.Since(t.epochStart).Seconds()
	st := EpochStats{
		Epoch: step / t.steps, Samples: step * t.cfg.Batch, TrainLoss: t.lossSum / float64(t.steps),
		Seconds: secs, SamplesPerSec: float64(t.steps*t.cfg.Batch) / secs,
		CommSeconds: (t.comm - t.comm0).Seconds(), ComputeSecs: (t.compute - t.compute0).Seconds(),
	}
	if t.eval != nil && (!t.vc.Elastic || step == t.total) {
		unflatten(t.model.ParamData(), deviceVec(s.V, s.V.Local()[0], "params"))
		var err error
		if st.TestLoss, st.TestAcc, err = evaluateVirtual(s.V, t.eval, t.test); err != nil {
			return fmt.Errorf("rank %d: evaluation: %w", s.Comm.Rank(), err)
		}
	}
	t.clock += secs
	t.res.Epochs = append(t.res.Epochs, st)
	t.flushed = step / t.steps
	fmt.Fprintf(t.log(), "epoch %d/%d  %d virtual devices on %d processes  train loss %.4f  test loss %.4f  test acc %.4f  %6.0f samples/s\n",
		st.Epoch, t.cfg.Epochs, t.m, hosts(s.V), st.TrainLoss, st.TestLoss, st.TestAcc, st.SamplesPerSec)
	t.epochStart, t.comm0, t.compute0 = time.Now(), t.comm, t.compute
	t.lossSum = 0
	return nil
}

// migrate moves the devices at -migrate-at onto the first -migrate-to
// processes (fewer if ranks were lost) and checks the state that came.
func (t *vrun) migrate() error {
	s := t.s
	mig, err := migrate(s.V, s.Comm, min(t.vc.MigrateTo, s.Comm.Size()), t.np)
	if err != nil {
		return err // a rank lost during the move: recover onto the survivors, then migrate again
	}
	mig.Step = int(s.Step)
	t.res.Migration = mig
	fmt.Fprintf(t.log(), "step %d: migrated %d virtual devices from %d to %d processes in %.1f ms (%.1f MB of parameters and momentum moved)\n",
		s.Step, t.m, mig.From, mig.To, 1e3*mig.Seconds, float64(mig.Bytes)/1e6)
	if len(s.V.Local()) == 0 {
		return nil
	}
	if b, _ := s.V.Buffer(s.V.Local()[0], "step"); binary.LittleEndian.Uint64(b) != s.Step {
		return fmt.Errorf("rank %d: the migrated state is that of step %d, not %d", s.Comm.Rank(), binary.LittleEndian.Uint64(b), s.Step)
	}
	return nil
}

// finish gathers the run's results once the last step is done.
func (t *vrun) finish() *RunResult {
	s, res := t.s, t.res
	log := t.log()
	t.prof.Write(log, fmt.Sprintf("%d virtual devices on %d processes", t.m, hosts(s.V)))
	if t.vc.Elastic {
		reportRecoveries(log, s.Recoveries)
		res.Recoveries = s.Recoveries
	}
	res.Stats.ComputeSec, res.Stats.WaitSec, res.Stats.Steps = t.compute.Seconds(), t.comm.Seconds(), int(s.Step)
	res.Stats.InFlightSec = t.comm.Seconds() // one blocking allreduce per step: nothing overlaps it
	res.Stats.MBPerStep = float64(8*(t.np+1)) / 1e6
	res.Buckets = 1
	unflatten(t.model.ParamData(), deviceVec(s.V, s.V.Local()[0], "params"))
	res.summarize(int(s.Step)*t.cfg.Batch, t.comm, t.model.ParamData())
	res.final = s.Comm
	return res
}

// migrate moves the devices onto ranks 0..to-1 and says what it cost:
// the parameters and momentum travel to the processes that host devices
// for the first time (the others have them already).
func migrate(v *vppu.Comm, c *engine.Comm, to, np int) (*Migration, error) {
	before := v.Place()
	after := vppu.Block(v.Size(), to)
	moved := 0
	for d, r := range after {
		if !slices.Contains(before, r) && slices.Index(after, r) == d {
			moved++ // the first device of a process new to the job
		}
	}
	start := time.Now()
	if err := v.Migrate(after); err != nil {
		return nil, fmt.Errorf("rank %d: %w", c.Rank(), err)
	}
	return &Migration{From: distinct(before), To: distinct(after), Seconds: time.Since(start).Seconds(),
		Bytes: int64(moved) * 2 * 8 * int64(np)}, nil
}

func distinct(p vppu.Place) int {
	s := slices.Clone(p)
	slices.Sort(s)
	return len(slices.Compact(s))
}

func hosts(v *vppu.Comm) int { return distinct(v.Place()) }

// update is classical momentum on the devices' parameters: v ← μv + g,
// w ← w − ηv (plain SGD when μ is 0).
func update(w, vel, g []float64, lr, mu float64) {
	for i := range w {
		if mu != 0 {
			vel[i] = mu*vel[i] + g[i]
			w[i] -= lr * vel[i]
		} else {
			w[i] -= lr * g[i]
		}
	}
}

// evaluateVirtual splits the test set over the devices (device d takes
// the d-th of m equal parts) and sums loss and hits with the virtual
// allreduce, so the figures do not depend on the placement either.
func evaluateVirtual(v *vppu.Comm, eval *Evaluator, test *Dataset) (loss, acc float64, err error) {
	m := v.Size()
	local := v.Local()
	sums := make([][]byte, len(local))
	for k, d := range local {
		lo, hi := d*test.N/m, (d+1)*test.N/m
		idx := make([]int, hi-lo)
		for i := range idx {
			idx[i] = lo + i
		}
		l, hits, err := eval.Eval(test, idx)
		if err != nil {
			return 0, 0, err
		}
		sums[k] = f64Bytes([]float64{l, float64(hits)})
	}
	if err := v.AllReduce(sums, sums, 2, engine.Float64, engine.Sum); err != nil {
		return 0, 0, fmt.Errorf("allreduce of the test metrics: %w", err)
	}
	s := f64s(sums[0])
	return s[0] / float64(test.N), s[1] / float64(test.N), nil
}

// deviceVec is a device's registered buffer as float64s.
func deviceVec(v *vppu.Comm, d int, name string) []float64 {
	b, _ := v.Buffer(d, name)
	return f64s(b)
}

func f64s(b []byte) []float64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&b[0])), len(b)/8)
}

func flatten(parts [][]float64, n int) []float64 {
	out := make([]float64, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func unflatten(parts [][]float64, flat []float64) {
	for _, p := range parts {
		flat = flat[copy(p, flat):]
	}
}
