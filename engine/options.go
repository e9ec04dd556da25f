package engine

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/topology"
)

// DefaultTimeout bounds every blocking wait when Options.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// Options configure a communicator. The zero value is usable.
type Options struct {
	// Timeout bounds every wait of every collective (GOCOLL_TIMEOUT).
	Timeout time.Duration
	// Algo overrides the algorithm choice (GOCOLL_ALGO): a bare name such as
	// "ring" applies to every collective that has it; "allreduce=hd,alltoall=bruck"
	// sets them one by one. See algo.go for the names.
	Algo string
	// BruckRadix is the radix of the Bruck all-to-all (GOCOLL_BRUCK_RADIX, default 2).
	BruckRadix int
	// Segments is q, the number of pipeline segments per halving-doubling
	// round (GOCOLL_HD_SEGMENTS, default chosen by size).
	Segments int
	// NetBandwidth is what one host's network link carries, in bytes/s
	// each way (GOCOLL_NET_BANDWIDTH, e.g. "250mbit" or "25gbit"): the cost
	// model uses it to choose algorithms across hosts. Zero: unknown, and
	// the model picks what is closest to the best at 1, 10 and 100 Gbit/s.
	NetBandwidth float64
	// SocketIfname picks the network interface for TCP (GOCOLL_SOCKET_IFNAME).
	SocketIfname string
	// Transport: "auto" (shared memory inside a host, TCP between hosts), or
	// "tcp" to force TCP everywhere (GOCOLL_TRANSPORT).
	Transport string
	// NoCMA keeps ranks on one host from reading each other's buffers with
	// process_vm_readv, so that data always passes through the shared
	// slots (GOCOLL_CMA=0). By default they do wherever every rank can.
	NoCMA bool
	// LockedCallers says that blocking calls come from goroutines locked
	// to their threads, as calls from C through cgo do (the C library sets
	// it). Such a call, run on the caller's thread, then waits by yielding
	// the core only: runtime.Gosched there hands the thread's goroutine
	// through another thread, ~5 µs a round.
	LockedCallers bool
	// FlightRecords is how many of its last operations a communicator
	// keeps for its dumps (GOCOLL_FLIGHT_RECORDS; zero: DefaultFlightRecords;
	// negative, or GOCOLL_FLIGHT_RECORDS=0: no recorder, no SIGUSR1 handler
	// and no dump on failure).
	FlightRecords int
	// ShrinkQuorum is how many ranks Shrink's agreement needs: "live" or
	// "" (the default: every rank not found failed, so any number of
	// crashes can be survived, but the two sides of a network partition
	// each go on alone) or "majority" (more than half the communicator's
	// ranks: never two communicators, but fewer survivors get
	// ErrNoQuorum). See docs/elastic.md.
	ShrinkQuorum string
	// DumpDir is where dumps are written (GOCOLL_DUMP_DIR; empty: the temp
	// dir, os.TempDir, at the time of the dump).
	DumpDir string
	// Logger receives debug and warning output; nil discards it.
	Logger *slog.Logger
	// Metrics, when set, is updated after every operation (see NewMetrics).
	Metrics *Metrics
	// Getenv reads launcher variables for NewCommFromEnv (os.Getenv when
	// nil). A C library passes C's getenv: Go's copy of the environment is
	// taken at load time and misses variables set later.
	Getenv func(string) string

	hooks *testHooks // fault injection for this package's tests; nil otherwise
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.BruckRadix < 2 {
		o.BruckRadix = 2
	}
	if o.Transport == "" {
		o.Transport = "auto"
	}
	if o.FlightRecords == 0 {
		o.FlightRecords = DefaultFlightRecords
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	return o
}

// OptionsFromEnv reads the GOCOLL_* variables through getenv (os.Getenv when
// nil). Logging goes to stderr at GOCOLL_DEBUG's level (DEBUG, INFO, WARN,
// ERROR; WARN when unset); GOCOLL_DEBUG=OFF silences it.
func OptionsFromEnv(getenv func(string) string) (Options, error) {
	return OptionsFromSettings(getenv)
}

// Setting gives one GOCOLL_* setting a value of its own for one
// communicator (a field of the C library's gocollConfig_t, a keyword of
// Python's gocoll.init), in place of the environment's.
type Setting struct {
	Var   string // the variable it replaces, e.g. "GOCOLL_TIMEOUT"
	Value string // in that variable's syntax; "" means unset: the environment's value applies
	Field string // what error messages call it, e.g. "gocollConfig_t.timeoutMs"
}

// OptionsFromSettings is OptionsFromEnv where each setting's value wins
// over its variable: the same parsing and checks for both (a bad value is
// an ErrInvalidArgument naming the setting's Field), so a communicator's
// own settings can never mean something else than the variables. A
// setting for a variable this function does not read is an error.
func OptionsFromSettings(getenv func(string) string, settings ...Setting) (Options, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	o := Options{Getenv: getenv}
	own := map[string]Setting{}
	for _, st := range settings {
		if !slices.Contains(settingVars, st.Var) {
			return o, fmt.Errorf("%w: %s: %s is no per-communicator setting", ErrInvalidArgument, st.Field, st.Var)
		}
		if st.Value != "" {
			own[st.Var] = st
		}
	}
	// get returns a setting's value and how to name it in an error.
	get := func(name string) (value, what string) {
		if st, ok := own[name]; ok {
			return st.Value, st.Field
		}
		return getenv(name), name
	}
	if v, what := get("GOCOLL_TIMEOUT"); v != "" {
		d, err := parseDuration(v)
		if err != nil || d <= 0 {
			return o, fmt.Errorf("%w: %s=%q: want a duration such as 30s or a number of seconds", ErrInvalidArgument, what, v)
		}
		o.Timeout = d
	}
	var what string
	o.Algo, what = get("GOCOLL_ALGO")
	if _, err := parseAlgoSpec(o.Algo); err != nil {
		return o, fmt.Errorf("%s=%q: %w", what, o.Algo, err)
	}
	for _, iv := range []struct {
		name string
		dst  *int
		min  int
	}{{"GOCOLL_BRUCK_RADIX", &o.BruckRadix, 2}, {"GOCOLL_HD_SEGMENTS", &o.Segments, 1}} {
		if v, what := get(iv.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < iv.min {
				return o, fmt.Errorf("%w: %s=%q: want an integer ≥ %d", ErrInvalidArgument, what, v, iv.min)
			}
			*iv.dst = n
		}
	}
	if v, what := get("GOCOLL_FLIGHT_RECORDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1<<20 {
			return o, fmt.Errorf("%w: %s=%q: want an integer from 0 (off) to 1048576", ErrInvalidArgument, what, v)
		}
		o.FlightRecords = n
		if n == 0 {
			o.FlightRecords = -1
		}
	}
	o.DumpDir, _ = get("GOCOLL_DUMP_DIR")
	if v, what := get("GOCOLL_NET_BANDWIDTH"); v != "" {
		bw, err := topology.ParseRate(v)
		if err != nil {
			return o, fmt.Errorf("%w: %s=%q: want a rate such as 250mbit, 10gbit or 1.25GB", ErrInvalidArgument, what, v)
		}
		o.NetBandwidth = bw
	}
	o.SocketIfname, _ = get("GOCOLL_SOCKET_IFNAME")
	v, what := get("GOCOLL_TRANSPORT")
	switch t := strings.ToLower(v); t {
	case "", "auto", "tcp":
		o.Transport = t
	default:
		return o, fmt.Errorf("%w: %s=%q: want auto or tcp", ErrInvalidArgument, what, t)
	}
	v, what = get("GOCOLL_CMA")
	switch strings.ToLower(v) {
	case "", "1", "on", "true", "yes":
	case "0", "off", "false", "no":
		o.NoCMA = true
	default:
		return o, fmt.Errorf("%w: %s=%q: want 1 or 0", ErrInvalidArgument, what, v)
	}
	// Warnings reach stderr unless silenced: they are what an operator
	// needs to see (an unauthenticated job across hosts, a metrics port
	// moved, refused connections), and a quiet default would hide them.
	lvl := slog.LevelWarn
	v, what = get("GOCOLL_DEBUG")
	switch v := strings.ToUpper(v); v {
	case "":
	case "OFF", "NONE":
		o.Logger = slog.New(slog.DiscardHandler)
		return o, nil
	default:
		if err := lvl.UnmarshalText([]byte(v)); err != nil {
			return o, fmt.Errorf("%w: %s=%q: want DEBUG, INFO, WARN, ERROR or OFF", ErrInvalidArgument, what, v)
		}
	}
	v, what = get("GOCOLL_DEBUG_FILE")
	out, err := debugFile(v, what)
	if err != nil {
		return o, err
	}
	host, _ := os.Hostname()
	o.Logger = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: lvl})).With("host", host, "pid", os.Getpid())
	return o, nil
}

