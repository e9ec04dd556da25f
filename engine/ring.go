package engine

import "github.com/gocoll/gocoll/engine/kernel"

// Ring collectives (document 004): ranks form the ring r → r+1. A
// reduce-scatter takes N-1 steps in which every rank passes one block to its
// successor and folds the block it receives into its own copy; an allgather
// takes N-1 more steps that pass the finished blocks on unchanged. Each block
// is reduced in the same order on every run, so results are reproducible, and
// the allgather copies bytes, so every rank ends bitwise identical.

// chunkLayout splits count elements into n blocks whose sizes differ by at
// most one element.
func chunkLayout(count, n, es int) []block {
	l := make([]block, n)
	for i := range l {
		lo, hi := i*count/n, (i+1)*count/n
		l[i] = block{lo * es, (hi - lo) * es}
	}
	return l
}

func mod(a, n int) int { return ((a % n) + n) % n }

// reduceScatterRing reduces buf's blocks around the ring. With shift = 0 rank
// r ends owning block r+1 (what allreduce wants: the allgather then starts
// from it); with shift = -1 rank r owns block r.
func reduceScatterRing(x *execCtx, buf []byte, blocks []block, dt DataType, op RedOp, shift int) error {
	n, r := x.size(), x.rank()
	next, prev := mod(r+1, n), mod(r-1, n)
	maxBlock := 0
	for _, b := range blocks {
		maxBlock = max(maxBlock, b.n)
	}
	tmp := x.scratchBuf(0, maxBlock)
	for s := 0; s < n-1; s++ {
		sb := blocks[mod(r-s+shift, n)]
		rb := blocks[mod(r-s-1+shift, n)]
		in := tmp[:rb.n]
		if err := x.sendRecv(next, s, buf[sb.off:sb.off+sb.n], prev, s, in); err != nil {
			return err
		}
		kernel.Reduce(buf[rb.off:rb.off+rb.n], in, dt, op)
	}
	return nil
}

// allgatherRing circulates blocks: rank r starts from block r+shift+1… it
// owns block mod(r+1+shift) after a reduce-scatter with that shift.
func allgatherRingFrom(x *execCtx, buf []byte, blocks []block, shift int, step0 int) error {
	n, r := x.size(), x.rank()
	next, prev := mod(r+1, n), mod(r-1, n)
	for s := 0; s < n-1; s++ {
		sb := blocks[mod(r+1+shift-s, n)]
		rb := blocks[mod(r+shift-s, n)]
		if err := x.sendRecv(next, step0+s, buf[sb.off:sb.off+sb.n], prev, step0+s, buf[rb.off:rb.off+rb.n]); err != nil {
			return err
		}
	}
	return nil
}

// allgatherRing: rank r starts owning block r.
func allgatherRing(x *execCtx, buf []byte, blocks []block) error {
	return allgatherRingFrom(x, buf, blocks, -1, 0)
}

func allreduceRing(x *execCtx, buf []byte, count int, dt DataType, op RedOp) error {
	n := x.size()
	blocks := chunkLayout(count, n, dt.Size())
	if err := reduceScatterRing(x, buf, blocks, dt, op, 0); err != nil {
		return err
	}
	if op == Avg {
		own := blocks[mod(x.rank()+1, n)]
		kernel.DivideBy(buf[own.off:own.off+own.n], dt, n)
	}
	return allgatherRingFrom(x, buf, blocks, 0, n)
}
