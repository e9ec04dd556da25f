package bootstrap

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
)

// Launch is what the launcher's environment says about this process.
type Launch struct {
	// Source is the launcher recognised: "gocoll" (GOCOLL_RANK/GOCOLL_SIZE),
	// "torchrun", "openmpi" or "slurm".
	Source     string
	Rank, Size int
	// LocalRank and LocalSize place the process among the ranks of its
	// host; -1 and 0 when the launcher does not say (derive locality from
	// host names exchanged through the root instead).
	LocalRank, LocalSize int
	// RootAddr is "host:port" of the gocoll bootstrap root. Rank 0 serves it
	// (StartRoot on ":port", all interfaces) and every rank dials it.
	RootAddr string
	// Secret authenticates the job's connections. With GOCOLL_SECRET set it
	// is the SHA-256 of that string and SecretFromEnv is true; otherwise it
	// is derived from the job's identity (launcher, job id, root address,
	// size), which every rank computes alike but anyone who can read the
	// job's environment can guess. The caller should then use SecretFile
	// for a SingleHost job, and warn for any other.
	Secret        []byte
	SecretFromEnv bool
	// SingleHost: every rank runs on this host (the launcher's local size
	// is the job's size, one Slurm node, a single rank, or a loopback root
	// address).
	SingleHost bool
	// JobKey names the job alike on every rank (launcher, job id, root
	// address, size), for SecretFile.
	JobKey string
}

// Port range for ports derived from a job id.
const (
	derivedPortBase  = 20000
	derivedPortRange = 12768
)

