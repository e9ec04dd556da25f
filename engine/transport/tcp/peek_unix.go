//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package tcp

import (
	"errors"
	"net"
	"syscall"
)

// canPeek tells whether peek works here (else there is no watcher).
const canPeek = true

// errNoData: nothing is queued on the connection (or it cannot be looked at).
var errNoData = errors.New("no data")

// peek copies the front of c's receive queue into buf without consuming it
// and without blocking (recv with MSG_PEEK|MSG_DONTWAIT). It does not take
// the connection's read lock, so it may run while a Read is blocked. n == 0
// with a nil error is the end of the stream; errNoData means nothing is
// queued; another error is the connection's (e.g. ECONNRESET).
func peek(c net.Conn, buf []byte) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, errNoData
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, errNoData
	}
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			n, _, rerr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if rerr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return 0, errNoData // closed here
	}
	if rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK {
		return 0, errNoData
	}
	if rerr != nil {
		return 0, rerr
	}
	return n, nil
}
