package redist

import (
	"fmt"

	"github.com/gocoll/gocoll/engine"
)

// Place says which ranks of the communicator are the plan's senders and
// receivers: sender i is rank src[i], receiver j rank dst[j] (nil: i and j
// themselves). A rank may be both; its messages to itself are copies.
func (p *Plan) Place(src, dst []int) error {
	if src != nil && len(src) != p.Q || dst != nil && len(dst) != p.P {
		return fmt.Errorf("redist: %d sender and %d receiver ranks for %d and %d processors", len(src), len(dst), p.Q, p.P)
	}
	for _, ranks := range [][]int{src, dst} {
		seen := map[int]bool{}
		for _, r := range ranks {
			if r < 0 || seen[r] {
				return fmt.Errorf("redist: ranks %v: each rank plays at most one sender and one receiver", ranks)
			}
			seen[r] = true
		}
	}
	p.mu.Lock()
	p.srcRanks, p.dstRanks, p.runs = src, dst, nil
	p.mu.Unlock()
	return nil
}

// Counts is how many elements rank holds in the source layout and in the
// destination layout: the lengths (in elements) of the buffers it passes to
// Redistribute.
func (p *Plan) Counts(rank int) (src, dst int) {
	for i := 0; i < p.Q; i++ {
		if p.srcRank(i) == rank {
			src = p.mover.srcCount(i)
		}
	}
	for j := 0; j < p.P; j++ {
		if p.dstRank(j) == rank {
			dst = p.mover.dstCount(j)
		}
	}
	return src, dst
}

// SrcElems is how many elements sender i holds in the source layout.
func (p *Plan) SrcElems(i int) int { return p.mover.srcCount(i) }

// DstElems is how many elements receiver j holds in the destination layout.
func (p *Plan) DstElems(j int) int { return p.mover.dstCount(j) }

func (p *Plan) srcRank(i int) int {
	if p.srcRanks != nil {
		return p.srcRanks[i]
	}
	return i
}

func (p *Plan) dstRank(j int) int {
	if p.dstRanks != nil {
		return p.dstRanks[j]
	}
	return j
}

// Comm is what executing a plan needs of a communicator: its rank and
// point-to-point messages (engine.Comm has them; so do virtual
// communicators).
type Comm interface {
	Rank() int
	Size() int
	SendOp(buf []byte, count int, dt engine.DataType, peer int) engine.Op
	RecvOp(buf []byte, count int, dt engine.DataType, peer int) engine.Op
}

// Redistribute runs the plan on c: src is this rank's buffer in the source
// layout (the elements of every sender index this rank plays, in local
// order; nil if it plays none), dst its buffer in the destination layout.
// Step by step, each rank packs what it sends (strided elements become one
// contiguous message), sends and receives its messages of the step, and
// unpacks; every element moves exactly once. Every rank of c that takes
// part must call it with the same plan.
func Redistribute(c Comm, p *Plan, src, dst []byte, dt engine.DataType) error {
	return RedistributeAt(c, p, Endpoints{
		SrcRank: p.srcRank, DstRank: p.dstRank,
		Src: func(int) []byte { return src }, Dst: func(int) []byte { return dst },
	}, dt)
}

// Endpoints says which rank plays each processor of a plan and where the
// buffers of the processors this rank plays are. A rank may play several
// senders and receivers (virtual devices do): messages between two ranks
// in one step then travel in the step's order, which both sides follow.
type Endpoints struct {
	SrcRank func(i int) int    // rank playing sender i
	DstRank func(j int) int    // rank playing receiver j
	Src     func(i int) []byte // buffer of sender i (asked only of this rank's)
	Dst     func(j int) []byte // buffer of receiver j (likewise)
}

// RedistributeAt is Redistribute with the processors placed by e.
func RedistributeAt(c Comm, p *Plan, e Endpoints, dt engine.DataType) error {
	me := c.Rank()
	if !dt.Valid() || dt.Size() == 0 {
		return fmt.Errorf("redist: %w: datatype %v", engine.ErrInvalidArgument, dt)
	}
	es := dt.Size()
	srcs, dsts := map[int][]byte{}, map[int][]byte{}
	check := func(name string, idx int, buf []byte, rs map[int]runs) error {
		for _, r := range rs {
			for _, x := range r {
				if (x.off+x.n)*es > len(buf) {
					return fmt.Errorf("redist: %w: the %s buffer of processor %d on rank %d holds %d bytes, the layout needs %d", engine.ErrInvalidArgument, name, idx, me, len(buf), (x.off+x.n)*es)
				}
			}
		}
		return nil
	}
	for i := 0; i < p.Q; i++ {
		if e.SrcRank(i) == me {
			srcs[i] = e.Src(i)
			if err := check("source", i, srcs[i], p.sendRuns(i)); err != nil {
				return err
			}
		}
	}
	for j := 0; j < p.P; j++ {
		if e.DstRank(j) == me {
			dsts[j] = e.Dst(j)
			if err := check("destination", j, dsts[j], p.recvRuns(j)); err != nil {
				return err
			}
		}
	}
	var bufs [][]byte
	buffer := func(k, n int) []byte {
		for len(bufs) <= k {
			bufs = append(bufs, nil)
		}
		if cap(bufs[k]) < n {
			bufs[k] = make([]byte, n)
		}
		return bufs[k][:n]
	}
	type pending struct {
		req *engine.Request
		buf []byte
		j   int
		rs  runs
	}
	for _, step := range p.Steps {
		var reqs []pending
		k := 0
		for _, m := range step {
			sender, receiver := e.SrcRank(m.Src) == me, e.DstRank(m.Dst) == me
			if !sender && !receiver {
				continue
			}
			buf := buffer(k, m.Elems*es)
			k++
			if sender {
				pack(buf, srcs[m.Src], p.sendRuns(m.Src)[m.Dst], es)
				if receiver {
					unpack(dsts[m.Dst], buf, p.recvRuns(m.Dst)[m.Src], es)
					continue
				}
				req, err := c.SendOp(buf, m.Elems, dt, e.DstRank(m.Dst)).Start()
				if err != nil {
					return err
				}
				reqs = append(reqs, pending{req: req})
				continue
			}
			req, err := c.RecvOp(buf, m.Elems, dt, e.SrcRank(m.Src)).Start()
			if err != nil {
				return err
			}
			reqs = append(reqs, pending{req, buf, m.Dst, p.recvRuns(m.Dst)[m.Src]})
		}
		// A failure fails the communicator, and with it the other
		// requests: only internal buffers are still in use, so return.
		for _, r := range reqs {
			if err := r.req.Wait(); err != nil {
				return err
			}
		}
		for _, r := range reqs {
			if r.buf != nil {
				unpack(dsts[r.j], r.buf, r.rs, es)
			}
		}
	}
	return nil
}

func pack(out, src []byte, rs runs, es int) {
	k := 0
	for _, r := range rs {
		k += copy(out[k:], src[r.off*es:(r.off+r.n)*es])
	}
}

func unpack(dst, in []byte, rs runs, es int) {
	k := 0
	for _, r := range rs {
		k += copy(dst[r.off*es:(r.off+r.n)*es], in[k:])
	}
}
