package vppu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu/redist"
)

// onRanks runs f on every rank of n in-process ranks and returns their
// errors.
func onRanks(t *testing.T, n int, f func(c *engine.Comm) error) []error {
	t.Helper()
	return onRanksOpts(t, n, engine.Options{Timeout: 20 * time.Second}, f)
}

func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// contribution is device v's data for a call: random float32 values, so a
// change of summation order changes bits.
func contribution(seed, v, count int) []byte {
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(v)))
	b := make([]byte, 4*count)
	for i := range count {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.NormFloat64())*float32(1+v)))
	}
	return b
}

// foldRef is the documented order, written out plainly: device 0 first.
func foldRef(xs [][]byte) []byte {
	out := make([]byte, len(xs[0]))
	for i := 0; i < len(out); i += 4 {
		acc := math.Float32frombits(binary.LittleEndian.Uint32(xs[0][i:]))
		for _, x := range xs[1:] {
			acc += math.Float32frombits(binary.LittleEndian.Uint32(x[i:]))
		}
		binary.LittleEndian.PutUint32(out[i:], math.Float32bits(acc))
	}
	return out
}

// results runs every collective on m virtual devices placed by place over
// n ranks and returns, per device, what each collective left in its recv.
func results(t *testing.T, m, n int, place Place) map[string][][]byte {
	t.Helper()
	out := map[string][][]byte{}
	var mu sync.Mutex
	put := func(name string, v int, b []byte) {
		mu.Lock()
		defer mu.Unlock()
		if out[name] == nil {
			out[name] = make([][]byte, m)
		}
		out[name][v] = bytes.Clone(b)
	}
	l, err := ParseLogical("ring", m)
	if err != nil {
		t.Fatal(err)
	}
	noErrors(t, onRanks(t, n, func(pc *engine.Comm) error {
		c, err := New(pc, l, place)
		if err != nil {
			return err
		}
		defer c.Destroy()
		return everyCollective(c, put)
	}))
	return out
}

// everyCollective runs every collective on c's local devices (count
// elements each) and hands each device's result to put.
func everyCollective(c *Comm, put func(name string, v int, b []byte)) error {
	const count = 37 // not a multiple of anything
	m := c.Size()
	local := c.Local()
	bufs := func(size int, fill func(v int) []byte) [][]byte {
		bs := make([][]byte, len(local))
		for k, v := range local {
			bs[k] = make([]byte, size)
			if fill != nil {
				copy(bs[k], fill(v))
			}
		}
		return bs
	}
	if len(local) == 0 {
		return nil
	}
	send := bufs(4*count, func(v int) []byte { return contribution(1, v, count) })
	recv := bufs(4*count, nil)
	if err := c.AllReduce(send, recv, count, engine.Float32, engine.Sum); err != nil {
		return err
	}
	for k, v := range local {
		put("allreduce", v, recv[k])
	}
	// In place, and non-blocking.
	inplace := bufs(4*count, func(v int) []byte { return contribution(1, v, count) })
	r, err := c.IAllReduce(inplace, inplace, count, engine.Float32, engine.Avg)
	if err != nil {
		return err
	}
	if err := r.Wait(); err != nil {
		return err
	}
	for k, v := range local {
		put("allreduce-avg", v, inplace[k])
	}
	root := m - 1
	red := bufs(4*count, nil)
	if err := c.Reduce(send, red, count, engine.Float32, engine.Sum, root); err != nil {
		return err
	}
	for k, v := range local {
		if v == root {
			put("reduce", v, red[k])
		}
	}
	bc := bufs(4*count, nil)
	if err := c.Broadcast(send, bc, count, engine.Float32, m/2); err != nil {
		return err
	}
	for k, v := range local {
		put("broadcast", v, bc[k])
	}
	ag := bufs(4*count*m, nil)
	if err := c.AllGather(send, ag, count, engine.Float32); err != nil {
		return err
	}
	for k, v := range local {
		put("allgather", v, ag[k])
	}
	big := bufs(4*count*m, func(v int) []byte { return contribution(2, v, count*m) })
	rs := bufs(4*count, nil)
	if err := c.ReduceScatter(big, rs, count, engine.Float32, engine.Sum); err != nil {
		return err
	}
	for k, v := range local {
		put("reducescatter", v, rs[k])
	}
	a2a := bufs(4*count*m, nil)
	if err := c.AllToAll(big, a2a, count, engine.Float32); err != nil {
		return err
	}
	for k, v := range local {
		put("alltoall", v, a2a[k])
	}
	return c.Barrier()
}

