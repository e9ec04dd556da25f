package engine

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
)

// A soak is a long random sequence of every collective, the same on every
// rank (one seed), with sizes from 0 to a few MiB, every type and reduction,
// plain and MemAlloc'd buffers, blocking and non-blocking forms, point-to-
// point pairs and the collectives of split sub-communicators (re-split from
// time to time). Each rank checks every result it receives against a
// reference it computes itself.
type soakConfig struct {
	ops      int    // operations in the sequence
	seed     uint64 // of the shared sequence
	maxBytes int    // largest buffer of one operation
}

// soakConfigFromEnv reads what the parent test passes to its ranks.
func soakConfigFromEnv() soakConfig {
	cfg := soakConfig{ops: 2000, maxBytes: 3 << 20}
	if n, err := strconv.Atoi(os.Getenv("GOCOLL_TEST_SOAK_OPS")); err == nil && n > 0 {
		cfg.ops = n
	}
	if n, err := strconv.Atoi(os.Getenv("GOCOLL_TEST_SOAK_BYTES")); err == nil && n > 0 {
		cfg.maxBytes = n
	}
	cfg.seed, _ = strconv.ParseUint(os.Getenv("GOCOLL_TEST_SOAK_SEED"), 10, 64)
	return cfg
}

// soakStep is one operation of the sequence on one rank: the operations
// to issue (a point-to-point pair has two), and the check of the result,
// once they completed.
type soakStep struct {
	kind  string
	what  string
	ops   []Op
	check func() error
}

// soaker draws a soak's steps on one rank.
type soaker struct {
	cfg      soakConfig
	shared   *rand.Rand // equal on every rank: which operation, type, size, root
	local    *rand.Rand // this rank's own: buffers, in place, blocking or not
	pool     [2][]byte  // MemAlloc'd send and receive buffers of the parent communicator
	blocking bool       // the step being drawn runs blocking (pool buffers allowed)
	counts   map[string]int
}

func soak(c *Comm, cfg soakConfig) error {
	s := &soaker{
		cfg:    cfg,
		shared: rand.New(rand.NewPCG(cfg.seed, 1)),
		local:  rand.New(rand.NewPCG(cfg.seed, uint64(2+c.Rank()))),
		counts: map[string]int{},
	}
	for i := range s.pool {
		b, err := c.MemAlloc(cfg.maxBytes)
		if err != nil {
			return err
		}
		defer c.MemFree(b)
		s.pool[i] = b
	}
	var sub *Comm
	defer func() {
		if sub != nil {
			sub.Destroy()
		}
	}()
	type inflight struct {
		step soakStep
		reqs []*Request
	}
	var pending []inflight
	drain := func() error {
		for _, p := range pending {
			for _, r := range p.reqs {
				if err := r.Wait(); err != nil {
					return fmt.Errorf("%s: %w", p.step.what, err)
				}
			}
			if err := p.step.check(); err != nil {
				return fmt.Errorf("%s: %w", p.step.what, err)
			}
		}
		pending = pending[:0]
		return nil
	}
	start := time.Now()
	for i := 0; i < cfg.ops; i++ {
		if i%500 == 0 {
			// A new sub-communicator: a collective over the parent, with
			// every operation still pending on either finished first.
			if err := drain(); err != nil {
				return err
			}
			if sub != nil {
				if err := sub.Destroy(); err != nil {
					return fmt.Errorf("op %d: destroy sub-communicator: %w", i, err)
				}
			}
			color := c.Rank() % 2
			if i/500%2 == 1 {
				color = c.Rank() / 2
			}
			var err error
			if sub, err = c.Split(color, -c.Rank()); err != nil {
				return fmt.Errorf("op %d: split: %w", i, err)
			}
			s.counts["split"]++
		}
		s.blocking = s.local.Float64() < 0.7
		cc := c
		if s.shared.Float64() < 0.2 {
			cc = sub
		}
		step := s.step(cc, cc == c, i)
		s.counts[step.kind]++
		if !s.blocking {
			reqs := make([]*Request, len(step.ops))
			for k, o := range step.ops {
				var err error
				if reqs[k], err = o.Start(); err != nil {
					return fmt.Errorf("%s: %w", step.what, err)
				}
			}
			pending = append(pending, inflight{step, reqs})
			if len(pending) >= 4 || s.local.Float64() < 0.3 {
				if err := drain(); err != nil {
					return err
				}
			}
			continue
		}
		// Blocking: all but the last operation start (the first of a
		// send/receive pair must not wait for the second), the last runs.
		var reqs []*Request
		for _, o := range step.ops[:len(step.ops)-1] {
			r, err := o.Start()
			if err != nil {
				return fmt.Errorf("%s: %w", step.what, err)
			}
			reqs = append(reqs, r)
		}
		if err := step.ops[len(step.ops)-1].Run(); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
		for _, r := range reqs {
			if err := r.Wait(); err != nil {
				return fmt.Errorf("%s: %w", step.what, err)
			}
		}
		if err := step.check(); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
	}
	if err := drain(); err != nil {
		return err
	}
	if err := c.Barrier(); err != nil {
		return err
	}
	if c.Rank() == 0 {
		var kinds []string
		for k, n := range s.counts {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		}
		slices.Sort(kinds)
		fmt.Printf("SOAK %d ops in %v: %s\n", cfg.ops, time.Since(start).Round(time.Millisecond), strings.Join(kinds, " "))
	}
	return nil
}

