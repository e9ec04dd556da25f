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
	b := &caseBuilder{c: c, cfg: cfg, n: c.Size(), rank: c.Rank(), es: cfg.dt.Size(), send: send, recv: recv,
		salt: uint64(len(op))<<32 ^ uint64(nominal)}
	b.elems = int(nominal / int64(b.es))
	cs = &opCase{op: op, factor: busFactor(op, b.n)}
	switch op {
	case "allreduce", "reduce":
		ok = b.reduction(cs, op)
	case "broadcast":
		ok = b.broadcast(cs)
	case "sendrecv":
		ok, err = b.sendRecv(cs)
	case "allgather":
		ok = b.allGather(cs)
	case "reducescatter":
		ok = b.reduceScatter(cs)
	case "alltoall":
		ok = b.allToAll(cs)
	case "alltoallv":
		ok = b.allToAllv(cs)
	default:
		return nil, false, fmt.Errorf("unknown op %q (want one of %v)", op, allOps)
	}
	if !ok || err != nil {
		return nil, false, err
	}
	return cs, true, nil
}

// caseBuilder holds what every op's case is built from: the rank's
// communicator, the flags, the buffers and the nominal size in elements.
// Each method fills one op's case (its size, run and check) and reports
// false when the size holds no element for this rank count.
type caseBuilder struct {
	c          *engine.Comm
	cfg        *config
	n, rank    int
	es, elems  int // element size, elements in the nominal size
	send, recv []byte
	salt       uint64
}

// checked makes cs's check: fill this rank's fillN input elements of s
// from the pattern (of a reduction or of moved data), poison r, run once,
// then count r's wrong elements.
func (b *caseBuilder) checked(cs *opCase, reduce bool, s, r []byte, fillN int, verify func(k *checker, p *pattern) int64) {
	cs.check = func(k *checker) (int64, error) {
		p := newPattern(b.cfg.dt, b.cfg.redop, reduce, b.n, b.salt)
		p.fill(s, b.rank, 0, fillN)
		for i := range r {
			r[i] = 0xff
		}
		if err := cs.run(); err != nil {
			return 0, err
		}
		return verify(k, p), nil
	}
}

// expect is checked for a result read as one run of outN elements of r,
// element i as want writes it.
func (b *caseBuilder) expect(cs *opCase, reduce bool, s, r []byte, fillN, outN int, want func(p *pattern, i int, dst []byte)) {
	b.checked(cs, reduce, s, r, fillN, func(k *checker, p *pattern) int64 {
		return k.verify(r, outN, func(i int, dst []byte) { want(p, i, dst) })
	})
}

// whole sizes cs as the whole nominal size (allreduce, reduce, broadcast,
// sendrecv) and returns its send and receive buffers.
func (b *caseBuilder) whole(cs *opCase) (s, r []byte, cnt int) {
	cnt = b.elems
	cs.bytes, cs.count = int64(cnt*b.es), cnt
	return b.send[:cnt*b.es], b.recv[:cnt*b.es], cnt
}

// blocks sizes cs as n per-rank blocks of cnt elements (allgather,
// reducescatter, alltoall).
func (b *caseBuilder) blocks(cs *opCase) (cnt, total int) {
	cnt = b.elems / b.n
	total = cnt * b.n
	cs.bytes, cs.count = int64(total*b.es), total
	return cnt, total
}

// reduction: allreduce, or reduce, whose result only the root checks.
func (b *caseBuilder) reduction(cs *opCase, op string) bool {
	s, r, cnt := b.whole(cs)
	if cnt == 0 {
		return false
	}
	c, dt, redop, root := b.c, b.cfg.dt, b.cfg.redop, b.cfg.root
	out := cnt
	if op == "allreduce" {
		cs.run = func() error { return c.AllReduce(s, r, cnt, dt, redop) }
	} else {
		cs.run = func() error { return c.Reduce(s, r, cnt, dt, redop, root) }
		if b.rank != root {
			out = 0
		}
	}
	b.expect(cs, true, s, r, cnt, out, func(p *pattern, i int, dst []byte) { p.putReduced(dst, i) })
	return true
}

