package redist

import (
	"fmt"

	"github.com/gocoll/gocoll/engine"
)

// The two ways the CSS paper (docs/design/redistribution.md) compares CSS with, for benchmarks: one
// all-to-allv over every rank, and the "traditional" order in which every
// sender posts all its messages at once, destination (myid + k) mod n for
// k = 0, 1, …, and every receiver all its receives likewise.

// AllToAllvComm is what the all-to-allv baseline needs of a communicator.
type AllToAllvComm interface {
	Comm
	AllToAllv(send []byte, sendcounts, sdispls []int, recv []byte, recvcounts, rdispls []int, dt engine.DataType) error
}

// RedistributeAllToAllv moves the plan's data with one AllToAllv: every
// message packed into one send buffer, unpacked from one receive buffer.
func RedistributeAllToAllv(c AllToAllvComm, p *Plan, src, dst []byte, dt engine.DataType) error {
	me, n, es := c.Rank(), c.Size(), dt.Size()
	sendCounts, sdispls := make([]int, n), make([]int, n)
	recvCounts, rdispls := make([]int, n), make([]int, n)
	role := p.roles(me)
	sendRuns, recvRuns := role.sends, role.recvs
	for j := range sendRuns {
		sendCounts[p.dstRank(j)] = p.COM[role.i][j]
	}
	for i := range recvRuns {
		recvCounts[p.srcRank(i)] = p.COM[i][role.j]
	}
	total := func(counts, displs []int) int {
		t := 0
		for r, c := range counts {
			displs[r] = t
			t += c
		}
		return t
	}
	sbuf := make([]byte, total(sendCounts, sdispls)*es)
	rbuf := make([]byte, total(recvCounts, rdispls)*es)
	// A rank plays at most one sender and one receiver (Place), so each
	// rank pair is one message.
	for j, rs := range sendRuns {
		pack(sbuf[sdispls[p.dstRank(j)]*es:], src, rs, es)
	}
	if err := c.AllToAllv(sbuf, sendCounts, sdispls, rbuf, recvCounts, rdispls, dt); err != nil {
		return err
	}
	for i, rs := range recvRuns {
		unpack(dst, rbuf[rdispls[p.srcRank(i)]*es:], rs, es)
	}
	return nil
}

// RedistributeNaive posts every receive and every send of this rank at
// once, peers in the order (myid + k) mod n, and waits for all of them:
// messages of different lengths from several senders reach one receiver
// at the same time, which is the contention CSS removes.
func RedistributeNaive(c Comm, p *Plan, src, dst []byte, dt engine.DataType) error {
	me, n, es := c.Rank(), c.Size(), dt.Size()
	role := p.roles(me)
	mySrc, myDst, sendRuns, recvRuns := role.i, role.j, role.sends, role.recvs
	type pending struct {
		req *engine.Request
		buf []byte
		rs  runs
	}
	var reqs []pending
	byRank := func(procs int, rank func(int) int) map[int]int {
		m := map[int]int{}
		for k := 0; k < procs; k++ {
			m[rank(k)] = k
		}
		return m
	}
	srcOf, dstOf := byRank(p.Q, p.srcRank), byRank(p.P, p.dstRank)
	if myDst >= 0 {
		for k := 0; k < n; k++ {
			peer := (me + k) % n
			i, ok := srcOf[peer]
			if !ok || p.COM[i][myDst] == 0 {
				continue
			}
			buf := make([]byte, p.COM[i][myDst]*es)
			if peer == me {
				pack(buf, src, sendRuns[myDst], es)
				unpack(dst, buf, recvRuns[i], es)
				continue
			}
			r, err := c.RecvOp(buf, p.COM[i][myDst], dt, peer).Start()
			if err != nil {
				return err
			}
			reqs = append(reqs, pending{r, buf, recvRuns[i]})
		}
	}
	if mySrc >= 0 {
		for k := 0; k < n; k++ {
			peer := (me + k) % n
			j, ok := dstOf[peer]
			if !ok || peer == me || p.COM[mySrc][j] == 0 {
				continue
			}
			buf := make([]byte, p.COM[mySrc][j]*es)
			pack(buf, src, sendRuns[j], es)
			r, err := c.SendOp(buf, p.COM[mySrc][j], dt, peer).Start()
			if err != nil {
				return err
			}
			reqs = append(reqs, pending{req: r})
		}
	}
	for _, r := range reqs {
		if err := r.req.Wait(); err != nil {
			return fmt.Errorf("redist: naive order: %w", err)
		}
	}
	for _, r := range reqs {
		if r.buf != nil {
			unpack(dst, r.buf, r.rs, es)
		}
	}
	return nil
}
