package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/proctest"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// runRanks runs fn once per rank, each on its own goroutine, and returns the
// errors by rank.
func runRanks(comms []*Comm, fn func(c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(c)
		}()
	}
	wg.Wait()
	return errs
}

func mustRanks(t testing.TB, comms []*Comm, fn func(c *Comm) error) {
	t.Helper()
	for r, err := range runRanks(comms, fn) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func newLocal(t testing.TB, n int, opts Options) []*Comm {
	t.Helper()
	comms, err := NewLocalComms(n, opts)
	return closedAtEnd(t, comms, err)
}

// newPlaced is newLocal over the given in-memory world, the ranks placed
// on hosts as the placement says (nil: one host).
func newPlaced(t testing.TB, w *mem.World, hosts [][]int, opts Options) []*Comm {
	t.Helper()
	comms, err := newLocalWorld(w, hosts, opts)
	return closedAtEnd(t, comms, err)
}

// closedAtEnd fails the test on err, else has comms aborted and destroyed
// when it ends.
func closedAtEnd(t testing.TB, comms []*Comm, err error) []*Comm {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Abort()
			c.Destroy()
		}
	})
	return comms
}

// newJoined makes n ranks in this process that join as processes of one
// host would (a unique id, then NewComm on each rank's goroutine), so they
// connect through what join picks for them: with Options.Transport "auto"
// the shared-memory rings and the shared-memory collectives (package
// shmcoll), with "tcp" loopback TCP.
func newJoined(t testing.TB, n int, opts Options) []*Comm {
	t.Helper()
	id, err := NewUniqueID(opts)
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = NewComm(id, n, r, opts) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Abort()
				c.Destroy()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return comms
}

// newShm is newJoined over shared memory; it fails the test when the ranks
// did not get the shared-memory collectives.
func newShm(t testing.TB, n int, opts Options) []*Comm {
	t.Helper()
	opts.Transport = "auto"
	comms := newJoined(t, n, opts)
	for r, c := range comms {
		if n > 1 && c.arena == nil {
			t.Fatalf("rank %d: no shared-memory collectives", r)
		}
	}
	return comms
}

// A world makes n in-process ranks: goroutines over the in-memory
// transport, or joined over shared memory.
type world struct {
	name string
	make func(t testing.TB, n int, opts Options) []*Comm
	// parallel: several worlds may run at once. Shared-memory ranks poll
	// and yield as if each had a core (shmsync.PolicyFor): several such
	// worlds at once on a small machine mostly wait for each other.
	parallel bool
	// msgRanks are the rank counts at which the conformance matrix runs
	// the message algorithms (nil: all); the default ones run at all.
	msgRanks []int
	// shortRanks bounds the rank counts of the matrix with -short (0: no
	// bound).
	shortRanks int
}

// Over shared memory the default algorithms are the shared-memory
// collectives, the matrix's point there; the message algorithms run over
// the rings at a power of two and a non-power of two (and across
// processes, TestConformanceProcesses).
var worlds = []world{
	{name: "mem", make: newLocal, parallel: true},
	{name: "shm", make: newShm, msgRanks: []int{4, 5}, shortRanks: 5},
}

// awaitPending waits until c has an operation issued and not finished.
func awaitPending(t testing.TB, c *Comm) {
	t.Helper()
	proctest.Until(t, time.Minute, fmt.Sprintf("operation pending on rank %d", c.rank), func() bool {
		return c.pending.Load() > 0
	})
}

// setElem stores the small integer v as element i of buf in type dt.
func setElem(buf []byte, dt DataType, i int, v int64) {
	switch dt {
	case Int8, Uint8, Bool:
		buf[i] = byte(v)
	case Int16:
		binary.NativeEndian.PutUint16(buf[2*i:], uint16(v))
	case Int32, Uint32:
		binary.NativeEndian.PutUint32(buf[4*i:], uint32(v))
	case Int64, Uint64:
		binary.NativeEndian.PutUint64(buf[8*i:], uint64(v))
	case Float16:
		binary.NativeEndian.PutUint16(buf[2*i:], kernel.Float32ToFloat16(float32(v)))
	case Bfloat16:
		binary.NativeEndian.PutUint16(buf[2*i:], kernel.Float32ToBfloat16(float32(v)))
	case Float32:
		binary.NativeEndian.PutUint32(buf[4*i:], math.Float32bits(float32(v)))
	case Float64:
		binary.NativeEndian.PutUint64(buf[8*i:], math.Float64bits(float64(v)))
	}
}

// inputFor fills a buffer whose reductions are exact in every type and any
// association: small values, and only 1s and 2s under prod for floats.
// Bool inputs are bytes 0, 1 and 2 (true too, so that results show they are
// normalised to 1); bitwise ops get values of both signs, sign bits set.
func inputFor(dt DataType, op RedOp, rank, count, salt int) []byte {
	b := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		v := int64((rank*7 + i*3 + salt*5) % 5)
		switch {
		case dt == Bool:
			v = int64((rank*5 + i*7 + salt) % 3)
		case op.IsBitwise():
			v = int64((rank*37+i*101+salt*7)%251) - 125
		case op == Prod && dt.IsFloat():
			v = v%2 + 1
		case op == Max || op == Min:
			v = int64((rank*13+i*11+salt)%200) - 100
			if dt == Uint8 || dt == Int8 {
				v = int64((rank*13 + i*11 + salt) % 120)
			}
		}
		setElem(b, dt, i, v)
	}
	return b
}

// expectReduce folds inputs in rank order with the reference kernel.
func expectReduce(inputs [][]byte, dt DataType, op RedOp) []byte {
	out := append([]byte(nil), inputs[0]...)
	for _, in := range inputs[1:] {
		kernel.ReferenceReduce(out, in, dt, op)
	}
	if op == Avg {
		kernel.DivideBy(out, dt, len(inputs))
	}
	return out
}

func diffBytes(got, want []byte, es int) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			e := i / es
			return fmt.Sprintf("element %d: got % x want % x", e, got[e*es:(e+1)*es], want[e*es:(e+1)*es])
		}
	}
	return ""
}

func putF32(b []byte, f float32) { binary.NativeEndian.PutUint32(b, math.Float32bits(f)) }
