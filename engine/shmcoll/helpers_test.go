//go:build linux

package shmcoll

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/kernel"
)

// newTag returns a fresh communicator tag.
func newTag() [8]byte {
	var t [8]byte
	binary.LittleEndian.PutUint64(t[:], rand.Uint64())
	return t
}

// world is n ranks of one communicator as goroutines of this process, each
// with its own Arena (its own mappings of every file).
type world struct {
	tag    [8]byte
	arenas []*Arena
}

func newWorld(t testing.TB, n, slot int) *world {
	t.Helper()
	w := &world{tag: newTag(), arenas: make([]*Arena, n)}
	peers := map[int]PeerInfo{}
	for r := range n {
		a, err := Create(Config{Rank: r, Size: n, Tag: w.tag, SlotBytes: slot})
		if err != nil {
			w.close()
			t.Fatal(err)
		}
		w.arenas[r] = a
		peers[r] = a.Ref()
	}
	for _, a := range w.arenas {
		if err := a.Connect(context.Background(), peers); err != nil {
			w.close()
			t.Fatal(err)
		}
	}
	for _, a := range w.arenas {
		a.Release()
	}
	if fds := shmtest.Fds(segPrefix(w.tag)); len(fds) != 0 {
		t.Fatalf("descriptors open after Release: %v", fds)
	}
	t.Cleanup(func() {
		w.close()
		checkNoFiles(t, w.tag)
	})
	return w
}

func (w *world) close() {
	for _, a := range w.arenas {
		if a != nil {
			a.Close()
		}
	}
}

// run calls f on every rank in its own goroutine and returns the errors.
func (w *world) run(f func(r int, a *Arena) error) []error {
	errs := make([]error, len(w.arenas))
	var wg sync.WaitGroup
	for r, a := range w.arenas {
		wg.Go(func() { errs[r] = f(r, a) })
	}
	wg.Wait()
	return errs
}

// segPrefix starts the names of the segments of communicator tag;
// allocPrefix those of its registered allocations.
func segPrefix(tag [8]byte) string   { return fmt.Sprintf("gocoll-arena-%x-", tag[:]) }
func allocPrefix(tag [8]byte) string { return fmt.Sprintf("gocoll-alloc-%x-", tag[:]) }

// checkNoFiles: nothing of communicator tag is named in /dev/shm, and no
// segment of it is open or mapped here any more (allocations stay until
// Free, by design: C code may hold them after Close).
func checkNoFiles(t testing.TB, tag [8]byte) {
	t.Helper()
	left := append(shmtest.Leftovers(segPrefix(tag)), shmtest.Files(allocPrefix(tag))...)
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// A tcase is one collective call of the conformance matrix. count is in
// elements: the buffer of AllReduce, Reduce and Broadcast, the send block of
// AllGather, the recv block of ReduceScatter, the per-peer block of AllToAll.
type tcase struct {
	kind    string
	dt      kernel.DataType
	op      kernel.RedOp
	count   int
	root    int
	inPlace bool
	random  bool // random floats instead of small integers
	reg     bool // even ranks' send buffers come from Arena.Alloc
}

func (c tcase) String() string {
	s := fmt.Sprintf("%s/%v/%v/count=%d/root=%d", c.kind, c.dt, c.op, c.count, c.root)
	if c.inPlace {
		s += "/inplace"
	}
	if c.random {
		s += "/random"
	}
	if c.reg {
		s += "/registered"
	}
	return s
}

func (c tcase) sig() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s %d %d %d %d", c.kind, c.dt, c.op, c.count, c.root)
	return h.Sum64()
}

var (
	testTypes = []kernel.DataType{kernel.Float32, kernel.Float64, kernel.Float16, kernel.Bfloat16, kernel.Int32, kernel.Int8}
	testKinds = []string{"allreduce", "reduce", "reducescatter", "broadcast", "allgather", "alltoall"}
)

func isReduction(kind string) bool {
	return kind == "allreduce" || kind == "reduce" || kind == "reducescatter"
}

