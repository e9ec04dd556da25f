package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/flight"
	"github.com/gocoll/gocoll/engine/proctest"
)

// A blocking collective allocates nothing, with the recorder on or off.
func TestFlightRecorderAllocs(t *testing.T) {
	allocs := func(records int) float64 {
		cs, err := NewLocalComms(1, Options{FlightRecords: records})
		if err != nil {
			t.Fatal(err)
		}
		c := cs[0]
		defer c.Destroy()
		b := make([]byte, 1024)
		return testing.AllocsPerRun(2000, func() {
			if err := c.AllReduce(b, b, 256, Float32, Sum); err != nil {
				t.Fatal(err)
			}
		})
	}
	off, on := allocs(-1), allocs(16)
	// A blocking call run inline allocates nothing (Comm.run): every
	// allocation brings the garbage collector, which stops the caller.
	if on != 0 || off != 0 {
		t.Errorf("allreduce allocates %v times with the flight recorder, %v without; want none", on, off)
	}
}

// BenchmarkFlightRecorder measures what recording costs a small collective:
// compare on and off (they should be within noise). With one rank the call
// runs inline and nothing but the engine's own bookkeeping is timed.
func BenchmarkFlightRecorder(b *testing.B) {
	for _, n := range []int{1, 2} {
		for _, mode := range []struct {
			name    string
			records int
		}{{"off", -1}, {"on", DefaultFlightRecords}} {
			b.Run(fmt.Sprintf("n=%d/bytes=1KiB/recorder=%s", n, mode.name), func(b *testing.B) {
				cs, err := NewLocalComms(n, Options{FlightRecords: mode.records})
				if err != nil {
					b.Fatal(err)
				}
				defer destroyAll(cs)
				b.ReportAllocs()
				b.SetBytes(1024)
				done := make(chan error, len(cs))
				for _, c := range cs[1:] {
					go func() {
						buf := make([]byte, 1024)
						for i := 0; i < b.N; i++ {
							if err := c.AllReduce(buf, buf, 256, Float32, Sum); err != nil {
								done <- err
								return
							}
						}
						done <- nil
					}()
				}
				buf := make([]byte, 1024)
				for i := 0; i < b.N; i++ {
					if err := cs[0].AllReduce(buf, buf, 256, Float32, Sum); err != nil {
						b.Fatal(err)
					}
				}
				for range cs[1:] {
					if err := <-done; err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func destroyAll(cs []*Comm) {
	for _, c := range cs {
		c.Destroy()
	}
}

func readDump(t *testing.T, c *Comm) flight.Dump {
	t.Helper()
	var buf bytes.Buffer
	if err := c.DumpState(&buf); err != nil {
		t.Fatal(err)
	}
	var d flight.Dump
	if err := json.Unmarshal(buf.Bytes(), &d); err != nil {
		t.Fatalf("dump is not JSON: %v\n%s", err, buf.String())
	}
	return d
}

// The ring keeps the last N operations, oldest first, with what each was.
func TestFlightRecorderRing(t *testing.T) {
	cs, err := NewLocalComms(2, Options{FlightRecords: 8, Algo: "ring"})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(cs)
	errs := runRanks(cs, func(c *Comm) error {
		b := make([]byte, 4096)
		for i := 0; i < 11; i++ {
			if err := c.AllReduce(b, b, 1024, Float32, Sum); err != nil {
				return err
			}
		}
		if c.Rank() == 0 {
			return c.Send(b, 3, Int64, 1)
		}
		return c.Recv(b, 3, Int64, 0)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	d := readDump(t, cs[1])
	if d.Rank != 1 || d.Size != 2 || d.Capacity != 8 || d.Total != 12 || d.Pid != os.Getpid() || d.Comm == "" {
		t.Errorf("header: %+v", d)
	}
	if len(d.Records) != 8 || len(d.InFlight) != 0 {
		t.Fatalf("%d records, %d in flight; want 8 and 0: %+v", len(d.Records), len(d.InFlight), d.Records)
	}
	for i, r := range d.Records[:7] {
		want := flight.Record{N: uint64(5 + i), Op: "allreduce", Seq: uint64(4 + i), Bytes: 4096, Type: "float32", Algo: "ring", Peer: 0, State: flight.StateOK}
		if r.N != want.N || r.Op != want.Op || r.Seq != want.Seq || r.Bytes != want.Bytes || r.Type != want.Type || r.Algo != want.Algo || r.Peer != want.Peer || r.State != want.State || r.End == nil || r.End.Before(r.Start) {
			t.Errorf("record %d: %+v, want %+v", i, r, want)
		}
	}
	if r := d.Records[7]; r.Op != "recv" || !r.P2P || r.Seq != 0 || r.Bytes != 24 || r.Peer != 0 || r.State != flight.StateOK {
		t.Errorf("last record: %+v", r)
	}
}

// A rank that never arrives at a collective: the others time out, each
// writes its dump on that first failure, and the diagnosis of the real
// dumps names the missing rank and the collective.
func TestFlightDumpOnFailure(t *testing.T) {
	dir := t.TempDir()
	cs, err := NewLocalComms(4, Options{Timeout: 300 * time.Millisecond, DumpDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(cs)
	errs := runRanks(cs, func(c *Comm) error {
		b := make([]byte, 64)
		n := 3
		if c.Rank() == 2 {
			n = 2
		}
		for i := 0; i < n; i++ {
			if err := c.AllReduce(b, b, 16, Float32, Sum); err != nil {
				return err
			}
		}
		return nil
	})
	for r, err := range errs {
		if (r == 2) != (err == nil) {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	dumps, err := flight.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(dumps) != 3 {
		t.Fatalf("%d dumps, want one per failed rank", len(dumps))
	}
	for _, d := range dumps {
		if d.Reason != "failure" || d.Error == "" || !strings.Contains(filepath.Base(d.File), fmt.Sprintf("-r%d-c", d.Rank)) {
			t.Errorf("%s: %+v", d.File, d)
		}
	}
	vs := flight.Diagnose(dumps)
	if len(vs) != 1 {
		t.Fatalf("%d verdicts", len(vs))
	}
	v := vs[0]
	if v.Op != "allreduce" || v.Seq != 2 || !slices.Equal(v.Absent, []int{2}) || !slices.Equal(v.Waiting, []int{0, 1, 3}) {
		t.Errorf("verdict %+v", v)
	}
	if !strings.Contains(v.Text, "rank 2 did not arrive at allreduce #2") {
		t.Errorf("verdict text: %s", v.Text)
	}
	t.Log(v.Text)
}

// An explicit dump while an operation is in flight shows it, with the peer
// it waits for.
func TestFlightDumpInFlight(t *testing.T) {
	dir := t.TempDir()
	cs, err := NewLocalComms(2, Options{DumpDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(cs)
	b := make([]byte, 64)
	req, err := cs[0].IRecv(b, 8, Float64, 1)
	if err != nil {
		t.Fatal(err)
	}
	var d flight.Dump
	proctest.Until(t, 10*time.Second, "recv in flight", func() bool {
		d = readDump(t, cs[0])
		return len(d.InFlight) == 1
	})
	if len(d.InFlight) != 1 || d.InFlight[0].Op != "recv" || d.InFlight[0].Peer != 1 || d.InFlight[0].State != flight.StateInFlight || d.InFlight[0].End != nil {
		t.Errorf("in flight: %+v", d.InFlight)
	}
	path, err := cs[0].DumpStateFile()
	if err != nil || filepath.Dir(path) != dir {
		t.Fatalf("DumpStateFile: %q, %v", path, err)
	}
	if err := cs[1].Send(b, 8, Float64, 0); err != nil {
		t.Fatal(err)
	}
	if err := req.Wait(); err != nil {
		t.Fatal(err)
	}
}

// With the recorder off a communicator keeps nothing and a failure writes
// no dump.
func TestFlightRecorderOff(t *testing.T) {
	o, err := OptionsFromEnv(func(k string) string {
		return map[string]string{"GOCOLL_FLIGHT_RECORDS": "0", "GOCOLL_DUMP_DIR": "/d"}[k]
	})
	if err != nil || o.FlightRecords >= 0 || o.DumpDir != "/d" {
		t.Fatalf("%+v %v", o, err)
	}
	for _, bad := range []string{"-1", "x", "2000000"} {
		if _, err := OptionsFromEnv(func(k string) string {
			return map[string]string{"GOCOLL_FLIGHT_RECORDS": bad}[k]
		}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("GOCOLL_FLIGHT_RECORDS=%s: %v", bad, err)
		}
	}
	dir := t.TempDir()
	o.DumpDir = dir
	cs, err := NewLocalComms(2, o)
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(cs)
	cs[0].Abort()
	if d := readDump(t, cs[0]); len(d.Records) != 0 || d.Capacity != 0 {
		t.Errorf("%+v", d)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("dumped with the recorder off: %v", ents)
	}
}

// Real processes: 4 ranks allreduce in a loop, one is SIGKILLed; every
// survivor fails and leaves a dump, and the doctor's diagnosis of them
// names the killed rank and the collective.
func TestFlightKilledRankProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tr := range []string{"tcp", "auto"} {
		t.Run(tr, func(t *testing.T) { killedRank(t, tr) })
	}
}

func killedRank(t *testing.T, transport string) {
	dir := t.TempDir()
	env := []string{"GOCOLL_TRANSPORT=" + transport, "GOCOLL_TIMEOUT=60s", "GOCOLL_DUMP_DIR=" + dir}
	kids := proctest.Start(t, "loop", 4, env, nil)
	waitOutput(t, kids[2], "READY", time.Minute)
	kids[2].Cmd.Process.Signal(syscall.SIGKILL)
	proctest.Wait(t, kids, time.Minute)
	for r, k := range kids {
		if r != 2 && proctest.ExitCode(k.Err) != 4 {
			t.Errorf("rank %d: exit %d, want 4\n%s", r, proctest.ExitCode(k.Err), k.Out.String())
		}
	}
	dumps, err := flight.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ranks := []int{}
	for _, d := range dumps {
		ranks = append(ranks, d.Rank)
	}
	slices.Sort(ranks)
	if !slices.Equal(ranks, []int{0, 1, 3}) {
		t.Fatalf("dumps of ranks %v, want 0, 1 and 3", ranks)
	}
	vs := flight.Diagnose(dumps)
	if len(vs) != 1 {
		t.Fatalf("%d verdicts: %+v", len(vs), vs)
	}
	v := vs[0]
	if v.Op != "allreduce" || !slices.Contains(v.Absent, 2) || !slices.Contains(v.NoDump, 2) || len(v.Waiting) == 0 {
		t.Errorf("verdict %+v", v)
	}
	if !strings.Contains(v.Text, "rank 2 did not arrive at allreduce #") {
		t.Errorf("verdict does not name rank 2 and the allreduce: %s", v.Text)
	}
	t.Logf("doctor's verdict:\n%s", v.Text)
	if out := os.Getenv("GOCOLL_TEST_KEEP_DUMPS"); out != "" && transport == "tcp" {
		for _, d := range dumps {
			b, _ := os.ReadFile(d.File)
			os.WriteFile(filepath.Join(out, filepath.Base(d.File)), b, 0o644)
		}
	}
}

// SIGUSR1 makes a running rank write its dump, and it keeps running.
func TestFlightSignalProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	dir := t.TempDir()
	kids := proctest.Start(t, "loop", 2, []string{"GOCOLL_TIMEOUT=60s", "GOCOLL_DUMP_DIR=" + dir}, nil)
	waitOutput(t, kids[1], "READY", time.Minute)
	kids[1].Cmd.Process.Signal(syscall.SIGUSR1)
	pattern := filepath.Join(dir, fmt.Sprintf("gocoll-dump-*-%d-r1-*.json", kids[1].Cmd.Process.Pid))
	var d flight.Dump
	proctest.Until(t, time.Minute, "a dump from rank 1", func() bool {
		paths, _ := filepath.Glob(pattern)
		if len(paths) != 1 {
			return false
		}
		b, err := os.ReadFile(paths[0])
		return err == nil && json.Unmarshal(b, &d) == nil
	})
	if d.Reason != "SIGUSR1" || d.Rank != 1 || d.Size != 2 || len(d.Records) == 0 || d.Records[0].Op != "allreduce" || d.Error != "" {
		t.Errorf("dump %+v", d)
	}
	if kids[1].Cmd.ProcessState != nil {
		t.Errorf("rank 1 exited after SIGUSR1")
	}
	for _, k := range kids {
		k.Cmd.Process.Kill()
	}
}

// waitOutput waits until a child printed want, showing what it printed if
// it never does.
func waitOutput(t *testing.T, k *proctest.Child, want string, limit time.Duration) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("the child's output:\n%s", k.Out.String())
		}
	}()
	proctest.Until(t, limit, fmt.Sprintf("%q in the output", want), func() bool { return strings.Contains(k.Out.String(), want) })
}

// TestInlineCallsAllocateNothing: blocking collectives over the
// shared-memory arena allocate nothing on either rank, so that steady
// training loops never wake the garbage collector.
func TestInlineCallsAllocateNothing(t *testing.T) {
	cs := newShm(t, 2, Options{})
	const runs = 500
	send, recv := make([]byte, 4096), make([]byte, 4096)
	vCounts, vDispls := []int{512, 512}, []int{0, 512} // (elements)
	peer := func(c *Comm, n int) chan error {
		done := make(chan error, 1)
		go func() {
			s, r := make([]byte, 4096), make([]byte, 4096)
			for range n {
				if err := c.AllReduce(s, r, 1024, Float32, Sum); err != nil {
					done <- err
					return
				}
				if err := c.AllGather(s[:2048], r, 512, Float32); err != nil {
					done <- err
					return
				}
				if err := c.AllToAllv(s, vCounts, vDispls, r, vCounts, vDispls, Float32); err != nil {
					done <- err
					return
				}
				if err := c.Barrier(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		return done
	}
	done := peer(cs[1], runs+1) // AllocsPerRun makes one warm-up run
	got := testing.AllocsPerRun(runs, func() {
		if err := cs[0].AllReduce(send, recv, 1024, Float32, Sum); err != nil {
			t.Fatal(err)
		}
		if err := cs[0].AllGather(send[:2048], recv, 512, Float32); err != nil {
			t.Fatal(err)
		}
		if err := cs[0].AllToAllv(send, vCounts, vDispls, recv, vCounts, vDispls, Float32); err != nil {
			t.Fatal(err)
		}
		if err := cs[0].Barrier(); err != nil {
			t.Fatal(err)
		}
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got != 0 {
		t.Errorf("%v allocations per allreduce + allgather + alltoallv + barrier over shared memory; want none", got)
	}
}

// oneRankCalls are a collective of each kind, 4 KiB, on the one-rank c.
func oneRankCalls(c *Comm, s, r []byte) []struct {
	name string
	f    func() error
} {
	return []struct {
		name string
		f    func() error
	}{
		{"allreduce", func() error { return c.AllReduce(s, r, 1024, Float32, Sum) }},
		{"reduce", func() error { return c.Reduce(s, r, 1024, Float32, Sum, 0) }},
		{"broadcast", func() error { return c.Broadcast(s, r, 1024, Float32, 0) }},
		{"allgather", func() error { return c.AllGather(s, r, 1024, Float32) }},
		{"reducescatter", func() error { return c.ReduceScatter(s, r, 1024, Float32, Sum) }},
		{"alltoall", func() error { return c.AllToAll(s, r, 1024, Float32) }},
		{"alltoall in place", func() error { return c.AllToAll(r, r, 1024, Float32) }},
		{"barrier", c.Barrier},
	}
}

// TestOneRankCallsAllocateNothing: a communicator of one rank (a single
// process run, say) copies and returns; no collective builds a schedule
// for it.
func TestOneRankCallsAllocateNothing(t *testing.T) {
	c := newLocal(t, 1, Options{})[0]
	s, r := make([]byte, 4096), make([]byte, 4096)
	for _, tc := range oneRankCalls(c, s, r) {
		if got := testing.AllocsPerRun(100, func() {
			if err := tc.f(); err != nil {
				t.Fatal(err)
			}
		}); got != 0 {
			t.Errorf("%s: %v allocations per call on one rank; want none", tc.name, got)
		}
	}
	// alltoallv keeps its block lists from one blocking call to the next.
	counts, displs := []int{1024}, []int{0}
	if got := testing.AllocsPerRun(100, func() {
		if err := c.AllToAllv(s, counts, displs, r, counts, displs, Float32); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("alltoallv: %v allocations per call on one rank; want none", got)
	}
}
