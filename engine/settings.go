package engine

import (
	"errors"
	"fmt"
	"github.com/gocoll/gocoll/engine/internal/choose"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/topology"
)

//go:generate go test -run ^TestSettingsDoc$ -update .

// A setting is one GOCOLL_* variable, declared once (as NCCL_PARAM declares
// NCCL's): how its value is parsed into Options, what it defaults to, what
// it does. OptionsFromSettings walks the table; docs/settings.md is
// generated from it (TestSettingsDoc); the C library's gocollConfig_t and
// Python's Config are checked against its Config column (capi's
// TestConfigFields, test_config_matches_header in
// bridge/python/tests/test_loading.py). To add a setting: an Options
// field, an entry here, a gocollConfig_t field in gocoll.h (at the end,
// with a new GOCOLL_CONFIG_VERSION, and its size in capi/config.go's
// configLayouts), the same field in Python's Config; then go generate
// ./engine.
type setting struct {
	Var   string // the environment variable
	Scope string // who reads it: see the scope constants
	Field string // the Options field it sets; "" for variables read elsewhere
	// Config is the field of gocollConfig_t (and of Python's Config) that
	// gives a communicator its own value; "" for variables read elsewhere.
	// The field is an int when num is set, else a string.
	Config string
	// Default is the value in force when the variable is unset, in its
	// syntax; "" when no value of the variable says what unset does, and
	// Unset says it.
	Default string
	Unset   string
	Range   string // the values it takes: "want " + Range is the error for one outside it
	Doc     string // what it does

	// parse sets the value given as text (the variable's); nil: the text
	// is an integer, given to num. It returns errRange, or an error that
	// says what it wants.
	parse func(p *parsed, v string) error
	// num sets the value given as an int (gocollConfig_t's int fields),
	// with the same checks as the text: no round trip through a string.
	// nil: the setting has no int form.
	num func(p *parsed, n int) error
}

// Scopes: who reads a variable, and when.
const (
	scopeComm    = "communicator" // OptionsFromSettings, for each communicator; it may have its own value
	scopeLaunch  = "launch"       // package bootstrap, when a communicator joins from the launcher's environment
	scopeProcess = "process"      // the C library, once per process
	scopePython  = "python"       // the Python package
)

// errRange says that a value is outside the setting's Range.
var errRange = errors.New("out of range")

// parsed is OptionsFromSettings' work in progress: the Options, and the
// logging settings that together make Options.Logger.
type parsed struct {
	Options
	logLevel slog.Level // GOCOLL_DEBUG (WARN when unset)
	logOff   bool       // GOCOLL_DEBUG=OFF
	logOut   io.Writer  // GOCOLL_DEBUG_FILE (stderr when nil)
}