// reference computes what every collective must give, from the
// contributions, the documented fold order and plain loops.
func reference(m int) map[string][][]byte {
	const count = 37
	out := map[string][][]byte{}
	var xs, bigs [][]byte
	for v := range m {
		xs = append(xs, contribution(1, v, count))
		bigs = append(bigs, contribution(2, v, count*m))
	}
	sum := foldRef(xs)
	avg := bytes.Clone(sum)
	for i := 0; i < len(avg); i += 4 {
		f := math.Float32frombits(binary.LittleEndian.Uint32(avg[i:]))
		binary.LittleEndian.PutUint32(avg[i:], math.Float32bits(f/float32(m)))
	}
	var gathered []byte
	for _, x := range xs {
		gathered = append(gathered, x...)
	}
	for _, name := range []string{"allreduce", "allreduce-avg", "reduce", "broadcast", "allgather", "reducescatter", "alltoall"} {
		out[name] = make([][]byte, m)
	}
	for v := range m {
		out["allreduce"][v] = sum
		out["allreduce-avg"][v] = avg
		out["broadcast"][v] = xs[m/2]
		out["allgather"][v] = gathered
		var blocks [][]byte
		var a2a []byte
		for w := range m {
			blocks = append(blocks, bigs[w][4*count*v:4*count*(v+1)])
			a2a = append(a2a, bigs[w][4*count*v:4*count*(v+1)]...)
		}
		out["reducescatter"][v] = foldRef(blocks)
		out["alltoall"][v] = a2a
	}
	out["reduce"][m-1] = sum
	return out
}

// Every collective at M = 1..9 virtual devices over 1..M ranks, placed in
// blocks and cyclically: each device's result equals the reference bit for
// bit, so all placements agree with each other.
func TestPlacementIndependence(t *testing.T) {
	for m := 1; m <= 9; m++ {
		want := reference(m)
		for n := 1; n <= m; n++ {
			for _, place := range []Place{Block(m, n), CyclicPlace(m, n)} {
				got := results(t, m, n, place)
				for name, devs := range want {
					for v, w := range devs {
						if w != nil && !bytes.Equal(got[name][v], w) {
							t.Fatalf("M=%d on %d ranks placed %v: %s of device %d differs from the reference", m, n, place, name, v)
						}
					}
				}
			}
		}
	}
}

// Ranks the placement leaves out still create the communicator (it is a
// collective of the parent) and are told, clearly, that they host nothing.
func TestUnplacedRanks(t *testing.T) {
	l, _ := ParseLogical("full", 3)
	errs := onRanks(t, 4, func(pc *engine.Comm) error {
		c, err := New(pc, l, Place{0, 0, 2})
		if err != nil {
			return err
		}
		defer c.Destroy()
		send := make([][]byte, len(c.Local()))
		for k := range send {
			send[k] = make([]byte, 8)
		}
		err = c.AllReduce(send, send, 2, engine.Float32, engine.Sum)
		if pc.Rank() == 1 || pc.Rank() == 3 {
			if !errors.Is(err, ErrNoDevice) {
				return fmt.Errorf("unplaced rank: got %v, want ErrNoDevice", err)
			}
			return nil
		}
		return err
	})
	noErrors(t, errs)
}

