package engine

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/gocoll/gocoll/engine/kernel"
)

// suite says which part of the matrix a conformance run covers.
type suite struct {
	dtypes []DataType
	ops    []RedOp
	counts []int
	colls  map[string]bool // nil: all
}

func (s suite) has(coll string) bool { return s.colls == nil || s.colls[coll] }

// conformance runs every collective on c with inputs every rank can compute
// for every other rank, and checks the results against the reference. It is
// the same code in-process and in child processes.
func conformance(c *Comm, s suite) error {
	n, r := c.Size(), c.Rank()
	for _, dt := range s.dtypes {
		es := dt.Size()
		for _, count := range s.counts {
			for _, op := range s.ops {
				if kernel.CheckOp(dt, op) != nil {
					if err := refused(c, s, dt, op, count); err != nil {
						return err
					}
					continue
				}
				inputs := make([][]byte, n)
				for q := range inputs {
					inputs[q] = inputFor(dt, op, q, count, 0)
				}
				want := expectReduce(inputs, dt, op)
				where := func(coll string) string { return fmt.Sprintf("%s %s/%s count=%d", coll, dt, op, count) }
				if s.has("allreduce") {
					// (Garbage in recv, which an out-of-place call must not read.)
					got := bytes.Repeat([]byte{0xa5}, count*es)
					if err := c.AllReduce(inputs[r], got, count, dt, op); err != nil {
						return fmt.Errorf("%s: %w", where("allreduce"), err)
					}
					if d := diffBytes(got, want, es); d != "" {
						return fmt.Errorf("%s: %s", where("allreduce"), d)
					}
					if !bytes.Equal(inputs[r], inputFor(dt, op, r, count, 0)) {
						return fmt.Errorf("%s: the send buffer changed", where("allreduce"))
					}
					inplace := append([]byte(nil), inputs[r]...)
					if err := c.AllReduce(inplace, inplace, count, dt, op); err != nil {
						return fmt.Errorf("%s in place: %w", where("allreduce"), err)
					}
					if d := diffBytes(inplace, want, es); d != "" {
						return fmt.Errorf("%s in place: %s", where("allreduce"), d)
					}
				}
				if s.has("reduce") {
					for _, root := range []int{0, n - 1, n / 2} {
						got := make([]byte, count*es)
						if err := c.Reduce(inputs[r], got, count, dt, op, root); err != nil {
							return fmt.Errorf("%s root=%d: %w", where("reduce"), root, err)
						}
						if r == root {
							if d := diffBytes(got, want, es); d != "" {
								return fmt.Errorf("%s root=%d: %s", where("reduce"), root, d)
							}
						} else if !bytes.Equal(got, make([]byte, len(got))) {
							return fmt.Errorf("%s root=%d: non-root receive buffer was written", where("reduce"), root)
						}
					}
				}
				if s.has("reducescatter") {
					block := count * es
					full := make([][]byte, n)
					for q := range full {
						full[q] = inputFor(dt, op, q, count*n, 1)
					}
					wantAll := expectReduce(full, dt, op)
					got := bytes.Repeat([]byte{0xa5}, block)
					if err := c.ReduceScatter(full[r], got, count, dt, op); err != nil {
						return fmt.Errorf("%s: %w", where("reducescatter"), err)
					}
					if d := diffBytes(got, wantAll[r*block:(r+1)*block], es); d != "" {
						return fmt.Errorf("%s: %s", where("reducescatter"), d)
					}
					inplace := append([]byte(nil), full[r]...)
					if err := c.ReduceScatter(inplace, inplace[r*block:], count, dt, op); err != nil {
						return fmt.Errorf("%s in place: %w", where("reducescatter"), err)
					}
					if d := diffBytes(inplace[r*block:(r+1)*block], wantAll[r*block:(r+1)*block], es); d != "" {
						return fmt.Errorf("%s in place: %s", where("reducescatter"), d)
					}
				}
			}
			if err := dataMovement(c, s, dt, count); err != nil {
				return err
			}
		}
	}
	if s.has("barrier") {
		for i := 0; i < 3; i++ {
			if err := c.Barrier(); err != nil {
				return fmt.Errorf("barrier: %w", err)
			}
		}
	}
	return nil
}

