//go:build linux

package shmcoll

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/gocoll/gocoll/engine/sched"
)

// AllToAllv through the slots: the all-to-all whose blocks differ in size
// from peer to peer (and whose sizes only the two ranks of a pair know).
//
// A slot holds a column per rank. Each piece moves up to w = vColumn bytes
// of every block: the owner copies bytes [k·w, (k+1)·w) of its block for
// peer j into its slot's column j, every rank passes the piece's barrier, then
// each copies its column out of every peer's slot into its receive block.
// Each column has a cache line of sizes in the segment's sizes area of the
// buffer set, which the first piece fills and the peer reads after that
// barrier, before it copies anything:
//
//	word 0: the largest block its owner sends to any peer
//	word 1: the bytes the owner sends to the column's rank
//	word 2: the bytes the owner expects from it
//	word 3: where that block starts in the owner's send buffer
//
// From word 0 of its column in every slot each rank computes the same
// number of pieces (the largest block anywhere over the column width);
// from words 1 and 2 it checks both directions of each of its pairs, so
// that both ranks of a pair whose counts disagree report it in the same
// call, before any block is written.
//
// As in AllToAll, a rank may instead publish its send buffer's address
// (publishAddr: cross-memory reads allowed, blocks from cmaFloor, and the
// measured choice of choosePath): then it copies nothing, its
// peers read their whole block out of its process in the first piece
// (word 3 says where), its blocks count for no piece, and the call ends
// with a closing barrier so that it keeps its buffer until they are done.

// vColumn is the bytes of a column: the most bytes of each block one piece
// moves.
func (a *Arena) vColumn() int { return a.slot / a.size &^ (lineBytes - 1) }

// FitsAllToAllv says whether the slots leave room for a column of at least
// a cache line per rank (the same on every rank: all use the same slot
// size; Create's slots always do).
func (a *Arena) FitsAllToAllv() bool { return a.size == 1 || a.vColumn() >= lineBytes }

// AllToAllv sends sb[j] (bytes of send) to rank j and receives rank j's
// block into rb[j] (bytes of recv); sb[j] on this rank must have the
// length of rb[this rank] on rank j. Blocks must lie inside their buffers,
// and no receive block may overlap a send block or another receive block
// (the engine checks: it also owns the error messages for them).
func (a *Arena) AllToAllv(ctx context.Context, c Call, send []byte, sb []sched.Block, recv []byte, rb []sched.Block) error {
	if len(sb) != a.size || len(rb) != a.size {
		return fmt.Errorf("%w: alltoallv: %d send and %d receive blocks for %d ranks", ErrInvalid, len(sb), len(rb), a.size)
	}
	for j := range a.size {
		if sb[j].Off < 0 || sb[j].Len < 0 || sb[j].Off+sb[j].Len > len(send) || rb[j].Off < 0 || rb[j].Len < 0 || rb[j].Off+rb[j].Len > len(recv) {
			return fmt.Errorf("%w: alltoallv: block %d outside its buffer", ErrInvalid, j)
		}
	}
	if me := a.rank; sb[me].Len != rb[me].Len {
		return fmt.Errorf("%w: alltoallv: rank %d sends itself %d bytes but expects %d", ErrInvalid, me, sb[me].Len, rb[me].Len)
	}
	if !a.FitsAllToAllv() {
		return fmt.Errorf("%w: alltoallv: %d-byte slots leave no column for %d ranks", ErrInvalid, a.slot, a.size)
	}
	// The sizes differ between ranks: the record carries none.
	if err := a.begin(c, 0, desc(kindAllToAllv, 0, 0, -1)); err != nil {
		return err
	}
	defer a.end()
	own := a.rank
	ownCopy := func() {
		copy(recv[rb[own].Off:rb[own].Off+rb[own].Len], send[sb[own].Off:sb[own].Off+sb[own].Len])
	}
	if a.size == 1 {
		ownCopy()
		return nil
	}
	most := 0 // the largest block this rank sends
	for j := range a.size {
		if j != own {
			most = max(most, sb[j].Len)
		}
	}
	k, timed := a.choosePath(chooseAllToAllv, most, 0)
	if most < cmaFloor {
		// Every rank counts the call (choosePath), but this rank's
		// blocks take the slots whatever the path: its time says
		// nothing about the choice.
		timed = false
	}
	start := a.pathStart(timed)
	err := a.allToAllv(ctx, send, sb, recv, rb, most, ownCopy)
	a.pathEnd(chooseAllToAllv, k, timed, start, err)
	return err
}

