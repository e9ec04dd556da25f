package engine

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

var awkwardCounts = []int{0, 1, 5, 13, 64}

// TestConformanceInProcess is the whole matrix: every collective × datatype ×
// op × algorithm × rank count 1..9, with ranks as goroutines, over the
// in-memory transport and over shared memory (see worlds). The algorithms
// are the automatic choice and every schedule of the registry that runs on
// one host (registryAlgos): a registry line is tested end to end without a
// test line.
func TestConformanceInProcess(t *testing.T) {
	algos := append([]string{""}, registryAlgos()...)
	for _, w := range worlds {
		for n := 1; n <= 9; n++ {
			for _, algo := range algos {
				if algo != "" && w.msgRanks != nil && !slices.Contains(w.msgRanks, n) || testing.Short() && w.shortRanks > 0 && n > w.shortRanks {
					continue
				}
				t.Run(fmt.Sprintf("%s/n=%d/algo=%s", w.name, n, algo), func(t *testing.T) {
					if w.parallel {
						t.Parallel()
					}
					comms := w.make(t, n, Options{Algo: algo, Timeout: time.Minute})
					s := suite{dtypes: kernel.AllDataTypes(), ops: kernel.AllRedOps(), counts: awkwardCounts}
					if testing.Short() {
						s.dtypes = []DataType{Float32, Float16, Int8}
					}
					mustRanks(t, comms, func(c *Comm) error { return conformance(c, s) })
				})
			}
		}
	}
}

// registryAlgos are GOCOLL_ALGO values that together force every schedule
// of the registry (engine.Schedules) that runs on one host: the i-th names
// each collective's i-th, cycling through the shorter lists.
func registryAlgos() []string {
	per := map[sched.Coll][]string{}
	most := 0
	for _, e := range Schedules() {
		if !e.Hosts {
			per[e.Coll] = append(per[e.Coll], e.Name)
			most = max(most, len(per[e.Coll]))
		}
	}
	out := make([]string, most)
	for i := range out {
		var parts []string
		for _, coll := range sched.Colls() {
			if names := per[coll]; len(names) > 0 {
				parts = append(parts, coll.String()+"="+names[i%len(names)])
			}
		}
		out[i] = strings.Join(parts, ",")
	}
	return out
}

func TestBruckRadixes(t *testing.T) {
	for _, radix := range []int{2, 3, 4, 7} {
		for _, n := range []int{2, 3, 5, 8, 9} {
			comms := newLocal(t, n, Options{Algo: "alltoall=bruck", BruckRadix: radix})
			s := suite{dtypes: []DataType{Int32, Uint8}, counts: []int{0, 1, 3}, colls: map[string]bool{"alltoall": true}}
			mustRanks(t, comms, func(c *Comm) error { return conformance(c, s) })
		}
	}
}

// Larger messages take multi-segment paths (pipelined broadcast, HD segments).
func TestLargeMessages(t *testing.T) {
	for _, algo := range []string{"allreduce=ring", "allreduce=hd", "broadcast=pipeline", "allreduce=rd"} {
		ranks := []int{2, 3, 4}
		if raceEnabled {
			ranks = []int{3} // (as TestHDMatrix)
		}
		for _, n := range ranks {
			comms := newLocal(t, n, Options{Algo: algo})
			s := suite{dtypes: []DataType{Float32}, ops: []RedOp{Sum, Avg}, counts: []int{300001}, colls: map[string]bool{"allreduce": true, "broadcast": true}}
			mustRanks(t, comms, func(c *Comm) error { return conformance(c, s) })
		}
	}
}

