package tcp

import (
	"errors"
	"fmt"
	"net"
	"os"
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

// OpenFiles is how many descriptors this process has open, or -1 when
// unknown.
func OpenFiles() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(fds)
}

// CheckFiles says, with the numbers, when this process cannot open need
// more descriptors under its limit (a clear error at setup, rather than
// connections that fail one by one later).
func CheckFiles(need int) error {
	lim, open := FileLimit(), OpenFiles()
	if lim == 0 || open < 0 || uint64(open+need) <= lim {
		return nil
	}
	return fmt.Errorf("%w: this process has %d descriptors open and needs about %d more, over its open-file limit RLIMIT_NOFILE %d: raise it with ulimit -n", syscall.EMFILE, open, need, lim)
}

// Gone says whether the peer of c, a connection it has sent nothing on
// that is still to be read, closed it or reset it: a look at the front of
// the stream that consumes nothing and does not block. Where the system
// cannot look, nothing is ever gone.
func Gone(c net.Conn) bool {
	var b [1]byte
	n, err := peek(c, b[:])
	return err == nil && n == 0 || err != nil && err != errNoData
}
