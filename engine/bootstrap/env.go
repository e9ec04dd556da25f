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
// map in tests). Recognised, in this order of precedence (Launcher's):
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
	l, job := readPlace(&e, getenv)
	if e.err != nil {
		return Launch{}, e.err
	}
	if err := l.validate(); err != nil {
		return Launch{}, err
	}
	host, port, err := rootAddr(&e, l.Source, job)
	if err != nil {
		return Launch{}, err
	}
	l.RootAddr = net.JoinHostPort(host, port)
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		job.singleHost = true // a rank elsewhere could not reach the root
	}
	l.SingleHost = job.singleHost || l.Size == 1
	l.JobKey = fmt.Sprintf("%s\x00%s\x00%s\x00%d", l.Source, job.id, l.RootAddr, l.Size)
	if s := getenv("GOCOLL_SECRET"); s != "" {
		l.Secret, l.SecretFromEnv = HashSecret(s), true
	} else {
		sum := sha256.Sum256([]byte("gocoll derived secret v1\x00" + l.JobKey))
		l.Secret = sum[:]
	}
	return l, nil
}

// Launcher names the launcher whose variables make this process a rank of
// a job — "gocoll", "torchrun", "openmpi" or "slurm", in FromEnv's order
// of precedence — or "" for a process started by hand. A program that
// starts its own ranks when run by hand (gocoll-bench, the SGD example)
// asks it which to do.
//
// Only srun's tasks count as Slurm ranks (SLURM_STEP_ID): a batch script's
// own shell has SLURM_PROCID too. FromEnv still reads that environment as
// Slurm's, and an incomplete torchrun one (RANK or WORLD_SIZE alone) to
// say what is missing; for both Launcher says "".
func Launcher(getenv func(string) string) string {
	has := func(k string) bool { return strings.TrimSpace(getenv(k)) != "" }
	switch {
	case has("GOCOLL_RANK") || has("GOCOLL_SIZE"):
		return "gocoll"
	case has("RANK") && has("WORLD_SIZE"):
		return "torchrun"
	case has("OMPI_COMM_WORLD_RANK"):
		return "openmpi"
	case has("SLURM_PROCID") && has("SLURM_STEP_ID"):
		return "slurm"
	}
	return ""
}

// LauncherVars lists the variables through which launchers place a process
// in a job (rank, size, local rank and size, root address). A program that
// starts ranks of its own drops them from the ranks' environment, so no
// variable of the job it runs in misplaces them.
func LauncherVars() []string {
	return []string{
		"GOCOLL_RANK", "GOCOLL_SIZE", "GOCOLL_LOCAL_RANK", "GOCOLL_LOCAL_SIZE", "GOCOLL_ROOT_ADDR",
		"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
		"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
		"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID",
	}
}

