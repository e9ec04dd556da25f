//go:build linux

package shmcoll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport"
)

// canCMA says whether this process may read its own memory with
// process_vm_readv, which decides, in these tests, whether arenas should
// turn cross-memory reads on (a seccomp profile may forbid it).
func canCMA() bool {
	src := []byte("gocoll")
	dst := make([]byte, len(src))
	return readRemote(os.Getpid(), dst, addrOf(src)) == nil && string(dst) == "gocoll"
}

// cmaSlot: slots just large enough for every rank count's threshold, so
// that the cases run in several pieces without taking long (under -race).
const cmaSlot = 256 << 10

// cmaCases: the collectives that read peers' buffers out of their
// processes, with blocks above every rank count's threshold (the first
// count leaves a last piece of 12 bytes, which goes through the slot), in
// several pieces and in place, from plain and (on even ranks) registered
// memory.
func cmaCases(n int) []tcase {
	var out []tcase
	for _, kind := range []string{"allgather", "alltoall", "broadcast"} {
		for _, count := range []int{(64<<10)/4 + 3, (cmaSlot/n)/4*2 + 5} {
			for _, inPlace := range []bool{false, true} {
				for _, reg := range []bool{false, true} {
					out = append(out, tcase{kind: kind, dt: kernel.Float32, op: kernel.Sum, count: count, root: n - 1, inPlace: inPlace, reg: reg})
				}
			}
		}
	}
	return out
}

// TestCMA: every rank turns cross-memory reads on at the first barrier
// exactly when the process may use them, the collectives that use them
// deliver the reference results, and they did use them (the first call of
// a size class always tries them, at any rank count).
func TestCMA(t *testing.T) {
	want := canCMA()
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			w := newWorld(t, n, cmaSlot)
			checkWorld(t, w, cmaCases(n), 1)
			used := want
			for r, a := range w.arenas {
				if a.cma != want {
					t.Errorf("rank %d: cross-memory reads %v, process_vm_readv works: %v", r, a.cma, want)
				}
				if used != (a.cmaReads > 0) {
					t.Errorf("rank %d: %d process_vm_readv copies made; %d ranks, allowed %v", r, a.cmaReads, n, want)
				}
				// A 2-rank broadcast's root writes half of the data.
				if isRoot := r == n-1; want && n == 2 && isRoot != (a.cmaWrites > 0) {
					t.Errorf("rank %d: %d process_vm_writev copies made, root %v", r, a.cmaWrites, isRoot)
				}
			}
		})
	}
}

// TestNoCMA: one rank configured without cross-memory reads turns them off
// for all, and the data then goes through the slots.
func TestNoCMA(t *testing.T) {
	n := 3
	w := newWorldOf(t, n, groupMaker{slot: cmaSlot, noCMA: func(r int) bool { return r == 1 }})
	checkWorld(t, w, cmaCases(n), 1)
	for r, a := range w.arenas {
		if a.cma || a.cmaReads != 0 {
			t.Errorf("rank %d: cross-memory reads on (%d copies) though rank 1 said no", r, a.cmaReads)
		}
		// The override wins before any timing: no call was counted.
		for op := range a.paths.cls {
			for k, c := range a.paths.cls[op] {
				if c.calls != 0 || c.est(0) != 0 || c.est(1) != 0 {
					t.Errorf("rank %d: op %d class %d timed with cross-memory reads off: %+v", r, op, k, c)
				}
			}
		}
		for k, c := range a.paths.v {
			if c.est(0) != 0 || c.est(1) != 0 {
				t.Errorf("rank %d: alltoallv size class %d timed with cross-memory reads off: %+v", r, k, c)
			}
		}
	}
}

