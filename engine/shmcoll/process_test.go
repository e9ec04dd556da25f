//go:build linux

package shmcoll

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

// Ranks in separate processes are the kit's children (TestMain runs them):
// these roles add to the kit's own.
func (groupMaker) GroupRoles() map[string]transporttest.Role[transporttest.Group] {
	type role = transporttest.Role[transporttest.Group]
	arena := func(f func(ctx context.Context, a *Arena, p *transporttest.Parent) error) role {
		return func(ctx context.Context, g transporttest.Group, p *transporttest.Parent) error {
			return f(ctx, g.(kitRank).Arena, p)
		}
	}
	return map[string]role{
		// The conformance matrix; the parent compares the hashes.
		"matrix": arena(func(ctx context.Context, a *Arena, p *transporttest.Parent) error {
			cases := matrix(a.Size(), a.SlotBytes(), testTypes, kernel.AllRedOps())
			hashes := make([]uint64, len(cases))
			if err := runMatrix(ctx, a, cases, hashes); err != nil {
				return err
			}
			// Across processes too, cross-memory reads are on wherever the
			// kernel allows them, and used (2 ranks: the test slot's pieces
			// exceed the 8 KiB threshold), writes too (2 ranks: each is the
			// root of a broadcast above it).
			if a.cma != canCMA() || (a.cma && a.Size() == 2 && (a.cmaReads == 0 || a.cmaWrites == 0)) {
				return fmt.Errorf("cross-memory copies %v after %d reads and %d writes; process_vm_readv works: %v",
					a.cma, a.cmaReads, a.cmaWrites, canCMA())
			}
			var b strings.Builder
			for _, h := range hashes {
				fmt.Fprintf(&b, "%x,", h)
			}
			p.Say("HASHES %s", b.String())
			return nil
		}),
		// Calls whose path the ranks choose by their own timing: each
		// reports the path it took in every call (P: cross-memory, S:
		// the slots) and the hashes of what it received.
		"paths": arena(func(ctx context.Context, a *Arena, p *transporttest.Parent) error {
			return pathTrace(ctx, a, p, 3*exploreEvery, -1)
		}),
		// The same with estimates that contradict each other: the leader's
		// favour the slots until call skewFlip and cross-memory copies
		// from there, the other ranks' the other way round.
		"paths-skew": arena(func(ctx context.Context, a *Arena, p *transporttest.Parent) error {
			return pathTrace(ctx, a, p, skewCalls, skewFlip)
		}),
		// Rank 0 broadcasts and exits at once; the others come later.
		"bcast-exit": arena(func(ctx context.Context, a *Arena, p *transporttest.Parent) error {
			// Not the first call: that one waits for everyone (it decides
			// cross-memory reads).
			if err := a.Barrier(ctx, Call{Seq: 0}); err != nil {
				return err
			}
			if a.Rank() == 0 {
				if err := bcast(ctx, a, 1, 4096, 0); err != nil {
					return err
				}
				p.Say("OK")
				os.Exit(0) // no Close: the process is simply gone
			}
			p.Say("READY")
			p.Next() // the parent saw rank 0 exit
			if a.Rank() == 2 {
				// Rank 1 waits for this one at the broadcast's end past
				// a liveness check: rank 0 being gone must not fail it.
				time.Sleep(3 * livenessEvery)
			}
			if err := bcast(ctx, a, 1, 4096, 0); err != nil {
				return err
			}
			p.Say("OK")
			report(p, a.Barrier(ctx, Call{Seq: 2}))
			return nil
		}),
		// Allocations only small calls touched, then wait to be killed.
		"alloc": arena(func(ctx context.Context, a *Arena, p *transporttest.Parent) error {
			for _, n := range []int{4096, 1 << 20} {
				m, err := a.Alloc(n)
				if err != nil {
					return err
				}
				// Below the in-place threshold: the peers never map it.
				if err := a.AllReduce(ctx, Call{Seq: uint64(n)}, m[:64], m[:64], kernel.Int8, kernel.Sum); err != nil {
					return err
				}
			}
			p.Say("READY")
			for _, ok := p.Next(); ok; _, ok = p.Next() {
			}
			return nil
		}),
		// Rank 2 passes another signature.
		"mismatch": arena(func(ctx context.Context, a *Arena, p *transporttest.Parent) error {
			b := make([]byte, 256)
			report(p, a.AllReduce(ctx, Call{Seq: 1, Sig: 42 + uint64(a.Rank()/2)}, b, b, kernel.Int8, kernel.Sum))
			return nil
		}),
		// "iters bytes" → AllReduce float32 sum that often; rank 0 says
		// the time.
		"bench": arena(func(ctx context.Context, a *Arena, p *transporttest.Parent) error {
			line, _ := p.Next()
			var iters, bytes int
			fmt.Sscanf(line, "%d %d", &iters, &bytes)
			send, recv := make([]byte, bytes), make([]byte, bytes)
			for i := range send {
				send[i] = byte(i)
			}
			times := make([]time.Duration, iters)
			var start, last time.Time
			for i := -3; i < iters; i++ {
				if i == 0 {
					if err := a.Barrier(ctx, Call{Seq: 1 << 40}); err != nil {
						return err
					}
					start = time.Now()
					last = start
				}
				if err := a.AllReduce(ctx, Call{Seq: uint64(i + 10), Sig: 1}, send, recv, kernel.Float32, kernel.Sum); err != nil {
					return err
				}
				if i >= 0 {
					now := time.Now()
					times[i], last = now.Sub(last), now
				}
			}
			slices.Sort(times)
			p.Say("TIME %d %d %d", time.Since(start).Nanoseconds(), times[len(times)/2], times[(len(times)-1)*99/100])
			return nil
		}),
	}
}

