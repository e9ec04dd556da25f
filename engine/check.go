package engine

import (
	"fmt"
	"unsafe"

	"github.com/gocoll/gocoll/engine/kernel"
)

// The argument checks every call shares: the collectives (collectives.go,
// alltoallw.go), the calls over virtual devices (virtual.go) and the
// sends and receives (p2p.go). A check that fails returns an
// ErrInvalidArgument naming the argument; nothing has been sent then, and
// the communicator stays usable.

// The checks run on every call: each is a test the compiler inlines, and
// only a failure calls out to build its error (a call per check and
// argument was a tenth of a small call's instructions).

func checkType(dt DataType) error {
	if dt.Valid() {
		return nil
	}
	return typeErr(dt)
}

func typeErr(dt DataType) error { return invalidArg("unknown datatype %d", int32(dt)) }

// checkOp refuses unknown ops and ops not defined on dt (bitwise ops on
// floating-point types, avg on bool) before anything is sent.
func checkOp(dt DataType, op RedOp) error {
	// Sum, by far the most used op, is defined on every type: no more to check.
	if op == Sum && dt.Valid() {
		return nil
	}
	return opErr(dt, op)
}

func opErr(dt DataType, op RedOp) error {
	if err := kernel.CheckOp(dt, op); err != nil {
		return invalidArg("%v", err)
	}
	return nil
}

func checkBuf(name string, b []byte, count int, dt DataType) error {
	if count >= 0 && len(b) >= count*dt.Size() {
		return nil
	}
	return bufErr(name, b, count, dt)
}

func bufErr(name string, b []byte, count int, dt DataType) error {
	if count < 0 {
		return invalidArg("negative count %d", count)
	}
	return invalidArg("%s holds %d bytes, %d elements of %s need %d", name, len(b), count, dt, count*dt.Size())
}

func (c *Comm) checkRank(what string, r int) error {
	if r < 0 || r >= c.size {
		return invalidArg("%s %d out of range [0,%d)", what, r, c.size)
	}
	return nil
}

func addr(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// overlap reports whether a[:na] and b[:nb] share memory.
func overlap(a []byte, na int, b []byte, nb int) bool {
	if na == 0 || nb == 0 {
		return false
	}
	pa, pb := addr(a), addr(b)
	return pa < pb+uintptr(nb) && pb < pa+uintptr(na)
}

// checkInPlace accepts disjoint buffers or a send buffer at exactly inPlaceOff
// bytes into recv; anything else that overlaps would read what it writes.
func checkInPlace(send []byte, ns int, recv []byte, nr int, inPlaceOff int) (inPlace bool, err error) {
	if ns > 0 && addr(send) == addr(recv)+uintptr(inPlaceOff) {
		return true, nil
	}
	if overlap(send, ns, recv, nr) {
		return false, invalidArg("send and receive buffers overlap without being in place")
	}
	return false, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