// Bad input: a placement the ranks disagree on fails on every rank; a
// wrong number of buffers, short buffers or a bad root are argument
// errors, and the communicator keeps working after them.
func TestBadInput(t *testing.T) {
	l, _ := ParseLogical("ring", 4)
	errs := onRanks(t, 2, func(pc *engine.Comm) error {
		place := Block(4, 2)
		if pc.Rank() == 1 {
			place = CyclicPlace(4, 2)
		}
		if _, err := New(pc, l, place); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("disagreeing placements: got %v", err)
		}
		if _, err := New(pc, l, Place{0, 1, 2, 0}); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("rank out of range: got %v", err)
		}
		c, err := New(pc, l, Block(4, 2))
		if err != nil {
			return err
		}
		defer c.Destroy()
		two := [][]byte{make([]byte, 16), make([]byte, 16)}
		if err := c.AllReduce(two[:1], two[:1], 4, engine.Float32, engine.Sum); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("one buffer for two devices: got %v", err)
		}
		if err := c.AllReduce(two, two, 5, engine.Float32, engine.Sum); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("short buffers: got %v", err)
		}
		if err := c.Broadcast(two, two, 4, engine.Float32, 9); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("bad root: got %v", err)
		}
		if err := c.Register(7, "w", nil); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("register on a foreign device: got %v", err)
		}
		if err := c.AllReduce(two, two, 4, engine.Float32, engine.Band); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("band on float32: got %v", err)
		}
		if err := c.ReduceScatter(two, two, 4, engine.Bool, engine.Avg); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("avg on bool: got %v", err)
		}
		// bool or over the devices: device v's byte v is 2 (true), the
		// rest 0; the result is normalised to 1.
		flags := make([][]byte, len(c.Local()))
		for k, v := range c.Local() {
			flags[k] = make([]byte, 8)
			flags[k][v] = 2
		}
		if err := c.AllReduce(flags, flags, 8, engine.Bool, engine.Bor); err != nil {
			return err
		}
		for _, f := range flags {
			if !bytes.Equal(f, []byte{1, 1, 1, 1, 0, 0, 0, 0}) {
				return fmt.Errorf("bool bor: got %v", f)
			}
		}
		return c.AllReduce(two, two, 4, engine.Float32, engine.Sum)
	})
	noErrors(t, errs)
}

// Migration in one process: 8 devices on 4 ranks move to ranks {1, 3};
// their registered buffers arrive, the others leave, and an allreduce
// after the move gives the bits it gave before.
func TestMigrateInProcess(t *testing.T) {
	const m, count = 8, 1000
	l, _ := ParseLogical("torus:2x4", m)
	to := Place{1, 1, 1, 1, 3, 3, 3, 3}
	errs := onRanks(t, 4, func(pc *engine.Comm) error {
		c, err := New(pc, l, Block(m, 4))
		if err != nil {
			return err
		}
		defer c.Destroy()
		allreduce := func() ([][]byte, error) {
			var bufs [][]byte
			for _, v := range c.Local() {
				b, ok := c.Buffer(v, "grad")
				if !ok {
					return nil, fmt.Errorf("device %d has no grad buffer", v)
				}
				bufs = append(bufs, b)
			}
			out := make([][]byte, len(bufs))
			for k := range out {
				out[k] = make([]byte, 4*count)
			}
			return out, c.AllReduce(bufs, out, count, engine.Float32, engine.Sum)
		}
		for _, v := range c.Local() {
			if err := c.Register(v, "grad", contribution(3, v, count)); err != nil {
				return err
			}
			if err := c.Register(v, "empty", nil); err != nil {
				return err
			}
		}
		before, err := allreduce()
		if err != nil {
			return err
		}
		if err := c.Migrate(to); err != nil {
			return err
		}
		if pc.Rank() == 0 || pc.Rank() == 2 {
			if len(c.Local()) != 0 {
				return fmt.Errorf("rank %d still hosts %v", pc.Rank(), c.Local())
			}
			return nil
		}
		for _, v := range c.Local() {
			if b, _ := c.Buffer(v, "grad"); !bytes.Equal(b, contribution(3, v, count)) {
				return fmt.Errorf("device %d: grad buffer damaged by the move", v)
			}
			if names := c.Buffers(v); len(names) != 2 {
				return fmt.Errorf("device %d arrived with buffers %v", v, names)
			}
		}
		after, err := allreduce()
		if err != nil {
			return err
		}
		if !bytes.Equal(after[0], before[0]) {
			return fmt.Errorf("allreduce after migration differs from before")
		}
		tb, err := c.Tables()
		if err != nil {
			return err
		}
		for _, e := range tb.Physical {
			if e.Ranks[0] != to[e.From] || e.Ranks[1] != to[e.To] {
				return fmt.Errorf("routing table not regenerated: %+v", e)
			}
		}
		return nil
	})
	noErrors(t, errs)
}

