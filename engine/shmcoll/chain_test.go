//go:build linux

package shmcoll

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
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

// runChain runs ChainAllReduce of the vectors on a 2-rank world whose
// first rank hosts devices 0…k-1, and returns each rank's recv.
func runChain(t *testing.T, w *world, seq uint64, vs [][]byte, k, first int, op kernel.RedOp) ([][]byte, []error) {
	t.Helper()
	n := len(vs[0])
	recv := [][]byte{garbage(n), garbage(n)}
	errs := w.run(func(r int, a *Arena) error {
		mine := vs[k:]
		if r == first {
			mine = vs[:k]
		}
		div := 1
		if op == kernel.Avg {
			div = len(vs)
		}
		return a.ChainAllReduce(context.Background(), Call{Seq: seq}, bytes.Join(mine, nil), len(mine), recv[r], first, kernel.Float32, op, div)
	})
	return recv, errs
}

// TestChainAllReduce: both ranks get the fold in device order, bit for
// bit, whichever rank comes first, however the devices split, with
// vectors of one piece, several, and more than a slot.
func TestChainAllReduce(t *testing.T) {
	w := newWorld(t, 2, MinSlotBytes)
	seq := uint64(0)
	for _, count := range []int{1, 3, 1000, 100_003} {
		for _, m := range []int{2, 5, 8} {
			vs := chainVectors(m, count)
			for _, op := range []kernel.RedOp{kernel.Sum, kernel.Avg} {
				want := refFold(vs, kernel.Float32, op)
				for k := 1; k < m; k++ {
					for first := range 2 {
						seq++
						recv, errs := runChain(t, w, seq, vs, k, first, op)
						for r := range 2 {
							if errs[r] != nil {
								t.Fatalf("count %d, %d devices, %d first on rank %d: rank %d: %v", count, m, k, first, r, errs[r])
							}
							if !bytes.Equal(recv[r], want) {
								t.Errorf("count %d, %d devices, %v, %d first on rank %d: rank %d's result is not the fold in device order", count, m, op, k, first, r)
							}
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
		"first out of range": a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), 2, kernel.Float32, kernel.Sum, 1),
		"short input":        a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 2, make([]byte, 8), 0, kernel.Float32, kernel.Sum, 1),
		"no device":          a.ChainAllReduce(ctx, Call{}, nil, 0, make([]byte, 8), 0, kernel.Float32, kernel.Sum, 1),
		"partial element":    a.ChainAllReduce(ctx, Call{}, make([]byte, 6), 1, make([]byte, 6), 0, kernel.Float32, kernel.Sum, 1),
		"bad op":             a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), 0, kernel.Float32, kernel.Band, 1),
		"zero divisor":       a.ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), 0, kernel.Float32, kernel.Avg, 0),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	buf := make([]byte, 16)
	if err := a.ChainAllReduce(ctx, Call{}, buf, 1, buf, 0, kernel.Float32, kernel.Sum, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("recv overlapping the input: %v, want ErrInvalid", err)
	}
	three := newWorld(t, 3, 0)
	if err := three.arenas[0].ChainAllReduce(ctx, Call{}, make([]byte, 8), 1, make([]byte, 8), 0, kernel.Float32, kernel.Sum, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("3 ranks: %v, want ErrInvalid", err)
	}
}

// Ranks that disagree on which comes first fail, both, instead of each
// folding its own chain.
func TestChainAllReduceDisagree(t *testing.T) {
	w := newWorld(t, 2, 0)
	vs := chainVectors(4, 1000)
	errs := w.run(func(r int, a *Arena) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return a.ChainAllReduce(ctx, Call{Seq: 1}, bytes.Join(vs[:2], nil), 2, make([]byte, 4000), r, kernel.Float32, kernel.Sum, 1)
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
		return a.ChainAllReduce(ctx, Call{Seq: 1}, bytes.Join(vs[:2], nil), 2, make([]byte, 400_000), 0, kernel.Float32, kernel.Sum, 1)
	})
	if errs[0] == nil || !errors.Is(errs[0], transport.ErrRemoteAbort) {
		t.Errorf("rank 0: %v, want the peer's abort", errs[0])
	}
}
