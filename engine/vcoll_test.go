package engine

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// vblock is block b (count float64s) of a vector of such blocks.
func vblock(x []byte, b, count int) []byte { return x[8*b*count : 8*(b+1)*count] }

// TestVirtualCollectives runs every virtual collective besides the
// allreduce on block, cyclic and explicit placements, over the in-memory
// transport and shared memory, against plain references: the reductions
// must equal the fold in device order bit for bit.
func TestVirtualCollectives(t *testing.T) {
	const m, count = 8, 20_011 // chunks of the chain, and a ragged last one
	for _, tc := range virtualCases {
		for _, shm := range []bool{false, true} {
			comms := virtualComms(t, tc.n, shm)
			// References: the fold of whole vectors (reduce) and of
			// vectors of M blocks (reduce-scatter's block v is block v of
			// that fold), the gathered and the transposed blocks.
			small := devFold(m, count, false)
			bigAvg := devFold(m, m*count, true)
			var gathered []byte
			var bigs [][]byte
			for v := range m {
				gathered = append(gathered, devVector(v, count)...)
				bigs = append(bigs, devVector(v, m*count))
			}
			mustRanks(t, comms, func(c *Comm) error {
				var mine []int
				var send, big [][]byte
				for v, r := range tc.devices {
					if r == c.Rank() {
						mine = append(mine, v)
						send = append(send, vblock(gathered, v, count))
						big = append(big, bigs[v])
					}
				}
				bufs := func(size int) [][]byte {
					out := make([][]byte, len(mine))
					for k := range out {
						out[k] = make([]byte, size)
					}
					return out
				}
				fail := func(what string, k int) {
					t.Errorf("%s (shm %v): %s of device %d is wrong", tc.name, shm, what, mine[k])
				}
				for _, root := range []int{0, 5, m - 1} {
					recv := make([]byte, 8*count)
					if err := c.Virtual(tc.devices).Reduce(send, recv, count, Float64, Sum, root); err != nil {
						return err
					}
					if tc.devices[root] == c.Rank() && !bytes.Equal(recv, small) {
						t.Errorf("%s (shm %v): reduce to device %d is not the fold in device order", tc.name, shm, root)
					}
				}
				rs := bufs(8 * count)
				r, err := c.Virtual(tc.devices).IReduceScatter(big, rs, count, Float64, Avg)
				if err != nil {
					return err
				}
				if err := r.Wait(); err != nil {
					return err
				}
				for k, v := range mine {
					if !bytes.Equal(rs[k], vblock(bigAvg, v, count)) {
						fail("reduce-scatter", k)
					}
				}
				ag := bufs(8 * m * count)
				if err := c.Virtual(tc.devices).AllGather(send, ag, count, Float64); err != nil {
					return err
				}
				for k := range mine {
					if !bytes.Equal(ag[k], gathered) {
						fail("allgather", k)
					}
				}
				a2a := bufs(8 * m * count)
				if err := c.Virtual(tc.devices).AllToAll(big, a2a, count, Float64); err != nil {
					return err
				}
				for k, w := range mine {
					for v := range m {
						if !bytes.Equal(vblock(a2a[k], v, count), vblock(bigs[v], w, count)) {
							fail("all-to-all", k)
						}
					}
				}
				bc := bufs(8 * count)
				var root []byte
				if tc.devices[3] == c.Rank() {
					root = vblock(gathered, 3, count)
				}
				if err := c.Virtual(tc.devices).Broadcast(root, bc, count, Float64, 3); err != nil {
					return err
				}
				for k := range mine {
					if !bytes.Equal(bc[k], vblock(gathered, 3, count)) {
						fail("broadcast", k)
					}
				}
				// One result buffer per device, and one shared by all.
				each, one := bufs(8*count), make([]byte, 8*count)
				if err := c.Virtual(tc.devices).AllReduceEach(send, each, count, Float64, Sum); err != nil {
					return err
				}
				shared := make([][]byte, len(mine))
				for k := range shared {
					shared[k] = one
				}
				if err := c.Virtual(tc.devices).AllReduceEach(send, shared, count, Float64, Sum); err != nil {
					return err
				}
				for k := range mine {
					if !bytes.Equal(each[k], small) || !bytes.Equal(shared[k], small) {
						fail("allreduce", k)
					}
				}
				return nil
			})
		}
	}
}

