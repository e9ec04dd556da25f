package main

/*
#include <stddef.h>
#include <stdlib.h>
void capi_set_thread_error(const char* msg, size_t n);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// gocollResult_t values (gocoll.h).
const (
	resSuccess         = 0
	resUnhandledError  = 1
	resSystemError     = 2
	resInternalError   = 3
	resInvalidArgument = 4
	resInvalidUsage    = 5
	resRemoteError     = 6
	resInProgress      = 7
	resTimeout         = 8
	resRevoked         = 9
	resExcluded        = 10
	resNoQuorum        = 11
)

// resultCode maps an engine error to the gocollResult_t the C caller sees.
// The numeric codes exist only here; the engine speaks in sentinel errors.
func resultCode(err error) int {
	var errno syscall.Errno
	var sysErr *os.SyscallError
	var netErr *net.OpError
	var pathErr *os.PathError
	switch {
	case err == nil:
		return resSuccess
	case errors.Is(err, engine.ErrInvalidArgument):
		return resInvalidArgument
	// Before the generic kinds: a revoked call also wraps the abort
	// that carried it, and the caller's next step (shrink) differs.
	case errors.Is(err, engine.ErrExcluded):
		return resExcluded
	case errors.Is(err, engine.ErrRevoked):
		return resRevoked
	// Not a peer failure: shrinking again cannot help (the caller that
	// retries on gocollRemoteError would retry in vain).
	case errors.Is(err, engine.ErrNoQuorum):
		return resNoQuorum
	// Setup failures, before the generic kinds: a rendezvous error may
	// also wrap a deadline or a closed connection, and every rank must
	// report the cause the root named.
	case errors.Is(err, engine.ErrSizeMismatch), errors.Is(err, engine.ErrRankConflict), errors.Is(err, engine.ErrAuth):
		return resInvalidUsage
	case errors.Is(err, engine.ErrRankLeft):
		return resRemoteError
	case errors.Is(err, engine.ErrRankMissing):
		return resTimeout
	case errors.Is(err, engine.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return resTimeout
	case errors.Is(err, engine.ErrPeerLost), errors.Is(err, engine.ErrRemoteAbort):
		return resRemoteError
	case errors.Is(err, engine.ErrInvalidUsage), errors.Is(err, engine.ErrMismatch),
		errors.Is(err, engine.ErrDestroyed), errors.Is(err, engine.ErrAborted):
		return resInvalidUsage
	case errors.As(err, &errno), errors.As(err, &sysErr), errors.As(err, &netErr), errors.As(err, &pathErr):
		return resSystemError
	default:
		return resInternalError
	}
}

// argErr is an invalid-argument error found by the C layer itself.
func argErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", engine.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// fail records err as the last error of comm (when there is one) and of the
// calling thread, and returns its result code.
func fail(name string, comm *commState, err error) C.int {
	msg := name + ": " + err.Error()
	if comm != nil {
		comm.setErr(msg)
	}
	setThreadError(msg)
	return C.int(resultCode(err))
}

// setThreadError stores msg in the calling C thread's buffer. Exported Go
// functions run on the thread that called them (cgo locks the goroutine to
// it for the duration of the call), so this is that thread's.
func setThreadError(msg string) {
	if msg == "" {
		return
	}
	cs := C.CString(msg)
	C.capi_set_thread_error(cs, C.size_t(len(msg)))
	C.free(unsafe.Pointer(cs))
}

// guard turns a panic in an entry point into gocollInternalError: nothing
// the C caller does may take the process down.
func guard(name string, rc *C.int) {
	if p := recover(); p != nil {
		setThreadError(fmt.Sprintf("%s: internal error: panic: %v", name, p))
		*rc = resInternalError
	}
}
