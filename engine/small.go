package engine

import "github.com/gocoll/gocoll/engine/kernel"

// Latency-bound algorithms: few steps, whole buffers per message.

// combine sets mine = lower op higher, where lower is the buffer of the
// lower-numbered side, so both partners of an exchange compute the same
// expression and end with the same bytes.
func combine(mine, theirs []byte, theirsLower bool, dt DataType, op RedOp) {
	if theirsLower {
		kernel.Reduce3(mine, theirs, mine, dt, op)
	} else {
		kernel.Reduce(mine, theirs, dt, op)
	}
}

// foldLayout maps ranks onto the largest power of two p ≤ n (MPICH's
// scheme): among the first 2·(n-p) ranks, each even rank hands its data to the
// odd rank above it and sits out; the rest renumber densely.
type foldLayout struct{ n, p, rem int }

func newFold(n int) foldLayout {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	return foldLayout{n, p, n - p}
}

// vrank is r's number among the p active ranks, or -1 if r sits out.
func (f foldLayout) vrank(r int) int {
	if r < 2*f.rem {
		if r%2 == 0 {
			return -1
		}
		return r / 2
	}
	return r - f.rem
}

// real is the rank behind active number v.
func (f foldLayout) real(v int) int {
	if v < f.rem {
		return 2*v + 1
	}
	return v + f.rem
}

// allreduceRD is recursive doubling: log2(p) exchanges of the whole buffer,
// for messages where latency, not bandwidth, decides.
func allreduceRD(x *execCtx, buf []byte, count int, dt DataType, op RedOp) error {
	n, r := x.size(), x.rank()
	f := newFold(n)
	tmp := x.scratchBuf(0, len(buf))
	v := f.vrank(r)
	step := 0
	if r < 2*f.rem {
		if v < 0 {
			if err := x.send(r+1, step, buf); err != nil {
				return err
			}
		} else {
			if err := x.recv(r-1, step, tmp); err != nil {
				return err
			}
			combine(buf, tmp, true, dt, op)
		}
	}
	step++
	if v >= 0 {
		for mask := 1; mask < f.p; mask <<= 1 {
			peer := f.real(v ^ mask)
			if err := x.sendRecv(peer, step, buf, peer, step, tmp); err != nil {
				return err
			}
			combine(buf, tmp, peer < r, dt, op)
			step++
		}
	} else {
		step += bitsLen(f.p)
	}
	if op == Avg {
		if v >= 0 {
			kernel.DivideBy(buf, dt, n)
		}
	}
	if r < 2*f.rem {
		if v < 0 {
			return x.recv(r+1, step, buf)
		}
		return x.send(r-1, step, buf)
	}
	return nil
}

func bitsLen(p int) int {
	k := 0
	for 1<<k < p {
		k++
	}
	return k
}

// reduceTree is a binomial tree toward root: in round k, ranks whose relative
// number has bit k set send their partial result to the rank 2^k below and
// stop. acc holds this rank's partial result.
func reduceTree(x *execCtx, acc []byte, count int, dt DataType, op RedOp, root int) error {
	n, r := x.size(), x.rank()
	v := mod(r-root, n)
	var tmp []byte
	for mask, k := 1, 0; mask < n; mask, k = mask<<1, k+1 {
		if v&mask != 0 {
			return x.send(mod(v-mask+root, n), k, acc)
		}
		if v+mask < n {
			if tmp == nil {
				tmp = x.scratchBuf(0, len(acc))
			}
			if err := x.recv(mod(v+mask+root, n), k, tmp); err != nil {
				return err
			}
			// acc is the lower relative rank's partial: keep the order fixed.
			kernel.Reduce(acc, tmp, dt, op)
		}
	}
	if op == Avg {
		kernel.DivideBy(acc, dt, n)
	}
	return nil
}

// broadcastTree is a binomial tree from root: each rank receives once from
// its parent (relative number with the lowest set bit cleared) and forwards
// to its children, farthest first.
func broadcastTree(x *execCtx, buf []byte, root int) error {
	n, r := x.size(), x.rank()
	v := mod(r-root, n)
	mask := 1
	for mask < n {
		if v&mask != 0 {
			if err := x.recv(mod(v-mask+root, n), 0, buf); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if v+mask < n {
			if err := x.send(mod(v+mask+root, n), 0, buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// broadcastPipeline passes segments down the chain root → root+1 → …, so
// every link carries the message once and all links are busy at the same time.
func broadcastPipeline(x *execCtx, buf []byte, root int) error {
	n, r := x.size(), x.rank()
	v := mod(r-root, n)
	prev, next := mod(r-1, n), mod(r+1, n)
	const seg = 256 << 10
	var inflight pending
	for off, k := 0, 0; off < len(buf); off, k = off+seg, k+1 {
		part := buf[off:min(off+seg, len(buf))]
		if v != 0 {
			if err := x.recv(prev, k, part); err != nil {
				if inflight != nil {
					inflight.wait() // leave no send running past the operation
				}
				return err
			}
		}
		if v != n-1 {
			if inflight != nil {
				if err := inflight.wait(); err != nil {
					return err
				}
			}
			inflight = x.goSend(next, k, part)
		}
	}
	if inflight != nil {
		return inflight.wait()
	}
	return nil
}

// barrierDissemination: in round k every rank signals rank+2^k and waits for
// rank-2^k; after ceil(log2 n) rounds everyone has heard from everyone.
func barrierDissemination(x *execCtx) error {
	n, r := x.size(), x.rank()
	for d, k := 1, 0; d < n; d, k = d*2, k+1 {
		if err := x.sendRecv(mod(r+d, n), k, nil, mod(r-d, n), k, nil); err != nil {
			return err
		}
	}
	return nil
}
