package mem

import (
	"context"
	"sync"
	"testing"

	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/transporttest"
)

// maker builds in-process worlds for the transport test kit: the first
// rank of a job to be prepared makes its World.
type maker struct {
	mu     sync.Mutex
	worlds map[string]*World
}

func (m *maker) Caps() transporttest.Caps {
	return transporttest.Caps{
		Block:  transporttest.Block{Msgs: depth + 1},
		Closed: transport.ErrAborted,
	}
}

func (m *maker) Prepare(cfg transporttest.Config) (transporttest.Setup[transport.Transport], error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.worlds == nil {
		m.worlds = map[string]*World{}
	}
	w := m.worlds[cfg.Job]
	if w == nil {
		w = NewWorld(cfg.Size)
		m.worlds[cfg.Job] = w
	}
	return transporttest.Setup[transport.Transport]{
		Connect: func(context.Context, []string) (transport.Transport, error) { return w.Endpoint(cfg.Rank), nil },
	}, nil
}

func TestConformance(t *testing.T) { transporttest.RunConformance(t, &maker{}) }
func TestFaults(t *testing.T)      { transporttest.RunFaults(t, &maker{}) }

// Waiting: a Send waits once its link holds depth messages, a Recv while
// nothing is queued from the peer. (Without it the kit guesses from time,
// and under the race detector it took a Send still filling the link for
// one that waits.)
func (m *maker) Waiting(tr transport.Transport, peer int, send bool) bool {
	ep := tr.(*Endpoint)
	if send {
		l := ep.w.links[ep.rank][peer]
		return len(l) == cap(l)
	}
	return len(ep.w.links[peer][ep.rank]) == 0
}