// TestCMAPeerGone: a read from a process that no longer exists fails the
// call with ErrPeerLost naming the peer, and aborts the arena.
func TestCMAPeerGone(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv not permitted here")
	}
	w := newWorld(t, 2, 0)
	if errs := w.run(func(r int, a *Arena) error { return a.Barrier(context.Background(), Call{Seq: 1}) }); errs[0] != nil || errs[1] != nil {
		t.Fatal(errorsText(errs))
	}
	// Pretend rank 1 lives in a process that has exited and published an
	// address for this piece.
	a := w.arenas[0]
	a.segs[1].proc.Pid = exitedPid(t)
	a.segs[1].recs[a.phase&1].addr = addrOf(make([]byte, 1))
	err := a.fetch(make([]byte, 64), 1, 0, 0, 0, 64, 64)
	var lost *transport.PeerLostError
	if !errors.As(err, &lost) || lost.Peer != 1 {
		t.Fatalf("fetch from an exited process: %v, want a PeerLostError for rank 1", err)
	}
	if err := a.Barrier(context.Background(), Call{Seq: 2}); !errors.Is(err, transport.ErrAborted) {
		t.Fatalf("next call: %v, want ErrAborted", err)
	}
}

// exitedPid returns the pid of a child that has exited and been reaped.
func exitedPid(t *testing.T) int {
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Skip(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	// Give a pid reuse no chance to matter: it would need the pid space to
	// wrap within the test.
	time.Sleep(time.Millisecond)
	if err := syscall.Kill(p.Pid, 0); err == nil {
		t.Skip("pid reused")
	}
	return p.Pid
}

// TestStoreGate: a 2-rank broadcast's root writes half of the data into
// its peer's buffer; the peer must not leave the call while that write may
// still run (its caller could free the buffer), and the root must not
// write once the peer left.
func TestStoreGate(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	const n = 64 << 10
	ctx := context.Background()
	setup := func(t *testing.T) *world {
		w := newWorld(t, 2, cmaSlot)
		// The first call decides cross-memory copies: every rank takes part.
		for _, err := range w.run(func(r int, a *Arena) error { return bcast(ctx, a, 1, n, 0) }) {
			if err != nil {
				t.Fatal(err)
			}
		}
		return w
	}
	// Rank 1 fails (its root does not come) while the root holds its gate,
	// as in the middle of the write: rank 1 returns only once the gate is
	// released.
	t.Run("peer waits", func(t *testing.T) {
		w := setup(t)
		p := w.arenas[1].phase + 1 // the phase rank 1 publishes its address at
		if !w.arenas[0].claimStore(1, p) {
			t.Fatal("gate closed before the call")
		}
		early, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- w.arenas[1].Broadcast(early, Call{Seq: 2, Sig: 7}, make([]byte, n), 0) }()
		proctest.Until(t, time.Minute, "rank 1 waiting at its gate or returned", func() bool {
			return w.arenas[1].gateWaits.Load() > 0 || len(done) > 0
		})
		select {
		case err := <-done:
			t.Fatalf("rank 1 returned (%v) while the root held its store gate", err)
		default:
		}
		w.arenas[1].segs[1].gate.Store(p << 2) // the root's release
		if err := <-done; err == nil {
			t.Fatal("rank 1's broadcast succeeded without its root")
		}
		if w.arenas[0].claimStore(1, p) {
			t.Error("the root could claim the gate of a phase rank 1 gave up on")
		}
	})
	// The same in a 2-rank AllReduce by cross-memory copies, where each
	// rank writes half of the result into the other's recv.
	t.Run("allreduce peer waits", func(t *testing.T) {
		w := setup(t)
		a := w.arenas[1]
		cl := &a.paths.cls[chooseAllReduce][bits.Len(n/2)]
		cl.calls, cl.next, cl.agreed, cl.seen = 2, 1<<30, 2, 2 // cross-memory agreed
		p := a.phase + 1
		if !w.arenas[0].claimStore(1, p) {
			t.Fatal("gate closed before the call")
		}
		early, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			b := make([]byte, n)
			done <- a.AllReduce(early, Call{Seq: 2, Sig: 7}, b, b, kernel.Float32, kernel.Sum)
		}()
		proctest.Until(t, time.Minute, "rank 1 waiting at its gate or returned", func() bool {
			return a.gateWaits.Load() > 0 || len(done) > 0
		})
		select {
		case err := <-done:
			t.Fatalf("rank 1 returned (%v) while rank 0 held its store gate", err)
		default:
		}
		a.segs[1].gate.Store(p << 2) // rank 0's release
		if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rank 1's allreduce without rank 0: %v, want its deadline", err)
		}
		if w.arenas[0].claimStore(1, p) {
			t.Error("rank 0 could claim the gate of a phase rank 1 gave up on")
		}
	})
	// Once rank 1 gave up on the phase, the root does not write.
	t.Run("root refrains", func(t *testing.T) {
		w := setup(t)
		p := w.arenas[0].phase // the phase store writes for
		mine := make([]byte, n)
		w.arenas[1].me.recs[p&1].addr = addrOf(mine) // where rank 1's record would send the write
		w.arenas[1].closeGate(p, 0)
		if err := w.arenas[0].store(1, bytes.Repeat([]byte{0xab}, n), addrOf(mine)); err != nil {
			t.Fatal(err)
		}
		if i := bytes.IndexByte(mine, 0xab); i >= 0 || w.arenas[0].cmaWrites != 0 {
			t.Errorf("the root wrote (%d copies) after rank 1 gave up on the phase", w.arenas[0].cmaWrites)
		}
		runtime.KeepAlive(mine)
	})
}

