// Command sgd trains a multi-layer perceptron on Fashion-MNIST with
// data-parallel minibatch SGD: a hand-written pass, bit for bit the model's
// Gorgonia graph, computes each rank's gradients, gocoll averages them, and
// every rank applies the same update.
//
// With no flags it runs the demo: the same training on 1, 2 and 4 ranks
// (separate processes on this host), one after another, and writes a report
// (examples/sgd/out/report.md) showing that more ranks change the speed,
// not the result. Other ways to run it:
//
//	sgd -np 4                  4 processes on this host (re-executes itself)
//	sgd -local 4               4 ranks as goroutines of this process
//	sgd -compare 1,2,4,8       several rank counts one after another
//	sgd -np 4 -virtual 8 -migrate-at 1000 -migrate-to 2
//	                           8 virtual devices on 4 processes, moved onto
//	                           2 of them before step 1000 (vppu)
//	sgd -np 4 -virtual 8 -elastic [-respawn]
//	                           8 virtual devices that survive a killed rank
//	                           process (docs/elastic.md); -respawn starts a
//	                           replacement that joins
//	sgd -virtual 8 -migrate-at 1000 -compare 2,4,4:2
//	                           the three side by side ("4:2": 4 processes
//	                           migrating to 2)
//	torchrun --no_python --nproc_per_node 4 --redirects 1 --tee 1 sgd
//	mpirun --allow-run-as-root --oversubscribe -np 4 sgd
//
// Under a launcher (torchrun, Open MPI, Slurm, or GOCOLL_RANK/GOCOLL_SIZE/
// GOCOLL_ROOT_ADDR) each process is one rank and joins with
// engine.NewCommFromEnv. The last lines printed are "weights sha256 <hex>"
// and "test accuracy: 0.xxxx".
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/bootstrap"
)

// options are the command line.
type options struct {
	cfg        Config
	hidden     string
	np, local  int
	compare    string
	goroutines bool
	check      bool
	tol        float64
	trainLimit int
	testLimit  int
	data       string
	synthetic  bool
	report     string
	result     string
	algo       string
	bucketKB   int
	virtual    VirtualConfig

	fs *flag.FlagSet
}

