package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

const hdAlgo = "allreduce=hd,reduce=hd,reducescatter=hd"

func hdComms(t testing.TB, n, q int) []*Comm {
	t.Helper()
	comms, err := NewLocalComms(n, Options{Algo: hdAlgo, Segments: q, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Abort()
			_ = c.Destroy()
		}
	})
	return comms
}

// hdRun runs fn on every rank, each on its own goroutine, and fails the test
// with the first error.
func hdRun(t testing.TB, what string, comms []*Comm, fn func(c *Comm) error) {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
}

// hdInput gives values whose reduction is exact in every tested type and in
// any association: |sum| ≤ 9·8 < 256 (exact even in bfloat16), products of
// ±1 and ±2 are powers of two, no zeros under prod, no negative zeros.
func hdInput(dt DataType, op RedOp, rank, count, salt int) []byte {
	b := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		h := rank*7 + i*13 + salt*5 + (i*i)%11
		v := int64(h%17) - 8
		if op == Prod {
			v = [...]int64{1, 2, -1, 1, -2, 1, 1}[h%7]
		}
		setElem(b, dt, i, v)
	}
	return b
}

// TestHDMatrix checks allreduce, reduce and reduce-scatter with the
// halving–doubling algorithms against the reference, for 1..9 ranks, awkward
// counts, five types, every op and q in {1, 3, 8}; reduce runs with every
// root for q = 3 and with one root (varying) for the other q.
func TestHDMatrix(t *testing.T) {
	dts := []DataType{Float32, Float64, Int32, Float16, Bfloat16}
	ops := kernel.AllRedOps()
	if raceEnabled {
		// The types and ops change the kernel only (avg adds the
		// division): the race detector needs each schedule and rank
		// count, the plain run checks the values.
		dts = []DataType{Float32, Float16}
		ops = []RedOp{Sum, Avg}
	}
	qs := []int{1, 3, 8}
	for n := 1; n <= 9; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := make([][]*Comm, len(qs))
			for i, q := range qs {
				comms[i] = hdComms(t, n, q)
			}
			counts := []int{0, 1, 2, 7, n - 1, 1000, 4097}
			for ci, count := range counts {
				if ci > 0 && count == counts[ci-1] || n == 1 && count == 0 && ci > 0 {
					continue
				}
				for _, dt := range dts {
					for _, op := range ops {
						if kernel.CheckOp(dt, op) != nil {
							continue // refusals: conformance_test.go
						}
						hdCheckOne(t, comms, qs, n, count, dt, op)
					}
				}
			}
		})
	}
}

func hdCheckOne(t *testing.T, comms [][]*Comm, qs []int, n, count int, dt DataType, op RedOp) {
	t.Helper()
	es := dt.Size()
	salt := count + int(dt)*3 + int(op)*7
	inputs := make([][]byte, n)
	for r := range inputs {
		inputs[r] = hdInput(dt, op, r, count, salt)
	}
	want := expectReduce(inputs, dt, op)

	// Reduce-scatter: recvcount = count, so n*count elements per rank.
	rsIn := make([][]byte, n)
	for r := range rsIn {
		rsIn[r] = hdInput(dt, op, r, n*count, salt+1)
	}
	rsWant := expectReduce(rsIn, dt, op)

	for qi, q := range qs {
		cs := comms[qi]
		what := fmt.Sprintf("n=%d count=%d %v %v q=%d", n, count, dt, op, q)
		outs := make([][]byte, n)
		red := make([][][]byte, n) // red[root][rank]
		rs := make([][]byte, n)
		hdRun(t, what, cs, func(c *Comm) error {
			r := c.Rank()
			// allreduce: in place on odd ranks, out of place on even.
			out := make([]byte, count*es)
			send := inputs[r]
			if r%2 == 1 {
				copy(out, send)
				send = out
			}
			if err := c.AllReduce(send, out, count, dt, op); err != nil {
				return fmt.Errorf("allreduce: %w", err)
			}
			outs[r] = out
			for root := 0; root < n; root++ {
				if q != 3 && root != salt%n {
					continue // every root with q = 3, one with the others
				}
				res := make([]byte, count*es)
				if err := c.Reduce(inputs[r], res, count, dt, op, root); err != nil {
					return fmt.Errorf("reduce root %d: %w", root, err)
				}
				if r == root {
					red[root] = [][]byte{res}
				} else if !bytes.Equal(res, make([]byte, count*es)) {
					return fmt.Errorf("reduce root %d touched recv on rank %d", root, r)
				}
			}
			blk := make([]byte, count*es)
			if err := c.ReduceScatter(rsIn[r], blk, count, dt, op); err != nil {
				return fmt.Errorf("reducescatter: %w", err)
			}
			rs[r] = blk
			return nil
		})
		for r := 0; r < n; r++ {
			if d := diffBytes(outs[r], want, es); d != "" {
				t.Fatalf("%s: allreduce rank %d: %s", what, r, d)
			}
			if red[r] != nil {
				if d := diffBytes(red[r][0], want, es); d != "" {
					t.Fatalf("%s: reduce root %d: %s", what, r, d)
				}
			}
			if d := diffBytes(rs[r], rsWant[r*count*es:(r+1)*count*es], es); d != "" {
				t.Fatalf("%s: reducescatter rank %d: %s", what, r, d)
			}
		}
	}
}

