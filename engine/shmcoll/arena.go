//go:build linux

package shmcoll

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport"
)

// livenessEvery is how often a sleeping waiter checks that the peer
// processes still run.
const livenessEvery = 100 * time.Millisecond

// Arena is one rank's intra-host collective engine. See the package
// documentation for the protocol.
type Arena struct {
	rank, size int
	tag        [8]byte
	file       *shmseg.OwnFile // the segment's memory file, open until Release
	ref        PeerInfo
	open       shmsync.Opener // Config.Open
	slot       int
	log        *slog.Logger
	policy     shmsync.Policy // PolicyFor(size), then PolicyAmong the connected ranks
	coloc      shmsync.Coloc  // the waits' record of sharing a core with the peers (Policy.Colocation)
	wait       shmsync.Policy // the current call's: policy, Goroutines unless Call.Locked
	noCMA      bool           // Config.NoCMA
	cma        bool           // every rank can read every peer's memory (decided at the first barrier)
	copyBlock  int            // copyBlock(size) (tests lower it)
	cmaReads   int            // process_vm_readv copies made (call goroutine; for tests)
	cmaWrites  int            // process_vm_writev copies made (likewise)
	useCMA     bool           // the current call may publish addresses (choosePath)
	regRead    bool           // the current call read registered memory in place (not timed)
	paths      pathChooser    // allgather/alltoall(v): slots or cross-memory copies
	gateWaits  atomic.Int32   // times closeGate found a peer writing (for tests)

	own  []byte     // own segment mapping
	me   *segment   // view of own
	segs []*segment // by rank, own included; set by Connect

	// State of the call in flight (one at a time, guarded by busy).
	phase      uint64    // last barrier phase this rank arrived at
	lag        bool      // the last barrier waited for some peers only (see settle)
	waitPhase  uint64    // the phase being waited for (check)
	piece      uint64    // data pieces so far: piece&1 is the buffer set
	cur        record    // the call's record
	terms      [][]byte  // scratch: one operand per rank
	chainTerms [][]byte  // scratch: ChainAllReduce's operands
	chainSeen  []bool    // scratch: ChainAllReduce's check of its order
	lastLive   time.Time // last liveness probe of the peers

	busy      atomic.Bool // a call is in flight (or Close owns the mappings)
	connected atomic.Bool
	closed    atomic.Bool
	aborted   atomic.Bool
	abortErr  error // set before aborted is stored

	shutMu   sync.Mutex // serialises Abort, Close and Connect
	unmapped bool

	// Registered buffers (alloc.go).
	allocMu  sync.Mutex                  // serialises Alloc and Free
	nextReg  uint64                      // last allocation id
	regs     atomic.Pointer[[]*regAlloc] // own allocations, copy on write
	peerRegs []map[uint64][]byte         // by rank: peers' allocations mapped here (call goroutine, then Close)
}

// Create makes, maps and pre-touches this rank's segment.
func Create(cfg Config) (*Arena, error) {
	if cfg.Size < 1 || cfg.Size > MaxRanks || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("%w: rank %d, size %d (at most %d ranks)", ErrInvalid, cfg.Rank, cfg.Size, MaxRanks)
	}
	slot := cfg.SlotBytes
	if slot == 0 {
		slot = DefaultSlotBytes
	}
	if slot < 0 || slot > MaxSlotBytes {
		return nil, fmt.Errorf("%w: slot size %d (at most %d)", ErrInvalid, slot, MaxSlotBytes)
	}
	slot = roundUp(max(slot, MinSlotBytes, 64*cfg.Size), pageSize)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Arena{
		rank:      cfg.Rank,
		size:      cfg.Size,
		tag:       cfg.Tag,
		open:      cfg.Open,
		slot:      slot,
		log:       log,
		policy:    shmsync.PolicyFor(cfg.Size),
		noCMA:     cfg.NoCMA,
		copyBlock: copyBlock(cfg.Size),
		terms:     make([][]byte, cfg.Size),
		peerRegs:  make([]map[uint64][]byte, cfg.Size),
	}
	m, fd, err := createSegment(cfg.Tag, cfg.Rank, cfg.Size, slot)
	if err != nil {
		return nil, fmt.Errorf("shmcoll: rank %d: %w", cfg.Rank, err)
	}
	a.own, a.file = m, shmseg.NewOwnFile(fd)
	if a.ref, err = shmsync.RefOf(fd); err != nil {
		syscall.Munmap(m)
		syscall.Close(fd)
		return nil, fmt.Errorf("shmcoll: rank %d: %w", cfg.Rank, err)
	}
	a.me = newSegment(a.rank, m, slot, shmsync.Self())
	log.Debug("shmcoll: segment created", "rank", a.rank, "file", a.ref, "slot", slot, "bytes", len(m))
	return a, nil
}

