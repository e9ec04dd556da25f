//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package tcp

import (
	"errors"
	"net"
)

// canPeek tells whether peek works here: without it there is no watcher,
// and a failure is noticed only by the calls reading from the failed peer.
const canPeek = false

var errNoData = errors.New("no data")

func peek(c net.Conn, buf []byte) (int, error) { return 0, errNoData }
