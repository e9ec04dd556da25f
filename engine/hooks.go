package engine

import "github.com/gocoll/gocoll/engine/internal/shmsync"

// setupPoint is a step of connect at which a test may stop a rank (kill
// it, say) to check what that leaves behind.
type setupPoint int

const (
	setupProbed    setupPoint = iota // probe file made, before the first exchange
	setupCreated                     // segments made and open, before the second exchange
	setupExchanged                   // every rank's segments known, before connecting
	setupConnected                   // peers' segments mapped, before the last exchange
	setupReleased                    // segments' descriptors closed, before returning
	numSetupPoints
)

var setupPointNames = [...]string{"probed", "created", "exchanged", "connected", "released"}

func (p setupPoint) String() string { return setupPointNames[p] }

// testHooks injects faults in this package's tests; Options.hooks is nil
// otherwise.
type testHooks struct {
	// setup runs at each setupPoint of connect.
	setup func(setupPoint)
	// open replaces opening a peer's memory files through /proc/<pid>/fd
	// (shmsync.OpenProcFd): a process that may not open another's.
	open shmsync.Opener
	// beforeTCP runs when this rank has learnt its peers' addresses and is
	// about to connect to them over TCP (its listener is open; the peers
	// may already be accepting).
	beforeTCP func()
	// shrink runs at each step of Shrink ("agreed": the view decided,
	// "connected": the new links made); true crashes the rank there (its
	// control links close as a dead process's would).
	shrink func(rank int, point string) bool
}

func (h *testHooks) at(p setupPoint) {
	if h != nil && h.setup != nil {
		h.setup(p)
	}
}

func (h *testHooks) crashAt(rank int, point string) bool {
	return h != nil && h.shrink != nil && h.shrink(rank, point)
}

func (h *testHooks) opener() shmsync.Opener {
	if h == nil {
		return nil
	}
	return h.open
}