// FromEnv reads the launcher environment through getenv (os.Getenv, or a
// map in tests). Recognised, in this order of precedence:
//
//   - gocoll: GOCOLL_RANK, GOCOLL_SIZE (GOCOLL_LOCAL_RANK, GOCOLL_LOCAL_SIZE
//     optional) with GOCOLL_ROOT_ADDR (or MASTER_ADDR).
//   - torchrun (and any "env://" launch): RANK, WORLD_SIZE, LOCAL_RANK,
//     LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
//   - Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE.
//   - Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with
//     SLURM_STEP_TASKS_PER_NODE/SLURM_TASKS_PER_NODE and SLURM_NODEID,
//     SLURM_NTASKS_PER_NODE or SLURM_NTASKS/SLURM_NNODES for LocalSize.
//
// The root's host: the host of GOCOLL_ROOT_ADDR ("host" or "host:port") if
// set, else MASTER_ADDR; else, when every rank runs on one host (Open MPI
// LOCAL_SIZE == SIZE, Slurm one node), 127.0.0.1; else for Slurm the first
// host of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST (where
// Slurm starts task 0); else it is an error asking for GOCOLL_ROOT_ADDR.
//
// The root's port: the port of GOCOLL_ROOT_ADDR, else GOCOLL_PORT, else
// MASTER_PORT+1, else (Open MPI, Slurm) a port in [20000, 32768) — below
// Linux's ephemeral range, so no outgoing connection holds it — hashed from
// the job id (OMPI_MCA_ess_base_jobid; SLURM_JOB_ID and SLURM_STEP_ID), which
// all ranks of the job compute alike. Under torchrun, gocoll never binds
// MASTER_PORT itself: torchrun's own TCP store already listens there, so the
// root takes GOCOLL_PORT if set, else MASTER_PORT+1. This is the documented
// contract: keep MASTER_PORT+1 free or set GOCOLL_PORT.
func FromEnv(getenv func(string) string) (Launch, error) {
	e := envReader{get: func(k string) string { return strings.TrimSpace(getenv(k)) }}
	l := Launch{LocalRank: -1}
	var (
		jobID      string // identifies the job for a derived port and secret
		singleHost bool
		nodelist   string // Slurm: where to look for the root host
	)
	switch {
	case e.has("GOCOLL_RANK") || e.has("GOCOLL_SIZE"):
		l.Source = "gocoll"
		l.Rank, l.Size = e.int("GOCOLL_RANK"), e.int("GOCOLL_SIZE")
		l.LocalRank, l.LocalSize = e.optInt("GOCOLL_LOCAL_RANK", -1), e.optInt("GOCOLL_LOCAL_SIZE", 0)
		singleHost = l.LocalSize > 0 && l.LocalSize == l.Size
	case e.has("RANK") && e.has("WORLD_SIZE"):
		l.Source = "torchrun"
	case e.has("OMPI_COMM_WORLD_RANK"):
		l.Source = "openmpi"
		l.Rank, l.Size = e.int("OMPI_COMM_WORLD_RANK"), e.int("OMPI_COMM_WORLD_SIZE")
		l.LocalRank, l.LocalSize = e.optInt("OMPI_COMM_WORLD_LOCAL_RANK", -1), e.optInt("OMPI_COMM_WORLD_LOCAL_SIZE", 0)
		singleHost = l.LocalSize > 0 && l.LocalSize == l.Size
		jobID = e.first("OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE")
	case e.has("SLURM_PROCID"):
		l.Source = "slurm"
		l.Rank = e.int("SLURM_PROCID")
		if e.has("SLURM_NTASKS") || !e.has("SLURM_NPROCS") {
			l.Size = e.int("SLURM_NTASKS")
		} else {
			l.Size = e.int("SLURM_NPROCS")
		}
		l.LocalRank = e.optInt("SLURM_LOCALID", -1)
		nnodes := 0
		for _, k := range []string{"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"} {
			if e.has(k) {
				nnodes = e.int(k)
				break
			}
		}
		singleHost = nnodes == 1
		l.LocalSize = slurmLocalSize(e, l.Size, nnodes)
		if id := e.get("SLURM_JOB_ID"); id != "" {
			jobID = id + "." + e.get("SLURM_STEP_ID")
		} else if id := e.get("SLURM_JOBID"); id != "" {
			jobID = id + "." + e.get("SLURM_STEP_ID")
		}
		nodelist = e.first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
	case e.has("RANK") || e.has("WORLD_SIZE"):
		l.Source = "torchrun" // incomplete: report what is missing
	default:
		return Launch{}, errors.New("bootstrap: no launcher environment found: run under torchrun, mpirun (Open MPI) or srun (Slurm), or set GOCOLL_RANK, GOCOLL_SIZE and GOCOLL_ROOT_ADDR")
	}
	if l.Source == "torchrun" {
		l.Rank, l.Size = e.int("RANK"), e.int("WORLD_SIZE")
		l.LocalRank, l.LocalSize = e.optInt("LOCAL_RANK", -1), e.optInt("LOCAL_WORLD_SIZE", 0)
		singleHost = l.LocalSize > 0 && l.LocalSize == l.Size
		if !e.has("MASTER_ADDR") && !e.has("GOCOLL_ROOT_ADDR") {
			e.fail(errors.New("MASTER_ADDR is not set (torchrun sets it; or set GOCOLL_ROOT_ADDR)"))
		}
		jobID = e.get("TORCHELASTIC_RUN_ID") + "@" + e.get("MASTER_ADDR") + ":" + e.get("MASTER_PORT")
	}
	if e.err != nil {
		return Launch{}, e.err
	}
	if err := l.validate(); err != nil {
		return Launch{}, err
	}

	// Where the root listens.
	var host, port string
	if v := e.get("GOCOLL_ROOT_ADDR"); v != "" {
		h, p, err := splitHostMaybePort(v)
		if err != nil {
			return Launch{}, fmt.Errorf("bootstrap: GOCOLL_ROOT_ADDR=%q: %v", v, err)
		}
		host, port = h, p
	}
	if host == "" {
		switch {
		case e.has("MASTER_ADDR"):
			host = e.get("MASTER_ADDR")
		case singleHost:
			host = "127.0.0.1"
		case nodelist != "":
			h, err := FirstHost(nodelist)
			if err != nil {
				return Launch{}, fmt.Errorf("bootstrap: cannot find the root host in the Slurm node list %q: %v; set GOCOLL_ROOT_ADDR", nodelist, err)
			}
			host = h
		case l.Source == "gocoll":
			return Launch{}, errors.New("bootstrap: GOCOLL_RANK/GOCOLL_SIZE are set but GOCOLL_ROOT_ADDR is not: set it to rank 0's host:port")
		default:
			return Launch{}, fmt.Errorf("bootstrap: %s job spans several hosts and nothing says where rank 0 runs: set GOCOLL_ROOT_ADDR to its host name or address (e.g. mpirun -x GOCOLL_ROOT_ADDR=$(hostname))", l.Source)
		}
	}
	if port == "" {
		switch {
		case e.has("GOCOLL_PORT"):
			p, err := parsePort(e.get("GOCOLL_PORT"))
			if err != nil {
				return Launch{}, fmt.Errorf("bootstrap: GOCOLL_PORT=%q: %v", e.get("GOCOLL_PORT"), err)
			}
			port = strconv.Itoa(p)
		case e.has("MASTER_PORT"):
			// MASTER_PORT belongs to torchrun's store; the root uses the next one.
			p, err := parsePort(e.get("MASTER_PORT"))
			if err == nil && p == 65535 {
				err = errors.New("MASTER_PORT+1 is not a port; set GOCOLL_PORT")
			}
			if err != nil {
				return Launch{}, fmt.Errorf("bootstrap: MASTER_PORT=%q: %v", e.get("MASTER_PORT"), err)
			}
			port = strconv.Itoa(p + 1)
		case l.Source == "torchrun":
			return Launch{}, errors.New("bootstrap: MASTER_PORT is not set (torchrun sets it); set GOCOLL_PORT")
		case jobID != "":
			port = strconv.Itoa(derivedPort(l.Source + ":" + jobID))
		case l.Source == "gocoll":
			return Launch{}, errors.New("bootstrap: no port for the root: give GOCOLL_ROOT_ADDR as host:port, or set GOCOLL_PORT")
		default:
			return Launch{}, fmt.Errorf("bootstrap: no port for the root and no %s job id to derive one from: set GOCOLL_PORT", l.Source)
		}
	}
	l.RootAddr = net.JoinHostPort(host, port)
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		singleHost = true // a rank elsewhere could not reach the root
	}
	l.SingleHost = singleHost || l.Size == 1
	l.JobKey = fmt.Sprintf("%s\x00%s\x00%s\x00%d", l.Source, jobID, l.RootAddr, l.Size)

	if s := getenv("GOCOLL_SECRET"); s != "" {
		sum := sha256.Sum256([]byte(s))
		l.Secret, l.SecretFromEnv = sum[:], true
	} else {
		sum := sha256.Sum256([]byte("gocoll derived secret v1\x00" + l.JobKey))
		l.Secret = sum[:]
	}
	return l, nil
}