// Ref is where the peers' Connect finds this rank's segment (until
// Release).
func (a *Arena) Ref() PeerInfo { return a.ref }

// Rank is this rank; Size the number of ranks.
func (a *Arena) Rank() int { return a.rank }

// Size is the number of ranks.
func (a *Arena) Size() int { return a.size }

// SlotBytes is the effective slot size (Config.SlotBytes after rounding).
func (a *Arena) SlotBytes() int { return a.slot }

// Connect maps the segment of every other rank, which must all be in peers
// (entries for this rank are ignored), and verifies each header: magic,
// version, tag, rank, size, slot size, creator pid and that the creator
// still runs. It may be called once.
func (a *Arena) Connect(ctx context.Context, peers map[int]PeerInfo) error {
	a.shutMu.Lock()
	defer a.shutMu.Unlock()
	if err := a.localErr(); err != nil {
		return err
	}
	if a.connected.Load() {
		return fmt.Errorf("%w: Connect called twice", ErrInvalid)
	}
	for r := range peers {
		if r < 0 || r >= a.size {
			return fmt.Errorf("%w: peer rank %d out of range for size %d", ErrInvalid, r, a.size)
		}
	}
	segs := make([]*segment, a.size)
	segs[a.rank] = a.me
	fail := func(err error) error {
		for _, s := range segs {
			if s != nil && s != a.me {
				syscall.Munmap(s.m)
			}
		}
		return fmt.Errorf("shmcoll: rank %d connecting: %w", a.rank, err)
	}
	for r := range a.size {
		if r == a.rank {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		info, ok := peers[r]
		if !ok {
			return fail(fmt.Errorf("%w: no segment for rank %d", ErrInvalid, r))
		}
		s, err := openSegment(a.open, info, a.tag, r, a.size, a.slot)
		if err != nil {
			return fail(err)
		}
		segs[r] = s
		if s.remote && !s.proc.Alive() {
			return fail(&transport.PeerLostError{Peer: r, Reason: fmt.Sprintf("process %d is gone", s.proc.Pid), Dead: true})
		}
		if err := a.peerErr(s, math.MaxUint64); err != nil {
			return fail(err)
		}
	}
	a.segs = segs
	pids := make([]int, 0, len(segs))
	for _, s := range segs {
		pids = append(pids, s.proc.Pid)
	}
	a.policy = shmsync.PolicyAmong(a.size, pids)
	cma := !a.noCMA
	for _, s := range segs {
		cma = cma && (s == a.me || probeCMA(s))
	}
	// Published before this rank first arrives at a barrier, so every peer
	// reads it after passing that barrier (decideCMA).
	if cma {
		shmseg.Word(a.own, offCMA).Store(cmaOK)
	} else {
		shmseg.Word(a.own, offCMA).Store(cmaNo)
	}
	a.lastLive = time.Now()
	a.connected.Store(true)
	a.log.Debug("shmcoll: connected", "rank", a.rank, "size", a.size)
	return nil
}

// Release closes the descriptor through which peers open this rank's
// segment; the mappings stay valid. Call it once every rank connected.
// Idempotent; Close releases too.
func (a *Arena) Release() { a.file.Release() }

// Abort stops this rank: pending and later calls fail with an error
// wrapping transport.ErrAborted, and the failure is recorded in the segment
// so that every peer's pending or next call fails too (with
// transport.ErrRemoteAbort and the reason, or transport.ErrPeerLost when
// reason relays a lost rank, plus transport.ErrMismatch when reason wraps
// it). Only the first Abort counts; after Close it does nothing.
func (a *Arena) Abort(reason error) {
	if reason == nil {
		reason = errors.New("aborted")
	}
	a.shutMu.Lock()
	defer a.shutMu.Unlock()
	if a.closed.Load() || a.aborted.Load() {
		return
	}
	a.abortErr = fmt.Errorf("shmcoll: rank %d: %w: %v", a.rank, transport.ErrAborted, reason)
	a.aborted.Store(true)
	f := transport.FailureOf(a.rank, reason)
	shmseg.Header(a.own).Fail(f, errors.Is(reason, transport.ErrMismatch))
	a.log.Debug("shmcoll: abort", "rank", a.rank, "origin", f.Origin, "reason", f.Reason)
	a.wakeAll()
}

// wakeAll wakes every sleeper on any arrival counter this rank can see:
// peers waiting on this rank, and waiters here and in other processes
// sleeping on a third rank, who then re-check every state word.
func (a *Arena) wakeAll() {
	for _, s := range a.segs {
		if s != nil {
			shmsync.WakeAll(s.arrive[0])
			shmsync.WakeAll(s.arrive[1])
		}
	}
	if a.segs == nil && a.me != nil { // not connected yet
		shmsync.WakeAll(a.me.arrive[0])
		shmsync.WakeAll(a.me.arrive[1])
	}
}

// Close marks the segment closed (peers still waiting on this rank fail
// with transport.ErrPeerLost), fails a pending call with ErrClosed, waits
// for it to leave, then unmaps and releases the segment. Idempotent.
func (a *Arena) Close() error {
	a.shutMu.Lock()
	if a.closed.Load() {
		a.shutMu.Unlock()
		return nil
	}
	a.closed.Store(true)
	if !a.aborted.Load() {
		a.me.state.Store(shmseg.StateClosed)
	}
	a.wakeAll()
	a.shutMu.Unlock()
	// Wait for a call in flight to notice and leave; then keep busy set so
	// that nothing touches the mappings again.
	for i := 0; !a.busy.CompareAndSwap(false, true); i++ {
		time.Sleep(time.Duration(min(i+1, 10)) * 100 * time.Microsecond)
		a.shutMu.Lock()
		a.wakeAll()
		a.shutMu.Unlock()
	}
	a.shutMu.Lock()
	defer a.shutMu.Unlock()
	for _, s := range a.segs {
		if s != nil && s != a.me {
			syscall.Munmap(s.m)
		}
	}
	a.segs = nil
	a.unmapPeerRegs()
	syscall.Munmap(a.own)
	a.own, a.me = nil, nil
	a.unmapped = true
	a.file.Release()
	a.log.Debug("shmcoll: closed", "rank", a.rank)
	return nil
}

func (a *Arena) localErr() error {
	if a.aborted.Load() {
		return a.abortErr
	}
	if a.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Collective kinds, for the record's descriptor.
const (
	kindBarrier uint64 = iota + 1
	kindAllReduce
	kindReduce
	kindBroadcast
	kindAllGather
	kindReduceScatter
	kindAllToAll
	kindAllToAllv
	kindChain
)

var kindNames = [...]string{"", "barrier", "allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall", "alltoallv", "chain allreduce"}

func desc(kind uint64, dt kernel.DataType, op kernel.RedOp, root int) uint64 {
	return kind | uint64(uint8(dt))<<8 | uint64(uint8(op))<<16 | uint64(uint32(root+1))<<32
}

// begin starts a call: it takes the arena and sets the record that every
// barrier of the call publishes. On success the caller must call end.
func (a *Arena) begin(c Call, nbytes int, d uint64) error {
	if err := a.localErr(); err != nil {
		return err
	}
	if !a.busy.CompareAndSwap(false, true) {
		if err := a.localErr(); err != nil {
			return err
		}
		return fmt.Errorf("%w: concurrent calls on one arena (rank %d)", ErrInvalid, a.rank)
	}
	if err := a.localErr(); err != nil {
		a.busy.Store(false)
		return err
	}
	if !a.connected.Load() {
		a.busy.Store(false)
		return fmt.Errorf("%w: rank %d: not connected", ErrInvalid, a.rank)
	}
	a.cur = record{id: callID{seq: c.Seq, sig: c.Sig, nbytes: uint64(nbytes), desc: d}}
	a.useCMA, a.regRead = true, false
	a.wait = a.policy
	a.wait.Goroutines = !c.Locked
	a.wait.Coloc = &a.coloc
	// A peer that aborted or closed will not join this call. (Cheap: the
	// state lines are only written on failure, so they stay cached.) But
	// in a broadcast, ranks return without waiting for everyone
	// (barrierFrom): a peer that closed after it arrived at this call's
	// barrier did its part.
	need := uint64(math.MaxUint64)
	if d&0xff == kindBroadcast {
		need = a.phase + 1
	}
	for _, s := range a.segs {
		if s != a.me {
			if err := a.peerErr(s, need); err != nil {
				err = a.fail(fmt.Errorf("shmcoll: rank %d: %s #%d: %w", a.rank, kindNames[d&0xff], c.Seq, err))
				a.busy.Store(false)
				return err
			}
		}
	}
	return nil
}

func (a *Arena) end() { a.busy.Store(false) }

// nextSet returns the buffer set of the next data piece, once the piece may
// write this rank's slot of it (settle).
func (a *Arena) nextSet(ctx context.Context) (int, error) {
	if err := a.settle(ctx); err != nil {
		return 0, err
	}
	a.piece++
	return int(a.piece & 1), nil
}

// barrier publishes this rank's arrival at the next phase and waits until
// every peer arrived there with the same call record.
func (a *Arena) barrier(ctx context.Context) error {
	return a.barrierDoing(ctx, nil)
}

// barrierDoing is barrier running meanwhile, if not nil, between its
// arrival and the wait for the peers: work of this rank's own that the
// peers do not wait for.
func (a *Arena) barrierDoing(ctx context.Context, meanwhile func()) error {
	p, err := a.arrive(ctx)
	if err != nil {
		return err
	}
	if meanwhile != nil {
		meanwhile()
	}
	for k := 1; k < a.size; k++ {
		j := a.rank + k
		if j >= a.size {
			j -= a.size
		}
		if err := a.meet(ctx, a.segs[j], p, a.cur.id); err != nil {
			return err
		}
	}
	if p == 1 {
		a.decideCMA()
	}
	return nil
}

// arrive publishes this rank's arrival at the next phase with the call's
// record, once it may (settle), and returns the phase.
func (a *Arena) arrive(ctx context.Context) (uint64, error) {
	if err := a.localErr(); err != nil { // Abort or Close during a long call
		return 0, err
	}
	if err := a.settle(ctx); err != nil {
		return 0, err
	}
	a.phase++
	p := a.phase
	*a.me.recs[p&1] = a.cur
	shmsync.Publish(a.me.arrive[p&1], a.me.waiters, p)
	return p, nil
}

// meet waits until peer s arrived at phase p and checks that its record of
// p is want.
func (a *Arena) meet(ctx context.Context, s *segment, p uint64, want callID) error {
	if s.arrive[p&1].Load() < p {
		if err := a.await(ctx, s, p); err != nil {
			return a.fail(err)
		}
	}
	got := s.recs[p&1].id
	if !sameCall(got, want) {
		return a.fail(a.mismatch(s.rank, got, want))
	}
	if got.desc&voteValid != 0 {
		a.takeVote(got.desc)
	}
	return nil
}

// barrierFrom publishes this rank's arrival at the next phase, like
// barrier, but waits only for root's (a Broadcast's non-roots need nothing
// from each other, and the root needs nothing from anyone): with more
// ranks than cores, a full barrier there also waits for every descheduled
// rank to run once. The ranks that did not wait for everyone settle before
// they next write a slot or publish a phase.
func (a *Arena) barrierFrom(ctx context.Context, root int) error {
	if a.phase == 0 {
		return a.barrier(ctx) // the first one decides cross-memory reads: all must have arrived
	}
	p, err := a.arrive(ctx)
	if err != nil {
		return err
	}
	if a.rank != root {
		if err := a.meet(ctx, a.segs[root], p, a.cur.id); err != nil {
			return err
		}
	}
	a.lag = a.rank == root || a.size > 2
	return nil
}

// settle waits, after a barrier that did not wait for every peer, until
// every peer arrived at that barrier's phase P, and checks their records of
// it. That restores what full barriers keep by themselves, and what the
// protocol rests on: no rank is more than one phase ahead of another, so a
// rank about to publish phase P+1 (overwriting its record of P-1) or to
// write a slot (last read in a piece before P) knows that every peer is
// done with both. (A peer cannot be past P+1 meanwhile, so its record of P
// is still there.)
func (a *Arena) settle(ctx context.Context) error {
	if !a.lag {
		return nil
	}
	p := a.phase
	mine := a.me.recs[p&1].id
	for _, s := range a.segs {
		if s != a.me {
			if err := a.meet(ctx, s, p, mine); err != nil {
				return err
			}
		}
	}
	a.lag = false
	return nil
}

// decideCMA turns cross-memory reads on when every rank could read every
// peer; it runs once every rank arrived at the first barrier, when all the
// probe results are published, so all ranks decide alike.
func (a *Arena) decideCMA() {
	ok := true
	for _, s := range a.segs {
		ok = ok && shmseg.Word(s.m, offCMA).Load() == cmaOK
	}
	a.cma = ok
	a.log.Debug("shmcoll: cross-memory reads", "rank", a.rank, "on", ok)
}

// publishAddr says whether this rank lets peers read buf out of its process
// rather than copying it into its slot, where each peer would read per
// bytes of it in the current piece, and records buf's address if so: only
// where cross-memory reads are on and the call's path allows them
// (choosePath).
func (a *Arena) publishAddr(buf []byte, per int) bool {
	if !a.cma || !a.useCMA || per < cmaFloor || len(buf) == 0 {
		a.cur.addr = 0 // (an earlier piece of the call may have published it)
		return false
	}
	a.cur.addr = addrOf(buf)
	return true
}

// await waits for rank s.rank to arrive at phase p (it is at p-1, so its
// counter for p's parity holds p-2, or 0 before its first arrivals).
func (a *Arena) await(ctx context.Context, s *segment, p uint64) error {
	a.waitPhase = p
	err := a.wait.Await(ctx, s.arrive[p&1], s.waiters, p-min(p, 2), a.check)
	if err == nil {
		return nil
	}
	if errors.Is(err, transport.ErrAborted) || err == ErrClosed {
		return err // this rank's own doing, already explained
	}
	// The context's error, or a peer that aborted, closed or died: the
	// check looks at every peer, so the rank that failed may not be the
	// one this rank waited for, and must come first in the message.
	name, seq := kindNames[a.cur.id.desc&0xff], a.cur.id.seq
	if failed := failedRank(err); failed >= 0 && failed != s.rank {
		return fmt.Errorf("shmcoll: rank %d: %s #%d: rank %d failed while this rank waited for rank %d: %w",
			a.rank, name, seq, failed, s.rank, err)
	}
	return fmt.Errorf("shmcoll: rank %d: %s #%d waiting for rank %d: %w", a.rank, name, seq, s.rank, err)
}

// failedRank is the rank a peer failure names (lost, or where an abort
// started), or -1.
func failedRank(err error) int {
	var ple *transport.PeerLostError
	if errors.As(err, &ple) {
		return ple.Peer
	}
	var rae *transport.RemoteAbortError
	if errors.As(err, &rae) {
		return rae.Peer
	}
	return -1
}

// check runs before every futex sleep: local abort or close, every peer's
// state, and every livenessEvery the peer processes.
func (a *Arena) check() error {
	if err := a.localErr(); err != nil {
		return err
	}
	for _, s := range a.segs {
		if s != a.me {
			if err := a.peerErr(s, a.waitPhase); err != nil {
				return err
			}
		}
	}
	if now := time.Now(); now.Sub(a.lastLive) >= livenessEvery {
		a.lastLive = now
		for _, s := range a.segs {
			// A process that exited after it arrived at the phase waited
			// for did its part (a broadcast's root returns at once); the
			// first wait that needs more of it reports it lost.
			if s.remote && s.arrived() < a.waitPhase && !s.proc.Alive() {
				a.log.Warn("shmcoll: peer process gone", "rank", a.rank, "peer", s.rank, "pid", s.proc.Pid)
				return &transport.PeerLostError{Peer: s.rank, Reason: fmt.Sprintf("process %d exited", s.proc.Pid), Dead: true}
			}
		}
	}
	return nil
}

// peerErr reports a peer that aborted, from its state word, or one that
// closed before it arrived at phase need: a rank may close once its last
// call no longer needs it, while slower peers finish theirs (their reads of
// its segment go on through their own mappings).
func (a *Arena) peerErr(s *segment, need uint64) error {
	switch s.state.Load() {
	case shmseg.StateClosed:
		if s.arrived() >= need {
			return nil
		}
		return &transport.PeerLostError{Peer: s.rank, Reason: "it closed its arena"}
	case shmseg.StateAborted:
		f, mismatch := shmseg.Header(s.m).Failure()
		err := f.Err()
		if mismatch {
			return fmt.Errorf("%w (%w)", transport.ErrMismatch, err)
		}
		return err
	}
	return nil
}

// fail aborts the arena with err (so that the peers learn) and returns it.
func (a *Arena) fail(err error) error {
	if !errors.Is(err, transport.ErrAborted) && err != ErrClosed {
		a.Abort(err)
	}
	return err
}

func (a *Arena) mismatch(peer int, got, mine callID) error {
	return fmt.Errorf("shmcoll: rank %d: %w: rank %d is in %s, this rank in %s",
		a.rank, transport.ErrMismatch, peer, describe(got), describe(mine))
}

func describe(r callID) string {
	kind := r.desc & 0xff
	name := fmt.Sprintf("collective kind %d", kind)
	if kind < uint64(len(kindNames)) {
		name = kindNames[kind]
	}
	s := fmt.Sprintf("%s #%d (signature %016x, %d bytes", name, r.seq, r.sig, r.nbytes)
	switch kind {
	case kindAllReduce, kindReduce, kindReduceScatter, kindChain:
		s += fmt.Sprintf(", %v %v", kernel.DataType(uint8(r.desc>>8)), kernel.RedOp(uint8(r.desc>>16)))
	}
	if root := int(uint32(r.desc&^descDirect>>32)) - 1; root >= 0 && kind != kindChain {
		s += fmt.Sprintf(", root %d", root)
	} else if root >= 0 {
		s += fmt.Sprintf(", chain order %08x", root) // (orderKey)
	}
	if r.desc&descDirect != 0 {
		s += ", by cross-memory copies"
	}
	return s + ")"
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }
