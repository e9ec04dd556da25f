package engine

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultTimeout bounds every blocking wait when Options.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// Options configure a communicator. The zero value is usable.
type Options struct {
	// Timeout bounds every wait of every collective (GOCOLL_TIMEOUT).
	Timeout time.Duration
	// Algo overrides the algorithm choice (GOCOLL_ALGO): a bare name such as
	// "ring" applies to every collective that has it; "allreduce=hd,alltoall=bruck"
	// sets them one by one. See engine/internal/choose/registry.go for the names.
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
	// Connect says when TCP connections are made (GOCOLL_CONNECT): ""
	// (lazy: at creation only to each rank's ring and recursive-doubling
	// neighbours, the rest on first use, so that a rank holds descriptors
	// for the peers its collectives use) or "all" (every pair at creation:
	// a full mesh).
	Connect string
	// NoCMA keeps ranks on one host from reading each other's buffers with
	// process_vm_readv, so that data always passes through the shared
	// slots (GOCOLL_CMA=0). By default they do wherever every rank can.
	NoCMA bool
	// LockedCallers says that blocking calls come from goroutines locked
	// to their threads, as calls from C through cgo do (the C library sets
	// it). Such a call, run on the caller's thread, then waits by yielding
	// the core only: runtime.Gosched there hands the thread's goroutine
	// through another thread, a round trip far longer than a yield.
	LockedCallers bool
	// FlightRecords is how many of its last operations a communicator
	// keeps for its dumps (GOCOLL_FLIGHT_RECORDS; zero: DefaultFlightRecords;
	// negative, or GOCOLL_FLIGHT_RECORDS=0: no recorder, no SIGUSR1 handler
	// and no dump on failure).
	FlightRecords int
	// ShrinkQuorum is how many ranks Shrink's agreement needs
	// (GOCOLL_SHRINK_QUORUM): "majority" (more than half of the ranks not
	// known dead) or "live" (every rank not found failed); empty means
	// majority. See docs/settings.md and docs/elastic.md.
	ShrinkQuorum string
	// Tune says whether a communicator that spans hosts times its
	// allreduce schedules when it is created (GOCOLL_TUNE): "" (auto: use
	// the table cached for its hosts, else measure and cache it),
	// "redo" (measure and cache, whatever is cached) or "off" (the cost
	// model alone). See docs/tuning.md.
	Tune string
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
	if o.ShrinkQuorum == "" {
		o.ShrinkQuorum = "majority"
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

// OptionsFromEnv reads the per-communicator GOCOLL_* variables (the table in
// settings.go, documented in docs/settings.md) through getenv (os.Getenv when
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

	num   int  // the value as an int (IntSetting)
	isNum bool // num, not Value, is the value
}

// IntSetting is a Setting whose value is an int, as gocollConfig_t's int
// fields give it (ConfigField.Int): checked as the variable's text would
// be, without a round trip through one. GOCOLL_TIMEOUT's int is in
// milliseconds.
func IntSetting(variable string, n int, field string) Setting {
	return Setting{Var: variable, Field: field, num: n, isNum: true}
}

// OptionsFromSettings is OptionsFromEnv where each setting's value wins
// over its variable: the same parsing and checks for both (a bad value is
// an ErrInvalidArgument naming the setting's Field), so a communicator's
// own settings can never mean something else than the variables. A
// setting for a variable this function does not read is an error.
func OptionsFromSettings(getenv func(string) string, own ...Setting) (Options, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	p := parsed{Options: Options{Getenv: getenv}, logLevel: slog.LevelWarn}
	byVar := map[string]Setting{}
	for _, st := range own {
		s := settingByVar(st.Var)
		if s == nil || s.Scope != scopeComm {
			return p.Options, fmt.Errorf("%w: %s: %s is no per-communicator setting", ErrInvalidArgument, st.Field, st.Var)
		}
		if st.isNum && s.num == nil {
			return p.Options, fmt.Errorf("%w: %s: %s takes no integer", ErrInvalidArgument, st.Field, st.Var)
		}
		if st.isNum || st.Value != "" {
			byVar[st.Var] = st
		}
	}
	for i := range settings {
		s := &settings[i]
		if s.Scope != scopeComm {
			continue
		}
		st, ok := byVar[s.Var]
		var err error
		switch {
		case ok && st.isNum:
			if err = s.num(&p, st.num); err != nil {
				return p.Options, s.invalid(st.Field, strconv.Itoa(st.num), err)
			}
		case ok:
			if err = s.set(&p, st.Value); err != nil {
				return p.Options, s.invalid(st.Field, strconv.Quote(st.Value), err)
			}
		default:
			if v := getenv(s.Var); v != "" {
				if err = s.set(&p, v); err != nil {
					return p.Options, s.invalid(s.Var, strconv.Quote(v), err)
				}
			}
		}
	}
	o := p.Options
	if p.logOff {
		o.Logger = slog.New(slog.DiscardHandler)
		return o, nil
	}
	out := p.logOut
	if out == nil {
		out = os.Stderr
	}
	host, _ := os.Hostname()
	o.Logger = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: p.logLevel})).With("host", host, "pid", os.Getpid())
	return o, nil
}

// debugFile opens GOCOLL_DEBUG_FILE for appending, %h replaced by the host
// name and %p by the process id as in NCCL_DEBUG_FILE (one file per
// process: gocoll.%h.%p.log).
func debugFile(pattern string) (io.Writer, error) {
	host, _ := os.Hostname()
	path := strings.NewReplacer("%h", host, "%p", strconv.Itoa(os.Getpid()), "%%", "%").Replace(pattern)
	debugFiles.mu.Lock()
	defer debugFiles.mu.Unlock()
	if f, ok := debugFiles.open[path]; ok {
		return f, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	debugFiles.open[path] = f
	return f, nil
}

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
