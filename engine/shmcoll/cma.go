//go:build linux

package shmcoll

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/transport"
)

// Cross-memory attach (process_vm_readv, "CMA"): a rank whose buffer is not
// registered memory can still spare the copy into its slot by publishing
// the buffer's address; peers then copy straight out of its process into
// theirs, one copy instead of two, as Open MPI's vader BTL does for large
// messages. The kernel allows it between processes of one user unless a
// seccomp profile (Docker's default) or Yama forbids it, so every rank
// probes every peer at Connect and the arena uses it only when all ranks
// could (see Arena.decideCMA).

// Values of a segment's offCMA word (0 until its owner probed).
const (
	cmaOK uint64 = 1 // this rank could read every peer
	cmaNo uint64 = 2 // it could not, or it does not want to (Config.NoCMA)
)

// remoteIovec is struct iovec for the remote side: the address is in the
// other process, so it is a number here, not a pointer.
type remoteIovec struct {
	base uintptr
	len  uint64
}

// readRemote copies len(dst) bytes at addr in process pid into dst.
func readRemote(pid int, dst []byte, addr uint64) error {
	return remoteCopy(unix.SYS_PROCESS_VM_READV, "process_vm_readv", pid, dst, addr)
}

// writeRemote copies src into process pid at addr.
func writeRemote(pid int, src []byte, addr uint64) error {
	return remoteCopy(unix.SYS_PROCESS_VM_WRITEV, "process_vm_writev", pid, src, addr)
}

