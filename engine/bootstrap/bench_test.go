package bootstrap

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkRoot is a communicator's setup through one root, as the engine
// does it (engine/setup_rendezvous.go): n ranks join with a setup blob,
// then two more rounds (the second setup round, the control addresses),
// every round sending every rank the whole table. The ranks are
// goroutines over loopback in this process, so they share its cores with
// the root. It reports the time per rank (ns/rank), the root's time
// writing the tables per rank (root-ns/rank: the time its replies took,
// which on a network is bound by its link) and the bytes it wrote per
// setup (root-B). A job of more than Fanout ranks gets its tables through
// the relays (protocol.go).
func BenchmarkRoot(b *testing.B) {
	// The JSON setup entries of a rank over TCP with 8 ranks a host.
	blobs := [][]byte{make([]byte, 177), make([]byte, 284), make([]byte, 17)}
	for _, n := range []int{16, 64, 256, 1024} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			var sent, replying int64
			for range b.N {
				s, r := setupThroughRoot(b, n, blobs)
				sent, replying = sent+s, replying+r
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/rank")
			b.ReportMetric(float64(replying)/float64(b.N*n), "root-ns/rank")
			b.ReportMetric(float64(sent)/float64(b.N), "root-B")
		})
	}
}

func setupThroughRoot(b *testing.B, n int, blobs [][]byte) (sent, replying int64) {
	root, err := StartRoot("127.0.0.1:0", secret, time.Minute, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			c, table, err := Join(ctx, root.Addr(), secret, r, n, blobs[0])
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			for _, blob := range blobs[1:] {
				if len(table) != n {
					errs[r] = fmt.Errorf("rank %d: %d entries for %d ranks", r, len(table), n)
					return
				}
				if table, err = c.AllGather(ctx, blob); err != nil {
					errs[r] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := root.Wait(); err != nil {
		b.Fatal(err)
	}
	return root.sent.Load(), root.replying.Load()
}
