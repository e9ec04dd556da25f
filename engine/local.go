package engine

import (
	"errors"
	"fmt"

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
	for r := range comms {
		c, err := newComm(r, n, w.Endpoint(r), opts)
		if err != nil {
			for _, d := range comms[:r] {
				d.Abort()
				_ = d.Destroy()
			}
			return nil, fmt.Errorf("local communicator rank %d: %w", r, errors.Unwrap(err))
		}
		c.split = &localSplitter{world: w, hub: hub}
		c.place(hosts, nil)
		comms[r] = c
	}
	return comms, nil
}
