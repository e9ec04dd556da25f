package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu"
)

// runBench measures what a migration costs, as one rank of a launched job
// (build/vppubench starts them): m virtual devices, each with one
// registered buffer of each size, placed in blocks over every rank, move
// onto the first half of the ranks and back, round after round (the
// first move also creates the smaller set's sub-communicator; later ones
// reuse it). Beside
// it, the floor: the same buffers sent by plain point-to-point messages
// into buffers allocated beforehand (what remains of a migration without
// its buffer lists, allocation and re-split). Rank 0 prints a Markdown
// table of medians.
func runBench(w io.Writer, m int, sizesMiB string, rounds int) error {
	sizes, c, err := join(sizesMiB)
	if err != nil {
		return err
	}
	defer c.Destroy()
	n := c.Size()
	if n < 2 {
		return fmt.Errorf("-bench needs at least 2 ranks")
	}
	wide, narrow := vppu.Block(m, n), vppu.Block(m, n/2)
	l, err := vppu.ParseLogical("ring", m)
	if err != nil {
		return err
	}
	if c.Rank() == 0 {
		fmt.Fprintf(w, "| MiB per device | moved | first %d→%d ms | %d→%d ms | %d→%d ms | GB/s | point-to-point floor ms | floor GB/s |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
			n, n/2, n, n/2, n/2, n)
	}
	for _, size := range sizes {
		v, err := vppu.New(c, l, wide)
		if err != nil {
			return err
		}
		for _, d := range v.Local() {
			if err := v.Register(d, "x", make([]byte, size)); err != nil {
				return err
			}
		}
		moved := 0
		for d := range m {
			if wide[d] != narrow[d] {
				moved++
			}
		}
		var shrink, grow, floor []float64
		first := 0.0
		timed := func(f func() error) (float64, error) {
			if err := c.Barrier(); err != nil {
				return 0, err
			}
			t0 := time.Now()
			if err := f(); err != nil {
				return 0, err
			}
			if err := c.Barrier(); err != nil {
				return 0, err
			}
			return time.Since(t0).Seconds(), nil
		}
		src, dst := make([][]byte, m), make([][]byte, m)
		for d := range m {
			if wide[d] == c.Rank() {
				src[d] = make([]byte, size)
			}
			if narrow[d] == c.Rank() && wide[d] != c.Rank() {
				dst[d] = make([]byte, size)
			}
		}
		for round := 0; round <= rounds; round++ { // round 0 warms up
			s, err := timed(func() error { return v.Migrate(narrow) })
			if err != nil {
				return err
			}
			g, err := timed(func() error { return v.Migrate(wide) })
			if err != nil {
				return err
			}
			f, err := timed(func() error { return pointToPoint(c, wide, narrow, src, dst, size) })
			if err != nil {
				return err
			}
			if round > 0 {
				shrink, grow, floor = append(shrink, s), append(grow, g), append(floor, f)
			} else {
				first = s // includes splitting the new set of ranks
			}
		}
		v.Destroy()
		if c.Rank() == 0 {
			bytes := float64(moved * size)
			fmt.Fprintf(w, "| %d | %d of %d devices, %.0f MiB | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
				size>>20, moved, m, bytes/(1<<20), 1e3*first, 1e3*median(shrink), 1e3*median(grow), bytes/median(shrink)/1e9,
				1e3*median(floor), bytes/median(floor)/1e9)
		}
	}
	return nil
}