// settings: the per-communicator ones first, in the order their errors
// take precedence (GOCOLL_DEBUG before GOCOLL_DEBUG_FILE: a log turned off
// opens no file).
var settings = []setting{{
	Var: "GOCOLL_TIMEOUT", Scope: scopeComm, Field: "Timeout", Config: "timeoutMs",
	Default: "5m",
	Range:   "a duration > 0 such as 30s or 1m30s, or a number of seconds such as 90 or 0.5",
	Doc: "Bounds every wait of every operation of the communicator. On expiry the call " +
		"fails with ErrTimeout (gocollTimeout) naming the operation, its sequence number, the rank and " +
		"the peer it waited for. gocollConfig_t.timeoutMs gives it in milliseconds.",
	parse: func(p *parsed, v string) error {
		d, err := parseDuration(v)
		if err != nil || d <= 0 {
			return errRange
		}
		p.Timeout = d
		return nil
	},
	num: func(p *parsed, ms int) error {
		if ms <= 0 {
			return errors.New("want a positive number of milliseconds, or GOCOLL_CONFIG_UNDEF_INT for GOCOLL_TIMEOUT")
		}
		p.Timeout = time.Duration(ms) * time.Millisecond
		return nil
	},
}, {
	Var: "GOCOLL_ALGO", Scope: scopeComm, Field: "Algo", Config: "algo",
	Unset: "chosen for each call from its collective, message size, rank count and hosts " +
		"(the registry in engine/internal/choose/registry.go)",
	Range: "an algorithm name for every collective that has it (ring), or collective=name pairs " +
		"separated by commas (allreduce=hd,alltoall=bruck); the names: " + choose.Known(),
	Doc: "Overrides the algorithm choice. A name that cannot run a call (shm when the ranks span " +
		"hosts, hier on one host) is ignored for that call. GOCOLL_DEBUG=INFO logs each collective's " +
		"choice once per communicator, DEBUG every call's.",
	parse: func(p *parsed, v string) error {
		if _, err := parseAlgoSpec(v); err != nil {
			return err
		}
		p.Algo = v
		return nil
	},
}, {
	Var: "GOCOLL_BRUCK_RADIX", Scope: scopeComm, Field: "BruckRadix", Config: "bruckRadix",
	Default: "2",
	Range:   "an integer ≥ 2",
	Doc:     "The radix of the Bruck all-to-all: a larger radix takes fewer rounds, each sending more.",
	num:     atLeast(2, func(o *Options) *int { return &o.BruckRadix }),
}, {
	Var: "GOCOLL_HD_SEGMENTS", Scope: scopeComm, Field: "Segments", Config: "hdSegments",
	Unset: "chosen by message size",
	Range: "an integer ≥ 1",
	Doc:   "The number of pipeline segments q per round of the halving-doubling allreduce and reduce-scatter.",
	num:   atLeast(1, func(o *Options) *int { return &o.Segments }),
}, {
	Var: "GOCOLL_FLIGHT_RECORDS", Scope: scopeComm, Field: "FlightRecords", Config: "flightRecords",
	Default: strconv.Itoa(DefaultFlightRecords),
	Range:   "an integer from 0 (off) to 1048576",
	Doc: "How many of its last operations the communicator keeps in its flight recorder, which it " +
		"dumps on a failure or on SIGUSR1 (gocoll-doctor reads the dumps). 0 turns the recorder, " +
		"its dumps and its SIGUSR1 handler off.",
	num: func(p *parsed, n int) error {
		if n < 0 || n > 1<<20 {
			return errRange
		}
		p.FlightRecords = n
		if n == 0 {
			p.FlightRecords = -1
		}
		return nil
	},
}, {
	Var: "GOCOLL_DUMP_DIR", Scope: scopeComm, Field: "DumpDir", Config: "dumpDir",
	Unset: "the temp dir ($TMPDIR, else /tmp) at the time of the dump",
	Range: "a directory",
	Doc: "Where flight-recorder dumps are written, one file per rank and communicator: " +
		"`gocoll-dump-<host>-<pid>-r<rank>-c<comm>.json`.",
	parse: func(p *parsed, v string) error { p.DumpDir = v; return nil },
}, {
	Var: "GOCOLL_NET_BANDWIDTH", Scope: scopeComm, Field: "NetBandwidth", Config: "netBandwidth",
	Unset: "unknown: the cost model picks the algorithm closest to the best at 1, 10 and 100 Gbit/s alike",
	Range: "a rate such as 250mbit, 10gbit or 1.25GB (bytes/s)",
	Doc: "What one host's network link carries, each way. The cost model uses it to choose " +
		"algorithms for communicators that span hosts.",
	parse: func(p *parsed, v string) error {
		bw, err := topology.ParseRate(v)
		if err != nil {
			return errRange
		}
		p.NetBandwidth = bw
		return nil
	},
}, {
	Var: "GOCOLL_SOCKET_IFNAME", Scope: scopeComm, Field: "SocketIfname", Config: "socketIfname",
	Unset: "the local address that routes to the rendezvous root, else the first interface that is up and not loopback",
	Range: "a network interface name, or a prefix of one (eth matches eth0)",
	Doc:   "The network interface whose address the rank listens on and publishes for TCP.",
	parse: func(p *parsed, v string) error { p.SocketIfname = v; return nil },
}, {
	Var: "GOCOLL_TRANSPORT", Scope: scopeComm, Field: "Transport", Config: "transport",
	Default: "auto",
	Range:   "auto or tcp",
	Doc:     "auto: shared memory between the ranks of one host, TCP between hosts. tcp: TCP everywhere.",
	parse: func(p *parsed, v string) error {
		switch t := strings.ToLower(v); t {
		case "auto", "tcp":
			p.Transport = t
			return nil
		}
		return errRange
	},
}, {
	Var: "GOCOLL_CONNECT", Scope: scopeComm, Field: "Connect", Config: "connect",
	Default: "lazy",
	Range:   "lazy or all",
	Doc: "When TCP connections are made. lazy: when a communicator is created, only to each rank's ring " +
		"and recursive-doubling neighbours (about 2 + log2 of the ranks), the rest on the first call " +
		"that uses them, so descriptors grow with the peers used rather than with the ranks " +
		"(docs/scale.md). all: every pair at creation, a full mesh.",
	parse: func(p *parsed, v string) error {
		switch c := strings.ToLower(v); c {
		case "lazy":
			p.Connect = ""
			return nil
		case "all":
			p.Connect = c
			return nil
		}
		return errRange
	},
}, {
	Var: "GOCOLL_SHRINK_QUORUM", Scope: scopeComm, Field: "ShrinkQuorum", Config: "shrinkQuorum",
	Default: "majority",
	Range:   "majority or live",
	Doc: "How many ranks Shrink's agreement needs. majority: more than half of the communicator's ranks " +
		"whose process is not known to have ended (a closed or refused connection, an exited process: a " +
		"rank only silent counts), so the two sides of a network partition, or a stalled rank and the " +
		"others, never both go on, while survivors of kills, however many, do; fewer get ErrNoQuorum. " +
		"live: every rank not found failed (any number of failures survived, but the two sides of a " +
		"partition each go on alone). See docs/elastic.md.",
	parse: func(p *parsed, v string) error {
		switch q := strings.ToLower(v); q {
		case "live", "majority":
			p.ShrinkQuorum = q
			return nil
		}
		return errRange
	},
}, {
	Var: "GOCOLL_TUNE", Scope: scopeComm, Field: "Tune", Config: "tune",
	Default: "auto",
	Range:   "auto, redo or off",
	Doc: "Across hosts, whether a communicator times the allreduce schedules that the cost model " +
		"predicts within 1.5× of its fastest when it is created, at 256 KiB, 1, 4 and 16 MiB within " +
		"half a second, and keeps the fastest (the model's pick unless another ran 10 % faster) for " +
		"calls of those sizes, the same table on every rank. " +
		"auto: take the table cached for the same hosts, CPU and settings under the user's cache dir " +
		"($XDG_CACHE_HOME/gocoll, else ~/.cache/gocoll), else measure and cache it, so that a rerun adds " +
		"in the same order. redo: measure and cache. off: the cost model alone. Any rank's off, or a " +
		"GOCOLL_ALGO that names the allreduce, turns it off for all (docs/tuning.md).",
	parse: func(p *parsed, v string) error {
		switch t := strings.ToLower(v); t {
		case "auto":
			p.Tune = ""
			return nil
		case "redo", "off":
			p.Tune = t
			return nil
		}
		return errRange
	},
}, {
	Var: "GOCOLL_CMA", Scope: scopeComm, Field: "NoCMA", Config: "cma",
	Default: "1",
	Range:   "1 or 0 (also on/off, true/false, yes/no)",
	Doc: "1: ranks on one host may copy allgather, alltoall(v) and 2-rank broadcast data straight out of " +
		"each other's buffers with process_vm_readv (and a 2-rank broadcast's root writes into its peer's with " +
		"process_vm_writev), one copy instead of two through shared memory, as Open MPI's cma does; the ranks " +
		"time both ways per size from 8 KiB per peer and all follow one rank's choice (docs/tuning.md). " +
		"Used only where every rank can so read and write every peer's memory (a seccomp profile " +
		"such as Docker's default, or Yama ptrace_scope 1, forbids it; the shared slots then carry " +
		"everything). 0: data always passes through the shared slots.",
	parse: func(p *parsed, v string) error {
		switch strings.ToLower(v) {
		case "1", "on", "true", "yes":
			return nil
		case "0", "off", "false", "no":
			p.NoCMA = true
			return nil
		}
		return errRange
	},
	num: func(p *parsed, n int) error {
		if n != 0 && n != 1 {
			return errRange
		}
		p.NoCMA = n == 0
		return nil
	},
}, {
	// Warnings reach stderr unless silenced: they are what an operator
	// needs to see (an unauthenticated job across hosts, a metrics port
	// moved, refused connections), and a quiet default would hide them.
	Var: "GOCOLL_DEBUG", Scope: scopeComm, Field: "Logger", Config: "debug",
	Default: "WARN",
	Range:   "DEBUG, INFO, WARN, ERROR or OFF, in any case",
	Doc: "The log level. Every line names host, pid, rank and communicator; INFO adds the transports " +
		"each communicator connected over and, once per communicator, the algorithm it chose for " +
		"each collective; DEBUG every call's choice. Refused connections are logged a few at a time, " +
		"then counted. OFF: nothing, not even warnings.",
	parse: func(p *parsed, v string) error {
		switch v := strings.ToUpper(v); v {
		case "OFF", "NONE":
			p.logOff = true
		default:
			if err := p.logLevel.UnmarshalText([]byte(v)); err != nil {
				return errRange
			}
		}
		return nil
	},
}, {
	Var: "GOCOLL_DEBUG_FILE", Scope: scopeComm, Field: "Logger", Config: "debugFile",
	Unset: "stderr",
	Range: "a file name, in which %h is the host name, %p the process id and %% a %",
	Doc: "Writes the log to this file (appending) instead of stderr, as NCCL_DEBUG_FILE does; " +
		"`/tmp/gocoll.%h.%p.log` makes one file per process.",
	parse: func(p *parsed, v string) error {
		if p.logOff {
			return nil
		}
		out, err := debugFile(v)
		p.logOut = out
		return err
	},
}, {
	Var: "GOCOLL_SECRET", Scope: scopeLaunch,
	Unset: "a job on one host uses a random secret passed through a private file; a job across hosts " +
		"one derived from its launch, which others can compute (rank 0 warns). The unique-id path " +
		"always carries a random one.",
	Range: "any string; the same private value on every rank",
	Doc:   "The job's shared secret: every connection proves that it knows it (HMAC challenge-response).",
}, {
	Var: "GOCOLL_ROOT_ADDR", Scope: scopeLaunch,
	Unset: "the launcher's (torchrun's MASTER_ADDR, the first host of a Slurm step, the local host " +
		"for Open MPI on one host)",
	Range: "host or host:port",
	Doc:   "Where the rendezvous root (rank 0) listens, when the launcher does not say.",
}, {
	Var: "GOCOLL_PORT", Scope: scopeLaunch,
	Unset: "MASTER_PORT+1, or derived from the Open MPI or Slurm job id",
	Range: "a TCP port",
	Doc:   "The rendezvous root's port (torchrun's own store owns MASTER_PORT).",
}, {
	Var: "GOCOLL_RANK", Scope: scopeLaunch,
	Unset: "the launcher's (torchrun's RANK, Open MPI's, Slurm's)",
	Range: "an integer from 0 to GOCOLL_SIZE-1",
	Doc:   "This process's rank, for a launch without a launcher (with GOCOLL_SIZE and GOCOLL_ROOT_ADDR).",
}, {
	Var: "GOCOLL_SIZE", Scope: scopeLaunch,
	Unset: "the launcher's (torchrun's WORLD_SIZE, Open MPI's, Slurm's)",
	Range: "an integer ≥ 1",
	Doc:   "The number of ranks, for a launch without a launcher.",
}, {
	Var: "GOCOLL_LOCAL_RANK", Scope: scopeLaunch,
	Unset: "worked out from the ranks' hosts",
	Range: "an integer from 0 to GOCOLL_LOCAL_SIZE-1",
	Doc:   "This process's rank among those of its host, for a launch without a launcher.",
}, {
	Var: "GOCOLL_LOCAL_SIZE", Scope: scopeLaunch,
	Unset: "worked out from the ranks' hosts",
	Range: "an integer ≥ 1",
	Doc:   "The number of ranks on this host, for a launch without a launcher.",
}, {
	Var: "GOCOLL_METRICS_ADDR", Scope: scopeProcess,
	Unset: "no metrics endpoint",
	Range: "host:port",
	Doc: "Where the C library (and so Python) serves Prometheus metrics at /metrics; each rank adds " +
		"its local rank to the port. A port in use never fails init: the next free one, else an " +
		"ephemeral port, is served and a warning names it. Go programs pass Options.Metrics instead.",
}, {
	Var: "GOCOLL_LIBRARY", Scope: scopePython,
	Unset: "a copy inside the package, else the repository's build/out/lib/libgocoll.so, else the " +
		"dynamic linker's search path",
	Range: "a path",
	Doc:   "The libgocoll.so the Python package loads.",
}, {
	Var: "GOCOLL_WHEEL_LIBRARY", Scope: scopePython,
	Unset: "one already in the package directory, else build/out/lib/libgocoll.so",
	Range: "a path",
	Doc:   "Building the Python wheel (pip install bridge/python): the libgocoll.so to ship inside it.",
}}

