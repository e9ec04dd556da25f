package bootstrap

import (
	"bytes"
	"crypto/sha256"
	"maps"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func getenv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	torch := map[string]string{
		"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "8",
		"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "none",
	}
	ompi1 := map[string]string{
		"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
		"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
		"OMPI_MCA_ess_base_jobid": "2587754497",
	}
	ompiN := map[string]string{
		"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
		"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
		"OMPI_MCA_ess_base_jobid": "2587754497",
	}
	slurm := map[string]string{
		"SLURM_PROCID": "8", "SLURM_NTASKS": "9", "SLURM_LOCALID": "0", "SLURM_NODEID": "4",
		"SLURM_NNODES": "5", "SLURM_TASKS_PER_NODE": "2(x4),1", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
		"SLURM_JOB_NODELIST": "node[01-04,07]",
	}
	ompiPort := strconv.Itoa(derivedPort("openmpi:2587754497"))
	slurmPort := strconv.Itoa(derivedPort("slurm:4242.0"))
	with := func(base map[string]string, kv ...string) map[string]string {
		m := make(map[string]string)
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}

	tests := []struct {
		name string
		env  map[string]string
		want Launch // Secret is checked separately
		err  string // substring; "" means success
	}{
		{name: "torchrun", env: torch,
			want: Launch{Source: "torchrun", Rank: 3, Size: 8, LocalRank: 1, LocalSize: 4, RootAddr: "10.0.0.5:29501"}},
		{name: "torchrun GOCOLL_PORT", env: with(torch, "GOCOLL_PORT", "31000"),
			want: Launch{Source: "torchrun", Rank: 3, Size: 8, LocalRank: 1, LocalSize: 4, RootAddr: "10.0.0.5:31000"}},
		{name: "torchrun without local", env: with(torch, "LOCAL_RANK", "<unset>", "LOCAL_WORLD_SIZE", "<unset>"),
			want: Launch{Source: "torchrun", Rank: 3, Size: 8, LocalRank: -1, LocalSize: 0, RootAddr: "10.0.0.5:29501"}},
		{name: "torchrun GOCOLL_ROOT_ADDR", env: with(torch, "GOCOLL_ROOT_ADDR", "head:7000"),
			want: Launch{Source: "torchrun", Rank: 3, Size: 8, LocalRank: 1, LocalSize: 4, RootAddr: "head:7000"}},
		{name: "torchrun beats slurm", env: with(slurm, "MASTER_ADDR", "h", "MASTER_PORT", "100", "RANK", "0", "WORLD_SIZE", "2"),
			want: Launch{Source: "torchrun", Rank: 0, Size: 2, LocalRank: -1, RootAddr: "h:101"}},
		{name: "torchrun no MASTER_ADDR", env: with(torch, "MASTER_ADDR", "<unset>"), err: "MASTER_ADDR is not set"},
		{name: "torchrun no MASTER_PORT", env: with(torch, "MASTER_PORT", "<unset>"), err: "MASTER_PORT is not set"},
		{name: "torchrun MASTER_PORT 65535", env: with(torch, "MASTER_PORT", "65535"), err: "MASTER_PORT+1"},
		{name: "torchrun bad MASTER_PORT", env: with(torch, "MASTER_PORT", "http"), err: `MASTER_PORT="http"`},
		{name: "torchrun bad RANK", env: with(torch, "RANK", "abc"), err: `RANK="abc" is not an integer`},
		{name: "torchrun rank out of range", env: with(torch, "RANK", "8"), err: "RANK=8 is out of range for WORLD_SIZE=8"},
		{name: "torchrun negative rank", env: with(torch, "RANK", "-1"), err: "RANK=-1 is out of range"},
		{name: "torchrun zero size", env: with(torch, "WORLD_SIZE", "0", "RANK", "0"), err: "WORLD_SIZE=0"},
		{name: "torchrun local rank out of range", env: with(torch, "LOCAL_RANK", "4"), err: "LOCAL_RANK=4 is out of range for LOCAL_WORLD_SIZE=4"},
		{name: "torchrun missing WORLD_SIZE", env: map[string]string{"RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, err: "WORLD_SIZE is not set"},

		{name: "openmpi one host", env: ompi1,
			want: Launch{Source: "openmpi", Rank: 2, Size: 4, LocalRank: 2, LocalSize: 4, RootAddr: "127.0.0.1:" + ompiPort}},
		{name: "openmpi one host GOCOLL_PORT", env: with(ompi1, "GOCOLL_PORT", "4444"),
			want: Launch{Source: "openmpi", Rank: 2, Size: 4, LocalRank: 2, LocalSize: 4, RootAddr: "127.0.0.1:4444"}},
		{name: "openmpi multi-host", env: ompiN, err: "set GOCOLL_ROOT_ADDR"},
		{name: "openmpi multi-host root host", env: with(ompiN, "GOCOLL_ROOT_ADDR", "node7"),
			want: Launch{Source: "openmpi", Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, RootAddr: "node7:" + ompiPort}},
		{name: "openmpi multi-host root host:port", env: with(ompiN, "GOCOLL_ROOT_ADDR", "node7:4000"),
			want: Launch{Source: "openmpi", Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, RootAddr: "node7:4000"}},
		{name: "openmpi IPv6 root", env: with(ompiN, "GOCOLL_ROOT_ADDR", "fd00::7"),
			want: Launch{Source: "openmpi", Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, RootAddr: "[fd00::7]:" + ompiPort}},
		{name: "openmpi MASTER_ADDR", env: with(ompiN, "MASTER_ADDR", "head", "MASTER_PORT", "29500"),
			want: Launch{Source: "openmpi", Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, RootAddr: "head:29501"}},
		{name: "openmpi no job id", env: with(ompi1, "OMPI_MCA_ess_base_jobid", "<unset>"), err: "set GOCOLL_PORT"},
		{name: "openmpi bad root", env: with(ompiN, "GOCOLL_ROOT_ADDR", "a:b:c"), err: "GOCOLL_ROOT_ADDR"},
		{name: "openmpi bad GOCOLL_PORT", env: with(ompi1, "GOCOLL_PORT", "70000"), err: `GOCOLL_PORT="70000"`},
		{name: "openmpi missing size", env: with(ompi1, "OMPI_COMM_WORLD_SIZE", "<unset>"), err: "OMPI_COMM_WORLD_SIZE is not set"},

		{name: "slurm nodelist", env: slurm,
			want: Launch{Source: "slurm", Rank: 8, Size: 9, LocalRank: 0, LocalSize: 1, RootAddr: "node01:" + slurmPort}},
		{name: "slurm step nodelist first", env: with(slurm, "SLURM_STEP_NODELIST", "gpu-[10-12],cpu1"),
			want: Launch{Source: "slurm", Rank: 8, Size: 9, LocalRank: 0, LocalSize: 1, RootAddr: "gpu-10:" + slurmPort}},
		{name: "slurm plain list", env: with(slurm, "SLURM_JOB_NODELIST", "<unset>", "SLURM_NODELIST", "alpha,beta"),
			want: Launch{Source: "slurm", Rank: 8, Size: 9, LocalRank: 0, LocalSize: 1, RootAddr: "alpha:" + slurmPort}},
		{name: "slurm ntasks per node", env: with(slurm, "SLURM_TASKS_PER_NODE", "<unset>", "SLURM_NTASKS_PER_NODE", "2", "SLURM_NTASKS", "10", "SLURM_LOCALID", "1"),
			want: Launch{Source: "slurm", Rank: 8, Size: 10, LocalRank: 1, LocalSize: 2, RootAddr: "node01:" + slurmPort}},
		{name: "slurm one node", env: map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n1"},
			want: Launch{Source: "slurm", Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, RootAddr: "127.0.0.1:" + slurmPort}},
		{name: "slurm no nodelist", env: with(slurm, "SLURM_JOB_NODELIST", "<unset>"), err: "set GOCOLL_ROOT_ADDR"},
		{name: "slurm bad nodelist", env: with(slurm, "SLURM_JOB_NODELIST", "node[01-04"), err: "Slurm node list"},
		{name: "slurm bad procid", env: with(slurm, "SLURM_PROCID", "x"), err: `SLURM_PROCID="x"`},
		{name: "slurm procid out of range", env: with(slurm, "SLURM_PROCID", "9"), err: "SLURM_PROCID=9 is out of range for SLURM_NTASKS=9"},

		{name: "gocoll", env: map[string]string{"GOCOLL_RANK": "1", "GOCOLL_SIZE": "2", "GOCOLL_ROOT_ADDR": "[::1]:5000"},
			want: Launch{Source: "gocoll", Rank: 1, Size: 2, LocalRank: -1, RootAddr: "[::1]:5000"}},
		{name: "gocoll host and port", env: map[string]string{"GOCOLL_RANK": "0", "GOCOLL_SIZE": "1", "GOCOLL_ROOT_ADDR": "h", "GOCOLL_PORT": "9"},
			want: Launch{Source: "gocoll", Rank: 0, Size: 1, LocalRank: -1, RootAddr: "h:9"}},
		{name: "gocoll beats torchrun", env: with(torch, "GOCOLL_RANK", "0", "GOCOLL_SIZE", "1", "GOCOLL_ROOT_ADDR", "x:1"),
			want: Launch{Source: "gocoll", Rank: 0, Size: 1, LocalRank: -1, RootAddr: "x:1"}},
		{name: "gocoll no root", env: map[string]string{"GOCOLL_RANK": "1", "GOCOLL_SIZE": "2"}, err: "GOCOLL_ROOT_ADDR is not"},
		{name: "gocoll no port", env: map[string]string{"GOCOLL_RANK": "1", "GOCOLL_SIZE": "2", "GOCOLL_ROOT_ADDR": "h"}, err: "GOCOLL_PORT"},
		{name: "gocoll missing size", env: map[string]string{"GOCOLL_RANK": "1", "GOCOLL_ROOT_ADDR": "h:1"}, err: "GOCOLL_SIZE is not set"},
		{name: "nothing", env: map[string]string{}, err: "no launcher environment"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromEnv(getenv(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Secret) != sha256.Size || got.SecretFromEnv {
				t.Errorf("secret %x fromEnv=%v", got.Secret, got.SecretFromEnv)
			}
			got.Secret, got.JobKey = nil, "" // JobKey: TestFromEnvSingleHost
			if want := strings.HasPrefix(got.RootAddr, "127.0.0.1:") || strings.HasPrefix(got.RootAddr, "localhost:") || strings.HasPrefix(got.RootAddr, "[::1]:") || got.LocalSize == got.Size || got.Size == 1; got.SingleHost != want {
				t.Errorf("SingleHost %v, want %v", got.SingleHost, want)
			}
			got.SingleHost = tc.want.SingleHost
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestFromEnvSecretAndPortAgree(t *testing.T) {
	rank := func(r, jobid string, extra ...string) Launch {
		m := map[string]string{
			"OMPI_COMM_WORLD_RANK": r, "OMPI_COMM_WORLD_SIZE": "4",
			"OMPI_COMM_WORLD_LOCAL_RANK": r, "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
			"OMPI_MCA_ess_base_jobid": jobid,
		}
		for i := 0; i < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		l, err := FromEnv(getenv(m))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := rank("0", "100"), rank("3", "100")
	if a.RootAddr != b.RootAddr || !bytes.Equal(a.Secret, b.Secret) {
		t.Errorf("ranks of one job disagree: %+v %+v", a, b)
	}
	c := rank("0", "101")
	if c.RootAddr == a.RootAddr || bytes.Equal(c.Secret, a.Secret) {
		t.Errorf("two jobs share %s", a.RootAddr)
	}
	_, port, _ := net.SplitHostPort(a.RootAddr)
	if p, _ := strconv.Atoi(port); p < 20000 || p >= 32768 {
		t.Errorf("derived port %d", p)
	}
	s := rank("1", "100", "GOCOLL_SECRET", "hunter2")
	want := sha256.Sum256([]byte("hunter2"))
	if !s.SecretFromEnv || !bytes.Equal(s.Secret, want[:]) {
		t.Errorf("GOCOLL_SECRET: %+v", s)
	}
}

func TestFirstHost(t *testing.T) {
	for in, want := range map[string]string{
		"a,b":              "a",
		"node[01-04,07]":   "node01",
		"node[07,01-04]":   "node07",
		"rack[1-2]-n[3,5]": "rack1-n3",
		"x[7]":             "x7",
		"gpu-[10-12],cpu1": "gpu-10",
		" single ":         "single",
		"n[001-100]-ib":    "n001-ib",
	} {
		if got, err := FirstHost(in); err != nil || got != want {
			t.Errorf("FirstHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "node[01", "node]", "n[a-b]", "[]"} {
		if got, err := FirstHost(bad); err == nil {
			t.Errorf("FirstHost(%q) = %q, want an error", bad, got)
		}
	}
}

func TestParseTasksPerNode(t *testing.T) {
	got, err := parseTasksPerNode("2(x3),1")
	if err != nil || !reflect.DeepEqual(got, []int{2, 2, 2, 1}) {
		t.Errorf("got %v %v", got, err)
	}
	if _, err := parseTasksPerNode("2(x"); err == nil {
		t.Error("bad list parsed")
	}
}

func TestUniqueID(t *testing.T) {
	secret := NewSecret()
	for _, addr := range []string{"10.0.0.1:29501", "[fe80::1%eth0]:65535", "host.example.org:1", strings.Repeat("h", MaxRootAddr-2) + ":1"} {
		id, err := NewUniqueID(addr, secret)
		if err != nil {
			t.Fatal(err)
		}
		got, s, err := id.Parse()
		if err != nil || got != addr || !bytes.Equal(s, secret[:]) {
			t.Errorf("round trip of %q: %q %x %v", addr, got, s, err)
		}
	}
	if _, err := NewUniqueID(strings.Repeat("h", MaxRootAddr+1), secret); err == nil {
		t.Error("overlong address accepted")
	}
	if _, err := NewUniqueID("", secret); err == nil {
		t.Error("empty address accepted")
	}
	if _, _, err := (UniqueID{}).Parse(); err == nil || !strings.Contains(err.Error(), "magic") {
		t.Errorf("zero id: %v", err)
	}
	id, _ := NewUniqueID("h:1", secret)
	id[4] = 9
	if _, _, err := id.Parse(); err == nil || !strings.Contains(err.Error(), "version") {
		t.Errorf("future version: %v", err)
	}
	if NewSecret() == NewSecret() {
		t.Error("secrets repeat")
	}
}

// TestFromEnvSingleHost: which jobs count as on one host (and so get a
// secret through a private file), and that the job key is the same on
// every rank of a job and differs between jobs.
func TestFromEnvSingleHost(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "node1", "MASTER_PORT": "100"}, true},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "100"}, false},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "node1", "MASTER_PORT": "100"}, true},
		{map[string]string{"GOCOLL_RANK": "1", "GOCOLL_SIZE": "2", "GOCOLL_ROOT_ADDR": "127.0.0.1:5"}, true},
		{map[string]string{"GOCOLL_RANK": "1", "GOCOLL_SIZE": "2", "GOCOLL_ROOT_ADDR": "localhost:5"}, true},
		{map[string]string{"GOCOLL_RANK": "1", "GOCOLL_SIZE": "2", "GOCOLL_ROOT_ADDR": "10.1.1.1:5"}, false},
		{map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7"}, true},
	} {
		l, err := FromEnv(getenv(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		if l.SingleHost != tc.want {
			t.Errorf("%v: SingleHost %v, want %v", tc.env, l.SingleHost, tc.want)
		}
		r0 := maps.Clone(tc.env)
		for _, k := range []string{"RANK", "GOCOLL_RANK", "SLURM_PROCID"} {
			if _, ok := r0[k]; ok {
				r0[k] = "0"
			}
		}
		l0, _ := FromEnv(getenv(r0))
		if l0.JobKey != l.JobKey || l.JobKey == "" {
			t.Errorf("%v: job keys %q and %q", tc.env, l0.JobKey, l.JobKey)
		}
	}
}

// TestLauncher: which environments make a process a rank, in FromEnv's
// precedence, and that FromEnv reads every one of them as that launcher's.
func TestLauncher(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, ""},
		{map[string]string{"GOCOLL_RANK": "1", "GOCOLL_SIZE": "2", "GOCOLL_ROOT_ADDR": "h:1"}, "gocoll"},
		{map[string]string{"GOCOLL_SIZE": "2"}, "gocoll"}, // FromEnv says GOCOLL_RANK is missing
		{map[string]string{"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "x", "MASTER_PORT": "5"}, "torchrun"},
		{map[string]string{"RANK": "0"}, ""},
		{map[string]string{"RANK": " ", "WORLD_SIZE": "4"}, ""},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_MCA_ess_base_jobid": "1"}, "openmpi"},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7"}, "slurm"},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, ""}, // a batch shell, not srun
		// precedence: gocoll, torchrun, Open MPI, Slurm
		{map[string]string{"GOCOLL_RANK": "0", "GOCOLL_SIZE": "1", "GOCOLL_ROOT_ADDR": "h:1", "RANK": "0", "WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}, "gocoll"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "x", "MASTER_PORT": "5", "OMPI_COMM_WORLD_RANK": "0", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "torchrun"},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_MCA_ess_base_jobid": "1", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "openmpi"},
	} {
		got := Launcher(getenv(tc.env))
		if got != tc.want {
			t.Errorf("%v: Launcher %q, want %q", tc.env, got, tc.want)
		}
		l, err := FromEnv(getenv(tc.env))
		switch {
		case got == "" || tc.env["GOCOLL_RANK"] == "" && got == "gocoll":
		case err != nil:
			t.Errorf("%v: FromEnv: %v", tc.env, err)
		case l.Source != got:
			t.Errorf("%v: FromEnv reads it as %q, Launcher says %q", tc.env, l.Source, got)
		}
	}
}

func TestHashSecret(t *testing.T) {
	want := sha256.Sum256([]byte("hunter2"))
	if got := HashSecret("hunter2"); !bytes.Equal(got, want[:]) {
		t.Errorf("HashSecret: %x, want %x", got, want)
	}
}