// Every rank ends with the same bytes, and a rerun gives the same bytes, even
// for float data whose sum depends on association.
func TestDeterministicBytes(t *testing.T) {
	for _, algo := range []string{"allreduce=ring", "allreduce=hd", "allreduce=rd"} {
		for _, n := range []int{3, 4, 7} {
			rng := rand.New(rand.NewSource(int64(n)))
			const count = 10007
			inputs := make([][]byte, n)
			for r := range inputs {
				inputs[r] = make([]byte, 4*count)
				for i := 0; i < count; i++ {
					setElem(inputs[r], Float32, i, 0)
					f := float32(rng.NormFloat64() * 1e3)
					putF32(inputs[r][4*i:], f)
				}
			}
			var first []byte
			for run := 0; run < 2; run++ {
				comms := newLocal(t, n, Options{Algo: algo})
				outs := make([][]byte, n)
				mustRanks(t, comms, func(c *Comm) error {
					outs[c.Rank()] = make([]byte, 4*count)
					return c.AllReduce(inputs[c.Rank()], outs[c.Rank()], count, Float32, Sum)
				})
				for r := 1; r < n; r++ {
					if !bytes.Equal(outs[r], outs[0]) {
						t.Fatalf("%s n=%d: rank %d differs from rank 0", algo, n, r)
					}
				}
				if first == nil {
					first = outs[0]
				} else if !bytes.Equal(first, outs[0]) {
					t.Fatalf("%s n=%d: second run differs", algo, n)
				}
			}
		}
	}
}

// Non-blocking operations: many in flight complete in issue order.
func TestManyInFlight(t *testing.T) {
	comms := newLocal(t, 4, Options{})
	mustRanks(t, comms, func(c *Comm) error {
		var reqs []*Request
		bufs := make([][]byte, 50)
		for i := range bufs {
			bufs[i] = inputFor(Int64, Sum, c.Rank(), 100+i, i)
			req, err := c.IAllReduce(bufs[i], bufs[i], 100+i, Int64, Sum)
			if err != nil {
				return err
			}
			reqs = append(reqs, req)
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			if err := reqs[i].Wait(); err != nil {
				return err
			}
			// Issue order: when i finished, every earlier one had too.
			for j := 0; j < i; j++ {
				if done, _ := reqs[j].Test(); !done {
					return fmt.Errorf("request %d finished before %d", i, j)
				}
			}
		}
		for i, b := range bufs {
			in := make([][]byte, 4)
			for r := range in {
				in[r] = inputFor(Int64, Sum, r, 100+i, i)
			}
			if d := diffBytes(b, expectReduce(in, Int64, Sum), 8); d != "" {
				return fmt.Errorf("op %d: %s", i, d)
			}
		}
		return nil
	})
}

// A blocking call issued while non-blocking ones are pending queues behind
// them (it returns after they finished, with every rank agreeing on the
// order); one issued with nothing pending runs inline. Rounds alternate the
// two, so a claim of the inline path that raced the queue shows up as a
// wrong sum, a mismatch between ranks or a call that overtook.
func TestBlockingBehindPending(t *testing.T) {
	comms := newLocal(t, 3, Options{})
	mustRanks(t, comms, func(c *Comm) error {
		for round := range 40 {
			queued := round % 4 // 0: the blocking call runs inline
			var reqs []*Request
			bufs := make([][]byte, queued+1)
			for i := range bufs {
				bufs[i] = inputFor(Int64, Sum, c.Rank(), 64+i, round)
			}
			for i := range queued {
				req, err := c.IAllReduce(bufs[i], bufs[i], 64+i, Int64, Sum)
				if err != nil {
					return err
				}
				reqs = append(reqs, req)
			}
			last := bufs[queued]
			if err := c.AllReduce(last, last, 64+queued, Int64, Sum); err != nil {
				return err
			}
			for i, req := range reqs {
				if done, _ := req.Test(); !done {
					return fmt.Errorf("round %d: the blocking call returned before request %d finished", round, i)
				}
			}
			for i, b := range bufs {
				in := make([][]byte, len(comms))
				for r := range in {
					in[r] = inputFor(Int64, Sum, r, 64+i, round)
				}
				if d := diffBytes(b, expectReduce(in, Int64, Sum), 8); d != "" {
					return fmt.Errorf("round %d, op %d: %s", round, i, d)
				}
			}
		}
		return nil
	})
}

