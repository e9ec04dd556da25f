package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/sched"
)

// devVector is virtual device v's float64 vector: random values of
// device-dependent scale, so another summation order changes bits.
func devVector(v, count int) []byte {
	rng := rand.New(rand.NewPCG(30, uint64(v)))
	b := make([]byte, 8*count)
	for i := range count {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(rng.NormFloat64()*float64(1+v*v)))
	}
	return b
}

// devFold is the fold in device order, written out plainly.
func devFold(m, count int, avg bool) []byte {
	acc := make([]float64, count)
	for v := range m {
		x := devVector(v, count)
		for i := range acc {
			f := math.Float64frombits(binary.LittleEndian.Uint64(x[8*i:]))
			if v == 0 {
				acc[i] = f
			} else {
				acc[i] += f
			}
		}
	}
	out := make([]byte, 8*count)
	for i, a := range acc {
		if avg {
			a /= float64(m)
		}
		binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(a))
	}
	return out
}

// virtualCases are block, cyclic and explicit placements of 8 devices.
type virtualCase struct {
	name    string
	n       int
	devices []int
}

var virtualCases = []virtualCase{
	{"block on 2", 2, []int{0, 0, 0, 0, 1, 1, 1, 1}},
	{"block on 4", 4, []int{0, 0, 1, 1, 2, 2, 3, 3}},
	{"cyclic on 3", 3, []int{0, 1, 2, 0, 1, 2, 0, 1}},
	{"explicit on 3", 3, []int{2, 2, 0, 1, 1, 2, 0, 0}},
}

// virtualComms is n ranks over shared memory or the in-memory transport.
func virtualComms(t *testing.T, n int, shm bool) []*Comm {
	if shm {
		return newShm(t, n, Options{Timeout: 20 * time.Second})
	}
	return newLocal(t, n, Options{Timeout: 20 * time.Second})
}

// TestVirtualAllReduce runs the engine's virtual allreduce on block,
// cyclic and explicit placements, over the in-memory transport and over
// shared memory: every rank gets the fold in device order, bit for bit.
func TestVirtualAllReduce(t *testing.T) {
	const m = 8
	// Two ranks over shared memory fold through the arena when the
	// devices form two runs, in either rank order, however they split.
	cases := append([]virtualCase{
		{"reversed on 2", 2, []int{1, 1, 1, 0, 0, 0, 0, 0}},
		{"one then seven on 2", 2, []int{0, 1, 1, 1, 1, 1, 1, 1}},
		{"cyclic on 2", 2, []int{0, 1, 0, 1, 0, 1, 0, 1}},
		{"blocks on 4 out of order", 4, []int{2, 2, 0, 0, 0, 3, 1, 1}},
		{"a rank twice, one without devices", 3, []int{0, 0, 1, 1, 1, 0, 0, 0}},
	}, virtualCases...)
	for _, tc := range cases {
		for _, shm := range []bool{false, true} {
			comms := virtualComms(t, tc.n, shm)
			// (Two ranks on one host: fewer elements than the arena's
			// chain has pieces, and several pieces.)
			for _, k := range []struct {
				op    RedOp
				count int
			}{{Sum, 40_001}, {Avg, 40_001}, {Sum, 3}} {
				op, count := k.op, k.count
				want := devFold(m, count, op == Avg)
				mustRanks(t, comms, func(c *Comm) error {
					var send [][]byte
					for v, r := range tc.devices {
						if r == c.Rank() {
							send = append(send, devVector(v, count))
						}
					}
					recv := make([]byte, 8*count)
					if err := c.Virtual(tc.devices).AllReduce(send, recv, count, Float64, op); err != nil {
						return err
					}
					if !bytes.Equal(recv, want) {
						t.Errorf("%s (shm %v, %v): rank %d's result is not the fold in device order", tc.name, shm, op, c.Rank())
					}
					return nil
				})
			}
		}
	}
}

