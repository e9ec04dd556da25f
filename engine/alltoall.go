package engine

// alltoallPairwise is the direct exchange: in step s rank r sends its block
// for r+s while receiving the block from r-s, so every step pairs each
// sender with a distinct receiver (no two senders hit one rank at once).
// It serves large blocks and, with per-peer layouts, alltoallv.
func alltoallPairwise(x *execCtx, send, recv []byte, sl, rl []block) error {
	n, r := x.size(), x.rank()
	copy(recv[rl[r].off:rl[r].off+rl[r].n], send[sl[r].off:sl[r].off+sl[r].n])
	for s := 1; s < n; s++ {
		to, from := mod(r+s, n), mod(r-s, n)
		sb, rb := sl[to], rl[from]
		if err := x.sendRecv(to, s, send[sb.off:sb.off+sb.n], from, s, recv[rb.off:rb.off+rb.n]); err != nil {
			return err
		}
	}
	return nil
}

// alltoallBruck aggregates small blocks (document 001's baseline): after a
// local rotation, block i is bound for rank r+i; in the round for digit
// position w = radix^p and digit d, every block whose p-th base-radix digit
// of i is d travels d·w ranks forward in one message. That is
// (radix-1)·ceil(log_radix n) messages per rank instead of n-1.
func alltoallBruck(x *execCtx, send, recv []byte, bs, radix int) error {
	n, r := x.size(), x.rank()
	tmp := x.scratchBuf(2, n*bs)
	for i := 0; i < n; i++ {
		src := mod(r+i, n) * bs
		copy(tmp[i*bs:(i+1)*bs], send[src:src+bs])
	}
	pack := x.scratchBuf(3, 2*n*bs)
	out, in := pack[:n*bs], pack[n*bs:]
	step := 0
	for w := 1; w < n; w *= radix {
		for d := 1; d < radix && d*w < n; d++ {
			k := 0
			for i := 0; i < n; i++ {
				if (i/w)%radix == d {
					copy(out[k*bs:], tmp[i*bs:(i+1)*bs])
					k++
				}
			}
			to, from := mod(r+d*w, n), mod(r-d*w, n)
			if err := x.sendRecv(to, step, out[:k*bs], from, step, in[:k*bs]); err != nil {
				return err
			}
			k = 0
			for i := 0; i < n; i++ {
				if (i/w)%radix == d {
					copy(tmp[i*bs:(i+1)*bs], in[k*bs:(k+1)*bs])
					k++
				}
			}
			step++
		}
	}
	// Block i now came from rank r-i.
	for i := 0; i < n; i++ {
		dst := mod(r-i, n) * bs
		copy(recv[dst:dst+bs], tmp[i*bs:(i+1)*bs])
	}
	return nil
}
