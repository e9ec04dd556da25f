package tcp

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// The server side of the handshake against a client that sends arbitrary
// bytes, then hangs up: it never panics, never accepts (nobody without the
// secret can produce the proof), and notices the hang-up instead of
// waiting for its deadline.
func FuzzServerHandshake(f *testing.F) {
	secret := []byte("fuzz-secret")
	tag := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	hello := make([]byte, clientHelloLen)
	copy(hello, hsMagic[:])
	hello[4] = hsVersion
	copy(hello[8:16], tag[:])
	f.Add(hello)
	f.Add(append(append([]byte(nil), hello...), make([]byte, macSize)...))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		srv, cli := net.Pipe()
		defer srv.Close()
		go func() {
			// Answer the server's hello while sending; hang up when done.
			go io.Copy(io.Discard, cli)
			cli.Write(in)
			cli.Close()
		}()
		start := time.Now()
		_, err := ServerHandshake(srv, secret, tag, 0, start.Add(2*time.Second), nil)
		if err == nil {
			t.Fatalf("a client without the secret was accepted: %x", in)
		}
		if errors.Is(err, ErrRefused) {
			t.Fatalf("refused after authenticating? %v", err)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("waited until its deadline for a client that had hung up: %v", err)
		}
	})
}
