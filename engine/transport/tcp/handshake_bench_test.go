package tcp

import (
	"net"
	"testing"
	"time"
)

// BenchmarkHandshake is one connection's setup as a rank sees it when it
// dials a peer: dial over loopback, the authenticated handshake (hello,
// challenge, proofs) with the peer accepting and answering, then close.
func BenchmarkHandshake(b *testing.B) {
	lns, addrs := listeners(b, 1)
	defer lns[0].Close()
	errs := make(chan error, 1)
	go func() {
		for {
			c, err := lns[0].Accept()
			if err != nil {
				return
			}
			_, err = ServerHandshake(c, testSecret, testTag, 0, time.Now().Add(10*time.Second), nil)
			c.Close()
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", addrs[0])
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ClientHandshake(c, testSecret, testTag, 1, time.Now().Add(10*time.Second)); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}