func TestSplit(t *testing.T) {
	comms := newLocal(t, 7, Options{})
	mustRanks(t, comms, func(c *Comm) error {
		color := c.Rank() % 2
		if c.Rank() == 6 {
			color = SplitNoColor
		}
		sub, err := c.Split(color, -c.Rank()) // reversed order inside each colour
		if err != nil {
			return err
		}
		if color == SplitNoColor {
			if sub != nil {
				return errors.New("no-colour rank got a communicator")
			}
			return c.Barrier()
		}
		defer sub.Destroy()
		if sub.Size() != 3 {
			return fmt.Errorf("sub size %d", sub.Size())
		}
		wantRank := 2 - c.Rank()/2
		if sub.Rank() != wantRank {
			return fmt.Errorf("sub rank %d, want %d", sub.Rank(), wantRank)
		}
		v := []byte{byte(c.Rank())}
		out := make([]byte, 1)
		if err := sub.AllReduce(v, out, 1, Uint8, Sum); err != nil {
			return err
		}
		want := byte(0 + 2 + 4)
		if color == 1 {
			want = 1 + 3 + 5
		}
		if out[0] != want {
			return fmt.Errorf("sub allreduce %d want %d", out[0], want)
		}
		// The parent keeps working beside the child.
		return c.Barrier()
	})
}

func TestBadArguments(t *testing.T) {
	comms := newLocal(t, 1, Options{})
	c := comms[0]
	buf := make([]byte, 64)
	cases := []struct {
		name string
		call func() error
	}{
		{"bad dtype", func() error { return c.AllReduce(buf, buf, 1, DataType(42), Sum) }},
		{"bad op", func() error { return c.AllReduce(buf, buf, 1, Float32, RedOp(9)) }},
		{"negative count", func() error { return c.AllReduce(buf, buf, -1, Float32, Sum) }},
		{"short recv", func() error { return c.AllReduce(buf, buf[:8], 16, Float32, Sum) }},
		{"overlap", func() error { return c.AllReduce(buf[:32], buf[4:36], 8, Float32, Sum) }},
		{"root out of range", func() error { return c.Broadcast(buf, buf, 1, Float32, 1) }},
		{"negative root", func() error { return c.Reduce(buf, buf, 1, Float32, Sum, -1) }},
		{"peer out of range", func() error { return c.Send(buf, 1, Float32, 3) }},
		{"alltoallv counts", func() error { return c.AllToAllv(buf, []int{1, 2}, []int{0}, buf, []int{1}, []int{0}, Int8) }},
		{"alltoallv past end", func() error {
			return c.AllToAllv(buf, []int{100}, []int{0}, make([]byte, 200), []int{100}, []int{0}, Int8)
		}},
		{"alltoallv own counts differ", func() error {
			return c.AllToAllv(buf, []int{2}, []int{0}, make([]byte, 8), []int{1}, []int{0}, Int8)
		}},
		{"split colour", func() error { _, err := c.Split(-5, 0); return err }},
	}
	for _, tc := range cases {
		err := tc.call()
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	if err := c.Send(buf, 1, Float32, 0); !errors.Is(err, ErrInvalidUsage) {
		t.Errorf("send to self: %v", err)
	}
	// Bad arguments do not poison the communicator.
	if err := c.AllReduce(buf, buf, 4, Float32, Sum); err != nil {
		t.Fatalf("after bad arguments: %v", err)
	}
}

func TestMismatchedCollectives(t *testing.T) {
	cases := map[string]func(c *Comm) error{
		"count": func(c *Comm) error {
			b := make([]byte, 400)
			return c.AllReduce(b, b, 10+c.Rank()%2, Float32, Sum)
		},
		"op": func(c *Comm) error {
			b := make([]byte, 400)
			return c.AllReduce(b, b, 10, Float32, RedOp(c.Rank()%2))
		},
		"dtype": func(c *Comm) error {
			b := make([]byte, 400)
			return c.AllReduce(b, b, 10, []DataType{Float32, Int32}[c.Rank()%2], Sum)
		},
		"root": func(c *Comm) error {
			b := make([]byte, 400)
			return c.Broadcast(b, b, 10, Float32, c.Rank()%2)
		},
		"collective": func(c *Comm) error {
			b := make([]byte, 400)
			if c.Rank() == 2 {
				return c.AllGather(make([]byte, 40), b[:160], 10, Float32)
			}
			return c.AllReduce(b, b, 10, Float32, Sum)
		},
	}
	for name, fn := range cases {
		t.Run(name, func(t *testing.T) {
			comms := newLocal(t, 4, Options{Timeout: 20 * time.Second})
			start := time.Now()
			// A mismatch surfaces in the call itself or, where a rank's
			// stray message is read only later, in the next collective.
			both := func(c *Comm) error {
				if err := fn(c); err != nil {
					return err
				}
				return c.Barrier()
			}
			for r, err := range runRanks(comms, both) {
				if err == nil {
					t.Errorf("rank %d: no error", r)
					continue
				}
				if !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrRemoteAbort) {
					t.Errorf("rank %d: %v, want mismatch or remote abort", r, err)
				}
			}
			if time.Since(start) > 10*time.Second {
				t.Errorf("mismatch took %v to surface", time.Since(start))
			}
		})
	}
}