var soakKinds = []string{"allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "alltoallv", "sendrecv", "barrier"}

// count draws an element count for buffers of up to max bytes of es-byte
// elements: sizes spread evenly over the powers of two, a few empty.
func (s *soaker) count(es, max int) int {
	if s.shared.IntN(20) == 0 {
		return 0
	}
	hi := 1 << s.shared.IntN(bits.Len(uint(s.cfg.maxBytes)))
	n := (hi/2 + s.shared.IntN(hi/2+1)) / es
	return min(n, max/es)
}

// buf returns n bytes for this rank's send (which=0) or receive (1)
// buffer: MemAlloc'd memory on the parent communicator in some blocking
// steps, fresh memory otherwise.
func (s *soaker) buf(parent bool, which, n int) []byte {
	if parent && s.blocking && s.local.IntN(3) == 0 {
		b := s.pool[which][:n]
		clear(b)
		return b
	}
	return make([]byte, n)
}

// step draws operation i on cc (parent: cc is the soak's communicator).
func (s *soaker) step(cc *Comm, parent bool, i int) soakStep {
	n, r := cc.Size(), cc.Rank()
	kind := soakKinds[s.shared.IntN(len(soakKinds))]
	dt := kernel.AllDataTypes()[s.shared.IntN(len(kernel.AllDataTypes()))]
	// Only the pairs the engine defines (no bitwise op on floats, no avg on
	// bool): every rank draws from the shared stream alike.
	op := kernel.AllRedOps()[s.shared.IntN(len(kernel.AllRedOps()))]
	for kernel.CheckOp(dt, op) != nil {
		op = kernel.AllRedOps()[s.shared.IntN(len(kernel.AllRedOps()))]
	}
	es := dt.Size()
	root := s.shared.IntN(n)
	where := "parent"
	if !parent {
		where = fmt.Sprintf("sub(rank %d of %d)", r, n)
	}
	st := soakStep{kind: kind, what: fmt.Sprintf("op %d: %s %s %v", i, where, kind, dt)}
	inplace := s.local.IntN(3) == 0
	switch kind {
	case "allreduce", "reduce":
		count := s.count(es, s.cfg.maxBytes)
		st.what += fmt.Sprintf("/%v count=%d root=%d", op, count, root)
		want := soakReduce(dt, op, n, count, i)
		send := s.buf(parent, 0, count*es)
		copy(send, soakInput(dt, op, r, count, i))
		recv := send
		if !inplace {
			recv = s.buf(parent, 1, count*es)
		}
		if kind == "allreduce" {
			st.ops = []Op{cc.AllReduceOp(send, recv, count, dt, op)}
		} else {
			st.ops = []Op{cc.ReduceOp(send, recv, count, dt, op, root)}
		}
		st.check = func() error {
			if kind == "reduce" && r != root {
				return nil
			}
			return diffErr(recv, want, es)
		}
	case "broadcast":
		count := s.count(es, s.cfg.maxBytes)
		st.what += fmt.Sprintf(" count=%d root=%d", count, root)
		want := soakInput(dt, Sum, root, count, i)
		recv := s.buf(parent, 1, count*es)
		var send []byte
		switch {
		case r == root && inplace:
			copy(recv, want)
			send = recv
		case r == root:
			send = s.buf(parent, 0, count*es)
			copy(send, want)
		}
		st.ops = []Op{cc.BroadcastOp(send, recv, count, dt, root)}
		st.check = func() error { return diffErr(recv, want, es) }
	case "allgather":
		count := s.count(es, s.cfg.maxBytes/n)
		st.what += fmt.Sprintf(" count=%d", count)
		block := count * es
		var want []byte
		for q := range n {
			want = append(want, soakInput(dt, Sum, q, count, i)...)
		}
		recv := s.buf(parent, 1, block*n)
		send := recv[r*block : (r+1)*block]
		if !inplace {
			send = s.buf(parent, 0, block)
		}
		copy(send, want[r*block:])
		st.ops = []Op{cc.AllGatherOp(send, recv, count, dt)}
		st.check = func() error { return diffErr(recv, want, es) }
	case "reducescatter":
		count := s.count(es, s.cfg.maxBytes/n)
		st.what += fmt.Sprintf("/%v count=%d", op, count)
		block := count * es
		want := soakReduce(dt, op, n, count*n, i)[r*block : (r+1)*block]
		send := s.buf(parent, 0, block*n)
		copy(send, soakInput(dt, op, r, count*n, i))
		recv := send[r*block : (r+1)*block]
		if !inplace {
			recv = s.buf(parent, 1, block)
		}
		st.ops = []Op{cc.ReduceScatterOp(send, recv, count, dt, op)}
		st.check = func() error { return diffErr(recv, want, es) }
	case "alltoall":
		count := s.count(es, s.cfg.maxBytes/n)
		st.what += fmt.Sprintf(" count=%d", count)
		block := count * es
		var want []byte
		for q := range n {
			want = append(want, soakInput(dt, Sum, q, count*n, i)[r*block:(r+1)*block]...)
		}
		send := s.buf(parent, 0, block*n)
		copy(send, soakInput(dt, Sum, r, count*n, i))
		recv := send
		if !inplace {
			recv = s.buf(parent, 1, block*n)
		}
		st.ops = []Op{cc.AllToAllOp(send, recv, count, dt)}
		st.check = func() error { return diffErr(recv, want, es) }
	case "alltoallv":
		// cnt[q][j]: elements rank q sends to rank j; rank q's blocks lie
		// in its send buffer in peer order, received in reverse peer
		// order with a gap of one element.
		maxc := max(s.count(es, s.cfg.maxBytes/(n*n)), 1)
		cnt := make([][]int, n)
		for q := range cnt {
			cnt[q] = make([]int, n)
			for j := range cnt[q] {
				cnt[q][j] = s.shared.IntN(maxc + 1)
			}
		}
		st.what += fmt.Sprintf(" counts=%v", cnt)
		offset := func(q, j int) int {
			o := 0
			for k := range j {
				o += cnt[q][k]
			}
			return o
		}
		src := func(q int) []byte { return soakInput(dt, Sum, q, offset(q, n), i) }
		sc, sd, rc, rd := make([]int, n), make([]int, n), make([]int, n), make([]int, n)
		roff := 0
		for j := n - 1; j >= 0; j-- {
			rc[j], rd[j] = cnt[j][r], roff
			roff += cnt[j][r] + 1
		}
		for j := range n {
			sc[j], sd[j] = cnt[r][j], offset(r, j)
		}
		send := s.buf(parent, 0, offset(r, n)*es)
		copy(send, src(r))
		recv := s.buf(parent, 1, roff*es)
		st.ops = []Op{cc.AllToAllvOp(send, sc, sd, recv, rc, rd, dt)}
		st.check = func() error {
			for j := range n {
				want := src(j)[offset(j, r)*es : offset(j, r+1)*es]
				if err := diffErr(recv[rd[j]*es:(rd[j]+rc[j])*es], want, es); err != nil {
					return fmt.Errorf("from rank %d: %w", j, err)
				}
			}
			return nil
		}
	case "sendrecv":
		if n == 1 {
			st.kind, st.what = "barrier", strings.Replace(st.what, "sendrecv", "barrier", 1)
			st.ops, st.check = []Op{cc.BarrierOp()}, func() error { return nil }
			break
		}
		count := s.count(es, s.cfg.maxBytes)
		k := 1 + s.shared.IntN(n-1)
		to, from := (r+k)%n, (r-k+n)%n
		st.what += fmt.Sprintf(" count=%d shift=%d", count, k)
		send := s.buf(parent, 0, count*es)
		copy(send, soakInput(dt, Sum, r, count, i))
		recv := s.buf(parent, 1, count*es)
		want := soakInput(dt, Sum, from, count, i)
		st.ops = []Op{cc.SendOp(send, count, dt, to), cc.RecvOp(recv, count, dt, from)}
		st.check = func() error { return diffErr(recv, want, es) }
	case "barrier":
		st.ops, st.check = []Op{cc.BarrierOp()}, func() error { return nil }
	}
	return st
}

// Soak inputs repeat every soakPeriod elements (the first ones of
// inputFor, tiled), and so do the references, computed on one period and
// tiled the same way: checking a result of a few MiB costs copies, not a
// reduction of every rank's input in the reference kernel on every rank.
// The period is prime, so that no chunk or segment size an algorithm uses
// (powers of two, shares of the count) is a multiple of it: data that
// lands at the wrong offset still shows.
const soakPeriod = 1021

// tile repeats period to n bytes.
func tile(period []byte, n int) []byte {
	out := make([]byte, n)
	k := copy(out, period)
	for k > 0 && k < n {
		k += copy(out[k:], out[:k])
	}
	return out
}

// soakInput is rank's input of count elements for operation salt.
func soakInput(dt DataType, op RedOp, rank, count, salt int) []byte {
	return tile(inputFor(dt, op, rank, min(count, soakPeriod), salt), count*dt.Size())
}

// soakReduce is the reduction of n ranks' soakInputs.
func soakReduce(dt DataType, op RedOp, n, count, salt int) []byte {
	inputs := make([][]byte, n)
	for q := range inputs {
		inputs[q] = inputFor(dt, op, q, min(count, soakPeriod), salt)
	}
	return tile(expectReduce(inputs, dt, op), count*dt.Size())
}

func diffErr(got, want []byte, es int) error {
	if bytes.Equal(got, want) {
		return nil
	}
	return errors.New(diffBytes(got, want, es))
}

// TestSoakProcesses runs a soak on 4 processes, over shared memory (rings
// and the shared-memory collectives) and over TCP:
// GOCOLL_TEST_SOAK_OPS operations (default 2000; a quarter over TCP),
// seed GOCOLL_TEST_SOAK_SEED (default: drawn, and logged to rerun it).
func TestSoakProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	cfg := soakConfigFromEnv()
	if cfg.seed == 0 {
		cfg.seed = rand.Uint64N(1 << 32)
	}
	for _, tc := range []struct {
		transport string
		ops       int
	}{{"auto", cfg.ops}, {"tcp", max(cfg.ops/4, 1)}} {
		t.Run(tc.transport, func(t *testing.T) {
			t.Logf("GOCOLL_TEST_SOAK_SEED=%d GOCOLL_TEST_SOAK_OPS=%d", cfg.seed, tc.ops)
			env := []string{"GOCOLL_TRANSPORT=" + tc.transport, "GOCOLL_TIMEOUT=120s",
				fmt.Sprintf("GOCOLL_TEST_SOAK_SEED=%d", cfg.seed), fmt.Sprintf("GOCOLL_TEST_SOAK_OPS=%d", tc.ops)}
			kids := startRanks(t, "soak", 4, env, nil)
			waitRanks(t, kids, 10*time.Minute)
			for r, k := range kids {
				if k.Err != nil {
					t.Errorf("rank %d: %v\n%s", r, k.Err, lastLines(k.Out.String(), 20))
				}
			}
			if line, ok := lineWith(kids[0].Out.String(), "SOAK "); ok {
				t.Log(line)
			}
		})
	}
}

func lineWith(s, prefix string) (string, bool) {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}