func TestVirtualCollectivesBadInput(t *testing.T) {
	comms := newLocal(t, 2, Options{Timeout: 5 * time.Second})
	c := comms[0]
	one, two := [][]byte{make([]byte, 32)}, [][]byte{make([]byte, 64)}
	place := []int{0, 1}
	for name, err := range map[string]error{
		"reduce, no devices":       c.Virtual(nil).Reduce(one, one[0], 4, Float64, Sum, 0),
		"reduce, root":             c.Virtual(place).Reduce(one, one[0], 4, Float64, Sum, 2),
		"reduce, short recv":       c.Virtual(place).Reduce(one, make([]byte, 8), 4, Float64, Sum, 0),
		"reduce, bad op":           c.Virtual(place).Reduce(one, one[0], 4, Float64, Band, 0),
		"reducescatter, short":     c.Virtual(place).ReduceScatter(one, one, 4, Float64, Sum),
		"reducescatter, recvs":     c.Virtual(place).ReduceScatter(two, nil, 4, Float64, Sum),
		"allgather, short recv":    c.Virtual(place).AllGather(one, one, 4, Float64),
		"allgather, bad type":      c.Virtual(place).AllGather(one, two, 4, DataType(99)),
		"alltoall, rank":           c.Virtual([]int{0, 2}).AllToAll(two, two, 4, Float64),
		"alltoall, too many sends": c.Virtual(place).AllToAll([][]byte{two[0], two[0]}, two, 4, Float64),
		"broadcast, root":          c.Virtual(place).Broadcast(one[0], one, 4, Float64, -1),
		"broadcast, short send":    c.Virtual(place).Broadcast(make([]byte, 8), one, 4, Float64, 0),
		"allreduce, recvs":         c.Virtual(place).AllReduceEach(one, [][]byte{one[0], one[0]}, 4, Float64, Sum),
	} {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

// A rank that hosts no device passes no buffers and still takes part:
// every collective completes and the others' results are right.
func TestVirtualCollectivesIdleRank(t *testing.T) {
	const count = 1000
	devices := []int{0, 2, 2, 0} // rank 1 hosts nothing
	m := len(devices)
	want := devFold(m, count, false)
	mustRanks(t, newLocal(t, 3, Options{Timeout: 20 * time.Second}), func(c *Comm) error {
		var send, recv, big, wide [][]byte
		for v, r := range devices {
			if r == c.Rank() {
				send = append(send, devVector(v, count))
				recv = append(recv, make([]byte, 8*count))
				big = append(big, make([]byte, 8*m*count))
				wide = append(wide, make([]byte, 8*m*count))
			}
		}
		var root []byte
		if c.Rank() == devices[1] {
			root = send[0]
		}
		if err := firstErr(
			c.Virtual(devices).AllReduceEach(send, recv, count, Float64, Sum),
			c.Virtual(devices).ReduceScatter(big, recv, count, Float64, Sum),
			c.Virtual(devices).AllGather(send, wide, count, Float64),
			c.Virtual(devices).AllToAll(big, wide, count, Float64),
			c.Virtual(devices).Broadcast(root, recv, count, Float64, 1),
		); err != nil {
			return err
		}
		if c.Rank() == 0 {
			red := make([]byte, 8*count)
			if err := c.Virtual(devices).Reduce(send, red, count, Float64, Sum, 3); err != nil {
				return err
			}
			if !bytes.Equal(red, want) {
				t.Error("reduce with an idle rank: not the fold in device order")
			}
		} else if err := c.Virtual(devices).Reduce(send, nil, count, Float64, Sum, 3); err != nil {
			return err
		}
		return nil
	})
}
