// Package sched turns collective algorithms into data. A builder takes the
// shape of one call (collective, rank count, byte sizes, root, ring orders,
// host groups) and returns a Schedule: for every rank, the ordered list of
// operations it performs — which byte range goes to or comes from which
// peer, where a received range is reduced, where data is copied or divided.
// One executor (in package engine) runs any schedule over a transport; the
// simulator in this package runs it over symbolic data to prove it correct;
// the cost model (package topology/cost) runs it over a machine description
// to predict its time. Nothing here touches a socket or a kernel.
//
// # Semantics of a rank's program
//
// Operations are issued in program order. An operation does not start before
// every earlier operation of the same rank that touches an overlapping byte
// range of the same buffer has completed, when either of the two writes it
// (read-after-write, write-after-read and write-after-write hazards). Reads
// do not wait for reads. Sends to one peer leave in program order and
// receives from one peer are matched in program order (the transports are
// FIFO per directed pair); otherwise operations run concurrently: a send is
// posted and the program moves on, so a chain broadcast receives segment k+1
// while it forwards segment k without saying so.
//
// RecvReduce receives into executor-owned scratch and only its reduction
// writes Dst: receiving waits for nothing, the reduction of its first
// segment waits for the earlier operations on Dst. That is what lets two
// partners each send their whole vector and receive the other's into
// scratch at the same time (recursive doubling) without a deadlock.
//
// Send and RecvReduce may cut their range into Segs segments, each its own
// message with tag Tag+k (k = 0..Segs-1), split by element as Segment says;
// RecvReduce reduces segment k while segment k+1 is in flight (document
// 000's pipelining). Recv is never segmented.
//
// Sync waits for every earlier operation of the rank to complete: a step
// boundary for algorithms that want lockstep (pairwise exchange pairs each
// sender with one receiver per step).
//
// Round is the logical time slot of an operation, used only by the cost
// model: operations of one round on all ranks are assumed to happen at the
// same time and share the links they use. A segmented operation occupies
// rounds Round..Round+Segs-1. Rounds never decrease along a program.
package sched

import (
	"fmt"
	"iter"
)

// Coll names a collective.
type Coll uint8

const (
	AllReduce Coll = iota
	Reduce
	Broadcast
	AllGather
	ReduceScatter
	AllToAll
	AllToAllv
	Barrier
	// AllToAllw is the all-to-all with a datatype per block (strided
	// vectors); its schedules run in block mode (see Schedule.Blocks).
	AllToAllw
	// NumColls is the number of collectives, for tables indexed by Coll.
	NumColls
)