// The skewed trace's length and the call from which the leader's
// estimates favour cross-memory copies ("paths-skew").
const skewCalls, skewFlip = 140, 100

// pathKinds are the calls of a pathTrace round, AllToAll second (the one
// whose ranks receive different bytes).
var pathKinds = []string{"allgather", "alltoall", "broadcast", "allreduce"}

// pathTrace runs calls rounds of a 32 KiB AllGather, AllToAll, Broadcast
// (root: the round modulo the ranks) and AllReduce (random floats) and
// says "PATHS" with the path of every call and the hashes of what it
// received. With flip >= 0, every
// rank sets its estimates before each call: the leader's favour the slots
// before round flip and cross-memory copies from there, the other ranks'
// the opposite.
func pathTrace(ctx context.Context, a *Arena, p *transporttest.Parent, calls, flip int) error {
	const bytes = 32 << 10
	// The first call decides cross-memory copies: before it, no call is
	// timed or counted.
	if err := a.Barrier(ctx, Call{Seq: 1 << 40}); err != nil {
		return err
	}
	var paths, hashes strings.Builder
	for i := range calls {
		for j, kind := range pathKinds {
			c := tcase{kind: kind, dt: kernel.Float32, op: kernel.Sum, count: bytes / 4, root: i % a.Size(), random: kind == "allreduce"}
			if flip >= 0 {
				op, leader, per := chooseAllGather, 0, bytes
				switch kind {
				case "alltoall":
					op = chooseAllToAll
				case "broadcast":
					op, leader = chooseBroadcast, 1-c.root
				case "allreduce":
					op, per = chooseAllReduce, bytes/2
				}
				cl := &a.paths.cls[op][bits.Len(uint(per))]
				if (a.Rank() == leader) == (i < flip) {
					setEst(&cl.pathTimes, 1, 1<<40)
				} else {
					setEst(&cl.pathTimes, 1<<40, 1)
				}
			}
			h, err := runCase(ctx, a, uint64(len(pathKinds)*i+j+1), c)
			if err != nil {
				return err
			}
			path := byte('S')
			if a.useCMA {
				path = 'P'
			}
			paths.WriteByte(path)
			fmt.Fprintf(&hashes, "%x,", h)
		}
	}
	p.Say("PATHS %s %s", paths.String(), hashes.String())
	return nil
}

// report tells the parent how err classifies.
func report(p *transporttest.Parent, err error) {
	if err == nil {
		p.Say("OK")
		return
	}
	peer := -1
	var ple *transport.PeerLostError
	var rae *transport.RemoteAbortError
	if errors.As(err, &ple) {
		peer = ple.Peer
	} else if errors.As(err, &rae) {
		peer = rae.Peer
	}
	p.Say("RESULT lost=%v remote=%v mismatch=%v deadline=%v peer=%d: %v",
		errors.Is(err, transport.ErrPeerLost), errors.Is(err, transport.ErrRemoteAbort),
		errors.Is(err, transport.ErrMismatch), errors.Is(err, context.DeadlineExceeded), peer, err)
}

func roles(n int, role string) []string {
	r := make([]string, n)
	for i := range r {
		r[i] = role
	}
	return r
}

// TestProcesses runs the conformance matrix with every rank in its own
// process; results every rank receives must hash alike everywhere.
func TestProcesses(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			if testing.Short() && n > 2 {
				t.Skip("short")
			}
			_, kids := transporttest.StartGroup(t, groupMaker{}, roles(n, "matrix"))
			hashes := make([][]string, n)
			for r, c := range kids {
				hashes[r] = strings.Split(c.ExpectWithin(t, "HASHES", 5*time.Minute), ",")
			}
			cases := matrix(n, testSlot, testTypes, kernel.AllRedOps())
			for i, c := range cases {
				if c.kind == "allreduce" || c.kind == "broadcast" || c.kind == "allgather" {
					for r := 1; r < n; r++ {
						if hashes[r][i] != hashes[0][i] {
							t.Errorf("%v: rank %d received other bytes than rank 0", c, r)
						}
					}
				}
			}
		})
	}
}

