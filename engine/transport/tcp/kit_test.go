package tcp

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

// kitLazy, set, makes a child process's ranks lazy with every peer eager
// (TestFaultsLazy).
const kitLazy = "GOCOLL_TEST_TCP_KIT_LAZY"

func TestMain(m *testing.M) {
	os.Exit(transporttest.Main(m, maker{lazy: os.Getenv(kitLazy) != "", eagerAll: true}))
}

// maker sets up TCP ranks over loopback for the transport test kit: a
// full mesh, or (lazy) connections made on first use, none at setup
// unless eagerAll.
type maker struct{ lazy, eagerAll bool }

func (m maker) Caps() transporttest.Caps {
	return transporttest.Caps{
		// More than both socket buffers, so that a Send nobody reads blocks.
		Block:                  transporttest.Block{Msgs: 1, Bytes: 32 << 20},
		Partial:                true,
		Processes:              true,
		StreamBreaksOnMismatch: true,
		PartialSends:           true,
		DeliversBeforeAbort:    true,
		Closed:                 transport.ErrAborted,
	}
}

func (m maker) Prepare(cfg transporttest.Config) (transporttest.Setup[transport.Transport], error) {
	ln, err := Listen("127.0.0.1")
	if err != nil {
		return transporttest.Setup[transport.Transport]{}, err
	}
	peers := cfg.Peers
	if peers == nil {
		peers = transporttest.AllRanks(cfg.Size)
	}
	return transporttest.Setup[transport.Transport]{
		Addr: ln.Addr().String(),
		Connect: func(ctx context.Context, addrs []string) (transport.Transport, error) {
			c := Config{Rank: cfg.Rank, Size: cfg.Size, Listener: ln, Addrs: addrs, Peers: peers, Secret: testSecret, Tag: cfg.Tag()}
			if m.lazy {
				c.Lazy = true
				if !m.eagerAll {
					c.Eager = []int{}
				}
			}
			tr, err := New(ctx, c)
			if err != nil {
				return nil, err // not a nil *Transport in an interface
			}
			return tr, nil
		},
	}, nil
}

// Kill cuts every connection as a crashed process's kernel would: no
// goodbye, no abort message, and the watcher stopped.
func (maker) Kill(tr transport.Transport) {
	t := tr.(*Transport)
	killed := errors.New("tcp: killed by the test")
	t.stop.CompareAndSwap(nil, &killed)
	t.closeConns()
}

func (maker) Watch(tr transport.Transport) {
	tr.(*Transport).watchOnce(make([]byte, transport.HeaderSize))
}

func (maker) Waiting(tr transport.Transport, peer int, send bool) bool {
	p := tr.(*Transport).peer(peer)
	if p == nil {
		return false
	}
	if !send {
		return p.reads.Load()&1 != 0
	}
	if p.wmu.TryLock() {
		p.wmu.Unlock()
		return false
	}
	return true
}

func TestConformance(t *testing.T) { transporttest.RunConformance(t, maker{}) }
func TestFaults(t *testing.T)      { transporttest.RunFaults(t, maker{}) }

// The conformance kit with every connection made on first use.
func TestConformanceLazy(t *testing.T) { transporttest.RunConformance(t, maker{lazy: true}) }

// The fault kit with the listener kept open: a failure is relayed along
// the connections that exist (the engine connects ring and doubling
// neighbours eagerly for that), and nothing connecting late must hide it.
func TestFaultsLazy(t *testing.T) {
	t.Setenv(kitLazy, "1")
	transporttest.RunFaults(t, maker{lazy: true, eagerAll: true})
}

// kitMesh is the kit's in-process mesh of n TCP ranks (peers as for
// transporttest.NewMesh).
func kitMesh(t *testing.T, n int, peers func(r int) []int) []*Transport {
	t.Helper()
	var ts []*Transport
	for _, tr := range transporttest.NewMesh(t, maker{}, n, peers) {
		ts = append(ts, tr.(*Transport))
	}
	return ts
}