// allToAllv is AllToAllv's data movement; most is the largest block this
// rank sends, ownCopy copies its block to itself (run while the first
// barrier waits for the peers).
func (a *Arena) allToAllv(ctx context.Context, send []byte, sb []sched.Block, recv []byte, rb []sched.Block, most int, ownCopy func()) error {
	own, col := a.rank, a.vColumn()
	direct := a.publishAddr(send, most)
	pieces, anyDirect := 1, false
	for k := 0; k < pieces; k++ {
		set, err := a.nextSet(ctx)
		if err != nil {
			return err
		}
		mine := a.me.slots[set]
		if k == 0 {
			a.putSizes(a.me.sizes[set], most, sb, rb)
		}
		lo := k * col
		for j := range a.size {
			if j != own && !direct && lo < sb[j].Len {
				b := sb[j]
				a.copyIn(mine[j*col:], send[b.Off+lo:b.Off+min(lo+col, b.Len)])
			}
		}
		if err := a.barrierDoing(ctx, ownCopy); err != nil {
			return err
		}
		ownCopy = nil
		if k == 0 {
			if pieces, err = a.checkSizes(set, sb, rb, col); err != nil {
				return err
			}
			anyDirect = a.anyReg()
		}
		at := own * col
		for i, s := range a.segs {
			b := rb[i]
			if i == own || lo >= b.Len {
				continue
			}
			// Bytes [pos, pos+n) of i's data: of the block, at the
			// column, or, when i published its buffer, all of it where
			// its sizes line says the block starts.
			pos, n := lo, min(col, b.Len-lo)
			if s.recs[a.phase&1].addr != 0 {
				if k > 0 {
					continue // read whole in the first piece
				}
				pos, n = int(binary.NativeEndian.Uint64(s.sizes[set][own*lineBytes+24:])), b.Len
			}
			if err := a.fetch(recv[b.Off+lo:b.Off+lo+n], i, set, at-pos, pos, pos+n, 0); err != nil {
				return err
			}
		}
	}
	if anyDirect {
		return a.closeReg(ctx, nil)
	}
	return nil
}

// putSizes writes the sizes line of every column of this rank's slot into
// the set's sizes area (most: the largest block it sends).
func (a *Arena) putSizes(sizes []byte, most int, sb, rb []sched.Block) {
	ne := binary.NativeEndian
	for j := range a.size {
		if j != a.rank {
			line := sizes[j*lineBytes:]
			ne.PutUint64(line, uint64(most))
			ne.PutUint64(line[8:], uint64(sb[j].Len))
			ne.PutUint64(line[16:], uint64(rb[j].Len))
			ne.PutUint64(line[24:], uint64(sb[j].Off))
		}
	}
}

// checkSizes reads this rank's sizes line in every peer's sizes area of
// the first piece's set: it returns the number of pieces the call takes,
// or the first disagreement between this rank's block sizes and a peer's.
func (a *Arena) checkSizes(set int, sb, rb []sched.Block, bs int) (int, error) {
	ne := binary.NativeEndian
	most := 0 // the largest block that goes through the slots
	if a.cur.addr == 0 {
		for j := range a.size {
			if j != a.rank {
				most = max(most, sb[j].Len)
			}
		}
	}
	for i, s := range a.segs {
		if i == a.rank {
			continue
		}
		line := s.sizes[set][a.rank*lineBytes:]
		if s.recs[a.phase&1].addr == 0 {
			most = max(most, int(ne.Uint64(line)))
		}
		sent := int(ne.Uint64(line[8:]))     // what i sends this rank
		expects := int(ne.Uint64(line[16:])) // what i expects from it
		switch {
		case sent != rb[i].Len:
			return 0, a.fail(&CountsError{Rank: a.rank, From: i, To: a.rank, Sent: sent, Expected: rb[i].Len})
		case expects != sb[i].Len:
			return 0, a.fail(&CountsError{Rank: a.rank, From: a.rank, To: i, Sent: sb[i].Len, Expected: expects})
		}
	}
	return max(1, (most+bs-1)/bs), nil
}
