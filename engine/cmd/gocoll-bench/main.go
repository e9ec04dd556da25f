// Command gocoll-bench measures gocoll's collectives the way nccl-tests
// measures NCCL's: one line per message size with the time (p50 and p99 over
// iterations), algorithm bandwidth, bus bandwidth and, with -c, the number of
// wrong elements found by an independent check.
//
// Sizes and bus bandwidth follow nccl-tests (doc/PERFORMANCE.md): size is the
// buffer for allreduce, reduce, broadcast and sendrecv; the gathered output
// for allgather; the input for reducescatter; the per-rank send buffer for
// alltoall and alltoallv. algbw = size/time; busbw = algbw × 2(n-1)/n for
// allreduce, × (n-1)/n for allgather, reducescatter, alltoall(v), × 1 for
// broadcast, reduce and sendrecv.
//
// Ranks run in one of three ways:
//
//	gocoll-bench -np 4 ...        4 goroutine ranks in this process
//	                              (-transport mem (default), auto or tcp)
//	gocoll-bench -procs 4 ...     4 processes: this program re-executed with
//	                              GOCOLL_RANK/GOCOLL_SIZE/GOCOLL_ROOT_ADDR
//	torchrun/mpirun/srun gocoll-bench ...
//	                              one rank of a launched job (engine.NewCommFromEnv;
//	                              for mpirun pass -x GOCOLL_ROOT_ADDR=host:port)
//
// GOCOLL_* variables (GOCOLL_TIMEOUT, GOCOLL_ALGO, GOCOLL_TRANSPORT, ...) are
// honoured in every mode; -algo and -transport override them.
//
// Exit status: 0 success, 1 wrong elements found, 2 error.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/kernel"
)

func main() { os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr)) }

// childEnv marks a rank started by -procs (the value is the mode text).
const childEnv = "GOCOLL_BENCH_CHILD"

// idEnv carries, to the ranks -procs starts, the unique id of the
// rendezvous root that the launcher itself runs (hex): as torchrun's agent
// runs its store, so that no rank holds a connection per rank while the
// job sets up.
const idEnv = "GOCOLL_BENCH_ID"

func usage(fs *flag.FlagSet) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, `usage: gocoll-bench [flags]

  gocoll-bench -np 4 -op allreduce -b 4K -e 64M -f 4 -c     goroutine ranks
  gocoll-bench -procs 2 -op all -c                           local processes
  torchrun --nproc-per-node 2 --no-python gocoll-bench ...    one rank of a launched job

flags:
`)
		fs.PrintDefaults()
		fmt.Fprintf(w, `
Bool flags take -c, -c=1 or -c=0 (not "-c 1").
Exit status: 0 ok, 1 wrong elements found, 2 error.
`)
	}
}

func benchMain(args []string, stdout, stderr io.Writer) int {
	cl, err := parseArgs(args, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errFlags):
		return 2 // the flag package said why
	case err != nil:
		return fail(stderr, "%v", err)
	}
	if cl.procs > 0 {
		return launch(cl.fs, cl.procs, cl.launchTimeout, stdout, stderr)
	}
	opts, err := engine.OptionsFromEnv(nil)
	if err != nil {
		return fail(stderr, "%v", err)
	}
	if cl.algo != "" {
		opts.Algo = cl.algo
	}
	cl.cfg.algo = opts.Algo
	launcher := bootstrap.Launcher(os.Getenv)
	if cl.np > 0 || launcher == "" {
		n := cl.np
		if n == 0 {
			n = 2
		}
		tr := cl.transport
		if tr == "" {
			tr = "mem"
		}
		cl.cfg.mode = "goroutines, transport " + tr
		return goroutines(cl.cfg, opts, n, tr, stdout, stderr)
	}
	return launchedRank(cl, opts, launcher, stdout, stderr)
}

// fail reports a usage or set-up error and returns exit status 2.
func fail(stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, "gocoll-bench: "+format+"\n", a...)
	return 2
}

// errFlags: the flag package could not parse the command line and has
// already said why.
var errFlags = errors.New("bad flags")

// cmdLine is what the command line says: the per-rank config and how to
// run the ranks.
type cmdLine struct {
	fs            *flag.FlagSet // the flags as set, for the ranks -procs starts
	cfg           *config
	np, procs     int
	transport     string
	algo          string
	launchTimeout time.Duration
}