// debugFile opens GOCOLL_DEBUG_FILE for appending, %h replaced by the host
// name and %p by the process id as in NCCL_DEBUG_FILE (one file per
// process: gocoll.%h.%p.log); unset, the log goes to stderr.
func debugFile(pattern, what string) (io.Writer, error) {
	if pattern == "" {
		return os.Stderr, nil
	}
	host, _ := os.Hostname()
	path := strings.NewReplacer("%h", host, "%p", strconv.Itoa(os.Getpid()), "%%", "%").Replace(pattern)
	debugFiles.mu.Lock()
	defer debugFiles.mu.Unlock()
	if f, ok := debugFiles.open[path]; ok {
		return f, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidArgument, what, err)
	}
	debugFiles.open[path] = f
	return f, nil
}

// settingVars are the variables OptionsFromSettings reads: every one may
// be a communicator's own Setting. (The launcher's variables, read when a
// communicator joins from the environment, and GOCOLL_METRICS_ADDR, the
// process's one metrics endpoint, are not per communicator.)
var settingVars = []string{"GOCOLL_TIMEOUT", "GOCOLL_ALGO", "GOCOLL_BRUCK_RADIX", "GOCOLL_HD_SEGMENTS",
	"GOCOLL_FLIGHT_RECORDS", "GOCOLL_DUMP_DIR", "GOCOLL_NET_BANDWIDTH", "GOCOLL_SOCKET_IFNAME",
	"GOCOLL_TRANSPORT", "GOCOLL_CMA", "GOCOLL_DEBUG", "GOCOLL_DEBUG_FILE"}

// debugFiles are the log files of this process, opened once each however
// many communicators log to them (a per-process resource, like stderr: the
// C library creates a communicator per init, and each must not cost a
// descriptor that stays open).
var debugFiles = struct {
	mu   sync.Mutex
	open map[string]*os.File
}{open: map[string]*os.File{}}

func parseDuration(v string) (time.Duration, error) {
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(s * float64(time.Second)), nil
	}
	return time.ParseDuration(v)
}