func TestTimeoutNamesPeer(t *testing.T) {
	comms := newLocal(t, 3, Options{Timeout: 200 * time.Millisecond})
	// Rank 2 never joins: rank 0 and 1 time out or hear that a peer did.
	errs := runRanks(comms[:2], func(c *Comm) error { return c.AllReduce(make([]byte, 4), make([]byte, 4), 1, Float32, Sum) })
	timeouts := 0
	for r, err := range errs {
		var oe *OpError
		if !errors.As(err, &oe) {
			t.Fatalf("rank %d: %v is not an OpError", r, err)
		}
		if errors.Is(err, ErrTimeout) {
			timeouts++
			if oe.Peer < 0 || !strings.Contains(err.Error(), "allreduce #0") {
				t.Errorf("rank %d: timeout error lacks op/seq/peer: %v", r, err)
			}
		}
	}
	if timeouts == 0 {
		t.Fatalf("no rank reported a timeout: %v", errs)
	}
	// The communicator is failed now; later calls say so at once.
	if err := comms[0].Barrier(); !errors.Is(err, ErrInvalidUsage) {
		t.Fatalf("after timeout: %v", err)
	}
}

// TestAbortUnblocks: an abort fails the collectives pending on every rank
// (the shared-memory collectives' too), naming the rank that aborted.
func TestAbortUnblocks(t *testing.T) {
	for _, w := range worlds {
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t, 3, Options{Timeout: time.Minute})
			done := make(chan error, 2)
			for _, c := range comms[1:] {
				go func() { done <- c.Barrier() }()
			}
			for _, c := range comms[1:] {
				awaitPending(t, c)
			}
			comms[0].Abort()
			for i := 0; i < 2; i++ {
				select {
				case err := <-done:
					var rae *transport.RemoteAbortError
					if !errors.As(err, &rae) || rae.Peer != 0 {
						t.Errorf("pending call after abort: %v, want a RemoteAbortError naming rank 0", err)
					}
				case <-time.After(time.Minute):
					t.Fatal("abort did not unblock pending calls")
				}
			}
			if _, err := comms[0].IBarrier(); !errors.Is(err, ErrInvalidUsage) {
				t.Errorf("call after abort: %v", err)
			}
		})
	}
}

