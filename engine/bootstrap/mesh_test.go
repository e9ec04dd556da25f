package bootstrap

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// TestBootstrapThenMesh is the engine's start-up in miniature: rank 0 runs
// the root, every rank listens, exchanges its address through the root and
// builds the TCP mesh from the table.
func TestBootstrapThenMesh(t *testing.T) {
	const n = 4
	root := startRoot(t, 10*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sum := sha256.Sum256(append([]byte("communicator 0\x00"), secret...))
	tag := [8]byte(sum[:8])
	errc := make(chan error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			errc <- func() error {
				ln, err := tcp.Listen("127.0.0.1")
				if err != nil {
					return err
				}
				addr, err := tcp.AdvertiseAddr(ln, "")
				if err != nil {
					return err
				}
				table, err := Exchange(ctx, root.Addr(), secret, r, n, []byte(addr))
				if err != nil {
					return err
				}
				addrs := make([]string, n)
				peers := make([]int, n)
				for i, b := range table {
					addrs[i], peers[i] = string(b), i
				}
				tr, err := tcp.New(ctx, tcp.Config{Rank: r, Size: n, Listener: ln, Addrs: addrs, Peers: peers, Secret: secret, Tag: tag})
				if err != nil {
					return err
				}
				defer tr.Close()
				// A ring step: send to the right, receive from the left.
				h := transport.Header{Kind: transport.KindData, Seq: 1, Len: 1}
				sendErr := make(chan error, 1)
				go func() { sendErr <- tr.Send(ctx, (r+1)%n, h, []byte{byte(r)}) }()
				buf := make([]byte, 1)
				if err := tr.Recv(ctx, (r+n-1)%n, h, buf); err != nil {
					return err
				}
				if int(buf[0]) != (r+n-1)%n {
					return fmt.Errorf("rank %d got %d", r, buf[0])
				}
				return <-sendErr
			}()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Error(err)
		}
	}
}