// dataMovement checks the collectives that copy without reducing.
func dataMovement(c *Comm, s suite, dt DataType, count int) error {
	n, r := c.Size(), c.Rank()
	es := dt.Size()
	block := count * es
	src := func(q, salt int) []byte { return inputFor(dt, Sum, q, count*n, salt) }
	where := func(coll string) string { return fmt.Sprintf("%s %s count=%d", coll, dt, count) }
	if s.has("broadcast") {
		for _, root := range []int{0, n - 1} {
			got := make([]byte, block)
			var send []byte
			if r == root {
				send = src(root, 2)[:block]
			}
			if err := c.Broadcast(send, got, count, dt, root); err != nil {
				return fmt.Errorf("%s root=%d: %w", where("broadcast"), root, err)
			}
			if d := diffBytes(got, src(root, 2)[:block], es); d != "" {
				return fmt.Errorf("%s root=%d: %s", where("broadcast"), root, d)
			}
		}
	}
	if s.has("allgather") {
		want := make([]byte, 0, block*n)
		for q := 0; q < n; q++ {
			want = append(want, src(q, 3)[:block]...)
		}
		got := make([]byte, block*n)
		if err := c.AllGather(src(r, 3)[:block], got, count, dt); err != nil {
			return fmt.Errorf("%s: %w", where("allgather"), err)
		}
		if d := diffBytes(got, want, es); d != "" {
			return fmt.Errorf("%s: %s", where("allgather"), d)
		}
		inplace := make([]byte, block*n)
		copy(inplace[r*block:], src(r, 3)[:block])
		if err := c.AllGather(inplace[r*block:], inplace, count, dt); err != nil {
			return fmt.Errorf("%s in place: %w", where("allgather"), err)
		}
		if d := diffBytes(inplace, want, es); d != "" {
			return fmt.Errorf("%s in place: %s", where("allgather"), d)
		}
	}
	if s.has("alltoall") {
		want := make([]byte, 0, block*n)
		for q := 0; q < n; q++ {
			want = append(want, src(q, 4)[r*block:(r+1)*block]...)
		}
		got := make([]byte, block*n)
		if err := c.AllToAll(src(r, 4), got, count, dt); err != nil {
			return fmt.Errorf("%s: %w", where("alltoall"), err)
		}
		if d := diffBytes(got, want, es); d != "" {
			return fmt.Errorf("%s: %s", where("alltoall"), d)
		}
		inplace := src(r, 4)
		if err := c.AllToAll(inplace, inplace, count, dt); err != nil {
			return fmt.Errorf("%s in place: %w", where("alltoall"), err)
		}
		if d := diffBytes(inplace, want, es); d != "" {
			return fmt.Errorf("%s in place: %s", where("alltoall"), d)
		}
	}
	if s.has("alltoallv") {
		// Rank i sends (i+j+count)%3 elements to rank j, laid out in reverse
		// peer order with a gap of one element, to exercise displacements.
		cnt := func(i, j int) int { return (i + j + count) % 3 }
		sc, sd := make([]int, n), make([]int, n)
		rc, rd := make([]int, n), make([]int, n)
		off := 0
		for j := n - 1; j >= 0; j-- {
			sc[j], sd[j] = cnt(r, j), off
			off += sc[j] + 1
		}
		send := inputFor(dt, Sum, r, off, 5)
		roff := 0
		for j := 0; j < n; j++ {
			rc[j], rd[j] = cnt(j, r), roff
			roff += rc[j]
		}
		got := make([]byte, roff*es)
		if err := c.AllToAllv(send, sc, sd, got, rc, rd, dt); err != nil {
			return fmt.Errorf("%s: %w", where("alltoallv"), err)
		}
		for j := 0; j < n; j++ {
			// Recompute what rank j sent to us.
			joff := 0
			for k := n - 1; k > r; k-- {
				joff += cnt(j, k) + 1
			}
			jsend := inputFor(dt, Sum, j, joff+cnt(j, r)+1, 5)
			wantj := jsend[joff*es : (joff+cnt(j, r))*es]
			if d := diffBytes(got[rd[j]*es:(rd[j]+rc[j])*es], wantj, es); d != "" {
				return fmt.Errorf("%s from rank %d: %s", where("alltoallv"), j, d)
			}
		}
	}
	if s.has("alltoallw") {
		// Rank i sends rank j (i+2j+count)%4 elements as a vector of
		// single elements two apart (every other element of a run of the
		// input); rank j receives them contiguous, blocks in reverse order.
		cnt := func(i, j int) int { return (i + 2*j + count) % 4 }
		in := inputFor(dt, Sum, r, 8*n, 6)
		sd, st := make([]int, n), make([]BlockType, n)
		rd, rt := make([]int, n), make([]BlockType, n)
		roff := 0
		for j := n - 1; j >= 0; j-- {
			sd[j], st[j] = 8*j*es, BlockType{Type: dt, Count: cnt(r, j), BlockLen: 1, Stride: 2}
			rd[j], rt[j] = roff, Contiguous(dt, cnt(j, r))
			roff += cnt(j, r) * es
		}
		got := make([]byte, roff)
		if err := c.AllToAllw(in, sd, st, got, rd, rt); err != nil {
			return fmt.Errorf("%s: %w", where("alltoallw"), err)
		}
		for j := 0; j < n; j++ {
			jin := inputFor(dt, Sum, j, 8*n, 6)
			for e := 0; e < cnt(j, r); e++ {
				from := (8*r + 2*e) * es
				if d := diffBytes(got[rd[j]+e*es:rd[j]+(e+1)*es], jin[from:from+es], es); d != "" {
					return fmt.Errorf("%s element %d from rank %d: %s", where("alltoallw"), e, j, d)
				}
			}
		}
	}
	if s.has("sendrecv") && n > 1 {
		// A ring of sends issued before the matching receives: point-to-point
		// operations progress concurrently, so this must not deadlock.
		next, prev := (r+1)%n, (r+n-1)%n
		got := make([]byte, block)
		req, err := c.ISend(src(r, 6)[:block], count, dt, next)
		if err != nil {
			return fmt.Errorf("%s: %w", where("send"), err)
		}
		if err := c.Recv(got, count, dt, prev); err != nil {
			return fmt.Errorf("%s: %w", where("recv"), err)
		}
		if err := req.Wait(); err != nil {
			return fmt.Errorf("%s: %w", where("send"), err)
		}
		if d := diffBytes(got, src(prev, 6)[:block], es); d != "" {
			return fmt.Errorf("%s: %s", where("sendrecv"), d)
		}
	}
	return nil
}

// refused checks that every reducing collective refuses an op that is not
// defined on dt with ErrInvalidArgument, on every rank alike (nothing is
// sent, so the ranks stay in step).
func refused(c *Comm, s suite, dt DataType, op RedOp, count int) error {
	n := c.Size()
	buf := make([]byte, count*n*dt.Size())
	for _, call := range []struct {
		coll string
		run  func() error
	}{
		{"allreduce", func() error { return c.AllReduce(buf[:count*dt.Size()], buf[:count*dt.Size()], count, dt, op) }},
		{"reduce", func() error { return c.Reduce(buf[:count*dt.Size()], buf[:count*dt.Size()], count, dt, op, n-1) }},
		{"reducescatter", func() error { return c.ReduceScatter(buf, make([]byte, count*dt.Size()), count, dt, op) }},
	} {
		if !s.has(call.coll) {
			continue
		}
		if err := call.run(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), op.String()) {
			return fmt.Errorf("%s %s/%s count=%d: got %v, want ErrInvalidArgument naming the op", call.coll, dt, op, count, err)
		}
	}
	return nil
}