// TestPathChooser pins the chooser's rules as data: the first call of a
// class copies out of the process, the second through the slots, then the
// agreed path, with the exploring calls on the other: the first at
// exploreEvery-1, then at gaps that double up to exploreMax while the
// agreement holds, and exploreEvery again after it changed; the leader
// votes only once it timed both paths, for the slots only when they are
// 10 % faster; an estimate is the second least of the path's last
// estWindow calls, so that a path that became slower is abandoned and one
// lucky call does not win a vote.
func TestPathChooser(t *testing.T) {
	const v, vc = voteValid, voteValid | voteCMA
	// The slots take half the copies' time until call 200, when they
	// become 4.5 times the copies' (the cores moved apart). The vote is the
	// slots from call 2 (the leader timed both), agreed from call 3 on;
	// the calls explore the copies at 7, then 16, 32, 64 and 64 calls
	// later. From 200 the slots' estimate (the second least of their
	// last estWindow calls) is 900 after 3 slow calls: call 203's vote
	// flips, and call 204 takes the copies, exploring the slots 8, 16 and
	// 32 calls after it.
	explores := map[int]bool{7: true, 23: true, 55: true, 119: true, 183: true, 211: true, 227: true, 259: true}
	const flip, voted = 200, 203
	var c pathClass
	for i := range 300 {
		wantPick := explores[i] != (i >= voted+1) // (true: cross-memory)
		wantVote, wantAgreed := uint64(v), uint8(1)
		switch {
		case i < 2:
			wantPick = i == 0
			wantVote, wantAgreed = 0, 0
		case i == 2:
			wantPick = true // no agreement yet at its start
		case i >= voted:
			wantVote, wantAgreed = vc, 2
		}
		got := c.pick()
		vote := c.vote(false)
		if got != wantPick || vote != wantVote {
			t.Fatalf("call %d: cross-memory %v, vote %#x; want %v, %#x (estimates %d, %d)", i, got, vote, wantPick, wantVote, c.est(0), c.est(1))
		}
		c.agree(vote | 7) // (other desc bits do not matter)
		took := int64(200)
		if !got {
			took = 100
			if i >= flip {
				took = 900
			}
		}
		c.record(got, time.Duration(took))
		if c.agreed != wantAgreed {
			t.Fatalf("call %d: agreed %d, want %d", i, c.agreed, wantAgreed)
		}
	}
	// The estimate rules: the second least of the last estWindow calls,
	// the least while there is one.
	var e pathClass
	for i, m := range []struct{ took, want int64 }{
		{100, 100}, {100, 100}, {900, 100}, {900, 100}, // 2 slow calls of 4
		{900, 900},          // 3 slow calls of 4: abandoned
		{50, 900}, {50, 50}, // one lucky call does not move it, two do
	} {
		e.record(false, time.Duration(m.took))
		if got := e.est(0); got != m.want {
			t.Errorf("after call %d (%d ns): estimate %d, want %d", i, m.took, got, m.want)
		}
	}
	// Within 10 %, the path the operation prefers keeps the vote: the
	// copies for the copy collectives, the slots for the AllReduce.
	for _, m := range []struct {
		slots, cma int64
		slotsFirst bool
		want       uint64
	}{
		{91, 100, false, vc}, {90, 100, false, v},
		{100, 91, true, v}, {100, 90, true, vc},
	} {
		setEst(&e.pathTimes, m.slots, m.cma)
		if got := e.vote(m.slotsFirst); got != m.want {
			t.Errorf("slots %d, cross-memory %d, slots first %v: vote %#x, want %#x", m.slots, m.cma, m.slotsFirst, got, m.want)
		}
	}
	// An invalid vote leaves the agreement alone.
	e.agreed = 2
	e.agree(voteCMA)
	if e.agreed != 2 {
		t.Errorf("invalid vote changed the agreement to %d", e.agreed)
	}
}

