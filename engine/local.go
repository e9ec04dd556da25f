package engine

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// NewLocalComms returns n communicators whose ranks are goroutines of this
// process, connected by the in-memory transport. Each must be driven by its
// own goroutine, as separate processes would be.
func NewLocalComms(n int, opts Options) ([]*Comm, error) {
	if n < 1 {
		return nil, invalidArg("rank count %d < 1", n)
	}
	return newLocalWorld(mem.NewWorld(n), nil, opts)
}

// newLocalWorld makes in-process ranks over w; hosts, when set, is the
// placement they pretend to have (tests of the hierarchical algorithms).
func newLocalWorld(w *mem.World, hosts [][]int, opts Options) ([]*Comm, error) {
	n := w.Size()
	comms := make([]*Comm, n)
	hub := newLocalHub()
	id := randomID()
	ctl := recovery.NewLocalWorld(n)
	for r := range comms {
		c, err := newComm(r, n, w.Endpoint(r), opts)
		if err != nil {
			for _, d := range comms[:r] {
				d.Abort()
				_ = d.Destroy()
			}
			return nil, fmt.Errorf("local communicator rank %d: %w", r, errors.Unwrap(err))
		}
		c.split, c.id, c.ctl = &localSplitter{world: w, hub: hub, id: id, ctl: ctl}, id, ctl.Member(r)
		c.place(hosts, nil)
		comms[r] = c
	}
	return comms, nil
}

// randomID names an in-process world, which has no rendezvous tag to be
// named by, so that its ranks' dumps do not mix with another world's.
func randomID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}