// Defaults of the demo: about 87.5% test accuracy in 6 epochs.
const (
	defaultHidden   = "128"
	defaultBatch    = 128
	defaultEpochs   = 6
	defaultLR       = 0.05
	defaultMomentum = 0.9
	defaultCompare  = "1,2,4"
)

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("sgd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.hidden, "hidden", defaultHidden, "hidden layer widths, comma-separated (model size)")
	fs.IntVar(&o.cfg.Batch, "batch", defaultBatch, "global minibatch size, split evenly over the ranks")
	fs.IntVar(&o.cfg.Epochs, "epochs", defaultEpochs, "passes over the training set")
	fs.Float64Var(&o.cfg.LR, "lr", defaultLR, "learning rate")
	fs.Float64Var(&o.cfg.Momentum, "momentum", defaultMomentum, "momentum (0: plain SGD)")
	var seed uint64
	fs.Uint64Var(&seed, "seed", 1, "seed of the initial weights and the batch order")
	fs.StringVar(&o.algo, "algo", "", "allreduce algorithm, sets GOCOLL_ALGO (ring, hd, rd, or e.g. allreduce=ring)")
	fs.IntVar(&o.np, "np", 0, "run N ranks as processes on this host")
	fs.IntVar(&o.local, "local", 0, "run N ranks as goroutines of this process")
	fs.StringVar(&o.compare, "compare", "", "run these rank counts one after another, e.g. 1,2,4 (the default with no -np/-local)")
	fs.BoolVar(&o.goroutines, "goroutines", false, "with -compare: ranks are goroutines instead of processes")
	fs.BoolVar(&o.check, "check", false, "check that all ranks hold identical parameters and that they match a 1-rank run on the same global batches; exit 1 if not")
	fs.Float64Var(&o.tol, "tol", DefaultTolerance, "relative tolerance of -check")
	fs.IntVar(&o.trainLimit, "train-limit", 0, "use only the first N training examples (0: all)")
	fs.IntVar(&o.testLimit, "test-limit", 0, "use only the first N test examples (0: all)")
	fs.StringVar(&o.data, "data", DefaultDataDir, "directory of the Fashion-MNIST IDX files (.gz or not)")
	fs.BoolVar(&o.synthetic, "synthetic", false, "train on synthetic data instead of Fashion-MNIST (sizes from -train-limit/-test-limit)")
	fs.StringVar(&o.report, "report", filepath.Join("examples", "sgd", "out"), "directory for report.md, loss.svg and results.json (empty: none)")
	fs.StringVar(&o.result, "result", "", "write rank 0's results as JSON to this file (used between -np and its ranks)")
	fs.IntVar(&o.bucketKB, "bucket-kb", DefaultBucketBytes>>10, "gradient bucket size in KiB")
	fs.BoolVar(&o.cfg.Profile, "profile", false, "print where rank 0's training steps go, phase by phase (ms per step)")
	fs.IntVar(&o.virtual.Devices, "virtual", 0, "train on M virtual devices placed in blocks over the ranks (results independent of the rank count)")
	fs.IntVar(&o.virtual.MigrateAt, "migrate-at", 0, "with -virtual: before this global step, migrate the devices onto -migrate-to processes")
	fs.IntVar(&o.virtual.MigrateTo, "migrate-to", 0, "with -migrate-at: how many processes (the first ones) keep the devices; the others leave")
	fs.BoolVar(&o.virtual.Elastic, "elastic", false, "with -virtual: when rank processes die, the others shrink the job, recover the devices and go on (same final weights)")
	fs.IntVar(&o.virtual.LogEvery, "log-every", 0, "with -virtual: print the loss every N steps (0: per epoch only)")
	fs.BoolVar(&o.virtual.Respawn, "respawn", false, "with -elastic and -np: start a replacement for each killed rank; it joins at a step boundary")
	fs.IntVar(&o.virtual.MinRanks, "min-ranks", 1, "with -elastic: the fewest processes to go on with")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.fs = fs
	o.cfg.Seed = seed
	o.cfg.BucketBytes = o.bucketKB << 10
	for _, h := range strings.Split(o.hidden, ",") {
		if strings.TrimSpace(h) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(h))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-hidden %q: want positive widths such as 128 or 256,128", o.hidden)
		}
		o.cfg.Hidden = append(o.cfg.Hidden, n)
	}
	switch {
	case o.cfg.Batch < 1, o.cfg.Epochs < 1:
		return nil, errors.New("-batch and -epochs must be at least 1")
	case !(o.cfg.LR > 0):
		return nil, errors.New("-lr must be positive")
	case o.np < 0 || o.local < 0:
		return nil, errors.New("-np and -local must not be negative")
	case o.np > 0 && o.local > 0, (o.np > 0 || o.local > 0) && o.compare != "":
		return nil, errors.New("use one of -np, -local and -compare")
	case o.virtual.Devices < 0, o.virtual.MigrateAt < 0, o.virtual.MigrateTo < 0:
		return nil, errors.New("-virtual, -migrate-at and -migrate-to must not be negative")
	case o.virtual.Devices == 0 && (o.virtual.MigrateAt > 0 || o.virtual.MigrateTo > 0):
		return nil, errors.New("-migrate-at and -migrate-to need -virtual")
	case o.virtual.Elastic && o.virtual.Devices == 0:
		return nil, errors.New("-elastic needs -virtual")
	case o.virtual.Respawn && (!o.virtual.Elastic || o.virtual.MigrateAt > 0):
		return nil, errors.New("-respawn needs -elastic and does not go with -migrate-at (processes that leave in the migration stop answering the job)")
	case o.virtual.Devices > 0 && o.check:
		return nil, errors.New("-check compares rank counts of plain data parallelism; with -virtual the runs agree to the bit (compare their losses)")
	case (o.virtual.MigrateAt > 0) != (o.virtual.MigrateTo > 0) && !strings.Contains(o.compare, ":"):
		return nil, errors.New("-migrate-at and -migrate-to go together")
	}
	return o, nil
}

// exitLeftOut is a rank's exit status when the others went on without
// it (stopped past the timeout, or of a view superseded meanwhile), or it
// could not reach a majority of the job (ErrNoQuorum: the others may be
// going on without it, on the side that has one): the job did not fail
// for that, this rank is no longer in it. When every rank exits so, the
// launcher fails the job.
const exitLeftOut = 3

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "sgd:", err)
		}
		if errors.Is(err, engine.ErrExcluded) || errors.Is(err, engine.ErrNoQuorum) {
			os.Exit(exitLeftOut)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.algo != "" {
		// Children and the engine's own parsing see it too.
		os.Setenv("GOCOLL_ALGO", o.algo)
	}
	opts, err := engine.OptionsFromEnv(nil)
	if err != nil {
		return err
	}
	start := time.Now()
	if os.Getenv(joinerVar) != "" {
		return runLaunched(o, opts, "joiner", stdout, start)
	}
	if l := bootstrap.Launcher(os.Getenv); l != "" {
		if o.np > 0 || o.local > 0 || o.compare != "" {
			return fmt.Errorf("started by a launcher (%s): -np, -local and -compare do not apply; each process is one rank", l)
		}
		return runLaunched(o, opts, l, stdout, start)
	}
	var counts []runSpec
	mode := "processes"
	switch {
	case o.local > 0:
		counts, mode = []runSpec{{n: o.local, to: o.virtual.MigrateTo}}, "goroutines"
	case o.np > 0:
		counts = []runSpec{{n: o.np, to: o.virtual.MigrateTo}}
	default:
		list := o.compare
		if list == "" {
			list = defaultCompare
		}
		if counts, err = parseCounts(list, o.virtual); err != nil {
			return err
		}
		if o.goroutines {
			mode = "goroutines"
		}
	}
	if !o.synthetic {
		// One clear error here rather than one per rank.
		if err := probeFashionMNIST(o.data); err != nil {
			return err
		}
	}
	var runs []*RunResult
	for i, spec := range counts {
		n := spec.n
		if len(counts) > 1 {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "== %s (%s) ==\n", spec.label(o.virtual), mode)
		}
		run := *o
		if spec.to > 0 {
			run.virtual.MigrateTo = spec.to
		} else {
			run.virtual.MigrateAt, run.virtual.MigrateTo = 0, 0
		}
		var res *RunResult
		if mode == "goroutines" {
			res, err = runGoroutines(&run, opts, n, stdout)
		} else {
			res, err = runProcesses(&run, n, stdout, stderr)
		}
		if err != nil {
			return err
		}
		runs = append(runs, res)
		if len(counts) > 1 {
			fmt.Fprintf(stdout, "%s: test accuracy %.4f, %.0f samples/s, %.0f%% of the step in allreduce\n",
				res.short(), res.TestAcc, res.SamplesPerSec, 100*res.CommShare)
		}
	}
	if o.report != "" {
		path, err := WriteReport(o.report, runs, commandLine(args), time.Since(start))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "report: %s (%s)\n", path, time.Since(start).Round(time.Second))
	}
	last := runs[len(runs)-1]
	fmt.Fprintf(stdout, "weights sha256 %s\n", last.WeightsSHA256)
	fmt.Fprintf(stdout, "test accuracy: %.4f\n", last.TestAcc)
	return nil
}

// runSpec is one run of -compare: n ranks, migrating to `to` ranks (with
// -virtual and -migrate-at; 0: no migration).
type runSpec struct{ n, to int }

func (s runSpec) label(v VirtualConfig) string {
	switch {
	case v.Devices == 0:
		return fmt.Sprintf("%d rank%s", s.n, plural(s.n))
	case s.to > 0:
		return fmt.Sprintf("%d virtual devices on %d processes, migrated to %d at step %d", v.Devices, s.n, s.to, v.MigrateAt)
	}
	return fmt.Sprintf("%d virtual devices on %d process%s", v.Devices, s.n, map[bool]string{true: "", false: "es"}[s.n == 1])
}

// parseCounts reads -compare: rank counts such as 1,2,4, and with -virtual
// and -migrate-at also N:K (N processes migrating to K).
func parseCounts(list string, v VirtualConfig) ([]runSpec, error) {
	var out []runSpec
	for _, f := range strings.Split(list, ",") {
		ns, ts, migrating := strings.Cut(strings.TrimSpace(f), ":")
		n, err := strconv.Atoi(ns)
		spec := runSpec{n: n}
		if migrating {
			spec.to, err = strconv.Atoi(ts)
			if err == nil && (v.Devices == 0 || v.MigrateAt == 0 || spec.to < 1 || spec.to > n) {
				return nil, fmt.Errorf("-compare %q: N:K (N processes migrating to K <= N) needs -virtual and -migrate-at", list)
			}
		} else if v.MigrateAt > 0 && v.MigrateTo > 0 {
			spec.to = min(v.MigrateTo, n)
		}
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-compare %q: want rank counts such as 1,2,4", list)
		}
		out = append(out, spec)
	}
	return out, nil
}

func commandLine(args []string) string {
	return strings.TrimSpace("sgd " + strings.Join(args, " "))
}