func (l Launch) validate() error {
	vars := map[string][4]string{
		"gocoll":   {"GOCOLL_RANK", "GOCOLL_SIZE", "GOCOLL_LOCAL_RANK", "GOCOLL_LOCAL_SIZE"},
		"torchrun": {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
		"openmpi":  {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
		"slurm":    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "tasks per node"},
	}[l.Source]
	switch {
	case l.Size < 1:
		return fmt.Errorf("bootstrap: %s=%d: the job needs at least one rank", vars[1], l.Size)
	case l.Rank < 0 || l.Rank >= l.Size:
		return fmt.Errorf("bootstrap: %s=%d is out of range for %s=%d", vars[0], l.Rank, vars[1], l.Size)
	case l.LocalSize < 0 || l.LocalSize > l.Size:
		return fmt.Errorf("bootstrap: %s=%d is out of range for %s=%d", vars[3], l.LocalSize, vars[1], l.Size)
	case l.LocalRank < -1 || l.LocalRank >= 0 && l.LocalSize > 0 && l.LocalRank >= l.LocalSize:
		return fmt.Errorf("bootstrap: %s=%d is out of range for %s=%d", vars[2], l.LocalRank, vars[3], l.LocalSize)
	}
	return nil
}

// envReader collects the first parse error so FromEnv reads linearly.
type envReader struct {
	get func(string) string
	err error
}

func (e *envReader) has(k string) bool { return e.get(k) != "" }

func (e *envReader) fail(err error) {
	if e.err == nil {
		e.err = fmt.Errorf("bootstrap: %w", err)
	}
}

func (e *envReader) first(keys ...string) string {
	for _, k := range keys {
		if v := e.get(k); v != "" {
			return v
		}
	}
	return ""
}

func (e *envReader) int(k string) int {
	v := e.get(k)
	if v == "" {
		e.fail(fmt.Errorf("%s is not set", k))
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		e.fail(fmt.Errorf("%s=%q is not an integer", k, v))
	}
	return n
}

func (e *envReader) optInt(k string, def int) int {
	if !e.has(k) {
		return def
	}
	return e.int(k)
}

// slurmLocalSize is the number of tasks on this node, 0 if unknown.
func slurmLocalSize(e envReader, size, nnodes int) int {
	if tpn := e.first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"); tpn != "" && e.has("SLURM_NODEID") {
		if node, err := strconv.Atoi(e.get("SLURM_NODEID")); err == nil {
			if counts, err := parseTasksPerNode(tpn); err == nil && node >= 0 && node < len(counts) {
				return counts[node]
			}
		}
	}
	if v := e.get("SLURM_NTASKS_PER_NODE"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 && n <= size {
			return n
		}
	}
	if nnodes > 0 && size%nnodes == 0 {
		return size / nnodes
	}
	return 0
}

