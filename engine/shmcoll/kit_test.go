//go:build linux

package shmcoll

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

func TestMain(m *testing.M) { os.Exit(transporttest.MainGroup(m, groupMaker{})) }

// slotVar overrides the slot size of the kit's ranks in child processes
// (the benchmarks use the default slots).
const slotVar = "GOCOLL_SHMCOLL_TEST_SLOT"

// groupMaker sets up arenas for the transport test kit. slot 0 means
// testSlot, or slotVar's value when set; noCMA, when set, says which ranks
// refuse cross-memory reads.
type groupMaker struct {
	slot  int
	noCMA func(rank int) bool
}

func (m groupMaker) slotBytes() int {
	if m.slot != 0 {
		return m.slot
	}
	if n, err := strconv.Atoi(os.Getenv(slotVar)); err == nil {
		return n
	}
	return testSlot
}

func (m groupMaker) GroupCaps() transporttest.GroupCaps {
	slot := m.slotBytes()
	return transporttest.GroupCaps{
		// Around the one-barrier path's limit (64 KiB over all ranks) and
		// over a slot: several pieces.
		Sizes:     []int{16<<10 - 1, 16<<10 + 1, 2*slot + 3},
		Processes: true,
		Closed:    ErrClosed,
	}
}

func (m groupMaker) PrepareGroup(cfg transporttest.Config) (transporttest.Setup[transporttest.Group], error) {
	a, err := Create(Config{Rank: cfg.Rank, Size: cfg.Size, Tag: cfg.Tag(), SlotBytes: m.slotBytes(), NoCMA: m.noCMA != nil && m.noCMA(cfg.Rank)})
	if err != nil {
		return transporttest.Setup[transporttest.Group]{}, err
	}
	return transporttest.Setup[transporttest.Group]{
		Addr: shmtest.RefAddr(a.Ref()),
		Connect: func(ctx context.Context, addrs []string) (transporttest.Group, error) {
			peers := map[int]PeerInfo{}
			for q, addr := range addrs {
				ref, err := shmtest.ParseRefAddr(addr)
				if err != nil {
					return kitRank{a}, fmt.Errorf("rank %d's address: %w", q, err)
				}
				peers[q] = ref
			}
			return kitRank{a}, a.Connect(ctx, peers)
		},
		Ready: func() { a.Release() },
	}, nil
}

// Leftovers: a job's arenas named in /dev/shm (there should never be any)
// or still open or mapped in this process once they closed.
func (groupMaker) Leftovers(job string) []string {
	return append(shmtest.Leftovers("gocoll-arena-"+job+"-"), shmtest.Files("gocoll-alloc-"+job+"-")...)
}

// allocPrefix starts the names of communicator tag's registered
// allocations (memory files: they show in /proc/<pid>/fd and maps only).
func allocPrefix(tag [8]byte) string { return fmt.Sprintf("gocoll-alloc-%x-", tag[:]) }

// kitRank is an arena as the kit's Group.
type kitRank struct{ *Arena }

func (k kitRank) AllReduce(ctx context.Context, seq, sig uint64, buf []byte) error {
	return k.Arena.AllReduce(ctx, Call{Seq: seq, Sig: sig}, buf, buf, kernel.Int8, kernel.Sum)
}

// TestKit runs the kit's collective scenarios: sums, mismatches, and a rank
// that aborts, closes, misses its deadline or dies during a collective.
func TestKit(t *testing.T) { transporttest.RunGroup(t, groupMaker{}) }

// newWorldOf is n ranks of gm as goroutines of this process.
func newWorldOf(t testing.TB, n int, gm groupMaker) *world {
	t.Helper()
	w := &world{}
	for _, g := range transporttest.NewGroup(t, gm, n) {
		w.arenas = append(w.arenas, g.(kitRank).Arena)
	}
	w.tag = w.arenas[0].tag
	return w
}