// TestProcessPathsAgree: ranks in separate processes, each timing its own
// calls, take the same path in every call (the leader's vote), and the
// data arrives alike on every path.
func TestProcessPathsAgree(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	for _, n := range []int{2, 3} {
		_, kids := transporttest.StartGroup(t, groupMaker{}, roles(n, "paths"))
		var first []string
		for r, c := range kids {
			got := strings.Fields(c.ExpectWithin(t, "PATHS", 2*time.Minute))
			if r == 0 {
				first = got
				continue
			}
			if len(got) != 2 || got[0] != first[0] {
				t.Errorf("%d ranks: rank %d took paths %v, rank 0 %v", n, r, got[0], first[0])
			}
			// All but alltoall deliver the same bytes everywhere.
			h, h0 := strings.Split(got[1], ","), strings.Split(first[1], ",")
			for i := range h {
				if i%len(pathKinds) != 1 && h[i] != h0[i] {
					t.Errorf("%d ranks: call %d: rank %d received other bytes than rank 0", n, i, r)
				}
			}
		}
	}
}

// TestProcessPathsBackoff: ranks in separate processes whose estimates
// contradict each other, and whose leader changes its mind at call
// skewFlip, still take the same path in every call: the leader's, with the
// exploring calls backed off while its vote holds (7, 23, 55) and back to
// 8 calls after it changed (108, 124).
func TestProcessPathsBackoff(t *testing.T) {
	if !canCMA() {
		t.Skip("process_vm_readv is not allowed here")
	}
	explores := map[int]bool{7: true, 23: true, 55: true, 108: true, 124: true}
	want := make([]byte, skewCalls)
	for i := range want {
		// Cross-memory: the first call, the explorations while the slots
		// are agreed (from call 2, after the leader's first vote, until
		// the call after the flip), the agreed path after it.
		cma := i == 0 || (i >= 2 && explores[i] != (i > skewFlip))
		want[i] = 'S'
		if cma {
			want[i] = 'P'
		}
	}
	for _, n := range []int{2, 3} {
		_, kids := transporttest.StartGroup(t, groupMaker{}, roles(n, "paths-skew"))
		var first []string
		for r, c := range kids {
			got := strings.Fields(c.ExpectWithin(t, "PATHS", 2*time.Minute))
			if len(got) != 2 {
				t.Fatalf("%d ranks: rank %d said %v", n, r, got)
			}
			for j, kind := range pathKinds {
				if (kind == "broadcast" || kind == "allreduce") && n != 2 {
					continue // chosen at 2 ranks only
				}
				var trace []byte
				for i := j; i < len(got[0]); i += len(pathKinds) {
					trace = append(trace, got[0][i])
				}
				if string(trace) != string(want) {
					t.Errorf("%d ranks: rank %d: %s paths\n%s, want\n%s", n, r, kind, trace, want)
				}
			}
			if r == 0 {
				first = got
				continue
			}
			h, h0 := strings.Split(got[1], ","), strings.Split(first[1], ",")
			for i := range h {
				if i%len(pathKinds) != 1 && h[i] != h0[i] {
					t.Errorf("%d ranks: call %d: rank %d received other bytes than rank 0", n, i, r)
				}
			}
		}
	}
}

// TestProcessBroadcastRootExits: a broadcast's root returns without waiting
// for the others (barrierFrom); when its process exits right after, the
// others still get the data out of its segment, and their next call
// reports it lost.
func TestProcessBroadcastRootExits(t *testing.T) {
	_, kids := transporttest.StartGroup(t, groupMaker{}, roles(3, "bcast-exit"))
	for _, c := range kids[1:] {
		c.Expect(t, "READY")
	}
	kids[0].Expect(t, "OK")
	kids[0].Wait()
	for _, c := range kids[1:] {
		c.Say(t, "go")
	}
	for _, c := range kids[1:] {
		c.Expect(t, "OK")
		if l := c.Expect(t, "RESULT"); !strings.HasPrefix(l, "lost=true") || !strings.Contains(l, "peer=0") {
			t.Errorf("rank %d: barrier after the root left: %s", c.Rank, l)
		}
	}
}

// Ranks killed while holding allocations leave nothing in /dev/shm (the
// kit's check at cleanup): named files stayed there for good when only
// small calls had used them.
func TestProcessKilledLeavesNoFiles(t *testing.T) {
	_, kids := transporttest.StartGroup(t, groupMaker{}, roles(3, "alloc"))
	for _, c := range kids {
		c.Expect(t, "READY")
	}
	for _, c := range kids {
		c.Kill(t)
		c.Wait()
	}
}

func TestProcessMismatch(t *testing.T) {
	_, kids := transporttest.StartGroup(t, groupMaker{}, roles(3, "mismatch"))
	for _, c := range kids {
		if l := c.Expect(t, "RESULT"); !strings.Contains(l, "mismatch=true") {
			t.Errorf("rank %d: %s", c.Rank, l)
		}
	}
}