// pointToPoint moves each device's buffer from its rank in a to its rank
// in b as one message, into memory allocated beforehand.
func pointToPoint(c *engine.Comm, a, b vppu.Place, src, dst [][]byte, size int) error {
	if size == 0 {
		return nil
	}
	var reqs []*engine.Request
	for d := range a {
		if a[d] == b[d] {
			continue
		}
		var r *engine.Request
		var err error
		switch c.Rank() {
		case a[d]:
			r, err = c.ISend(src[d], size, engine.Uint8, b[d])
		case b[d]:
			r, err = c.IRecv(dst[d], size, engine.Uint8, a[d])
		default:
			continue
		}
		if err != nil {
			return err
		}
		reqs = append(reqs, r)
	}
	for _, r := range reqs {
		if err := r.Wait(); err != nil {
			return err
		}
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// runAllReduceBench compares the virtual allreduce with the engine's plain
// allreduce of the same bytes per process, as one rank of a launched job
// (build/vppubench with OP=allreduce starts them): m virtual devices
// placed in blocks over every rank, each with a vector of the size, their
// gradients views of one array and one result per rank (what a training
// loop with replicated state passes), against a plain allreduce of the
// same bytes per rank (its devices' vectors end to end) and of one vector
// per rank (the same job without virtual devices). The three alternate,
// after a barrier each; rank 0 prints a Markdown table of medians.
func runAllReduceBench(w io.Writer, m int, sizesMiB string, rounds int) error {
	sizes, c, err := join(sizesMiB)
	if err != nil {
		return err
	}
	defer c.Destroy()
	l, err := vppu.ParseLogical("ring", m)
	if err != nil {
		return err
	}
	v, err := vppu.New(c, l, vppu.Block(m, c.Size()))
	if err != nil {
		return err
	}
	defer v.Destroy()
	local := len(v.Local())
	if c.Rank() == 0 {
		fmt.Fprintf(w, "| MiB per device | virtual allreduce, %d devices (%d per process), p50 µs | plain allreduce of the same bytes per process (%d vectors), p50 µs | speed against it | plain allreduce of one vector, p50 µs | speed against it |\n|---:|---:|---:|---:|---:|---:|\n", m, local, local)
	}
	timed := func(f func() error) (float64, error) {
		if err := c.Barrier(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		err := f()
		return time.Since(t0).Seconds(), err
	}
	for _, size := range sizes {
		count := size / 8
		plain, same := make([]byte, 8*count), make([]byte, local*8*count)
		grads := make([]byte, local*8*count)
		send, recv := make([][]byte, local), make([][]byte, local)
		result := make([]byte, 8*count)
		for k := range send {
			send[k] = grads[k*8*count : (k+1)*8*count]
			recv[k] = result
		}
		var tp, ts, tv []float64
		for round := 0; round <= rounds; round++ { // round 0 warms up
			p, err := timed(func() error { return c.AllReduce(plain, plain, count, engine.Float64, engine.Avg) })
			if err != nil {
				return err
			}
			sb, err := timed(func() error { return c.AllReduce(same, same, local*count, engine.Float64, engine.Avg) })
			if err != nil {
				return err
			}
			q, err := timed(func() error { return v.AllReduce(send, recv, count, engine.Float64, engine.Avg) })
			if err != nil {
				return err
			}
			if round > 0 {
				tp, ts, tv = append(tp, p), append(ts, sb), append(tv, q)
			}
		}
		if c.Rank() == 0 {
			mp, ms, mv := median(tp), median(ts), median(tv)
			fmt.Fprintf(w, "| %.3g | %.0f | %.0f | %.2f× | %.0f | %.2f× |\n", float64(size)/(1<<20), 1e6*mv, 1e6*ms, ms/mv, 1e6*mp, mp/mv)
		}
	}
	return nil
}

// join reads -sizes-mib (MiB such as 0,1,8 or 0.25, in whole float64s)
// and joins the launched job.
func join(sizesMiB string) ([]int, *engine.Comm, error) {
	var sizes []int
	for _, f := range strings.Split(sizesMiB, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 {
			return nil, nil, fmt.Errorf("-sizes-mib %q: want MiB per device such as 0,1,8", sizesMiB)
		}
		sizes = append(sizes, int(v*(1<<20))/8*8)
	}
	opts, err := engine.OptionsFromEnv(nil)
	if err != nil {
		return nil, nil, err
	}
	c, err := engine.NewCommFromEnv(opts)
	return sizes, c, err
}