// TestHDDeterministic: with random float data (sums depend on association)
// every rank ends with the same bytes, and reruns, new communicators and other
// segment counts give the same bytes again.
func TestHDDeterministic(t *testing.T) {
	for _, n := range []int{3, 4, 6, 7} {
		for _, dt := range []DataType{Float32, Bfloat16} {
			rng := rand.New(rand.NewSource(int64(n)*10 + int64(dt)))
			const count = 5003
			es := dt.Size()
			inputs := make([][]byte, n)
			for r := range inputs {
				inputs[r] = make([]byte, n*count*es)
				for i := 0; i < n*count; i++ {
					f := float32(rng.NormFloat64() * 1e3)
					if dt == Float32 {
						binary.NativeEndian.PutUint32(inputs[r][4*i:], math.Float32bits(f))
					} else {
						binary.NativeEndian.PutUint16(inputs[r][2*i:], kernel.Float32ToBfloat16(f))
					}
				}
			}
			var firstAR, firstRed, firstRS []byte
			for run, q := range []int{1, 3, 8, 0, 3} {
				what := fmt.Sprintf("n=%d %v run %d q=%d", n, dt, run, q)
				comms := hdComms(t, n, q)
				ar := make([][]byte, n)
				rs := make([][]byte, n)
				var red []byte
				const root = 2
				hdRun(t, what, comms, func(c *Comm) error {
					r := c.Rank()
					ar[r] = make([]byte, count*es)
					if err := c.AllReduce(inputs[r][:count*es], ar[r], count, dt, Sum); err != nil {
						return err
					}
					res := make([]byte, count*es)
					if err := c.Reduce(inputs[r][:count*es], res, count, dt, Sum, root); err != nil {
						return err
					}
					if r == root {
						red = res
					}
					rs[r] = make([]byte, count*es)
					return c.ReduceScatter(inputs[r], rs[r], count, dt, Sum)
				})
				for r := 1; r < n; r++ {
					if !bytes.Equal(ar[r], ar[0]) {
						t.Fatalf("%s: allreduce rank %d differs from rank 0", what, r)
					}
				}
				all := bytes.Join(rs, nil)
				if firstAR == nil {
					firstAR, firstRed, firstRS = ar[0], red, all
					continue
				}
				if !bytes.Equal(ar[0], firstAR) {
					t.Fatalf("%s: allreduce differs from the first run", what)
				}
				if !bytes.Equal(red, firstRed) {
					t.Fatalf("%s: reduce differs from the first run", what)
				}
				if !bytes.Equal(all, firstRS) {
					t.Fatalf("%s: reducescatter differs from the first run", what)
				}
			}
		}
	}
}

// TestHDLarge: a message large enough for the automatic q to pick several
// segments per round, and a forced q above the cap of 64.
func TestHDLarge(t *testing.T) {
	for _, tc := range []struct{ n, q, count int }{{5, 0, 300000}, {8, 0, 200003}, {6, 100, 4097}} {
		n, count, dt := tc.n, tc.count, Float32
		what := fmt.Sprintf("n=%d q=%d count=%d", n, tc.q, count)
		comms, err := NewLocalComms(n, Options{Algo: hdAlgo, Segments: tc.q, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		inputs := make([][]byte, n)
		for r := range inputs {
			inputs[r] = hdInput(dt, Sum, r, count, 1)
		}
		want := expectReduce(inputs, dt, Sum)
		outs := make([][]byte, n)
		var red []byte
		hdRun(t, what, comms, func(c *Comm) error {
			r := c.Rank()
			outs[r] = make([]byte, count*4)
			if err := c.AllReduce(inputs[r], outs[r], count, dt, Sum); err != nil {
				return err
			}
			res := make([]byte, count*4)
			if err := c.Reduce(inputs[r], res, count, dt, Sum, n-1); err != nil {
				return err
			}
			if r == n-1 {
				red = res
			}
			return nil
		})
		for r := range outs {
			if d := diffBytes(outs[r], want, 4); d != "" {
				t.Fatalf("%s: allreduce rank %d: %s", what, r, d)
			}
		}
		if d := diffBytes(red, want, 4); d != "" {
			t.Fatalf("%s: reduce: %s", what, d)
		}
		for _, c := range comms {
			if err := c.Destroy(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestHDFailure: a send that fails in the middle of a pipelined round fails
// the collective on every rank instead of hanging.
func TestHDFailure(t *testing.T) {
	for _, n := range []int{4, 6} {
		w := mem.NewWorld(n)
		boom := errors.New("link cut")
		w.Hook = func(from, to int, h transport.Header) error {
			if from == 1 && h.Step == 1<<12+1 { // the second segment of the first halving round
				return boom
			}
			return nil
		}
		comms, err := newLocalWorld(w, nil, Options{Algo: hdAlgo, Segments: 3, Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := hdInput(Float32, Sum, i, 100, 0)
				errs[i] = c.AllReduce(buf, buf, 100, Float32, Sum)
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err == nil {
				t.Errorf("n=%d: rank %d: allreduce succeeded over a cut link", n, r)
			}
		}
		if !errors.Is(errs[1], boom) {
			t.Errorf("n=%d: rank 1: %v, want the hook's error", n, errs[1])
		}
		for _, c := range comms {
			_ = c.Destroy()
		}
	}
}