// setEst makes c's estimates slots and cma, as if every call of its window
// took that long.
func setEst(c *pathTimes, slots, cma int64) {
	for i := range estWindow {
		c.last[0][i], c.last[1][i] = slots, cma
	}
}

// TestPathAgreed: ranks whose own estimates point different ways still
// take the same path in every call, the leader's (rank 0's), except in
// the calls that explore; the ranks' votes are not part of the records'
// comparison. Run at 2 and 3 ranks, AllGather and AllToAll, and for a
// 2-rank Broadcast, whose leader is the root's peer: with root 1, rank 0.
func TestPathAgreed(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	for _, n := range []int{2, 3} {
		for _, kind := range []string{"allgather", "alltoall", "broadcast"} {
			if kind == "broadcast" && n != 2 {
				continue
			}
			t.Run(fmt.Sprintf("%s/n=%d", kind, n), func(t *testing.T) {
				w := newWorld(t, n, cmaSlot)
				const count = (64 << 10) / 4 // a 64 KiB block per rank
				// The first call decides cross-memory copies.
				checkWorld(t, w, []tcase{{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4}}, 1)
				op := map[string]int{"allgather": chooseAllGather, "alltoall": chooseAllToAll, "broadcast": chooseBroadcast}[kind]
				k := bits.Len(count * 4)
				for _, a := range w.arenas {
					a.paths.cls[op][k].calls = 2 // past the first two calls
				}
				for call := 2; call < 3*exploreEvery+2; call++ {
					before := make([]int, n)
					for r, a := range w.arenas {
						before[r] = a.cmaReads + a.cmaWrites
						// What each rank measured (not timed here: set
						// before every call).
						if c := &a.paths.cls[op][k]; r == 0 {
							setEst(&c.pathTimes, 1, 1<<40) // the slots far faster
						} else {
							setEst(&c.pathTimes, 1<<40, 1) // the other way round
						}
					}
					checkWorld(t, w, []tcase{{kind: kind, dt: kernel.Float32, op: kernel.Sum, count: count, root: n - 1}}, 1)
					// Call 2 has no agreement yet (cross-memory); from
					// call 3 the leader's vote, the slots, but for the
					// exploring calls (the gap doubles after the first).
					want := call == 2 || call == exploreEvery-1 || call == 3*exploreEvery-1
					for r, a := range w.arenas {
						if got := a.cmaReads+a.cmaWrites > before[r]; got != want {
							t.Fatalf("call %d, rank %d: cross-memory reads %v, want %v", call, r, got, want)
						}
						if got := a.paths.cls[op][k].agreed; call > 2 && got != 1 {
							t.Fatalf("call %d, rank %d: agreed %d, want the slots (1)", call, r, got)
						}
					}
				}
			})
		}
	}
}

// TestPathRegisteredUntimed: a call in which a rank's registered buffer is
// read in place counts for the exploration schedule on every rank but
// gives no rank an estimate: that path is taken whatever the choice.
func TestPathRegisteredUntimed(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	w := newWorld(t, 2, cmaSlot)
	const count = (64 << 10) / 4 // 64 KiB per rank: registered memory is read in place
	checkWorld(t, w, []tcase{{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4}}, 1)
	cases := []tcase{
		{kind: "allgather", dt: kernel.Float32, op: kernel.Sum, count: count, reg: true},
		{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: count, root: 0, reg: true},
	}
	checkWorld(t, w, cases, 3)
	k := bits.Len(count * 4)
	for r, a := range w.arenas {
		for _, op := range []int{chooseAllGather, chooseBroadcast} {
			c := &a.paths.cls[op][k]
			if c.calls == 0 || c.est(0) != 0 || c.est(1) != 0 {
				t.Errorf("rank %d, op %d: %d calls counted, estimates %d, %d; want calls, no estimate", r, op, c.calls, c.est(0), c.est(1))
			}
		}
	}
}