// loadData returns the training and test sets the flags ask for.
func loadData(o *options) (train, test *Dataset, err error) {
	if o.synthetic {
		nt, ne := o.trainLimit, o.testLimit
		if nt <= 0 {
			nt = 4096
		}
		if ne <= 0 {
			ne = 1024
		}
		all := Synthetic(nt+ne, 64, 10, o.cfg.Seed)
		return all.Slice(0, nt), all.Slice(nt, nt+ne), nil
	}
	if train, err = LoadFashionMNIST(o.data, "train", o.trainLimit); err != nil {
		return nil, nil, err
	}
	if test, err = LoadFashionMNIST(o.data, "test", o.testLimit); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

// trainRank runs this rank's part of the job, then -check if asked; rank 0
// prints the verdict.
func trainRank(c *engine.Comm, o *options, opts engine.Options, train, test *Dataset, stdout io.Writer) (*RunResult, error) {
	var res *RunResult
	var err error
	if o.virtual.Devices > 0 {
		res, err = TrainVirtual(c, train, test, o.cfg, o.virtual, stdout)
	} else {
		res, err = Train(c, train, test, o.cfg, stdout)
	}
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", c.Rank(), err)
	}
	if res == nil {
		return nil, nil // left the job in a migration
	}
	res.WeightsSHA256 = weightsHash(res.params)
	if res.final == nil {
		res.final = c
	}
	res.Data = "Fashion-MNIST (" + o.data + ")"
	if o.synthetic {
		res.Data = "synthetic (Gaussian blobs)"
	}
	if o.check {
		verdict, err := checkRun(c, res, train, o.cfg, opts, o.tol)
		if c.Rank() == 0 && verdict != "" {
			fmt.Fprintf(stdout, "check: %s\n", verdict)
			res.Check = verdict
		}
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// runGoroutines runs n ranks as goroutines over the in-process transport.
func runGoroutines(o *options, opts engine.Options, n int, stdout io.Writer) (*RunResult, error) {
	train, test, err := loadData(o)
	if err != nil {
		return nil, err
	}
	comms, err := engine.NewLocalComms(n, opts)
	if err != nil {
		return nil, err
	}
	results := make([]*RunResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[r], errs[r] = trainRank(c, o, opts, train, test, stdout)
			if errs[r] != nil {
				c.Abort() // the others stop waiting for this rank
			}
		}()
	}
	wg.Wait()
	for _, c := range comms {
		_ = c.Destroy()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res := results[0]
	res.Mode = "goroutines"
	res.Transport = "in-process"
	return res, nil
}

// runProcesses re-executes this program as n rank processes and reads rank
// 0's results back.
func runProcesses(o *options, n int, stdout, stderr io.Writer) (*RunResult, error) {
	dir, err := os.MkdirTemp("", "gocoll-sgd-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	resultFile := filepath.Join(dir, "rank0.json")
	args := childArgs(o.fs)
	args = append(args, "-report=", "-result="+resultFile)
	if o.virtual.MigrateAt > 0 { // this run's, which -compare may have changed
		args = append(args, fmt.Sprintf("-migrate-at=%d", o.virtual.MigrateAt), fmt.Sprintf("-migrate-to=%d", o.virtual.MigrateTo))
	}
	el := elasticLaunch{On: o.virtual.Elastic, Respawn: o.virtual.Respawn}
	if el.Respawn {
		el.JobFile = filepath.Join(dir, "job")
	}
	if err := spawnRanks(n, args, nil, stdout, stderr, 10*time.Second, el); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(resultFile)
	if err != nil {
		return nil, fmt.Errorf("-np %d: rank 0 left no results: %w", n, err)
	}
	var res RunResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("-np %d: rank 0's results: %w", n, err)
	}
	res.Mode = "processes"
	return &res, nil
}

// childArgs repeats the flags the user set, minus those that choose how to
// run (a child is one rank).
func childArgs(fs *flag.FlagSet) []string {
	skip := map[string]bool{"np": true, "local": true, "compare": true, "goroutines": true, "report": true, "result": true,
		"migrate-at": true, "migrate-to": true}
	var args []string
	fs.Visit(func(f *flag.Flag) {
		if !skip[f.Name] {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	return args
}

// runLaunched is one rank started by a launcher (or by -np).
func runLaunched(o *options, opts engine.Options, launcher string, stdout io.Writer, start time.Time) error {
	train, test, err := loadData(o)
	if err != nil {
		return err
	}
	var c *engine.Comm
	if launcher == "joiner" {
		o.virtual.Joining = true
		c, o.virtual.JoinedView, err = joinJob(os.Getenv(jobFileVar), opts)
	} else {
		c, err = engine.NewCommFromEnv(opts)
	}
	if err != nil {
		return fmt.Errorf("joining the job (%s variables): %w", launcher, err)
	}
	o.virtual.JobFile = os.Getenv(jobFileVar)
	res, err := trainRank(c, o, opts, train, test, stdout)
	if err != nil {
		c.Abort()
		_ = c.Destroy()
		return err
	}
	if res != nil && res.final != c {
		// It survived lost ranks: the communicator it ended on is the
		// job's; the one it started on failed on purpose.
		if err := res.final.Destroy(); err != nil {
			return err
		}
		_ = c.Destroy()
		c = res.final
	} else if err := c.Destroy(); err != nil {
		return err
	}
	if c.Rank() != 0 || res == nil {
		return nil
	}
	res.Mode = "processes"
	if launcher != "gocoll" {
		res.Mode = launcher
	}
	if o.result != "" {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.result, b, 0o644); err != nil {
			return err
		}
	}
	if o.report != "" {
		path, err := WriteReport(o.report, []*RunResult{res}, commandLine(os.Args[1:]), time.Since(start))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "report: %s\n", path)
	}
	if o.result == "" { // else the parent (-np, -compare) has the last word
		fmt.Fprintf(stdout, "weights sha256 %s\n", res.WeightsSHA256)
		fmt.Fprintf(stdout, "test accuracy: %.4f\n", res.TestAcc)
	}
	return nil
}