// parseArgs reads and checks the flags.
func parseArgs(args []string, stderr io.Writer) (*cmdLine, error) {
	fs := flag.NewFlagSet("gocoll-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = usage(fs)
	opList := fs.String("op", "allreduce", "collective(s), comma-separated, or all: "+strings.Join(allOps, ","))
	minB := fs.String("b", "4K", "minimum size (bytes; K, M, G suffixes)")
	maxB := fs.String("e", "64M", "maximum size")
	factor := fs.Int64("f", 4, "size multiplication factor between sizes")
	iters := fs.Int("n", 20, "timed iterations per size")
	warmup := fs.Int("w", 5, "warm-up iterations per size")
	check := fs.Bool("c", false, "check results: count wrong elements against independently computed expectations")
	dtype := fs.String("d", "float32", "datatype: "+typeNames())
	redop := fs.String("o", "sum", "reduction op: sum, prod, max, min, avg, band, bor, bxor")
	root := fs.Int("root", 0, "root rank of reduce and broadcast")
	algo := fs.String("algo", "", "algorithm override, as GOCOLL_ALGO (e.g. ring, hd, allreduce=rd,alltoall=bruck)")
	jsonOut := fs.Bool("json", false, "one JSON object per size instead of the table")
	np := fs.Int("np", 0, "run this many goroutine ranks in this process (default 2 unless a launcher environment is present)")
	procs := fs.Int("procs", 0, "start this many local processes (re-executing this program)")
	transport := fs.String("transport", "", "mem (goroutines only, the default there), auto or tcp")
	memalloc := fs.Bool("memalloc", false, "allocate the buffers with Comm.MemAlloc (like gocollMemAlloc)")
	csvPath := fs.String("csv", "", "also append rows in the reference benches' CSV format to this file")
	label := fs.String("label", "gocoll-go", "label of the CSV rows")
	breakCheck := fs.Bool("break-check", false, "corrupt one expected element per check (self-test of the checker; with -c)")
	launchTimeout := fs.Duration("launch-timeout", 0, "with -procs: kill the ranks after this long (0: no limit)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errFlags
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (bool flags are written -c or -c=1)", fs.Arg(0))
	}
	cl := &cmdLine{fs: fs, np: *np, procs: *procs, transport: *transport, algo: *algo, launchTimeout: *launchTimeout,
		cfg: &config{iters: *iters, warmup: *warmup, check: *check, root: *root, json: *jsonOut,
			memalloc: *memalloc, breakCheck: *breakCheck, csvPath: *csvPath, label: *label, factor: *factor}}
	if err := cl.check(*minB, *maxB, *dtype, *redop, *opList); err != nil {
		return nil, err
	}
	return cl, nil
}

// check parses the flags given as text into cl.cfg and checks them together.
func (cl *cmdLine) check(minB, maxB, dtype, redop, opList string) error {
	cfg := cl.cfg
	var err error
	if cfg.minBytes, err = parseSize(minB); err != nil {
		return fmt.Errorf("-b: %v", err)
	}
	if cfg.maxBytes, err = parseSize(maxB); err != nil {
		return fmt.Errorf("-e: %v", err)
	}
	switch {
	case cfg.minBytes < 1 || cfg.maxBytes < cfg.minBytes:
		return errors.New("need 1 <= -b <= -e")
	case cfg.factor < 2 && cfg.minBytes != cfg.maxBytes:
		return errors.New("-f must be at least 2")
	case cfg.iters < 1 || cfg.warmup < 0:
		return errors.New("need -n >= 1 and -w >= 0")
	case cl.np < 0 || cl.procs < 0 || (cl.np > 0 && cl.procs > 0):
		return errors.New("give at most one of -np and -procs, positive")
	}
	if cfg.dt, err = kernel.ParseDataType(dtype); err != nil {
		return fmt.Errorf("-d: %v", err)
	}
	if cfg.redop, err = kernel.ParseRedOp(redop); err != nil {
		return fmt.Errorf("-o: %v", err)
	}
	if err := kernel.CheckOp(cfg.dt, cfg.redop); err != nil {
		return fmt.Errorf("-d %v -o %v: %v", cfg.dt, cfg.redop, err)
	}
	for _, op := range strings.Split(opList, ",") {
		op = strings.ToLower(strings.TrimSpace(op))
		switch {
		case op == "all":
			cfg.ops = append(cfg.ops, allOps...)
		case contains(allOps, op):
			cfg.ops = append(cfg.ops, op)
		default:
			return fmt.Errorf("-op: unknown collective %q (want %s or all)", op, strings.Join(allOps, ","))
		}
	}
	return nil
}

// launchedRank runs this process as one rank of a job a launcher (or
// -procs) started.
func launchedRank(cl *cmdLine, opts engine.Options, launcher string, stdout, stderr io.Writer) int {
	cfg := cl.cfg
	if cl.transport != "" {
		if cl.transport == "mem" {
			return fail(stderr, "-transport mem works only with goroutine ranks (-np)")
		}
		opts.Transport = cl.transport
	}
	cfg.mode = os.Getenv(childEnv)
	if cfg.mode == "" {
		cfg.mode = "processes, launcher environment " + launcherVars(launcher)
	}
	began := time.Now()
	c, err := joinJob(opts)
	if err != nil {
		return fail(stderr, "joining the job: %v", err)
	}
	cfg.setup = time.Since(began)
	out := io.Discard
	if c.Rank() == 0 {
		out = stdout
	}
	wrong, err := runRank(c, cfg, out, stderr)
	if err != nil {
		c.Abort()
		c.Destroy()
		return fail(stderr, "rank %d: %v", c.Rank(), err)
	}
	if err := c.Destroy(); err != nil {
		return fail(stderr, "rank %d: destroy: %v", c.Rank(), err)
	}
	if wrong > 0 {
		return 1
	}
	return 0
}

// joinJob joins the launcher's job: through the root -procs runs when it
// passed its id, else as the environment says.
func joinJob(opts engine.Options) (*engine.Comm, error) {
	hexID := os.Getenv(idEnv)
	if hexID == "" {
		return engine.NewCommFromEnv(opts)
	}
	var id engine.UniqueID
	b, err := hex.DecodeString(hexID)
	if err != nil || len(b) != len(id) {
		return nil, fmt.Errorf("%s is not a unique id", idEnv)
	}
	copy(id[:], b)
	l, err := bootstrap.FromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	return engine.NewComm(id, l.Size, l.Rank, opts)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func typeNames() string {
	var names []string
	for _, dt := range kernel.AllDataTypes() {
		names = append(names, dt.String())
	}
	return strings.Join(names, ", ")
}

// launcherVars names, for the header, the variables that made this process
// a rank of launcher (one of bootstrap.Launcher's names).
func launcherVars(launcher string) string {
	switch launcher {
	case "gocoll":
		return "GOCOLL_RANK/GOCOLL_SIZE"
	case "torchrun":
		return "RANK/WORLD_SIZE (torchrun)"
	case "openmpi":
		return "OMPI_COMM_WORLD_* (mpirun)"
	}
	return "SLURM_* (srun)"
}

// lockedWriter serialises the ranks' writes to stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// goroutines runs n ranks as goroutines of this process.
func goroutines(cfg *config, opts engine.Options, n int, tr string, stdout, stderr io.Writer) int {
	var comms []*engine.Comm
	var err error
	began := time.Now()
	switch tr {
	case "mem":
		comms, err = engine.NewLocalComms(n, opts)
	case "auto", "tcp":
		opts.Transport = tr
		comms, err = joinLocal(n, opts)
	default:
		err = fmt.Errorf("-transport %q: want mem, auto or tcp", tr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gocoll-bench: %v\n", err)
		return 2
	}
	cfg.setup = time.Since(began)
	errOut := &lockedWriter{w: stderr}
	wrong := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := io.Discard
			if r == 0 {
				out = stdout
			}
			wrong[r], errs[r] = runRank(c, cfg, out, errOut)
			if errs[r] != nil {
				c.Abort() // the peers fail at once instead of waiting for the timeout
			}
		}()
	}
	wg.Wait()
	for _, c := range comms {
		c.Destroy()
	}
	rc := 0
	for r, err := range errs {
		if err != nil {
			fmt.Fprintf(stderr, "gocoll-bench: rank %d: %v\n", r, err)
			rc = 2
		}
	}
	if rc == 0 && wrong[0] > 0 {
		rc = 1
	}
	return rc
}

// joinLocal makes n communicators of this process through the real
// rendezvous (unique id), so they use the same transports as processes.
func joinLocal(n int, opts engine.Options) ([]*engine.Comm, error) {
	id, err := engine.NewUniqueID(opts)
	if err != nil {
		return nil, err
	}
	comms := make([]*engine.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = engine.NewComm(id, n, r, opts)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				c.Destroy()
			}
		}
		return nil, err
	}
	return comms, nil
}