// TestAllReduceDirectBitwise: a 2-rank AllReduce gives the same bits on
// either path, the slots or cross-memory copies (reduceDirect): random
// floats, in place or not, over several blocks and a short last one, from
// plain and (rank 0) registered memory. The path is set as the agreed
// one, and each call checked to have taken it.
func TestAllReduceDirectBitwise(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	w := newWorld(t, 2, cmaSlot)
	checkWorld(t, w, []tcase{{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4}}, 1)
	ctx := context.Background()
	seq := uint64(10)
	types := []kernel.DataType{kernel.Float32, kernel.Float64, kernel.Float16, kernel.Bfloat16}
	ops := []kernel.RedOp{kernel.Sum, kernel.Prod, kernel.Avg, kernel.Max}
	if raceEnabled {
		// Every path once for the race detector (the types and ops only
		// change the kernel called): the plain run checks the bits.
		types, ops = types[2:3], ops[2:3]
	}
	for _, dt := range types {
		for _, op := range ops {
			for _, count := range []int{(40 << 10) / dt.Size(), 3*cmaSlot/dt.Size() + 7} {
				for _, v := range []struct{ inPlace, reg bool }{{false, false}, {true, false}, {false, true}} {
					c := tcase{kind: "allreduce", dt: dt, op: op, count: count, random: true, inPlace: v.inPlace, reg: v.reg}
					k := bits.Len(uint(count * dt.Size() / 2))
					var hashes [2][2]uint64
					seq++ // (the same data on both paths)
					for p, cma := range []bool{false, true} {
						errs := w.run(func(r int, a *Arena) error {
							// The agreed path, as every rank holds it,
							// with no exploration soon and the leader's
							// estimates for it.
							cl := &a.paths.cls[chooseAllReduce][k]
							cl.calls, cl.next = max(cl.calls, 2), 1<<30
							cl.agreed, cl.seen = uint8(1+p), uint8(1+p)
							if cma {
								setEst(&cl.pathTimes, 1<<40, 1)
							} else {
								setEst(&cl.pathTimes, 1, 1<<40)
							}
							before := a.cmaReads
							h, err := runCase(ctx, a, seq, c)
							if err != nil {
								return err
							}
							hashes[p][r] = h
							if got := a.cmaReads > before; got != cma {
								return fmt.Errorf("rank %d: cross-memory reads %v, want %v", r, got, cma)
							}
							return nil
						})
						if err := errorsText(errs); err != "" {
							t.Fatalf("%v, cross-memory %v:%s", c, cma, err)
						}
					}
					if hashes[0] != hashes[1] || hashes[0][0] != hashes[0][1] {
						t.Errorf("%v: hashes by path and rank %x differ", c, hashes)
					}
				}
			}
		}
	}
}

// TestAllReduceDirectDisagree: ranks that took different paths for a
// 2-rank AllReduce (which the chooser never lets happen) fail with a
// mismatch at the first barrier instead of waiting at different ones.
func TestAllReduceDirectDisagree(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	w := newWorld(t, 2, cmaSlot)
	checkWorld(t, w, []tcase{{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4}}, 1)
	const n = 1 << 20
	k := bits.Len(n / 2)
	errs := w.run(func(r int, a *Arena) error {
		cl := &a.paths.cls[chooseAllReduce][k]
		cl.calls, cl.next = 2, 1<<30
		cl.agreed, cl.seen = uint8(1+r), uint8(1+r) // rank 0 the slots, rank 1 cross-memory
		setEst(&cl.pathTimes, 1, 1<<40)
		b := make([]byte, n)
		return a.AllReduce(context.Background(), Call{Seq: 7}, b, b, kernel.Float32, kernel.Sum)
	})
	for r, err := range errs {
		if !errors.Is(err, transport.ErrMismatch) {
			t.Errorf("rank %d: %v, want a mismatch", r, err)
		}
	}
}

