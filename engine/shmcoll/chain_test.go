//go:build linux

package shmcoll

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport"
)

// chainVectors is m devices' float32 vectors of count elements, of
// device-dependent scale so that another fold order changes bits.
func chainVectors(m, count int) [][]byte {
	rng := rand.New(rand.NewPCG(7, uint64(m*count)))
	vs := make([][]byte, m)
	for v := range vs {
		vs[v] = make([]byte, 4*count)
		for i := range count {
			f := float32(rng.NormFloat64() * float64(1+v*v))
			binary.LittleEndian.PutUint32(vs[v][4*i:], math.Float32bits(f))
		}
	}
	return vs
}

// runChain runs ChainAllReduce of the vectors on world w: order[h] hosts
// the devices from split[h] to split[h+1]; it returns each rank's recv.
func runChain(w *world, seq uint64, vs [][]byte, order, split []int, op kernel.RedOp) ([][]byte, []error) {
	n := len(vs[0])
	recv := make([][]byte, len(order))
	for r := range recv {
		recv[r] = garbage(n)
	}
	errs := w.run(func(r int, a *Arena) error {
		h := slices.Index(order, r)
		mine := vs[split[h]:split[h+1]]
		div := 1
		if op == kernel.Avg {
			div = len(vs)
		}
		return a.ChainAllReduce(context.Background(), Call{Seq: seq}, bytes.Join(mine, nil), len(mine), recv[r], order, kernel.Float32, op, div)
	})
	return recv, errs
}

// TestChainAllReduce: every rank gets the fold in device order, bit for
// bit, on 2, 3 and 4 ranks in any order, however the devices split, with
// vectors of one piece, several, and more than a slot.
func TestChainAllReduce(t *testing.T) {
	seq := uint64(0)
	for _, tc := range []struct {
		order []int
		m     int
		split []int // nil: every split of m devices on 2 ranks
	}{
		{[]int{0, 1}, 2, nil},
		{[]int{1, 0}, 5, nil},
		{[]int{0, 1}, 8, nil},
		{[]int{2, 0, 1}, 5, []int{0, 1, 4, 5}},
		{[]int{0, 1, 2, 3}, 8, []int{0, 2, 4, 6, 8}},
		{[]int{3, 1, 0, 2}, 6, []int{0, 1, 2, 3, 6}},
	} {
		w := newWorld(t, len(tc.order), MinSlotBytes)
		splits := [][]int{tc.split}
		if tc.split == nil {
			splits = nil
			for k := 1; k < tc.m; k++ {
				splits = append(splits, []int{0, k, tc.m})
			}
		}
		for _, count := range []int{1, 3, 1000, 100_003} {
			vs := chainVectors(tc.m, count)
			for _, op := range []kernel.RedOp{kernel.Sum, kernel.Avg} {
				want := refFold(vs, kernel.Float32, op)
				for _, split := range splits {
					seq++
					recv, errs := runChain(w, seq, vs, tc.order, split, op)
					for r := range recv {
						if errs[r] != nil {
							t.Fatalf("order %v, split %v, count %d: rank %d: %v", tc.order, split, count, r, errs[r])
						}
						if !bytes.Equal(recv[r], want) {
							t.Errorf("order %v, split %v, count %d, %v: rank %d's result is not the fold in device order", tc.order, split, count, op, r)
						}
					}
				}
			}
		}
	}
}

func TestChainAllReduceBadInput(t *testing.T) {
	w := newWorld(t, 2, 0)
	a := w.arenas[0]
	ctx := context.Background()
	for name, err := range map[string]error{
		"rank out of range": a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), []int{0, 2}, kernel.Float32, kernel.Sum, 1),
		"rank twice":        a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), []int{1, 1}, kernel.Float32, kernel.Sum, 1),
		"rank missing":      a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), []int{0}, kernel.Float32, kernel.Sum, 1),
		"short input":       a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 2, make([]byte, 8), []int{0, 1}, kernel.Float32, kernel.Sum, 1),
		"no device":         a.ChainAllReduce(ctx, Call{}, nil, 0, make([]byte, 8), []int{0, 1}, kernel.Float32, kernel.Sum, 1),
		"partial element":   a.ChainAllReduce(ctx, Call{}, make([]byte, 6), 1, make([]byte, 6), []int{0, 1}, kernel.Float32, kernel.Sum, 1),
		"bad op":            a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), []int{0, 1}, kernel.Float32, kernel.Band, 1),
		"zero divisor":      a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), []int{0, 1}, kernel.Float32, kernel.Avg, 0),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	buf := make([]byte, 16)
	if err := a.ChainAllReduce(ctx, Call{}, buf, 1, buf, []int{0, 1}, kernel.Float32, kernel.Sum, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("recv overlapping the input: %v, want ErrInvalid", err)
	}
	one := newWorld(t, 1, 0)
	if err := one.arenas[0].ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), []int{0}, kernel.Float32, kernel.Sum, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("1 rank: %v, want ErrInvalid", err)
	}
}

// Ranks that disagree on the order fail, all of them, instead of each
// folding its own chain.
func TestChainAllReduceDisagree(t *testing.T) {
	w := newWorld(t, 2, 0)
	vs := chainVectors(4, 1000)
	errs := w.run(func(r int, a *Arena) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return a.ChainAllReduce(ctx, Call{Seq: 1}, bytes.Join(vs[:2], nil), 2, make([]byte, 4000), []int{r, 1 - r}, kernel.Float32, kernel.Sum, 1)
	})
	for r, err := range errs {
		if !errors.Is(err, transport.ErrMismatch) {
			t.Errorf("rank %d: %v, want a mismatch", r, err)
		}
	}
}

// A rank that aborts while the other waits in the chain ends the call on
// both, with the abort's reason, instead of leaving the other waiting.
func TestChainAllReducePeerAborts(t *testing.T) {
	w := newWorld(t, 2, MinSlotBytes)
	vs := chainVectors(4, 100_000)
	errs := w.run(func(r int, a *Arena) error {
		if r == 1 {
			// The first rank has folded a piece and waits for this one.
			time.Sleep(50 * time.Millisecond)
			a.Abort(errors.New("boom"))
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return a.ChainAllReduce(ctx, Call{Seq: 1}, bytes.Join(vs[:2], nil), 2, make([]byte, 400_000), []int{0, 1}, kernel.Float32, kernel.Sum, 1)
	})
	if errs[0] == nil || !errors.Is(errs[0], transport.ErrRemoteAbort) {
		t.Errorf("rank 0: %v, want the peer's abort", errs[0])
	}
}

// A steady stream of chain allreduces allocates nothing (the scratch of
// the first call is kept).
func TestChainAllReduceAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const n = 3
	w := newWorld(t, n, MinSlotBytes)
	order := []int{1, 2, 0}
	vs := chainVectors(2*n, 10_000)
	ins, recvs := make([][]byte, n), make([][]byte, n)
	for r := range n {
		ins[r], recvs[r] = bytes.Join(vs[2*r:2*r+2], nil), make([]byte, 40_000)
	}
	allocs := allocsPerCall(t, w, 20, 1, func(r int, a *Arena, seq uint64) error {
		return a.ChainAllReduce(context.Background(), Call{Seq: seq}, ins[r], 2, recvs[r], order, kernel.Float32, kernel.Sum, 1)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per call", allocs)
	}
}