// matrix lists the conformance cases for n ranks and slot bytes: every
// collective × type × op (ops only for reductions) × count × in place or
// not, then random-float reductions. Counts: 0, 1, 7, n-1, 4096+3, and more
// than a slot's piece (several pieces).
func matrix(n, slot int, types []kernel.DataType, ops []kernel.RedOp) []tcase {
	var out []tcase
	for _, kind := range testKinds {
		kops := ops
		if !isReduction(kind) {
			kops = []kernel.RedOp{kernel.Sum}
		}
		for _, dt := range types {
			piece := slot
			if kind == "reducescatter" || kind == "alltoall" {
				piece = slot / n &^ 63
			}
			counts := []int{0, 1, 7, n - 1, 4096 + 3, 2*piece/dt.Size() + 5}
			for _, op := range kops {
				for i, count := range counts {
					for _, inPlace := range []bool{false, true} {
						out = append(out, tcase{kind: kind, dt: dt, op: op, count: count, root: (i + int(op)) % n, inPlace: inPlace})
					}
				}
			}
		}
	}
	for _, kind := range []string{"allreduce", "reduce", "reducescatter"} {
		for _, dt := range []kernel.DataType{kernel.Float32, kernel.Float64, kernel.Float16, kernel.Bfloat16} {
			for _, op := range []kernel.RedOp{kernel.Sum, kernel.Prod, kernel.Avg} {
				for _, count := range []int{7, 1000, 4096 + 3, 2*slot/dt.Size() + 5} {
					out = append(out, tcase{kind: kind, dt: dt, op: op, count: count, root: n - 1, random: true})
				}
			}
		}
	}
	return out
}

// input is rank r's contribution for case c at sequence seq: elems
// elements, small integers in [-2, 2] (sums and products of up to 6 ranks
// are exact in every type, so any order gives the reference's bits) or
// random floats in [-1, 1).
func input(c tcase, seq uint64, r, elems int) []byte {
	rng := rand.New(rand.NewPCG(seq, uint64(r)*0x9e3779b97f4a7c15+1))
	b := make([]byte, elems*c.dt.Size())
	ne := binary.NativeEndian
	for i := range elems {
		var v float64
		if c.random {
			v = rng.Float64()*2 - 1
		} else {
			v = float64(rng.IntN(5) - 2)
		}
		p := b[i*c.dt.Size():]
		switch c.dt {
		case kernel.Int8, kernel.Uint8:
			p[0] = byte(int8(v))
		case kernel.Int32, kernel.Uint32:
			ne.PutUint32(p, uint32(int32(v)))
		case kernel.Int64, kernel.Uint64:
			ne.PutUint64(p, uint64(int64(v)))
		case kernel.Float16:
			ne.PutUint16(p, kernel.Float32ToFloat16(float32(v)))
		case kernel.Bfloat16:
			ne.PutUint16(p, kernel.Float32ToBfloat16(float32(v)))
		case kernel.Float32:
			ne.PutUint32(p, math.Float32bits(float32(v)))
		case kernel.Float64:
			ne.PutUint64(p, math.Float64bits(v))
		}
	}
	return b
}

// refFold combines terms in rank order with kernel.ReferenceReduce, then
// divides for Avg: the order every shmcoll reduction promises.
func refFold(terms [][]byte, dt kernel.DataType, op kernel.RedOp) []byte {
	acc := bytes.Clone(terms[0])
	for _, t := range terms[1:] {
		kernel.ReferenceReduce(acc, t, dt, op)
	}
	if op == kernel.Avg {
		kernel.DivideBy(acc, dt, len(terms))
	}
	return acc
}

func garbage(n int) []byte { return bytes.Repeat([]byte{0xa5}, n) }