var collNames = [NumColls]string{"allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "alltoallv", "barrier", "alltoallw"}

func (c Coll) String() string {
	if c < NumColls {
		return collNames[c]
	}
	return fmt.Sprintf("coll(%d)", uint8(c))
}

// Colls lists every collective, in declaration order.
func Colls() []Coll {
	out := make([]Coll, NumColls)
	for i := range out {
		out[i] = Coll(i)
	}
	return out
}

// ParseColl is the inverse of Coll.String.
func ParseColl(s string) (Coll, bool) {
	for i, n := range collNames {
		if n == s {
			return Coll(i), true
		}
	}
	return 0, false
}

// Buf names one of the buffers a schedule works on; the executor binds them
// per call.
type Buf uint8

const (
	// Work is the collective's vector: allreduce's result (the send data
	// copied in first), reduce's accumulator, broadcast's and allgather's
	// receive buffer, reduce-scatter's private copy of the input, and
	// all-to-all's receive buffer.
	Work Buf = iota
	// In is all-to-all's send buffer (read-only); for the virtual
	// allreduce, the contributions of the rank's devices back to back.
	In
	// Tmp is scratch of Schedule.TmpLen bytes, for packing (Bruck).
	Tmp
	NumBufs
)

func (b Buf) String() string {
	switch b {
	case Work:
		return "work"
	case In:
		return "in"
	case Tmp:
		return "tmp"
	}
	return fmt.Sprintf("buf(%d)", uint8(b))
}

// Range is Len bytes at Off of a buffer.
type Range struct {
	Buf      Buf
	Off, Len int
}

// End is the offset one past the range.
func (r Range) End() int { return r.Off + r.Len }

// Overlaps reports whether r and o share a byte.
func (r Range) Overlaps(o Range) bool {
	return r.Buf == o.Buf && r.Len > 0 && o.Len > 0 && r.Off < o.End() && o.Off < r.End()
}

// Kind is what an operation does.
type Kind uint8

const (
	// Send transmits Src to Peer (Segs messages, tags Tag..Tag+Segs-1).
	Send Kind = iota + 1
	// Recv receives from Peer into Dst (one message, tag Tag).
	Recv
	// RecvReduce receives Dst.Len bytes from Peer (Segs messages) and folds
	// them into Dst: Dst = theirs op Dst when TheirsFirst, else Dst op theirs.
	RecvReduce
	// Copy copies Src to Dst (equal lengths, no overlap).
	Copy
	// Scale divides Dst element-wise by Div (the finish of an average).
	Scale
	// Sync waits for every earlier operation of this rank.
	Sync
	// Accumulate folds Src into Dst on this rank: Dst = Dst op Src, the
	// running value the left operand (equal lengths, no overlap). A fold
	// in a fixed order (the virtual allreduce) adds one contribution at a
	// time to the partial sum it received.
	Accumulate
)

func (k Kind) String() string {
	switch k {
	case Send:
		return "send"
	case Recv:
		return "recv"
	case RecvReduce:
		return "recvreduce"
	case Copy:
		return "copy"
	case Scale:
		return "scale"
	case Sync:
		return "sync"
	case Accumulate:
		return "accumulate"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Op is one operation of a rank's program. Fields not used by its Kind are
// zero.
type Op struct {
	Kind        Kind
	Peer        int    // Send, Recv, RecvReduce
	Tag         uint32 // message tag (the header's step number) of the first segment
	Segs        int    // Send, RecvReduce: messages the range is cut into (0 means 1)
	Src         Range  // Send, Copy, Accumulate
	Dst         Range  // Recv, RecvReduce, Copy, Scale, Accumulate
	TheirsFirst bool   // RecvReduce: the peer's partial is the left operand
	Div         int    // Scale: divisor
	Round       int    // cost model's time slot (see the package comment)
}

// NSegs is Segs with 0 read as 1.
func (o Op) NSegs() int { return max(o.Segs, 1) }

// Bytes is the payload an operation moves or touches.
func (o Op) Bytes() int {
	switch o.Kind {
	case Send:
		return o.Src.Len
	default:
		return o.Dst.Len
	}
}

func (o Op) String() string {
	switch o.Kind {
	case Send:
		return fmt.Sprintf("r%d send %s[%d:%d] -> %d tag %d segs %d", o.Round, o.Src.Buf, o.Src.Off, o.Src.End(), o.Peer, o.Tag, o.NSegs())
	case Recv:
		return fmt.Sprintf("r%d recv %s[%d:%d] <- %d tag %d", o.Round, o.Dst.Buf, o.Dst.Off, o.Dst.End(), o.Peer, o.Tag)
	case RecvReduce:
		order := "mine op theirs"
		if o.TheirsFirst {
			order = "theirs op mine"
		}
		return fmt.Sprintf("r%d recvreduce %s[%d:%d] <- %d tag %d segs %d (%s)", o.Round, o.Dst.Buf, o.Dst.Off, o.Dst.End(), o.Peer, o.Tag, o.NSegs(), order)
	case Copy:
		return fmt.Sprintf("r%d copy %s[%d:%d] -> %s[%d:%d]", o.Round, o.Src.Buf, o.Src.Off, o.Src.End(), o.Dst.Buf, o.Dst.Off, o.Dst.End())
	case Scale:
		return fmt.Sprintf("r%d scale %s[%d:%d] / %d", o.Round, o.Dst.Buf, o.Dst.Off, o.Dst.End(), o.Div)
	case Accumulate:
		return fmt.Sprintf("r%d accumulate %s[%d:%d] op= %s[%d:%d]", o.Round, o.Dst.Buf, o.Dst.Off, o.Dst.End(), o.Src.Buf, o.Src.Off, o.Src.End())
	case Sync:
		return fmt.Sprintf("r%d sync", o.Round)
	}
	return o.Kind.String()
}

// Segment is the byte range [lo, hi) of segment k when n bytes of es-byte
// elements are cut into segs messages: by element, sizes differing by at
// most one element. Sender, receiver, executor and simulator all cut this way.
func Segment(k, n, es, segs int) (lo, hi int) {
	ne := n / es
	return k * ne / segs * es, (k + 1) * ne / segs * es
}

// Schedule is an algorithm instantiated for one call shape on N ranks.
type Schedule struct {
	Coll     Coll
	Algo     string // the builder's name
	N        int
	ElemSize int
	// Bytes each rank's buffers must hold.
	WorkLen, InLen, TmpLen int
	// Rounds is one past the largest round of any operation.
	Rounds int
	// Blocks: ranges count blocks whose sizes the executor learns while it
	// runs (see "Block mode" in the package comment).
	Blocks bool
	// Matched: a receive takes the message of its tag from its peer,
	// whichever order they were sent in (the control tree's schedules,
	// whose ranks learn the decisions in batches of their own). Tags are
	// then unique per directed pair.
	Matched bool
	// Tree, when set, is the control tree that decides this schedule
	// while it runs (aggregate-tree): the program is what it decides when
	// the ranks arrive in rank order, for the validator, the simulator and
	// the cost model; the executor runs the tree itself (sched.Node,
	// RankOps).
	Tree *Tree
	// prog yields rank's operations in program order.
	prog func(rank int, yield func(Op) bool)
}

// New makes a schedule whose program for rank r is what prog yields. prog
// must be a pure function of r (the cost model and the validator call it
// more than once).
func New(coll Coll, algo string, n, elemSize int, prog func(rank int, yield func(Op) bool)) *Schedule {
	return &Schedule{Coll: coll, Algo: algo, N: n, ElemSize: elemSize, prog: prog}
}

// Program is rank's operations in program order, generated on demand (a
// 4,096-rank ring is 67 million operations in all; the cost model walks the
// ranks side by side without holding them).
func (s *Schedule) Program(rank int) iter.Seq[Op] {
	return func(yield func(Op) bool) {
		// A program may ignore yield's answer; stop passing ops on anyway.
		stopped := false
		s.prog(rank, func(o Op) bool {
			stopped = stopped || !yield(o)
			return !stopped
		})
	}
}

// Ops is rank's program as a slice.
func (s *Schedule) Ops(rank int) []Op {
	var out []Op
	s.prog(rank, func(o Op) bool { out = append(out, o); return true })
	return out
}

// Len is the size in bytes of buffer b.
func (s *Schedule) Len(b Buf) int {
	switch b {
	case Work:
		return s.WorkLen
	case In:
		return s.InLen
	case Tmp:
		return s.TmpLen
	}
	return 0
}

// Block is a byte range of a buffer in a layout (alltoallv's per-peer
// blocks, or a vector cut into chunks).
type Block struct{ Off, Len int }

// EvenBlocks is n blocks of size bytes each, back to back.
func EvenBlocks(n, size int) []Block {
	l := make([]Block, n)
	for i := range l {
		l[i] = Block{i * size, size}
	}
	return l
}

// ChunkBlocks cuts count elements of es bytes into n blocks whose sizes
// differ by at most one element.
func ChunkBlocks(count, n, es int) []Block {
	l := make([]Block, n)
	for i := range l {
		lo, hi := i*count/n, (i+1)*count/n
		l[i] = Block{lo * es, (hi - lo) * es}
	}
	return l
}

// Params is the shape of one call; every rank builds from equal Params.
type Params struct {
	Coll     Coll
	N        int // ranks
	ElemSize int // bytes per element
	// Count is in elements: the whole vector for allreduce, reduce and
	// broadcast; each rank's block for allgather, reduce-scatter and
	// all-to-all.
	Count int
	Root  int  // reduce, broadcast
	Avg   bool // divide the reduction by N (Scale) where it is final

	// Layouts of alltoallv (per peer, bytes): SendBlocks[p] goes to p out
	// of In, RecvBlocks[p] is where p's block lands in Work. They differ
	// per rank, so Program(r) only makes sense for the building rank: a
	// v-schedule is built on each rank with its own layouts (Mine says
	// which rank that is) and is validated across ranks by the caller.
	SendBlocks, RecvBlocks []Block
	Mine                   int

	// Tuning; zero means the builder's default.
	Segments int // halving–doubling: segments per round (q)
	SegBytes int // chain broadcast: bytes per segment
	Radix    int // Bruck all-to-all
	// Aggregated all-to-all: the source (row) and destination (column)
	// sub-groups, each a partition of the ranks; nil: runs of Group ranks
	// (0: ⌈√N⌉).
	SrcGroups, DstGroups [][]int
	Group                int
	Relay                bool // one rank per destination group receives and hands out (see AggregateAllToAll)

	// Placement. Rings lists ring orders (each a permutation of 0..N-1);
	// nil means the single ring 0,1,…,N-1. Hosts lists the ranks of each
	// host, in local-rank order; hierarchical builders need every host to
	// hold the same number of ranks.
	Rings [][]int
	Hosts [][]int
	// Trees are the two trees of the double binary tree allreduce, as
	// parent arrays (-1 at the root; topology.DoubleBinaryTree makes
	// NCCL's); nil: the builder's own pair.
	Trees [][]int

	// Devices places the virtual collectives' devices (VirtualAllReduce,
	// vcoll.go): Devices[v] is the rank of device v. Nil for every other
	// schedule.
	Devices []int
}

// Builder makes the schedule of one algorithm.
type Builder func(p Params) (*Schedule, error)

// Bytes is the size of the collective's vector in the nccl-tests sense
// (what busbw is computed from): Count elements for allreduce, reduce and
// broadcast, N·Count for allgather, reduce-scatter and all-to-all.
func (p Params) Bytes() int {
	switch p.Coll {
	case AllGather, ReduceScatter, AllToAll:
		return p.N * p.Count * p.ElemSize
	}
	return p.Count * p.ElemSize
}