// A redistribution whose processors are virtual devices: cyclic(3) over 6
// devices into cyclic(4) over 5, on 1..4 ranks in blocks and cyclically
// (so one step often has several messages between the same two ranks).
// Every element lands where the destination layout puts it.
func TestRedistributeOnVirtualDevices(t *testing.T) {
	const m, n = 6, 500
	p, err := redist.PlanAffine(redist.Affine{Src: redist.Cyclic{Procs: 6, Block: 3}, Dst: redist.Cyclic{Procs: 5, Block: 4},
		SrcIndex: redist.Access{A: 1}, DstIndex: redist.Access{A: 1}, N: n})
	if err != nil {
		t.Fatal(err)
	}
	global := func(proc, off, b, procs int) int { return (off/b*procs+proc)*b + off%b }
	l, _ := ParseLogical("ring", m)
	for ranks := 1; ranks <= 4; ranks++ {
		for _, place := range []Place{Block(m, ranks), CyclicPlace(m, ranks)} {
			noErrors(t, onRanks(t, ranks, func(pc *engine.Comm) error {
				c, err := New(pc, l, place)
				if err != nil {
					return err
				}
				defer c.Destroy()
				local := c.Local()
				src, dst := make([][]byte, len(local)), make([][]byte, len(local))
				for k, v := range local {
					src[k] = make([]byte, 8*p.SrcElems(v))
					for off := range p.SrcElems(v) {
						binary.LittleEndian.PutUint64(src[k][8*off:], uint64(global(v, off, 3, 6)))
					}
					if v < 5 {
						dst[k] = make([]byte, 8*p.DstElems(v))
					}
				}
				if err := c.Redistribute(p, src, dst, engine.Uint64); err != nil {
					return err
				}
				for k, v := range local {
					for off := range len(dst[k]) / 8 {
						if got, want := binary.LittleEndian.Uint64(dst[k][8*off:]), uint64(global(v, off, 4, 5)); got != want {
							return fmt.Errorf("placed %v: device %d offset %d holds element %d, want %d", place, v, off, got, want)
						}
					}
				}
				return nil
			}))
		}
	}
}