// runCase runs c on rank r of n and checks the result against the reference.
// It returns a hash of what this rank received (for the cross-rank and
// cross-run comparisons).
func runCase(ctx context.Context, a *Arena, seq uint64, c tcase) (uint64, error) {
	n, r := a.Size(), a.Rank()
	es := c.dt.Size()
	call := Call{Seq: seq, Sig: c.sig()}
	var got, want []byte
	var err error
	// sendBuf returns a copy of data, in registered memory if c.reg asks
	// (freed at the end).
	var toFree [][]byte
	regBuf := func(data []byte) []byte {
		b, err := a.Alloc(len(data))
		if err != nil {
			panic(err)
		}
		copy(b, data)
		toFree = append(toFree, b)
		return b
	}
	sendBuf := func(data []byte) []byte {
		if !c.reg || r%2 != 0 || len(data) == 0 {
			return bytes.Clone(data)
		}
		return regBuf(data)
	}
	// recvBuf: AllReduce results in registered memory on ranks 0, 2 and 3
	// (so rank 3 has a plain send and a registered recv), plain on rank 1.
	recvBuf := func(data []byte) []byte {
		if !c.reg || r%4 == 1 || len(data) == 0 {
			return data
		}
		return regBuf(data)
	}
	defer func() {
		for _, b := range toFree {
			if err := a.Free(b); err != nil {
				panic(err)
			}
		}
	}()
	switch c.kind {
	case "allreduce", "reduce":
		ins := make([][]byte, n)
		for j := range n {
			ins[j] = input(c, seq, j, c.count)
		}
		send := sendBuf(ins[r])
		recv := garbage(len(send))
		if c.kind == "allreduce" {
			recv = recvBuf(recv)
		}
		if c.inPlace {
			recv = send
		}
		if c.kind == "allreduce" {
			err = a.AllReduce(ctx, call, send, recv, c.dt, c.op)
		} else {
			if r != c.root {
				recv = nil
			}
			err = a.Reduce(ctx, call, send, recv, c.dt, c.op, c.root)
		}
		if err == nil && !c.inPlace && !bytes.Equal(send, ins[r]) {
			return 0, fmt.Errorf("%v: send buffer modified", c)
		}
		if recv != nil {
			got, want = recv, refFold(ins, c.dt, c.op)
		}
	case "reducescatter":
		blk := c.count * es
		orig := input(c, seq, r, n*c.count)
		send := sendBuf(orig)
		recv := garbage(blk)
		if c.inPlace {
			recv = send[r*blk : (r+1)*blk]
		}
		err = a.ReduceScatter(ctx, call, send, recv, c.dt, c.op)
		if err == nil && !c.inPlace && !bytes.Equal(send, orig) {
			return 0, fmt.Errorf("%v: send buffer modified", c)
		}
		terms := make([][]byte, n)
		for j := range n {
			terms[j] = input(c, seq, j, n*c.count)[r*blk : (r+1)*blk]
		}
		got, want = recv, refFold(terms, c.dt, c.op)
	case "broadcast":
		buf := garbage(c.count * es)
		want = input(c, seq, c.root, c.count)
		if r == c.root {
			buf = sendBuf(want)
		}
		err = a.Broadcast(ctx, call, buf, c.root)
		got = buf
	case "allgather":
		blk := c.count * es
		mine := input(c, seq, r, c.count)
		recv := garbage(n * blk)
		send := mine
		if c.inPlace {
			if c.reg {
				recv = sendBuf(recv)
			}
			send = recv[r*blk : (r+1)*blk]
			copy(send, mine)
		} else {
			send = sendBuf(mine)
		}
		err = a.AllGather(ctx, call, send, recv)
		if err == nil && !bytes.Equal(send, mine) {
			return 0, fmt.Errorf("%v: send buffer modified", c)
		}
		for j := range n {
			want = append(want, input(c, seq, j, c.count)...)
		}
		got = recv
	case "alltoall":
		blk := c.count * es
		orig := input(c, seq, r, n*c.count)
		send := sendBuf(orig)
		recv := garbage(len(send))
		if c.inPlace {
			recv = send
		}
		err = a.AllToAll(ctx, call, send, recv)
		if err == nil && !c.inPlace && !bytes.Equal(send, orig) {
			return 0, fmt.Errorf("%v: send buffer modified", c)
		}
		for j := range n {
			want = append(want, input(c, seq, j, n*c.count)[r*blk:(r+1)*blk]...)
		}
		got = recv
	default:
		return 0, fmt.Errorf("unknown collective %q", c.kind)
	}
	if err != nil {
		return 0, fmt.Errorf("%v: %w", c, err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		return 0, fmt.Errorf("%v on rank %d: result differs from the reference at byte %d (element %d) of %d: got % x, want % x",
			c, r, i, i/es, len(got), got[i/es*es:min(len(got), i/es*es+es)], want[i/es*es:min(len(want), i/es*es+es)])
	}
	h := fnv.New64a()
	h.Write(got)
	return h.Sum64(), nil
}

// runMatrix runs cases in order on one rank; hashes[i] is case i's hash.
// It stops at the first error, aborting the arena so that the other ranks
// stop too.
func runMatrix(ctx context.Context, a *Arena, cases []tcase, hashes []uint64) error {
	for i, c := range cases {
		h, err := runCase(ctx, a, uint64(i+1), c)
		if err != nil {
			a.Abort(err)
			return err
		}
		hashes[i] = h
	}
	return nil
}

// allocsPerCall makes every rank run call runs+1 times, with sequence
// numbers from first on, and returns rank 0's allocations per call
// (testing.AllocsPerRun; the peers must make as many calls). It fails the
// test on any error.
func allocsPerCall(t *testing.T, w *world, runs int, first uint64, call func(r int, a *Arena, seq uint64) error) float64 {
	t.Helper()
	var allocs float64
	errs := w.run(func(r int, a *Arena) error {
		seq := first
		var err error
		f := func() {
			if e := call(r, a, seq); e != nil && err == nil {
				err = e
			}
			seq++
		}
		if r == 0 {
			allocs = testing.AllocsPerRun(runs, f)
		} else {
			for range runs + 1 {
				f()
			}
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(errorsText(errs))
		}
	}
	return allocs
}

func errorsText(errs []error) string {
	var b strings.Builder
	for r, err := range errs {
		if err != nil {
			fmt.Fprintf(&b, "\n  rank %d: %v", r, err)
		}
	}
	return b.String()
}
