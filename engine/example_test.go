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