// TestAllReduceLongVectors: vectors of many chunks on block, cyclic and
// explicit placements, with the send buffers as views of one array (read
// in place), as separate arrays (copied together) and in place, and with
// every device's recv the same buffer: each result equals the reference
// fold bit for bit.
func TestAllReduceLongVectors(t *testing.T) {
	const m, count = 8, 100_003
	var xs [][]byte
	for v := range m {
		xs = append(xs, contribution(7, v, count))
	}
	want := foldRef(xs)
	l, err := ParseLogical("ring", m)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		n     int
		place Place
	}{
		{2, Block(m, 2)}, {3, Block(m, 3)}, {2, CyclicPlace(m, 2)}, {3, Place{2, 2, 0, 1, 1, 2, 0, 0}},
	} {
		noErrors(t, onRanks(t, tc.n, func(pc *engine.Comm) error {
			c, err := New(pc, l, tc.place)
			if err != nil {
				return err
			}
			defer c.Destroy()
			local := c.Local()
			n := 4 * count
			whole := make([]byte, len(local)*n)
			views, separate := make([][]byte, len(local)), make([][]byte, len(local))
			for k, v := range local {
				views[k] = whole[k*n : (k+1)*n]
				copy(views[k], xs[v])
				separate[k] = bytes.Clone(xs[v])
			}
			shared := make([]byte, n)
			same := make([][]byte, len(local))
			for k := range same {
				same[k] = shared
			}
			for _, send := range [][][]byte{views, separate} {
				clear(shared)
				if err := c.AllReduce(send, same, count, engine.Float32, engine.Sum); err != nil {
					return err
				}
				if !bytes.Equal(shared, want) {
					return fmt.Errorf("placement %v: result differs from the reference fold", tc.place)
				}
			}
			if err := c.AllReduce(separate, separate, count, engine.Float32, engine.Sum); err != nil {
				return err
			}
			for k := range separate {
				if !bytes.Equal(separate[k], want) {
					return fmt.Errorf("placement %v in place: device %d's result differs from the reference fold", tc.place, local[k])
				}
			}
			return nil
		}))
	}
}

// TestSharedStateMigrates: state registered once per rank (RegisterShared)
// is found with every local device, stays put on ranks that keep devices,
// reaches ranks that host devices for the first time (one copy each) and
// is dropped by ranks left without devices; names are shared or per
// device, not both.
func TestSharedStateMigrates(t *testing.T) {
	const m = 8
	l, _ := ParseLogical("ring", m)
	state := func(r int) []byte { return contribution(11, 100+r, 64) }
	steps := []Place{
		{1, 1, 1, 1, 3, 3, 3, 3}, // onto two ranks: no copy needed
		{0, 0, 1, 1, 2, 2, 3, 3}, // back to four: ranks 0 and 2 get one
		{0, 1, 2, 3, 0, 1, 2, 3}, // cyclic: every rank kept devices
	}
	errs := onRanks(t, 4, func(pc *engine.Comm) error {
		c, err := New(pc, l, Block(m, 4))
		if err != nil {
			return err
		}
		defer c.Destroy()
		// Every rank starts with its own value, to see where copies come
		// from (a real job registers identical state everywhere).
		mine := state(pc.Rank())
		if err := c.RegisterShared("params", mine); err != nil {
			return err
		}
		if err := c.Register(c.Local()[0], "params", nil); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("a per-device buffer named like a shared one: %v", err)
		}
		if err := c.Register(c.Local()[0], "own", []byte{1}); err != nil {
			return err
		}
		if err := c.RegisterShared("own", nil); !errors.Is(err, engine.ErrInvalidArgument) {
			return fmt.Errorf("a shared buffer named like a device's: %v", err)
		}
		for i, to := range steps {
			if err := c.Migrate(to); err != nil {
				return err
			}
			local := c.Local()
			if len(local) == 0 {
				if _, ok := c.Buffer(0, "params"); ok {
					return fmt.Errorf("step %d: rank %d kept shared state without devices", i, pc.Rank())
				}
				continue
			}
			want := mine
			if i == 1 && (pc.Rank() == 0 || pc.Rank() == 2) {
				// From the rank of the lowest device it received (1, 3).
				want = state(pc.Rank() + 1)
			}
			for _, v := range local {
				b, ok := c.Buffer(v, "params")
				if !ok || !bytes.Equal(b, want) {
					return fmt.Errorf("step %d: device %d on rank %d: shared state %v, want the copy of rank %d's", i, v, pc.Rank(), ok, pc.Rank())
				}
				if names := c.Buffers(v); !slices.Contains(names, "params") {
					return fmt.Errorf("step %d: device %d lists %v", i, v, names)
				}
			}
			mine = want
		}
		return nil
	})
	noErrors(t, errs)
}