// parseTasksPerNode expands Slurm's "2(x3),1" into [2 2 2 1].
func parseTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		count, rep := part, "1"
		if i := strings.Index(part, "(x"); i >= 0 && strings.HasSuffix(part, ")") {
			count, rep = part[:i], part[i+2:len(part)-1]
		}
		c, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || c < 0 || r < 1 || r > 1<<16 {
			return nil, fmt.Errorf("bad tasks-per-node list %q", s)
		}
		for range r {
			out = append(out, c)
		}
	}
	return out, nil
}

// FirstHost returns the first host of a Slurm host list such as "a,b",
// "node[01-04,07]" or "rack[1-2]-n[3,5]" (zero padding is kept).
func FirstHost(list string) (string, error) {
	list = strings.TrimSpace(list)
	depth, end := 0, len(list)
scan:
	for i, ch := range list {
		switch ch {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				end = i
				break scan
			}
		}
	}
	item := list[:end]
	var b strings.Builder
	for {
		i := strings.IndexByte(item, '[')
		if i < 0 {
			if strings.IndexByte(item, ']') >= 0 {
				return "", errors.New("unbalanced ']'")
			}
			b.WriteString(item)
			break
		}
		j := strings.IndexByte(item[i:], ']')
		if j < 0 {
			return "", errors.New("unbalanced '['")
		}
		b.WriteString(item[:i])
		first, _, _ := strings.Cut(item[i+1:i+j], ",")
		lo, _, _ := strings.Cut(first, "-")
		if lo == "" || strings.Trim(lo, "0123456789") != "" {
			return "", fmt.Errorf("bad range %q", item[i:i+j+1])
		}
		b.WriteString(lo)
		item = item[i+j+1:]
	}
	if b.Len() == 0 {
		return "", errors.New("empty host list")
	}
	return b.String(), nil
}

// splitHostMaybePort accepts "host", "host:port", "[v6]:port" and a bare
// IPv6 address.
func splitHostMaybePort(v string) (host, port string, err error) {
	if h, p, err := net.SplitHostPort(v); err == nil {
		if h == "" {
			return "", "", errors.New("no host")
		}
		if _, err := parsePort(p); err != nil {
			return "", "", err
		}
		return h, p, nil
	}
	if strings.Count(v, ":") >= 2 && net.ParseIP(strings.Trim(v, "[]")) != nil {
		return strings.Trim(v, "[]"), "", nil // bare IPv6 address
	}
	if strings.ContainsAny(v, ":[]/ ") {
		return "", "", errors.New(`want "host" or "host:port"`)
	}
	return v, "", nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, errors.New("not a port number (1-65535)")
	}
	return p, nil
}

func derivedPort(jobID string) int {
	h := fnv.New64a()
	h.Write([]byte(jobID))
	return derivedPortBase + int(h.Sum64()%derivedPortRange)
}