// The registry gives a virtual allreduce the arena's chain where every
// rank on one host holds one run of devices, else the chain of messages;
// the other virtual collectives their own entries, and the broadcast the
// plain one's.
func TestVirtualAlgorithms(t *testing.T) {
	for _, tc := range []struct {
		n       int
		shm     bool
		devices []int
		want    string
	}{
		{2, true, []int{1, 1, 0, 0}, "virtual-shm"},
		{2, false, []int{1, 1, 0, 0}, "virtual-chain"},
		{2, true, []int{0, 1, 0, 1}, "virtual-chain"},
		{3, true, []int{0, 0, 1, 1, 1, 0}, "virtual-chain"},
	} {
		comms := virtualComms(t, tc.n, tc.shm)
		mustRanks(t, comms, func(c *Comm) error {
			v := c.Virtual(tc.devices)
			var send, recv [][]byte
			for _, r := range tc.devices {
				if r == c.Rank() {
					send, recv = append(send, make([]byte, 8*len(tc.devices))), append(recv, make([]byte, 8*len(tc.devices)))
				}
			}
			for _, k := range []struct {
				start func() (*Request, error)
				want  string
			}{
				{func() (*Request, error) { return v.IAllReduceEach(send, recv, 1, Float64, Sum) }, tc.want},
				{func() (*Request, error) { return v.IReduceScatter(send, recv, 1, Float64, Sum) }, "virtual-reducescatter"},
				{func() (*Request, error) { return v.IAllGather(send, recv, 1, Float64) }, "virtual-allgather"},
				{func() (*Request, error) { return v.IAllToAll(send, recv, 1, Float64) }, "virtual-alltoall"},
				{func() (*Request, error) { return v.IBroadcast(make([]byte, 8), recv, 1, Float64, 0) }, c.choose(sched.Broadcast, 8).name},
			} {
				r, err := k.start()
				if err != nil {
					return err
				}
				if r.algo != k.want {
					t.Errorf("n=%d shm=%v %v: %s ran %s, want %s", tc.n, tc.shm, tc.devices, r.op, r.algo, k.want)
				}
				if err := r.Wait(); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

func TestVirtualAllReduceBadInput(t *testing.T) {
	comms := newLocal(t, 2, Options{Timeout: 5 * time.Second})
	c := comms[0]
	one := [][]byte{make([]byte, 32)}
	for name, err := range map[string]error{
		"no devices":        c.Virtual(nil).AllReduce(one, make([]byte, 32), 4, Float64, Sum),
		"rank out of range": c.Virtual([]int{0, 2}).AllReduce(one, make([]byte, 32), 4, Float64, Sum),
		"too many sends":    c.Virtual([]int{0, 1}).AllReduce([][]byte{one[0], one[0]}, make([]byte, 32), 4, Float64, Sum),
		"short send":        c.Virtual([]int{0, 1}).AllReduce(one, make([]byte, 32), 5, Float64, Sum),
		"short recv":        c.Virtual([]int{0, 1}).AllReduce(one, make([]byte, 8), 4, Float64, Sum),
		"bad op":            c.Virtual([]int{0, 1}).AllReduce(one, make([]byte, 32), 4, Float64, Band),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

// Ranks that pass different placements fail, all of them, within the
// timeout instead of folding different chains.
func TestVirtualAllReduceDisagreeingPlacements(t *testing.T) {
	comms := newLocal(t, 2, Options{Timeout: 5 * time.Second})
	places := [][]int{{0, 1, 1}, {0, 0, 1}}
	errs := runRanks(comms, func(c *Comm) error {
		p := places[c.Rank()]
		var send [][]byte
		for _, r := range p {
			if r == c.Rank() {
				send = append(send, make([]byte, 8*1000))
			}
		}
		return c.Virtual(p).AllReduce(send, make([]byte, 8*1000), 1000, Float64, Sum)
	})
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error", r)
		}
	}
}
