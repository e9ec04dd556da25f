package engine_test

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// Four ranks as goroutines average a gradient vector. In a real job each
// rank is a process and calls engine.NewCommFromEnv(opts) instead.
func Example() {
	comms, err := engine.NewLocalComms(4, engine.Options{})
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	results := make([][]float64, len(comms))
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Destroy()
			grad := []float64{float64(c.Rank()), 1, math.Pi}
			buf := unsafe.Slice((*byte)(unsafe.Pointer(&grad[0])), len(grad)*8)
			if err := c.AllReduce(buf, buf, len(grad), engine.Float64, engine.Avg); err != nil {
				panic(err)
			}
			results[c.Rank()] = grad
		}()
	}
	wg.Wait()
	fmt.Printf("%.4f\n", results[3])
	// Output: [1.5000 1.0000 3.1416]
}

// Three ranks lose rank 1 (here: it aborts and leaves); the others agree
// on who is gone and go on as a communicator of 2. In a real job the loop
// catches the collective's error (ErrPeerLost, ErrTimeout, ErrRevoked) and
// shrinks, as docs/elastic.md shows.
func ExampleComm_Shrink() {
	comms, err := engine.NewLocalComms(3, engine.Options{})
	if err != nil {
		panic(err)
	}
	comms[1].Abort()
	comms[1].Destroy()
	survivors := []*engine.Comm{comms[0], comms[2]}
	out := make([]string, len(survivors))
	var wg sync.WaitGroup
	for i, c := range survivors {
		wg.Go(func() {
			defer c.Destroy()
			small, err := c.Shrink(nil)
			if err != nil {
				panic(err)
			}
			defer small.Destroy()
			out[i] = fmt.Sprintf("rank %d is now %d of %d; failed: %v", c.Rank(), small.Rank(), small.Size(), c.Failed())
		})
	}
	wg.Wait()
	for _, s := range out {
		fmt.Println(s)
	}
	// Output:
	// rank 0 is now 0 of 2; failed: [1]
	// rank 2 is now 1 of 2; failed: [1]
}
