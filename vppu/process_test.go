package vppu

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/proctest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(proctest.RoleVar); role != "" {
		os.Exit(child(role))
	}
	os.Exit(proctest.RunInTempDir(m))
}

// child is one rank of a migration job: 8 virtual devices placed by
// VPPU_FROM, each with a registered buffer; calls, a migration to VPPU_TO,
// more calls, every result checked against the reference. Exit 0: done
// (or left after the migration); 4: a collective or the migration failed.
func child(role string) int {
	opts, err := engine.OptionsFromEnv(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "options:", err)
		return 2
	}
	pc, err := engine.NewCommFromEnv(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "join:", err)
		return 3
	}
	defer pc.Destroy()
	if role == "collectives" {
		return collectivesChild(pc)
	}
	const m, count = 8, 50000
	from, err1 := ParsePlace(os.Getenv("VPPU_FROM"), m)
	to, err2 := ParsePlace(os.Getenv("VPPU_TO"), m)
	l, err3 := ParseLogical("ring", m)
	if err1 != nil || err2 != nil || err3 != nil {
		fmt.Fprintln(os.Stderr, err1, err2, err3)
		return 2
	}
	c, err := New(pc, l, from)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 4
	}
	defer c.Destroy()
	if role == "die" && pc.Rank() == 1 {
		// Die in the middle of the move: after the buffer lists were
		// exchanged, while the first buffer is on its way here.
		c.SetAlloc(func(int, string, int) ([]byte, error) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		})
	}
	for _, v := range c.Local() {
		if err := c.Register(v, "grad", contribution(5, v, count)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 4
		}
	}
	// State every device holds alike, kept once per process.
	state := contribution(9, 0, 1000)
	if len(c.Local()) > 0 {
		if err := c.RegisterShared("state", bytes.Clone(state)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 4
		}
	}
	var xs [][]byte
	for v := range m {
		xs = append(xs, contribution(5, v, count))
	}
	ref := foldRef(xs)
	check := func(when string) error {
		local := c.Local()
		send := make([][]byte, len(local))
		recv := make([][]byte, len(local))
		for _, v := range local {
			if b, ok := c.Buffer(v, "state"); !ok || !bytes.Equal(b, state) {
				return fmt.Errorf("%s: device %d has no or other shared state", when, v)
			}
		}
		for k, v := range local {
			b, ok := c.Buffer(v, "grad")
			if !ok {
				return fmt.Errorf("%s: device %d lost its buffer", when, v)
			}
			send[k], recv[k] = b, make([]byte, len(b))
		}
		if err := c.AllReduce(send, recv, count, engine.Float32, engine.Sum); err != nil {
			return err
		}
		for k, v := range local {
			if !bytes.Equal(recv[k], ref) {
				return fmt.Errorf("%s: allreduce on device %d differs from the reference", when, v)
			}
		}
		return nil
	}
	for i := range 3 {
		if len(c.Local()) == 0 {
			break
		}
		if err := check(fmt.Sprintf("before, call %d", i)); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", pc.Rank(), err)
			return 4
		}
	}
	start := time.Now()
	if err := c.Migrate(to); err != nil {
		fmt.Fprintf(os.Stderr, "MIGRATE FAILED rank %d: %v\n", pc.Rank(), err)
		return 4
	}
	fmt.Printf("rank %d migrated in %v, now hosting %v\n", pc.Rank(), time.Since(start), c.Local())
	if len(c.Local()) == 0 {
		return 0
	}
	for i := range 3 {
		if err := check(fmt.Sprintf("after, call %d", i)); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", pc.Rank(), err)
			return 4
		}
	}
	return 0
}

// Migration across real processes, every result checked before and after
// against the fold in device order: 4 → 2 processes, {0..3} → {4..7} of 8,
// cyclic to block, and an explicit placement to block over TCP.
func TestMigrateProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tc := range []struct {
		name     string
		n        int
		from, to string
		env      []string
	}{
		{"4to2", 4, "block:4", "block:2", nil},
		{"0-3to4-7", 8, "0,0,1,1,2,2,3,3", "4,4,5,5,6,6,7,7", nil},
		{"cyclic-to-block", 3, "cyclic:3", "block:2", nil},
		// Over TCP: the virtual allreduce's chain and its broadcast as
		// messages (no shared-memory broadcast).
		{"explicit-to-block-tcp", 3, "2,2,0,1,1,2,0,0", "block:3", []string{"GOCOLL_TRANSPORT=tcp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"VPPU_FROM=" + tc.from, "VPPU_TO=" + tc.to, "GOCOLL_TIMEOUT=60s"}, tc.env...)
			kids := proctest.Start(t, "migrate", tc.n, env, nil)
			proctest.Wait(t, kids, 2*time.Minute)
			for r, k := range kids {
				if k.Err != nil {
					t.Errorf("rank %d: %v\n%s", r, k.Err, k.Out.String())
				}
			}
		})
	}
}

// A rank killed in the middle of a migration: every other rank's Migrate
// fails with an error naming the migration, within seconds, and nobody
// hangs.
func TestRankDiesDuringMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	kids := proctest.Start(t, "die", 4, []string{"VPPU_FROM=block:4", "VPPU_TO=block:2", "GOCOLL_TIMEOUT=60s"}, nil)
	start := time.Now()
	proctest.Wait(t, kids, time.Minute)
	if el := time.Since(start); el > 40*time.Second {
		t.Errorf("the survivors took %v to fail", el)
	}
	if code := proctest.ExitCode(kids[1].Err); code != -1 {
		t.Fatalf("rank 1 should have been killed, exit %d:\n%s", code, kids[1].Out.String())
	}
	for r, k := range kids {
		if r == 1 {
			continue
		}
		out := k.Out.String()
		if code := proctest.ExitCode(k.Err); code != 4 || !strings.Contains(out, "MIGRATE FAILED") || !strings.Contains(out, "migrate on rank") {
			t.Errorf("rank %d: exit %d, want 4 with a migration error:\n%s", r, code, out)
		}
	}
}