// remoteCopy runs process_vm_readv or process_vm_writev (sysno, named
// name) between local and the bytes at addr in process pid until all of
// them moved.
func remoteCopy(sysno uintptr, name string, pid int, local []byte, addr uint64) error {
	for len(local) > 0 {
		l := syscall.Iovec{Base: &local[0], Len: uint64(len(local))}
		remote := remoteIovec{base: uintptr(addr), len: uint64(len(local))}
		n, _, errno := syscall.Syscall6(sysno, uintptr(pid),
			uintptr(unsafe.Pointer(&l)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
		if errno != 0 {
			return errno
		}
		if n == 0 || n > uintptr(len(local)) {
			return fmt.Errorf("%s returned %d of %d bytes", name, n, len(local))
		}
		local = local[n:]
		addr += uint64(n)
	}
	return nil
}

// probeCMA says whether this process can read and write peer s's memory:
// it reads the magic word of s's header through s's own mapping of it and
// writes the same value back (the kernel allows both alike, but a seccomp
// profile could allow one only, and a 2-rank broadcast's root writes).
func probeCMA(s *segment) bool {
	base := shmseg.Word(s.m, offBase).Load()
	if base == 0 {
		return false
	}
	var got [8]byte
	if readRemote(s.proc.Pid, got[:], base+shmseg.OffMagic) != nil {
		return false
	}
	return *(*uint64)(unsafe.Pointer(&got[0])) == segMagic &&
		writeRemote(s.proc.Pid, got[:], base+shmseg.OffMagic) == nil
}

// addrOf is the address of b's first byte, as peers pass it to
// process_vm_readv.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// fetch copies bytes [lo, hi) of peer j's data for the piece that just
// passed its barrier into dst: from its registered buffer or, when its
// record carries an address, out of its process; else from its slot of set
// at slotOff+lo. need is as for source.
func (a *Arena) fetch(dst []byte, j, set, slotOff, lo, hi int, need uint64) error {
	rec := a.segs[j].recs[a.phase&1]
	if rec.addr == 0 {
		src, err := a.source(j, set, slotOff, lo, hi, need)
		if err != nil {
			return err
		}
		copy(dst, src)
		return nil
	}
	return a.load(j, dst[:hi-lo], rec.addr+uint64(lo))
}

// load copies len(dst) bytes at addr, an address peer j's record of the
// current phase published, out of j's process into dst.
func (a *Arena) load(j int, dst []byte, addr uint64) error {
	a.cmaReads++
	if err := readRemote(a.segs[j].proc.Pid, dst, addr); err != nil {
		var cause error = &transport.PeerLostError{Peer: j, Reason: fmt.Sprintf("process %d: process_vm_readv: %v", a.segs[j].proc.Pid, err)}
		if err != syscall.ESRCH {
			cause = fmt.Errorf("%w: rank %d: reading %d bytes of rank %d's buffer at %#x: process_vm_readv: %v",
				transport.ErrProtocol, a.rank, len(dst), j, addr, err)
		}
		return a.fail(fmt.Errorf("shmcoll: rank %d: %w", a.rank, cause))
	}
	return nil
}

// store copies src into peer j's process at addr, an address its record
// of the current phase published: the 2-rank broadcast's root writing its
// half (see Arena.bcastSplit), a 2-rank AllReduce writing the peer's half
// of the result (reduceDirect). It writes only while it holds j's store
// gate for the phase, and does nothing when j already left the call (the
// barrier after it then reports why).
func (a *Arena) store(j int, src []byte, addr uint64) error {
	p := a.phase
	if !a.claimStore(j, p) {
		return nil
	}
	defer a.segs[j].gate.Store(p << 2)
	a.cmaWrites++
	if err := writeRemote(a.segs[j].proc.Pid, src, addr); err != nil {
		var cause error = &transport.PeerLostError{Peer: j, Reason: fmt.Sprintf("process %d: process_vm_writev: %v", a.segs[j].proc.Pid, err)}
		if err != syscall.ESRCH {
			cause = fmt.Errorf("%w: rank %d: writing %d bytes into rank %d's buffer at %#x: process_vm_writev: %v",
				transport.ErrProtocol, a.rank, len(src), j, addr, err)
		}
		return a.fail(fmt.Errorf("shmcoll: rank %d: %w", a.rank, cause))
	}
	return nil
}

// The store gate: a word in each rank's segment that makes a peer's write
// into the rank's buffer (store) and the rank's leaving a call with an
// error exclusive. Without it a rank that failed or was aborted could
// return, and its caller free or reuse the buffer, while the peer still
// wrote into it. Values for phase p: p<<2|gateWriting while a peer
// writes, p<<2|gateClosed once the rank gave up on p, p<<2 otherwise.
const (
	gateWriting = 1
	gateClosed  = 2
	// gateWait bounds how long a failing rank waits for a peer's write in
	// progress: the copy itself takes milliseconds, so only a peer stopped
	// (SIGSTOP, a debugger) between its copy and the release waits this
	// long, and then it no longer writes.
	gateWait = 10 * time.Second
)

// claimStore takes peer j's gate for phase p; false if j gave up on p.
func (a *Arena) claimStore(j int, p uint64) bool {
	g := a.segs[j].gate
	for {
		v := g.Load()
		if v == p<<2|gateClosed {
			return false
		}
		if g.CompareAndSwap(v, p<<2|gateWriting) {
			return true
		}
	}
}

// closeGate gives up on phase p: once it returns, no peer writes into this
// rank's buffer for p. It waits for a write in progress unless the writer
// (rank w) died, or for gateWait at most.
func (a *Arena) closeGate(p uint64, w int) {
	g := a.me.gate
	deadline := time.Now().Add(gateWait)
	for {
		v := g.Load()
		if v != p<<2|gateWriting {
			if g.CompareAndSwap(v, p<<2|gateClosed) {
				return
			}
			continue
		}
		if time.Now().After(deadline) || !a.segs[w].proc.Alive() {
			return
		}
		a.gateWaits.Add(1)
		time.Sleep(50 * time.Microsecond)
	}
}

// The measured choice between the slots and cross-memory copies.
//
// Which path is faster for an AllGather, AllToAll or AllToAllv of a given
// size depends on the machine (how far apart the cores are, how the kernel
// pins pages, how many ranks share a core), and on a VM it changes while a
// job runs. So the ranks time their calls and choose online, per operation
// and size class (a power of two), at every rank count. Online rather than
// by a calibration at the first communicator: a calibration measures an
// idle machine at one moment, while the calls measure the job itself, cost
// nothing extra, and keep adapting when vCPUs move.
//
// Every rank must take the same path in a call (a call with ranks on both
// is correct but goes piece by piece, slower than either), so one rank,
// the leader, decides and all follow. The leader is rank 0, except in a
// Broadcast, where it is the root's peer (the root of a broadcast through
// the slots returns before its peer has the data: only the peer's time
// compares the two paths). The leader votes from its estimates in the
// record it publishes (vote* bits of desc, left out of the records'
// comparison) and takes its vote as the class's agreed path at once;
// every other rank takes it when it meets that record at a barrier, which
// it does before its next call of the operation: in the same call for the
// operations with full barriers, and for a Broadcast's root at the closing
// barrier or when it settles at the start of its next call. Which call
// explores the other path depends only on the number of calls of the
// class, which every rank counts alike. Any choice is correct: a peer
// reads whatever a rank's record offers, so a wrong or stale vote costs
// time only. GOCOLL_CMA=0 (Config.NoCMA) on any rank turns cross-memory
// copies off before any of this (decideCMA).

// Operations whose path is chosen (the index into pathChooser.cls).
const (
	chooseAllGather = iota
	chooseAllToAll
	chooseAllToAllv
	chooseBroadcast // 2 ranks: the split cross-memory copy
	chooseAllReduce // 2 ranks: reduceDirect
	numChosen
)

// chosenOp maps a record's kind to its chosen operation (-1: none).
func chosenOp(kind uint64) int {
	switch kind {
	case kindAllGather:
		return chooseAllGather
	case kindAllToAll:
		return chooseAllToAll
	case kindAllToAllv:
		return chooseAllToAllv
	case kindBroadcast:
		return chooseBroadcast
	case kindAllReduce:
		return chooseAllReduce
	}
	return -1
}

// The vote in a record's desc: voteValid when the leader had estimates of
// both paths, voteCMA its choice, and the size class it is for.
const (
	voteValid      = 1 << 24
	voteCMA        = 1 << 25
	voteClassShift = 26 // 6 bits
	voteBits       = 0xff << 24
)

// choosePath decides whether this rank's data in an AllGather, AllToAll,
// AllToAllv or 2-rank Broadcast (op, a choose* constant) may be read out
// of (or, Broadcast's peer, written into) its process (a.useCMA), where
// that is possible at all, and returns the size class to record the
// call's time under (timed false: nothing to choose). size is the bytes
// per peer, the same on every rank, except in an AllToAllv, where it is
// the largest block this rank sends: AllToAllv's sizes differ between
// ranks, so every rank counts its calls in one class, whatever its own
// size (the exploration schedule and the agreement must be the same
// everywhere), while each keeps its times per class of its own size, so
// that the leader compares the two paths at the size it votes for. The
// leader (rank leader) publishes its vote.
func (a *Arena) choosePath(op, size, leader int) (k int, timed bool) {
	shared := op == chooseAllToAllv
	if !a.cma || !shared && size < cmaFloor {
		return 0, false
	}
	k = bits.Len(uint(size))
	sk := k // the class of the schedule and the agreement
	if shared {
		sk, a.paths.vLast = 0, k
	}
	c := &a.paths.cls[op][sk]
	a.useCMA = c.pick()

	if a.rank == leader {
		t := a.paths.times(op, k)
		vote := t.vote(slotsFirst(op))
		if shared && vote == 0 && size >= cmaFloor {
			// The leader's size is new: the class's calls are past
			// the two that try each path, so it asks for the path it
			// has no time for at this size.
			vote = t.untried()
		}
		if vote != 0 {
			a.cur.id.desc |= vote | uint64(sk)<<voteClassShift
			a.agreed(op, sk, vote)
		}
	}
	return k, true
}

// takeVote stores the vote in a leader's record (desc) as the agreed path
// of its operation and class.
func (a *Arena) takeVote(desc uint64) {
	if op := chosenOp(desc & 0xff); op >= 0 {
		a.agreed(op, int(desc>>voteClassShift&63), desc)
	}
}

// chosenNames names the chosen operations in the log.
var chosenNames = [numChosen]string{"allgather", "alltoall", "alltoallv", "broadcast", "allreduce"}

// agreed takes a vote (desc) for op's class k, and logs a change of path
// (GOCOLL_DEBUG): what the ranks chose on this machine, with this rank's
// estimates.
func (a *Arena) agreed(op, k int, desc uint64) {
	c := &a.paths.cls[op][k]
	was := c.agreed
	c.agree(desc)
	if c.agreed != was && a.log.Enabled(context.Background(), slog.LevelDebug) {
		tk := k
		if op == chooseAllToAllv {
			tk = a.paths.vLast // (one agreement for all sizes: this rank's last)
		}
		t := a.paths.times(op, tk)
		path := "slots"
		if c.agreed == 2 {
			path = "cross-memory"
		}
		from := 0 // bytes per peer the class starts at
		if tk > 0 {
			from = 1 << (tk - 1)
		}
		a.log.Debug("shmcoll: path chosen", "rank", a.rank, "op", chosenNames[op], "from_bytes", from,
			"path", path, "slots_ns", t.est(0), "cma_ns", t.est(1))
	}
}

// pathStart begins timing a call whose path choosePath chose (timed), so
// that pathEnd can record it.
func (a *Arena) pathStart(timed bool) time.Time {
	if !timed {
		return time.Time{} // (the 4 KiB calls read no clock)
	}
	return time.Now()
}

// pathEnd records a timed call that succeeded under size class k, unless
// it read registered memory in place, which no choice changes.
func (a *Arena) pathEnd(op, k int, timed bool, start time.Time, err error) {
	if timed && err == nil && !a.regRead {
		a.paths.times(op, k).record(a.useCMA, time.Since(start))
	}
}

// pathChooser holds, per chosen operation and size class, this rank's
// recent call times on each path and the path the ranks agreed
// on (see choosePath).
type pathChooser struct {
	cls [numChosen][64]pathClass
	// AllToAllv's times, by class of this rank's largest block (its
	// schedule and agreement are class 0 of cls), and the class of its
	// last call.
	v     [64]pathTimes
	vLast int
}

// times is where op's calls of size class k record their times.
func (p *pathChooser) times(op, k int) *pathTimes {
	if op == chooseAllToAllv {
		return &p.v[k]
	}
	return &p.cls[op][k].pathTimes
}

// pathClass is one operation's size class. Each path's estimate is the
// second least of its last estWindow call times: not the mean, since a
// call that waited for a late peer says little about the path; not the
// least, since one lucky call of a path that is slow at most others would
// win it the vote (the 2-rank AllReduce by cross-memory copies under load,
// docs/tuning.md). Both paths' estimates come from as many calls,
// however rarely one of them runs (an estimate that kept the best call
// ever of the path tried in the exploring calls would favour it over the
// one that runs all the time). A path that became slower is abandoned
// once estWindow-1 of its last estWindow calls were slow.
type pathClass struct {
	pathTimes
	calls  uint32 // calls so far, the same on every rank
	agreed uint8  // the leader's last valid vote: 0 none, 1 the slots, 2 cross-memory

	// The exploration schedule (pick), the same on every rank: the call
	// that explores next (0: exploreEvery-1, the first), the gap to the
	// one after it, and the agreed path pick last saw.
	next, gap uint32
	seen      uint8
}

// pathTimes is a size class's last call times on each path.
type pathTimes struct {
	last [2][estWindow]int64 // ns; [0] the slots, [1] cross-memory; 0: no call
	n    [2]uint8            // calls recorded per path, modulo estWindow
}

// estWindow is how many of a path's last calls its estimate covers.
const estWindow = 4

// est is path i's estimate (0: no call yet): the second least of its last
// estWindow calls (the least while it has one).
func (c *pathTimes) est(i int) int64 {
	var m1, m2 int64 // the least and the second least
	for _, v := range c.last[i] {
		switch {
		case v == 0:
		case m1 == 0 || v < m1:
			m1, m2 = v, m1
		case m2 == 0 || v < m2:
			m2 = v
		}
	}
	if m2 == 0 {
		return m1
	}
	return m2
}

// pick says whether the next call uses cross-memory copies: the first
// call does, the second goes through the slots, later ones take the
// agreed path (cross-memory while there is none), except the exploring
// calls, which try the other so that the leader's estimate of it stays
// fresh. The first explores at call exploreEvery-1; each exploration that
// left the agreed path where it was doubles the gap to the next, up to
// exploreMax, and a change of the agreed path brings it back to
// exploreEvery: a path that keeps losing costs ever fewer calls (with more
// ranks than cores, cross-memory copies took twice as long as the slots),
// while a change, when the machine moved, is checked again soon. It
// depends only on what every rank has alike: the calls of the class, and
// the agreed path, which every rank holds the same at pick (the leader
// applies its vote after its pick; the others at the call's barrier).
func (c *pathClass) pick() bool {
	n := c.calls
	c.calls++
	switch n {
	case 0:
		return true
	case 1:
		return false
	}
	if c.next == 0 {
		c.next, c.gap = exploreEvery-1, exploreEvery
	}
	if c.agreed != c.seen {
		if c.seen != 0 { // a change of path, not the first agreement
			c.next, c.gap = n+exploreEvery-1, exploreEvery
		}
		c.seen = c.agreed
	}
	explore := n == c.next
	if explore {
		c.gap = min(2*c.gap, exploreMax)
		c.next = n + c.gap
	}
	return (c.agreed != 1) != explore
}

// vote is the leader's choice from its estimates, as desc bits: none until
// it timed both paths; where the two are about even (within 10 %), the
// path the operation prefers (slotsFirst), so that the vote does not flip
// back and forth on noise.
func (c *pathTimes) vote(slotsFirst bool) uint64 {
	slots, cma := c.est(0), c.est(1)
	if slots == 0 || cma == 0 {
		return 0
	}
	if slotsFirst && cma*slotsDen > slots*slotsNum || !slotsFirst && slots*slotsDen <= cma*slotsNum {
		return voteValid
	}
	return voteValid | voteCMA
}

// untried is a vote for a path with no time yet (the cross-memory copies
// first), 0 when both have one.
func (c *pathTimes) untried() uint64 {
	switch {
	case c.est(1) == 0:
		return voteValid | voteCMA
	case c.est(0) == 0:
		return voteValid
	}
	return 0
}

// slotsFirst says which path op keeps where the two are about even: the
// copy collectives cross-memory copies, which spare a copy and leave the
// slots to others; the 2-rank AllReduce the slots, since its cross-memory
// path measured as fast only at its best calls, and slower at most others
// (docs/tuning.md).
func slotsFirst(op int) bool { return op == chooseAllReduce }

// agree takes the leader's desc: its vote, if valid, is the agreed path.
func (c *pathClass) agree(desc uint64) {
	if desc&voteValid == 0 {
		return
	}
	c.agreed = 1
	if desc&voteCMA != 0 {
		c.agreed = 2
	}
}

// record takes a call that took d on the path cma says.
func (c *pathTimes) record(cma bool, d time.Duration) {
	i := 0
	if cma {
		i = 1
	}
	c.last[i][c.n[i]%estWindow] = max(d.Nanoseconds(), 1)
	c.n[i]++
}

// copyBlock is copyIn's piece size for ranks processes on this machine.
func copyBlock(ranks int) int {
	if ranks <= runtime.NumCPU() {
		return cachedBlock
	}
	return math.MaxInt
}