// launch starts n copies of this program as the ranks of a local job, with
// the flags that were set (minus -procs), and waits for them. Rank 0's
// standard output is ours; every rank's standard error is ours. When a rank
// fails the others get a moment to report their side, then are killed.
func launch(fs *flag.FlagSet, n int, timeout time.Duration, stdout, stderr io.Writer) int {
	self, err := os.Executable()
	if err != nil {
		return fail(stderr, "cannot find my own executable: %v", err)
	}
	var args []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "procs" && f.Name != "np" && f.Name != "launch-timeout" {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	port, err := freePort()
	if err != nil {
		return fail(stderr, "no free port: %v", err)
	}
	env := jobEnv(os.Environ(), n, port)
	// The launcher runs the rendezvous root (it serves until every rank
	// joined, or the timeout), as torchrun's agent runs its store.
	opts, err := engine.OptionsFromEnv(nil)
	if err != nil {
		return fail(stderr, "%v", err)
	}
	id, err := engine.NewUniqueID(opts)
	if err != nil {
		return fail(stderr, "starting the rendezvous root: %v", err)
	}
	env = append(env, idEnv+"="+hex.EncodeToString(id[:]))
	if _, ok := stderr.(*os.File); !ok {
		stderr = &lockedWriter{w: stderr} // the ranks' copies run concurrently
	}
	done := make(chan rankExit, n)
	cmds := make([]*exec.Cmd, n)
	for r := 0; r < n; r++ {
		cmd := exec.Command(self, args...)
		cmd.Env = append(env[:len(env):len(env)], "GOCOLL_RANK="+strconv.Itoa(r), "GOCOLL_LOCAL_RANK="+strconv.Itoa(r))
		cmd.Stderr = stderr
		if r == 0 {
			cmd.Stdout = stdout
		}
		setParentDeathSignal(cmd)
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(stderr, "gocoll-bench: starting rank %d: %v\n", r, err)
			for _, c := range cmds[:r] {
				c.Process.Kill()
				c.Wait()
			}
			return 2
		}
		cmds[r] = cmd
		go func() { done <- rankExit{r, cmd.Wait()} }()
	}
	return waitRanks(cmds, done, timeout, stderr)
}

