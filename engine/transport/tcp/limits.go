package tcp

import (
	"errors"
	"fmt"
	"syscall"
)

// ErrCrossing is an acceptor's verdict on a dial that crossed its own
// dial of the same pair, which wins: the dialler waits for that one.
var ErrCrossing = errors.New("crossing connection: the peer's own dial wins")

// errConnected is an acceptor's verdict on a dial from a peer it is
// connected with already, or admitting a dial from.
var errConnected = errors.New("already connected")

// DescribeLimit adds the process's descriptor limit to err when err says
// it ran out of descriptors (EMFILE, ENFILE): the number an operator must
// raise, named where it is hit.
func DescribeLimit(err error) error {
	if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) {
		return err
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return err
	}
	return fmt.Errorf("%w (open-file limit RLIMIT_NOFILE %d, hard %d: raise it with ulimit -n)", err, lim.Cur, lim.Max)
}

// FileLimit is the process's open-file limit (RLIMIT_NOFILE's soft value),
// or 0 when unknown.
func FileLimit() uint64 {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return 0
	}
	return lim.Cur
}