// TestPathAllToAllvSizes: AllToAllv's ranks count their calls in one
// class (their sizes differ), but the leader votes from its times at the
// size of the call. A size it has no time for yet has each path tried
// (the cross-memory copies first) before the vote follows that size's
// times, never those of another size (a 16 MiB AllToAllv once kept the
// path a 1 MiB one had chosen, its times compared with the other size's).
func TestPathAllToAllvSizes(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	w := newWorld(t, 2, cmaSlot)
	checkWorld(t, w, []tcase{{kind: "broadcast", dt: kernel.Float32, op: kernel.Sum, count: 4}}, 1)
	for _, a := range w.arenas {
		a.paths.cls[chooseAllToAllv][0].calls = 2 // past the first two calls
	}
	small, big := 2*cmaFloor, 16*cmaFloor
	ks, kb := bits.Len(uint(small)), bits.Len(uint(big))
	layout := func(size int) *vLayout {
		return newVLayout(rand.New(rand.NewSource(int64(size))), 2, func(i, j int) int { return size })
	}
	leader := &w.arenas[0].paths
	seq := uint64(100)
	// call runs one AllToAllv of size bytes per peer, after est (if not
	// nil) set the leader's times, and says whether it took the
	// cross-memory copies.
	call := func(size int, est func()) bool {
		t.Helper()
		l := layout(size)
		seq++
		before := w.arenas[0].cmaReads + w.arenas[1].cmaReads
		errs := w.run(func(r int, a *Arena) error {
			if r == 0 && est != nil {
				est()
			}
			// No exploring call, however the agreement changed.
			a.paths.cls[chooseAllToAllv][0].next = 1 << 30
			send, got := l.send(seq, r), garbage(l.rn[r])
			if err := a.AllToAllv(context.Background(), Call{Seq: seq, Sig: 7}, send, l.sb[r], got, l.rb[r]); err != nil {
				return err
			}
			return l.check(seq, r, got)
		})
		for _, err := range errs {
			if err != nil {
				t.Fatal(errorsText(errs))
			}
		}
		return w.arenas[0].cmaReads+w.arenas[1].cmaReads > before
	}
	slotsAtSmall := func() { setEst(&leader.v[ks], 1, 1<<40) }
	// The small size: the first call of the class takes the copies (no
	// agreement yet), the leader votes the slots from its times.
	for i, want := range []bool{true, false, false} {
		if got := call(small, slotsAtSmall); got != want {
			t.Fatalf("small call %d: cross-memory %v, want %v", i, got, want)
		}
	}
	// The big size, no time at it yet: the agreed slots, then the copies
	// twice (the leader asks for the path untried at this size, and again
	// while the copies' first time is being taken).
	for i, want := range []bool{false, true, true} {
		if got := call(big, nil); got != want {
			t.Fatalf("big call %d: cross-memory %v, want %v", i, got, want)
		}
	}
	if leader.v[kb].est(0) == 0 || leader.v[kb].est(1) == 0 {
		t.Fatalf("big size: estimates %d, %d after trying both paths", leader.v[kb].est(0), leader.v[kb].est(1))
	}
	// From here the big size's times decide, whatever the small size's
	// say: the copies, then the slots. (The first call runs what the
	// leader's real times voted for in the call before: unchecked.)
	copiesAtBig := func() { slotsAtSmall(); setEst(&leader.v[kb], 1<<40, 1) }
	slotsAtBig := func() { setEst(&leader.v[ks], 1<<40, 1); setEst(&leader.v[kb], 1, 1<<40) }
	for i, c := range []struct {
		est  func()
		want bool
	}{{copiesAtBig, false}, {copiesAtBig, true}, {slotsAtBig, true}, {slotsAtBig, false}, {slotsAtBig, false}} {
		if got := call(big, c.est); got != c.want && i > 0 {
			t.Fatalf("big call %d with times set: cross-memory %v, want %v", 3+i, got, c.want)
		}
	}
}