// jobEnv is the environment of the ranks -procs starts, less their rank:
// ours without the variables of any job we run in, plus a fresh local
// job of n ranks whose root listens on port.
func jobEnv(environ []string, n, port int) []string {
	secret := make([]byte, 16)
	rand.Read(secret)
	drop := append(bootstrap.LauncherVars(), "GOCOLL_PORT", "GOCOLL_SECRET", childEnv, idEnv)
	env := []string{}
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); !slices.Contains(drop, k) {
			env = append(env, kv)
		}
	}
	return append(env, "GOCOLL_SIZE="+strconv.Itoa(n), "GOCOLL_LOCAL_SIZE="+strconv.Itoa(n),
		"GOCOLL_ROOT_ADDR=127.0.0.1:"+strconv.Itoa(port), "GOCOLL_SECRET="+hex.EncodeToString(secret),
		childEnv+"=processes started by -procs")
}

// rankExit is how a rank -procs started ended.
type rankExit struct {
	rank int
	err  error
}

// waitRanks waits for the ranks to exit and returns the worst exit status.
// A rank that fails for another reason than wrong elements gives the
// others a grace period, then they are killed; so do the -launch-timeout
// and an interrupt.
func waitRanks(cmds []*exec.Cmd, done <-chan rankExit, timeout time.Duration, stderr io.Writer) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var deadline <-chan time.Time
	if timeout > 0 {
		deadline = time.After(timeout)
	}
	var grace <-chan time.Time
	killAll := func() {
		for _, c := range cmds {
			c.Process.Kill() // an exited one just returns an error
		}
	}
	rc := 0
	for left := len(cmds); left > 0; {
		select {
		case e := <-done:
			left--
			if e.err != nil {
				code := 2
				var ee *exec.ExitError
				if errors.As(e.err, &ee) && ee.ExitCode() > 0 {
					code = ee.ExitCode()
				} else {
					fmt.Fprintf(stderr, "gocoll-bench: rank %d: %v\n", e.rank, e.err)
				}
				if code > rc {
					rc = code
				}
				if code != 1 && grace == nil { // 1 = wrong elements: the others finish normally
					grace = time.After(5 * time.Second)
				}
			}
		case <-grace:
			fmt.Fprintf(stderr, "gocoll-bench: a rank failed; killing the others\n")
			killAll()
			grace = nil
			rc = max(rc, 2)
		case <-deadline:
			fmt.Fprintf(stderr, "gocoll-bench: -launch-timeout %v passed; killing the ranks\n", timeout)
			killAll()
			deadline = nil
			rc = max(rc, 2)
		case s := <-sigs:
			fmt.Fprintf(stderr, "gocoll-bench: %v; killing the ranks\n", s)
			killAll()
			rc = max(rc, 2)
		}
	}
	return rc
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
