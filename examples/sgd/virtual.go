package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu"
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
	LogEvery  int    // print the loss every this many steps (0: never)
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
// updates it once per step. A rank left without devices by the migration returns (nil, nil).
func TrainVirtual(c *engine.Comm, train, test *Dataset, cfg Config, vc VirtualConfig, log io.Writer) (*RunResult, error) {
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
	out := log
	if c.Rank() != 0 {
		log = io.Discard
	}
	model, err := NewMLP(cfg.sizes(train), cfg.Batch/m, cfg.Seed)
	if err != nil {
		return nil, err
	}
	defer model.Close()
	logical, err := vppu.ParseLogical("ring", m)
	if err != nil {
		return nil, err
	}
	np := model.NumParams()
	var v *vppu.Comm
	joinedAt := 0
	if vc.Joining {
		// A replacement process: the members' Grow admitted it; its
		// devices and their state come with the members' Recover.
		var rec vppu.Recovery
		if v, rec, err = vppu.Join(c, logical, vppu.RecoverOptions{MinRanks: vc.MinRanks}); err != nil {
			return nil, err
		}
		defer v.Destroy()
		if len(v.Local()) == 0 {
			return nil, fmt.Errorf("rank %d joined but was given no virtual device", c.Rank())
		}
		joinedAt = int(rec.Step)
	} else {
		if v, err = vppu.New(c, logical, vppu.Block(m, c.Size())); err != nil {
			return nil, err
		}
		defer v.Destroy()
		if err := v.RegisterShared("params", f64Bytes(flatten(model.ParamData(), np))); err != nil {
			return nil, err
		}
		if err := v.RegisterShared("velocity", make([]byte, 8*np)); err != nil {
			return nil, err
		}
		// The global steps done: a process that receives devices checks that
		// the state it got is that of the step it is at.
		if err := v.RegisterShared("step", make([]byte, 8)); err != nil {
			return nil, err
		}
	}
	// With -respawn each step's allreduce carries one more element: rank
	// 0's count of waiting joiners (on its first device, times M so that
	// the average is the count), so every rank decides alike to grow.
	width := np + 1
	if vc.Respawn {
		width++
	}
	eval, err := cfg.evaluator(model, test)
	if err != nil {
		return nil, err
	}
	if eval != nil {
		defer eval.Close()
	}
	res := newResult(c, cfg, model, train, test)
	res.Virtual = m
	sched := Schedule{N: train.N, Batch: cfg.Batch, Seed: cfg.Seed}
	steps := sched.StepsPerEpoch()
	// Per local device: its gradient, then its shard's loss, as views of
	// one array (which the virtual allreduce reads in place); avg is the
	// average, every device's alike, written once. One pass computes all
	// the local devices' gradients, each straight into its view.
	var grads, avgs [][]byte
	var pass *Pass
	var gparts [][][]float64
	var losses []float64
	avg := make([]float64, width)
	var comm, compute time.Duration
	prof := newProfile(cfg.Profile)
	seen, step := joinedAt*cfg.Batch, joinedAt
	clock := 0.0
	total := cfg.Epochs * steps
	var el *elastic
	if vc.Elastic {
		el = &elastic{c: c, orig: c, out: out, min: vc.MinRanks, jobFile: vc.JobFile}
		if err := el.publish(); err != nil {
			return nil, err
		}
	}
	// survive handles a failed collective: without -elastic the run ends;
	// with it, the survivors shrink, recover the devices and return the
	// step they all are at now.
	survive := func(err error, what string) (int, error) {
		if el == nil {
			return 0, fmt.Errorf("rank %d step %d: %s: %w", c.Rank(), step, what, err)
		}
		at, rerr := el.recover(v, err, step, what)
		if rerr != nil {
			return 0, rerr
		}
		c = el.c
		if c.Rank() == 0 {
			log = out
		} else {
			log = io.Discard
		}
		return at, nil
	}
	epochStart, comm0, compute0 := time.Now(), comm, compute
	lossSum := 0.0
	var perm []int
	permEpoch := -1
	joiners := 0 // waiting to join, as the last step's allreduce said
	for step < total {
		if joiners > 0 {
			n := joiners
			joiners = 0
			if err := el.grow(v, n, step); err != nil {
				if step, err = survive(err, "admitting joiners"); err != nil {
					return nil, err
				}
			}
			c = el.c
			log = io.Discard
			if c.Rank() == 0 {
				log = out
			}
			grads = nil
			continue
		}
		e, s := step/steps, step%steps
		if e != permEpoch {
			perm, permEpoch = sched.Epoch(e), e
		}
		if vc.MigrateAt > 0 && step == vc.MigrateAt && res.Migration == nil {
			// After a lost rank there may be fewer processes than asked.
			mig, err := migrate(v, c, min(vc.MigrateTo, c.Size()), np)
			if err != nil {
				// A rank lost during the move: recover onto the survivors
				// (all of them), then migrate again.
				if step, err = survive(err, "migration"); err != nil {
					return nil, err
				}
				grads = nil
				continue
			}
			mig.Step = step
			res.Migration = mig
			fmt.Fprintf(log, "step %d: migrated %d virtual devices from %d to %d processes in %.1f ms (%.1f MB of parameters and momentum moved)\n",
				step, m, mig.From, mig.To, 1e3*mig.Seconds, float64(mig.Bytes)/1e6)
			if len(v.Local()) == 0 {
				return nil, nil
			}
			if b, _ := v.Buffer(v.Local()[0], "step"); binary.LittleEndian.Uint64(b) != uint64(step) {
				return nil, fmt.Errorf("rank %d: the migrated state is that of step %d, not %d", c.Rank(), binary.LittleEndian.Uint64(b), step)
			}
		}
		t := time.Now()
		prof.Start()
		local := v.Local()
		if len(grads) != len(local) {
			all := make([]byte, 8*width*len(local))
			grads, avgs = make([][]byte, len(local)), make([][]byte, len(local))
			if pass, err = NewPass(cfg.sizes(train), cfg.Batch/m, len(local)); err != nil {
				return nil, err
			}
			gparts, losses = make([][][]float64, len(local)), make([]float64, len(local))
			for k := range grads {
				grads[k] = all[8*width*k : 8*width*(k+1)]
				avgs[k] = f64Bytes(avg)
				gparts[k] = pass.Parts(f64s(grads[k])[:np])
			}
		}
		params, velocity := deviceVec(v, local[0], "params"), deviceVec(v, local[0], "velocity")
		for k, d := range local {
			pass.Load(train, k, sched.Shard(perm, s, d, m))
		}
		prof.Mark(phaseLoad)
		if err := pass.Run(pass.Parts(params), gparts, losses); err != nil {
			return nil, err
		}
		for k, loss := range losses {
			f64s(grads[k])[np] = loss
		}
		prof.Mark(phaseBackward)
		t1 := time.Now()
		compute += t1.Sub(t)
		if vc.Respawn {
			g := f64s(grads[0])
			g[np+1] = 0
			if c.Rank() == 0 {
				g[np+1] = float64(c.Joiners() * m)
			}
		}
		if err := v.AllReduce(grads, avgs, width, engine.Float64, engine.Avg); err != nil {
			if step, err = survive(err, "allreduce of the gradients"); err != nil {
				return nil, err
			}
			grads = nil // the devices of this rank may have changed
			continue
		}
		t2 := time.Now()
		comm += t2.Sub(t1)
		prof.Mark(phaseAllReduce)
		update(params, velocity, avg[:np], cfg.LR, cfg.Momentum)
		if b, _ := v.Buffer(local[0], "step"); len(b) == 8 {
			binary.LittleEndian.PutUint64(b, uint64(step+1))
		}
		compute += time.Since(t2)
		prof.Mark(phaseUpdate)
		prof.Step()
		loss := avg[np]
		if vc.Respawn {
			joiners = int(avg[np+1])
		}
		if el != nil {
			el.stepDone()
		}
		seen += cfg.Batch
		step++
		lossSum += loss
		res.Curve = append(res.Curve, CurvePoint{Samples: seen, Loss: loss, Seconds: clock + time.Since(epochStart).Seconds()})
		if vc.LogEvery > 0 && step%vc.LogEvery == 0 {
			fmt.Fprintf(log, "step %d loss %.4f\n", step, loss)
		}
		if step%steps != 0 {
			continue
		}
		secs := time.Since(epochStart).Seconds()
		clock += secs
		st := EpochStats{
			Epoch: e + 1, Samples: seen, TrainLoss: lossSum / float64(steps),
			Seconds: secs, SamplesPerSec: float64(steps*cfg.Batch) / secs,
			CommSeconds: (comm - comm0).Seconds(), ComputeSecs: (compute - compute0).Seconds(),
		}
		// With -elastic only the last epoch is evaluated: a recovery then
		// has one kind of collective to settle, the step's.
		if eval != nil && (el == nil || step == total) {
			for {
				unflatten(model.ParamData(), deviceVec(v, v.Local()[0], "params"))
				var err error
				if st.TestLoss, st.TestAcc, err = evaluateVirtual(v, eval, test); err == nil {
					break
				}
				if _, err = survive(err, "evaluation"); err != nil {
					return nil, err
				}
			}
		}
		res.Epochs = append(res.Epochs, st)
		fmt.Fprintf(log, "epoch %d/%d  %d virtual devices on %d processes  train loss %.4f  test loss %.4f  test acc %.4f  %6.0f samples/s\n",
			st.Epoch, cfg.Epochs, m, hosts(v), st.TrainLoss, st.TestLoss, st.TestAcc, st.SamplesPerSec)
		epochStart, comm0, compute0 = time.Now(), comm, compute
		lossSum = 0
	}
	prof.Write(log, fmt.Sprintf("%d virtual devices on %d processes", m, hosts(v)))
	if el != nil {
		el.report(log)
	}
	res.Stats.ComputeSec, res.Stats.WaitSec, res.Stats.Steps = compute.Seconds(), comm.Seconds(), step
	res.Stats.InFlightSec = comm.Seconds() // one blocking allreduce per step: nothing overlaps it
	res.Stats.MBPerStep = float64(8*(np+1)) / 1e6
	res.Buckets = 1
	unflatten(model.ParamData(), deviceVec(v, v.Local()[0], "params"))
	res.summarize(seen, comm, model.ParamData())
	res.final = c
	if el != nil {
		res.Recoveries = el.Stats
	}
	return res, nil
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