func (b *caseBuilder) broadcast(cs *opCase) bool {
	s, r, cnt := b.whole(cs)
	if cnt == 0 {
		return false
	}
	c, dt, root := b.c, b.cfg.dt, b.cfg.root
	cs.run = func() error { return c.Broadcast(s, r, cnt, dt, root) }
	b.expect(cs, false, s, r, cnt, cnt, func(p *pattern, i int, dst []byte) { p.put(dst, root, i) })
	return true
}

// sendRecv: every rank sends to the next and receives from the previous.
func (b *caseBuilder) sendRecv(cs *opCase) (bool, error) {
	s, r, cnt := b.whole(cs)
	if cnt == 0 {
		return false, nil
	}
	if b.n < 2 {
		return false, fmt.Errorf("sendrecv needs at least 2 ranks")
	}
	c, dt := b.c, b.cfg.dt
	next, prev := (b.rank+1)%b.n, (b.rank+b.n-1)%b.n
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
	b.expect(cs, false, s, r, cnt, cnt, func(p *pattern, i int, dst []byte) { p.put(dst, prev, i) })
	return true, nil
}

func (b *caseBuilder) allGather(cs *opCase) bool {
	cnt, total := b.blocks(cs)
	if cnt == 0 {
		return false
	}
	s, r, c, dt := b.send[:cnt*b.es], b.recv[:total*b.es], b.c, b.cfg.dt
	cs.run = func() error { return c.AllGather(s, r, cnt, dt) }
	b.expect(cs, false, s, r, cnt, total, func(p *pattern, i int, dst []byte) { p.put(dst, i/cnt, i%cnt) })
	return true
}

func (b *caseBuilder) reduceScatter(cs *opCase) bool {
	cnt, total := b.blocks(cs)
	if cnt == 0 {
		return false
	}
	s, r, c, dt, redop, rank := b.send[:total*b.es], b.recv[:cnt*b.es], b.c, b.cfg.dt, b.cfg.redop, b.rank
	cs.run = func() error { return c.ReduceScatter(s, r, cnt, dt, redop) }
	b.expect(cs, true, s, r, total, cnt, func(p *pattern, i int, dst []byte) { p.putReduced(dst, rank*cnt+i) })
	return true
}

func (b *caseBuilder) allToAll(cs *opCase) bool {
	cnt, total := b.blocks(cs)
	if cnt == 0 {
		return false
	}
	s, r, c, dt, rank := b.send[:total*b.es], b.recv[:total*b.es], b.c, b.cfg.dt, b.rank
	cs.run = func() error { return c.AllToAll(s, r, cnt, dt) }
	// block j of rank i goes to block i of rank j
	b.expect(cs, false, s, r, total, total, func(p *pattern, i int, dst []byte) { p.put(dst, i/cnt, rank*cnt+i%cnt) })
	return true
}

// allToAllv: uneven blocks. Rank i sends u*k elements to rank j, k = (j-i
// mod n)+1, so every rank sends and receives u*n(n+1)/2 elements in total.
func (b *caseBuilder) allToAllv(cs *opCase) bool {
	n, rank := b.n, b.rank
	u := 2 * b.elems / (n * (n + 1))
	if u == 0 {
		return false
	}
	total := u * n * (n + 1) / 2
	cs.bytes, cs.count = int64(total*b.es), total
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
	s, r := b.send[:total*b.es], b.recv[:total*b.es]
	c, dt, es := b.c, b.cfg.dt, b.es
	cs.run = func() error { return c.AllToAllv(s, scounts, sdispl[rank], r, rcounts, rdispls, dt) }
	b.checked(cs, false, s, r, total, func(k *checker, p *pattern) int64 {
		var wrong int64
		for j := 0; j < n; j++ {
			blk := r[rdispls[j]*es : (rdispls[j]+rcounts[j])*es]
			first := sdispl[j][rank]
			wrong += k.verify(blk, rcounts[j], func(i int, dst []byte) { p.put(dst, j, first+i) })
		}
		return wrong
	})
	return true
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
