package sched

import "fmt"

// Pairwise exchange: in step s rank r sends its block for r+s while
// receiving the block from r-s, so every step pairs each sender with a
// distinct receiver (no two senders hit one rank at once). A Sync closes
// each step, as the algorithm intends: otherwise every send would be in
// flight at once. It serves large blocks and, with per-peer layouts,
// all-to-allv.

func pairwise(coll Coll, n, es int, sendBlk, recvBlk func(rank, peer int) Block) func(r int, yield func(Op) bool) {
	return func(r int, yield func(Op) bool) {
		e := &emitter{yield: yield}
		own, dst := sendBlk(r, r), recvBlk(r, r)
		e.copy(0, Range{Buf: In, Off: own.Off, Len: own.Len}, work(dst.Off, dst.Len))
		for s := 1; s < n; s++ {
			to, from := mod(r+s, n), mod(r-s, n)
			sb, rb := sendBlk(r, to), recvBlk(r, from)
			e.send(to, uint32(s), s-1, Range{Buf: In, Off: sb.Off, Len: sb.Len}, 1)
			e.recv(from, uint32(s), s-1, work(rb.Off, rb.Len))
			e.sync(s - 1)
		}
	}
}

// PairwiseAllToAll: block j (Count elements) of In goes to rank j, which
// stores it as block i of its Work.
func PairwiseAllToAll(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	bs := p.Count * p.ElemSize
	blk := func(_, peer int) Block { return Block{peer * bs, bs} }
	s := New(AllToAll, "pairwise", p.N, p.ElemSize, pairwise(AllToAll, p.N, p.ElemSize, blk, blk))
	s.WorkLen, s.InLen = p.N*bs, p.N*bs
	s.Rounds = max(p.N-1, 1)
	return s, nil
}

// PairwiseAllToAllv is PairwiseAllToAll with per-peer blocks: SendBlocks[j]
// of In goes to rank j, RecvBlocks[i] of Work receives rank i's. The
// layouts are the building rank's (Params.Mine): the program of any other
// rank is not meaningful (see PerRank to assemble a whole job's schedule).
func PairwiseAllToAllv(p Params) (*Schedule, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if len(p.SendBlocks) != p.N || len(p.RecvBlocks) != p.N {
		return nil, fmt.Errorf("sched: alltoallv needs %d send and receive blocks, got %d and %d", p.N, len(p.SendBlocks), len(p.RecvBlocks))
	}
	s := New(AllToAllv, "pairwise", p.N, p.ElemSize, pairwise(AllToAllv, p.N, p.ElemSize,
		func(_, peer int) Block { return p.SendBlocks[peer] },
		func(_, peer int) Block { return p.RecvBlocks[peer] }))
	for _, b := range p.SendBlocks {
		s.InLen = max(s.InLen, b.Off+b.Len)
	}
	for _, b := range p.RecvBlocks {
		s.WorkLen = max(s.WorkLen, b.Off+b.Len)
	}
	s.Rounds = max(p.N-1, 1)
	return s, nil
}

// PerRank assembles one schedule from schedules built rank by rank (the
// v-collectives, whose layouts differ per rank): rank r's program is
// parts[r]'s program of r, and every buffer is as large as the largest
// part's. For validating and simulating a whole job.
func PerRank(parts []*Schedule) *Schedule {
	s := New(parts[0].Coll, parts[0].Algo, len(parts), parts[0].ElemSize, func(r int, yield func(Op) bool) {
		parts[r].prog(r, yield)
	})
	for _, q := range parts {
		s.WorkLen, s.InLen, s.TmpLen = max(s.WorkLen, q.WorkLen), max(s.InLen, q.InLen), max(s.TmpLen, q.TmpLen)
		s.Rounds = max(s.Rounds, q.Rounds)
	}
	return s
}
