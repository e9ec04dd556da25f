package main

import (
	"fmt"

	"github.com/gocoll/gocoll/engine"
)

// allOps lists the collectives gocoll-bench measures, in the order "all" runs them.
var allOps = []string{"allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "alltoallv", "sendrecv"}

// opInfo: whether the op takes a reduction operator and a root, and its
// bus-bandwidth factor (nccl-tests, PERFORMANCE.md).
func usesRedop(op string) bool {
	return op == "allreduce" || op == "reduce" || op == "reducescatter"
}

func usesRoot(op string) bool { return op == "reduce" || op == "broadcast" }

func busFactor(op string, n int) float64 {
	nf := float64(n)
	switch op {
	case "allreduce":
		return 2 * (nf - 1) / nf
	case "allgather", "reducescatter", "alltoall", "alltoallv":
		return (nf - 1) / nf
	}
	return 1 // reduce, broadcast, sendrecv
}

// opCase is one (op, size) of a run, bound to a rank's communicator and buffers.
type opCase struct {
	op     string
	bytes  int64 // nccl-tests size
	count  int   // elements in that size (nccl-tests' count column)
	run    func() error
	check  func(k *checker) (int64, error) // fill, run once, verify: wrong elements on this rank
	factor float64
}

// newCase builds the case for op at the nominal size; ok is false when the
// size holds no element for this rank count.
func newCase(c *engine.Comm, cfg *config, op string, nominal int64, send, recv []byte) (cs *opCase, ok bool, err error) {
	n, rank := c.Size(), c.Rank()
	dt, redop, root := cfg.dt, cfg.redop, cfg.root
	es := dt.Size()
	elems := int(nominal / int64(es))
	cs = &opCase{op: op, factor: busFactor(op, n)}
	salt := uint64(len(op))<<32 ^ uint64(nominal)
	reducePat := func() *pattern { return newPattern(dt, redop, true, n, salt) }
	movePat := func() *pattern { return newPattern(dt, redop, false, n, salt) }
	// checked makes a check: fill this rank's fillN input elements of s from
	// the pattern, poison r, run once, then count r's wrong elements.
	checked := func(mk func() *pattern, s, r []byte, fillN int, verify func(k *checker, p *pattern) int64) func(*checker) (int64, error) {
		return func(k *checker) (int64, error) {
			p := mk()
			p.fill(s, rank, 0, fillN)
			for i := range r {
				r[i] = 0xff
			}
			if err := cs.run(); err != nil {
				return 0, err
			}
			return verify(k, p), nil
		}
	}
	switch op {
	case "allreduce", "reduce":
		cnt := elems
		if cnt == 0 {
			return nil, false, nil
		}
		s, r := send[:cnt*es], recv[:cnt*es]
		cs.bytes, cs.count = int64(cnt*es), cnt
		if op == "allreduce" {
			cs.run = func() error { return c.AllReduce(s, r, cnt, dt, redop) }
		} else {
			cs.run = func() error { return c.Reduce(s, r, cnt, dt, redop, root) }
		}
		cs.check = checked(reducePat, s, r, cnt, func(k *checker, p *pattern) int64 {
			if op == "reduce" && rank != root {
				return 0
			}
			return k.verify(r, cnt, func(i int, dst []byte) { p.putReduced(dst, i) })
		})
	case "broadcast", "sendrecv":
		cnt := elems
		if cnt == 0 {
			return nil, false, nil
		}
		if op == "sendrecv" && n < 2 {
			return nil, false, fmt.Errorf("sendrecv needs at least 2 ranks")
		}
		s, r := send[:cnt*es], recv[:cnt*es]
		cs.bytes, cs.count = int64(cnt*es), cnt
		src := root // whose data lands in r
		if op == "broadcast" {
			cs.run = func() error { return c.Broadcast(s, r, cnt, dt, root) }
		} else {
			next, prev := (rank+1)%n, (rank+n-1)%n
			src = prev
			cs.run = func() error {
				rq, err := c.IRecv(r, cnt, dt, prev)
				if err != nil {
					return err
				}
				sq, err := c.ISend(s, cnt, dt, next)
				if err != nil {
					rq.Wait()
					return err
				}
				return firstErr(sq.Wait(), rq.Wait())
			}
		}
		cs.check = checked(movePat, s, r, cnt, func(k *checker, p *pattern) int64 {
			return k.verify(r, cnt, func(i int, dst []byte) { p.put(dst, src, i) })
		})
	case "allgather", "reducescatter", "alltoall":
		cnt := elems / n // per-rank block
		if cnt == 0 {
			return nil, false, nil
		}
		total := cnt * n
		cs.bytes, cs.count = int64(total*es), total
		switch op {
		case "allgather":
			s, r := send[:cnt*es], recv[:total*es]
			cs.run = func() error { return c.AllGather(s, r, cnt, dt) }
			cs.check = checked(movePat, s, r, cnt, func(k *checker, p *pattern) int64 {
				return k.verify(r, total, func(i int, dst []byte) { p.put(dst, i/cnt, i%cnt) })
			})
		case "reducescatter":
			s, r := send[:total*es], recv[:cnt*es]
			cs.run = func() error { return c.ReduceScatter(s, r, cnt, dt, redop) }
			cs.check = checked(reducePat, s, r, total, func(k *checker, p *pattern) int64 {
				return k.verify(r, cnt, func(i int, dst []byte) { p.putReduced(dst, rank*cnt+i) })
			})
		case "alltoall":
			s, r := send[:total*es], recv[:total*es]
			cs.run = func() error { return c.AllToAll(s, r, cnt, dt) }
			cs.check = checked(movePat, s, r, total, func(k *checker, p *pattern) int64 {
				// block j of rank i goes to block i of rank j
				return k.verify(r, total, func(i int, dst []byte) { p.put(dst, i/cnt, rank*cnt+i%cnt) })
			})
		}
	case "alltoallv":
		// Uneven blocks: rank i sends u*k elements to rank j, k = (j-i mod n)+1,
		// so every rank sends and receives u*n(n+1)/2 elements in total.
		u := 2 * elems / (n * (n + 1))
		if u == 0 {
			return nil, false, nil
		}
		total := u * n * (n + 1) / 2
		cs.bytes, cs.count = int64(total*es), total
		sendCount := func(i, j int) int { return u * ((j-i+n)%n + 1) }
		sdispl := make([][]int, n) // sdispl[i][j]: where rank i's block for j starts
		for i := range sdispl {
			sdispl[i] = make([]int, n)
			off := 0
			for j := 0; j < n; j++ {
				sdispl[i][j] = off
				off += sendCount(i, j)
			}
		}
		scounts, rcounts, rdispls := make([]int, n), make([]int, n), make([]int, n)
		off := 0
		for j := 0; j < n; j++ {
			scounts[j] = sendCount(rank, j)
			rcounts[j] = sendCount(j, rank)
			rdispls[j] = off
			off += rcounts[j]
		}
		s, r := send[:total*es], recv[:total*es]
		cs.run = func() error { return c.AllToAllv(s, scounts, sdispl[rank], r, rcounts, rdispls, dt) }
		cs.check = checked(movePat, s, r, total, func(k *checker, p *pattern) int64 {
			var wrong int64
			for j := 0; j < n; j++ {
				blk := r[rdispls[j]*es : (rdispls[j]+rcounts[j])*es]
				first := sdispl[j][rank]
				wrong += k.verify(blk, rcounts[j], func(i int, dst []byte) { p.put(dst, j, first+i) })
			}
			return wrong
		})
	default:
		return nil, false, fmt.Errorf("unknown op %q (want one of %v)", op, allOps)
	}
	return cs, true, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
