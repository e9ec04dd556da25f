//go:build linux

package shm

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

func TestMain(m *testing.M) { os.Exit(transporttest.Main(m, maker{})) }

// Test rings are small so that wrap-around and streaming happen often.
const testRing = MinRingBytes

// ringVar overrides the ring size of the kit's ranks, children included
// (the benchmarks use the default rings).
const ringVar = "GOCOLL_SHM_TEST_RING"

// maker sets up shared-memory ranks for the transport test kit.
type maker struct{}

func ringBytes() int {
	if n, err := strconv.Atoi(os.Getenv(ringVar)); err == nil {
		return n
	}
	return testRing
}

func (maker) Caps() transporttest.Caps {
	ring := ringBytes()
	return transporttest.Caps{
		Sizes:                  []int{ring - 1, ring, ring + 1, 3 * ring},
		Block:                  transporttest.Block{Msgs: 1, Bytes: 4 * ring},
		Partial:                true,
		Processes:              true,
		StreamBreaksOnMismatch: true,
		PartialSends:           true,
		ReasonSurvivesCut:      true, // the reason is in the segment header
		DeliversBeforeAbort:    true,
		Closed:                 ErrClosed,
	}
}

func (maker) Prepare(cfg transporttest.Config) (transporttest.Setup[transport.Transport], error) {
	peers := cfg.Peers
	if peers == nil {
		peers = transporttest.AllRanks(cfg.Size)
	}
	tr, err := Create(Config{Rank: cfg.Rank, Size: cfg.Size, Peers: peers, Tag: cfg.Tag(), RingBytes: ringBytes()})
	if err != nil {
		return transporttest.Setup[transport.Transport]{}, err
	}
	return transporttest.Setup[transport.Transport]{
		Addr: shmtest.RefAddr(tr.Ref()),
		Connect: func(ctx context.Context, addrs []string) (transport.Transport, error) {
			infos := map[int]PeerInfo{}
			for _, q := range peers {
				if q == cfg.Rank {
					continue
				}
				ref, err := shmtest.ParseRefAddr(addrs[q])
				if err != nil {
					return tr, fmt.Errorf("rank %d's address: %w", q, err)
				}
				infos[q] = ref
			}
			return tr, tr.Connect(ctx, infos)
		},
		Ready: func() { tr.Release() },
	}, nil
}

// Waiting: the waiter flags tell a call asleep on the futex.
func (maker) Waiting(tr transport.Transport, peer int, send bool) bool {
	p := tr.(*Transport).conns[peer]
	if send {
		return p.out.prodWait.Load() != 0
	}
	return p.in.consWait.Load() != 0
}

func (maker) Watch(tr transport.Transport) {
	tr.(*Transport).watchOnce(&watcher{pending: map[int]unread{}})
}

// Leftovers: a job's segments named in /dev/shm (there should never be
// any) or still open in this process once its transports closed.
func (maker) Leftovers(job string) []string {
	prefix := "gocoll-" + job + "-"
	return append(shmtest.Files(prefix), shmtest.Fds(prefix)...)
}

// Roles: "echo", the benchmarks' peer: "PING n size" (receive and send
// back n messages of size bytes) or "SINK n size" (receive them, then send
// an empty message).
func (maker) Roles() map[string]transporttest.Role[transport.Transport] {
	return map[string]transporttest.Role[transport.Transport]{
		"echo": func(ctx context.Context, tr transport.Transport, p *transporttest.Parent) error {
			for {
				line, ok := p.Next()
				if !ok {
					return nil
				}
				f := strings.Fields(line)
				n, _ := strconv.Atoi(f[1])
				size, _ := strconv.Atoi(f[2])
				if err := echo(ctx, tr, f[0] == "PING", n, size); err != nil {
					return err
				}
				p.Say("DONE")
			}
		},
	}
}

// echo is rank 1 of a benchmark pair: it receives n messages of size bytes
// from rank 0 and sends each back (ping) or, at the end, an empty message.
func echo(ctx context.Context, tr transport.Transport, ping bool, n, size int) error {
	buf := make([]byte, size)
	h := transport.Header{Kind: transport.KindData, Len: uint64(size)}
	for i := range n {
		h.Seq = uint64(i)
		if err := tr.Recv(ctx, 0, h, buf); err != nil {
			return err
		}
		if ping {
			if err := tr.Send(ctx, 0, h, buf); err != nil {
				return err
			}
		}
	}
	if !ping {
		return tr.Send(ctx, 0, transport.Header{Kind: transport.KindData}, nil)
	}
	return nil
}

func TestConformance(t *testing.T) { transporttest.RunConformance(t, maker{}) }
func TestFaults(t *testing.T)      { transporttest.RunFaults(t, maker{}) }

// newTag is a fresh communicator tag for the tests that create segments
// themselves.
func newTag(tb testing.TB) [8]byte {
	var tag [8]byte
	hex.Decode(tag[:], []byte(transporttest.NewJob()))
	return tag
}

// leftovers lists the segment files of communicator tag still in /dev/shm.
func leftovers(tag [8]byte) []string {
	return maker{}.Leftovers(hex.EncodeToString(tag[:]))
}

func checkNoLeftovers(tb testing.TB, tag [8]byte) {
	tb.Helper()
	if m := leftovers(tag); len(m) != 0 {
		tb.Errorf("segment files left behind: %v", m)
	}
}

// segPrefix starts the name of every segment of communicator tag.
func segPrefix(tag [8]byte) string { return "gocoll-" + hex.EncodeToString(tag[:]) + "-" }