// HashSecret is the job secret that GOCOLL_SECRET=s stands for: its
// SHA-256, so a secret of any length keys the connections' HMACs alike.
func HashSecret(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// jobPlace is what the launcher says about the job beyond the rank's place
// in it: where to look for the root and what names the job.
type jobPlace struct {
	id         string // identifies the job for a derived port and secret
	singleHost bool
	nodelist   string // Slurm: where to look for the root host
}

// readPlace reads the rank's place in the job from the launcher's
// variables; parse errors are left in e.
func readPlace(e *envReader, getenv func(string) string) (Launch, jobPlace) {
	l := Launch{LocalRank: -1, Source: Launcher(getenv)}
	var job jobPlace
	switch {
	case l.Source != "":
	case e.has("SLURM_PROCID"):
		l.Source = "slurm"
	case e.has("RANK") || e.has("WORLD_SIZE"):
		l.Source = "torchrun" // incomplete: report what is missing
	default:
		e.fail(errors.New("no launcher environment found: run under torchrun, mpirun (Open MPI) or srun (Slurm), or set GOCOLL_RANK, GOCOLL_SIZE and GOCOLL_ROOT_ADDR"))
		return Launch{}, job
	}
	switch l.Source {
	case "gocoll":
		l.Rank, l.Size = e.int("GOCOLL_RANK"), e.int("GOCOLL_SIZE")
		l.LocalRank, l.LocalSize = e.optInt("GOCOLL_LOCAL_RANK", -1), e.optInt("GOCOLL_LOCAL_SIZE", 0)
	case "torchrun":
		l.Rank, l.Size = e.int("RANK"), e.int("WORLD_SIZE")
		l.LocalRank, l.LocalSize = e.optInt("LOCAL_RANK", -1), e.optInt("LOCAL_WORLD_SIZE", 0)
		if !e.has("MASTER_ADDR") && !e.has("GOCOLL_ROOT_ADDR") {
			e.fail(errors.New("MASTER_ADDR is not set (torchrun sets it; or set GOCOLL_ROOT_ADDR)"))
		}
		job.id = e.get("TORCHELASTIC_RUN_ID") + "@" + e.get("MASTER_ADDR") + ":" + e.get("MASTER_PORT")
	case "openmpi":
		l.Rank, l.Size = e.int("OMPI_COMM_WORLD_RANK"), e.int("OMPI_COMM_WORLD_SIZE")
		l.LocalRank, l.LocalSize = e.optInt("OMPI_COMM_WORLD_LOCAL_RANK", -1), e.optInt("OMPI_COMM_WORLD_LOCAL_SIZE", 0)
		job.id = e.first("OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE")
	case "slurm":
		return readSlurm(e, l)
	}
	job.singleHost = l.LocalSize > 0 && l.LocalSize == l.Size
	return l, job
}

// readSlurm is readPlace for a Slurm task.
func readSlurm(e *envReader, l Launch) (Launch, jobPlace) {
	var job jobPlace
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
	job.singleHost = nnodes == 1
	l.LocalSize = slurmLocalSize(*e, l.Size, nnodes)
	if id := e.get("SLURM_JOB_ID"); id != "" {
		job.id = id + "." + e.get("SLURM_STEP_ID")
	} else if id := e.get("SLURM_JOBID"); id != "" {
		job.id = id + "." + e.get("SLURM_STEP_ID")
	}
	job.nodelist = e.first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
	return l, job
}

// rootAddr is the host and port the root listens on (FromEnv's rules).
func rootAddr(e *envReader, source string, job jobPlace) (host, port string, err error) {
	if v := e.get("GOCOLL_ROOT_ADDR"); v != "" {
		if host, port, err = splitHostMaybePort(v); err != nil {
			return "", "", fmt.Errorf("bootstrap: GOCOLL_ROOT_ADDR=%q: %v", v, err)
		}
	}
	if host == "" {
		if host, err = rootHost(e, source, job); err != nil {
			return "", "", err
		}
	}
	if port == "" {
		if port, err = rootPort(e, source, job.id); err != nil {
			return "", "", err
		}
	}
	return host, port, nil
}

// rootHost is where the root runs when GOCOLL_ROOT_ADDR does not say.
func rootHost(e *envReader, source string, job jobPlace) (string, error) {
	switch {
	case e.has("MASTER_ADDR"):
		return e.get("MASTER_ADDR"), nil
	case job.singleHost:
		return "127.0.0.1", nil
	case job.nodelist != "":
		h, err := FirstHost(job.nodelist)
		if err != nil {
			return "", fmt.Errorf("bootstrap: cannot find the root host in the Slurm node list %q: %v; set GOCOLL_ROOT_ADDR", job.nodelist, err)
		}
		return h, nil
	case source == "gocoll":
		return "", errors.New("bootstrap: GOCOLL_RANK/GOCOLL_SIZE are set but GOCOLL_ROOT_ADDR is not: set it to rank 0's host:port")
	}
	return "", fmt.Errorf("bootstrap: %s job spans several hosts and nothing says where rank 0 runs: set GOCOLL_ROOT_ADDR to its host name or address (e.g. mpirun -x GOCOLL_ROOT_ADDR=$(hostname))", source)
}

// rootPort is the root's port when GOCOLL_ROOT_ADDR does not say.
func rootPort(e *envReader, source, jobID string) (string, error) {
	switch {
	case e.has("GOCOLL_PORT"):
		p, err := parsePort(e.get("GOCOLL_PORT"))
		if err != nil {
			return "", fmt.Errorf("bootstrap: GOCOLL_PORT=%q: %v", e.get("GOCOLL_PORT"), err)
		}
		return strconv.Itoa(p), nil
	case e.has("MASTER_PORT"):
		// MASTER_PORT belongs to torchrun's store; the root uses the next one.
		p, err := parsePort(e.get("MASTER_PORT"))
		if err == nil && p == 65535 {
			err = errors.New("MASTER_PORT+1 is not a port; set GOCOLL_PORT")
		}
		if err != nil {
			return "", fmt.Errorf("bootstrap: MASTER_PORT=%q: %v", e.get("MASTER_PORT"), err)
		}
		return strconv.Itoa(p + 1), nil
	case source == "torchrun":
		return "", errors.New("bootstrap: MASTER_PORT is not set (torchrun sets it); set GOCOLL_PORT")
	case jobID != "":
		return strconv.Itoa(derivedPort(source + ":" + jobID)), nil
	case source == "gocoll":
		return "", errors.New("bootstrap: no port for the root: give GOCOLL_ROOT_ADDR as host:port, or set GOCOLL_PORT")
	}
	return "", fmt.Errorf("bootstrap: no port for the root and no %s job id to derive one from: set GOCOLL_PORT", source)
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