// atLeast is the int form of a setting that takes any integer from min.
func atLeast(min int, field func(o *Options) *int) func(*parsed, int) error {
	return func(p *parsed, n int) error {
		if n < min {
			return errRange
		}
		*field(&p.Options) = n
		return nil
	}
}

// settingByVar is the table's entry for a variable, or nil.
func settingByVar(name string) *setting {
	for i := range settings {
		if settings[i].Var == name {
			return &settings[i]
		}
	}
	return nil
}

// set applies the variable's text.
func (s *setting) set(p *parsed, v string) error {
	if s.parse != nil {
		return s.parse(p, v)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return errRange
	}
	return s.num(p, n)
}

// invalid is the error for a value the setting refused: what names where
// it came from (the variable, or a communicator's own setting), shown is
// the value as given.
func (s *setting) invalid(what, shown string, err error) error {
	switch {
	case errors.Is(err, errRange):
		return fmt.Errorf("%w: %s=%s: want %s", ErrInvalidArgument, what, shown, s.Range)
	case errors.Is(err, ErrInvalidArgument):
		return fmt.Errorf("%s=%s: %w", what, shown, err)
	}
	return fmt.Errorf("%w: %s=%s: %v", ErrInvalidArgument, what, shown, err)
}

// ConfigField is a per-communicator setting as a front end's config
// struct holds it (the C library's gocollConfig_t, Python's Config).
type ConfigField struct {
	Var  string // the variable it stands for
	Name string // the struct field
	Int  bool   // an int (given with IntSetting); else a string
}

// ConfigFields are the fields of gocollConfig_t, one per setting a
// communicator may have of its own, in the table's order.
func ConfigFields() []ConfigField {
	var out []ConfigField
	for _, s := range settings {
		if s.Config != "" {
			out = append(out, ConfigField{Var: s.Var, Name: s.Config, Int: s.num != nil})
		}
	}
	return out
}