// A peer that disappears (its endpoint closes, as a killed process's sockets
// do) fails the survivors promptly.
func TestPeerLost(t *testing.T) {
	w := mem.NewWorld(3)
	comms, err := newLocalWorld(w, nil, Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	for _, c := range comms[:2] {
		go func() {
			b := make([]byte, 40)
			done <- c.AllReduce(b, b, 10, Float32, Sum)
		}()
	}
	awaitPending(t, comms[0])
	awaitPending(t, comms[1])
	w.Endpoint(2).Close()
	for i := 0; i < 2; i++ {
		select {
		case err := <-done:
			if !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrRemoteAbort) {
				t.Errorf("survivor: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("survivors hang after a peer vanished")
		}
	}
	for _, c := range comms {
		c.Abort()
		c.Destroy()
	}
}

func TestDestroy(t *testing.T) {
	comms := newLocal(t, 2, Options{})
	mustRanks(t, comms, func(c *Comm) error { return c.Destroy() })
	if err := comms[0].Barrier(); !errors.Is(err, ErrDestroyed) {
		t.Fatalf("after destroy: %v", err)
	}
	if err := comms[0].Destroy(); !errors.Is(err, ErrDestroyed) {
		t.Fatalf("double destroy: %v", err)
	}
}

// GOCOLL_ALGO's errors are the engine's (the choice it makes:
// engine/internal/choose, TestOverrides).
func TestAlgoSpec(t *testing.T) {
	for _, bad := range []string{"nope", "allreduce=bruck", "alltoall=ring", "nocoll=ring"} {
		if _, err := parseAlgoSpec(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := parseAlgoSpec("allreduce=ring,alltoall=bruck"); err != nil {
		t.Fatal(err)
	}
}

var _ transport.Transport = (*mem.Endpoint)(nil)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	comms := newLocal(t, 3, Options{Metrics: m, Algo: "allreduce=ring"})
	mustRanks(t, comms, func(c *Comm) error {
		b := make([]byte, 400)
		for i := 0; i < 2; i++ {
			if err := c.AllReduce(b, b, 100, Float32, Sum); err != nil {
				return err
			}
		}
		return c.Barrier()
	})
	if got := testutil.ToFloat64(m.ops.WithLabelValues("allreduce", "ring")); got != 6 {
		t.Errorf("allreduce count %v, want 6 (2 per rank)", got)
	}
	if got := testutil.ToFloat64(m.bytes.WithLabelValues("allreduce")); got != 6*400 {
		t.Errorf("allreduce bytes %v", got)
	}
	if n := testutil.CollectAndCount(m.seconds); n == 0 {
		t.Error("no duration observed")
	}
}

// MemAlloc'd memory works as any buffer; with every rank on one host it is
// shared memory the peers read in place.
func TestMemAlloc(t *testing.T) {
	for _, tr := range []string{"auto", "tcp"} {
		comms := benchComms(t, 3, tr)
		mustRanks(t, comms, func(c *Comm) error {
			if (c.arena != nil) != (tr == "auto") {
				return fmt.Errorf("transport %s: arena present = %v", tr, c.arena != nil)
			}
			const count = 300000 // past the size where the arena reads in place
			send, err := c.MemAlloc(4 * count)
			if err != nil {
				return err
			}
			recv, err := c.MemAlloc(4 * count)
			if err != nil {
				return err
			}
			inputs := make([][]byte, c.Size())
			for r := range inputs {
				inputs[r] = inputFor(Float32, Sum, r, count, 9)
			}
			copy(send, inputs[c.Rank()])
			if err := c.AllReduce(send, recv, count, Float32, Sum); err != nil {
				return err
			}
			if d := diffBytes(recv, expectReduce(inputs, Float32, Sum), 4); d != "" {
				return fmt.Errorf("%s: %s", tr, d)
			}
			if err := c.MemFree(send); err != nil {
				return err
			}
			if err := c.MemFree(send); !errors.Is(err, ErrInvalidArgument) {
				return fmt.Errorf("double free: %v", err)
			}
			return c.MemFree(recv)
		})
	}
}

// TestBroadcastDisagreeingRoots: rank 0 passes root 0, the others root 1.
// No rank may keep data that differs from the others' without an error:
// the ranks that are not a root in their own view fail in the call, the
// self-declared roots in the call or their next one. In process (message
// path), over TCP, and over shared memory.
func TestBroadcastDisagreeingRoots(t *testing.T) {
	const n = 4
	for _, tr := range []string{"local", "tcp", "auto"} {
		for _, size := range []int{1 << 10, 1 << 20} {
			t.Run(fmt.Sprintf("%s/%d", tr, size), func(t *testing.T) {
				var comms []*Comm
				if tr == "local" {
					comms = newLocal(t, n, Options{Timeout: time.Minute})
				} else {
					comms = benchComms(t, n, tr)
				}
				inCall := make([]error, n)
				called := make([]bool, n)
				errs := runRanks(comms, func(c *Comm) error {
					root := 1
					if c.Rank() == 0 {
						root = 0
					}
					buf := make([]byte, size)
					// Not the first call: shared memory's first barrier
					// waits for everyone anyway. (A rank still leaving
					// it when a faster one already failed the broadcast
					// fails here, with the abort, and never calls it.)
					if err := c.Barrier(); err != nil {
						return err
					}
					called[c.Rank()] = true
					if inCall[c.Rank()] = c.Broadcast(buf, buf, size/4, Float32, root); inCall[c.Rank()] != nil {
						return inCall[c.Rank()]
					}
					return c.Barrier()
				})
				for r, err := range errs {
					if err == nil {
						t.Errorf("rank %d saw no error", r)
					} else if r >= 2 && called[r] && inCall[r] == nil {
						t.Errorf("rank %d returned from the broadcast without an error (then: %v)", r, err)
					}
				}
				for _, c := range comms {
					c.Abort()
				}
			})
		}
	}
}
