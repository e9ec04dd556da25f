package exec

import (
	"sync"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport"
)

// Link is what the executor needs of a communicator for one operation:
// its messages, its scratch memory, and how it ends. The engine's
// execution context implements it over a transport; tests implement it
// over the in-memory transport without a communicator.
type Link interface {
	Rank() int
	Size() int
	// Send and Recv move one message of the operation, step being its
	// tag; Recv's buffer has the message's length.
	Send(peer, step int, data []byte) error
	Recv(peer, step int, buf []byte) error
	// RecvVar receives the operation's next message from peer whatever
	// its step and length, into a buffer of Pool (the caller puts it back).
	RecvVar(peer int) (transport.Header, []byte, error)
	// CheckStep is the error for a message h from peer where step was
	// expected (nil when it is that step).
	CheckStep(peer, step int, h transport.Header) error
	// PeerError attributes err to peer, as the communicator reports it.
	PeerError(peer int, err error) error
	// Stop ends every transport call of the operation in flight: the
	// first failure stops the others at once.
	Stop()
	// Locked says the operation runs on a caller locked to its thread.
	Locked() bool
	// Pool is the communicator's scratch for concurrent receives.
	Pool() *Pool
	// Buf is reusable scratch i (0…3) of n bytes, owned by the goroutine
	// that runs the communicator's operations.
	Buf(i, n int) []byte
}

// NoType is the data type of an operation that moves bytes only.
const NoType = kernel.DataType(-1)

// Pool is a communicator's pool of scratch buffers: the concurrent
// receives of one schedule each take their own, and a steady stream of
// calls allocates nothing.
type Pool struct {
	mu   sync.Mutex
	bufs [][]byte
}

// Get returns a buffer of n bytes.
func (p *Pool) Get(n int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, b := range p.bufs {
		if cap(b) >= n {
			p.bufs[i] = p.bufs[len(p.bufs)-1]
			p.bufs = p.bufs[:len(p.bufs)-1]
			return b[:n]
		}
	}
	return make([]byte, n)
}

// Put gives b back.
func (p *Pool) Put(b []byte) {
	p.mu.Lock()
	p.bufs = append(p.bufs, b)
	p.mu.Unlock()
}

// pending is a receive running on its own goroutine.
type pending chan error

func (p pending) wait() error { return <-p }

// goRecv starts a receive so the runner can reduce meanwhile (pipelining:
// one segment folded while the next arrives).
func (r *runner) goRecv(peer, step int, buf []byte) pending {
	p := make(pending, 1)
	go func() { p <- r.l.Recv(peer, step, buf) }()
	return p
}
