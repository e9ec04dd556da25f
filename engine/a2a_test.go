package engine

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/exec"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// vJob is an alltoallv every rank can compute: counts[i][j] elements from
// rank i to rank j, each rank's blocks in a shuffled order with gaps.
type vJob struct {
	n, es          int
	counts         [][]int
	sdispls        [][]int // [rank][peer], elements
	rdispls        [][]int
	sendLen        []int // elements of each rank's send buffer
	recvLen        []int
	seed           int64
	sendBuf, recvB [][]byte
}

// newVJob draws block sizes from sizes (in elements), zeros included.
func newVJob(n, es int, seed int64, sizes func(rng *rand.Rand) int) *vJob {
	rng := rand.New(rand.NewSource(seed))
	j := &vJob{n: n, es: es, seed: seed}
	j.counts = make([][]int, n)
	for i := range n {
		j.counts[i] = make([]int, n)
		for k := range n {
			j.counts[i][k] = sizes(rng)
		}
	}
	place := func(count func(peer int) int) ([]int, int) {
		d := make([]int, n)
		off := 0
		for _, peer := range rng.Perm(n) {
			off += rng.Intn(3) // a gap
			d[peer] = off
			off += count(peer)
		}
		return d, off + rng.Intn(2)
	}
	j.sdispls, j.rdispls = make([][]int, n), make([][]int, n)
	j.sendLen, j.recvLen = make([]int, n), make([]int, n)
	for r := range n {
		j.sdispls[r], j.sendLen[r] = place(func(p int) int { return j.counts[r][p] })
		j.rdispls[r], j.recvLen[r] = place(func(p int) int { return j.counts[p][r] })
	}
	return j
}

// elem is element e of the block from rank i to rank k, as a byte pattern.
func (j *vJob) put(dst []byte, i, k, e int) {
	for b := range j.es {
		dst[b] = byte(i*131 + k*31 + e*7 + b + int(j.seed))
	}
}

// send is rank r's send buffer; recv a receive buffer filled with 0xee.
func (j *vJob) send(r int) []byte {
	buf := make([]byte, j.sendLen[r]*j.es)
	for k := range j.n {
		for e := range j.counts[r][k] {
			j.put(buf[(j.sdispls[r][k]+e)*j.es:], r, k, e)
		}
	}
	return buf
}

func (j *vJob) recv(r int) []byte {
	buf := make([]byte, j.recvLen[r]*j.es)
	for i := range buf {
		buf[i] = 0xee
	}
	return buf
}

// check compares rank r's receive buffer with what it must hold: every
// block in place, the gaps untouched.
func (j *vJob) check(r int, got []byte) error {
	want := j.recv(r)
	for i := range j.n {
		for e := range j.counts[i][r] {
			j.put(want[(j.rdispls[r][i]+e)*j.es:], i, r, e)
		}
	}
	if d := diffBytes(got, want, j.es); d != "" {
		return fmt.Errorf("rank %d: %s", r, d)
	}
	return nil
}

func (j *vJob) sendCounts(r int) []int { return j.counts[r] }
func (j *vJob) recvCounts(r int) []int {
	c := make([]int, j.n)
	for i := range c {
		c[i] = j.counts[i][r]
	}
	return c
}

// run has every rank of comms run the job's alltoallv.
func (j *vJob) run(t *testing.T, comms []*Comm, dt DataType) {
	t.Helper()
	mustRanks(t, comms, func(c *Comm) error {
		r := c.Rank()
		got := j.recv(r)
		if err := c.AllToAllv(j.send(r), j.sendCounts(r), j.sdispls[r], got, j.recvCounts(r), j.rdispls[r], dt); err != nil {
			return err
		}
		return j.check(r, got)
	})
}

var a2aAlgos = []string{"pairwise", "aggregate", "aggregate-tree"}

// The all-to-all of equal blocks through aggregation (static, under the
// control tree, and with one repacking rank per group), at 1..16 ranks,
// blocks from empty to 64 KiB.
func TestAllToAllAggregateSizes(t *testing.T) {
	for n := 1; n <= 16; n++ {
		for _, algo := range []string{"aggregate", "aggregate-tree", "aggregate-leader"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo), func(t *testing.T) {
				comms := newLocal(t, n, Options{Algo: "alltoall=" + algo, Timeout: time.Minute})
				// The check builds every rank's input on every rank: the
				// largest blocks only where that stays cheap.
				sizes := []int{0, 1, 8, 4096, 64 << 10}
				if n > 6 && n != 11 || raceEnabled && n > 4 {
					sizes = []int{0, 1, 8, 4096}
				}
				for _, bytes := range sizes {
					s := suite{dtypes: []DataType{Uint8}, ops: []RedOp{Sum}, counts: []int{bytes}, colls: map[string]bool{"alltoall": true}}
					mustRanks(t, comms, func(c *Comm) error { return conformance(c, s) })
				}
			})
		}
	}
}

// alltoallv through every algorithm at 1..16 ranks: random block sizes
// with zeros, displacements in any order.
func TestAllToAllvAlgorithms(t *testing.T) {
	for n := 1; n <= 16; n++ {
		for _, algo := range a2aAlgos {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo), func(t *testing.T) {
				comms := newLocal(t, n, Options{Algo: "alltoallv=" + algo, Timeout: time.Minute})
				for seed := range int64(3) {
					j := newVJob(n, 4, seed, func(rng *rand.Rand) int {
						if rng.Intn(4) == 0 {
							return 0
						}
						return rng.Intn(9)
					})
					j.run(t, comms, Float32)
				}
			})
		}
	}
}

// Blocks from empty to 64 KiB, on sub-groups that do not divide the ranks
// and on non-contiguous ones (hosts as groups: every other rank).
func TestAllToAllvLargeAndGroups(t *testing.T) {
	sizes := []int{0, 1, 7, 4096, 64 << 10}
	for _, tc := range []struct {
		n     int
		hosts [][]int
	}{
		{11, nil}, // groups of ⌈√11⌉ = 4: 4, 4, 3
		{6, [][]int{{0, 2, 4}, {1, 3, 5}}},
		{7, [][]int{{0, 3, 6}, {1, 4}, {2, 5}}},
	} {
		for _, algo := range a2aAlgos[1:] {
			t.Run(fmt.Sprintf("n=%d/hosts=%v/%s", tc.n, tc.hosts, algo), func(t *testing.T) {
				comms := newPlaced(t, mem.NewWorld(tc.n), tc.hosts, Options{Algo: "alltoallv=" + algo, Timeout: time.Minute})
				j := newVJob(tc.n, 1, 9, func(rng *rand.Rand) int { return sizes[rng.Intn(len(sizes))] })
				j.run(t, comms, Uint8)
			})
		}
	}
}

// Ranks whose counts disagree fail: the rank that finds out names both
// ranks and the collective, nothing hangs, no block of the wrong size is
// written, and a rank that returns without error has every block right.
func TestAllToAllvCountsDiffer(t *testing.T) {
	for _, algo := range append(a2aAlgos, "shm") {
		t.Run(algo, func(t *testing.T) {
			const n = 5
			var comms []*Comm
			if algo == "shm" { // the arena's, which a communicator on one host picks
				comms = newShm(t, n, Options{Timeout: time.Minute})
				if a := comms[0].choose(sched.AllToAllv, 0); a.name != "shm" {
					t.Fatalf("chose %s", a.name)
				}
			} else {
				comms = newLocal(t, n, Options{Algo: "alltoallv=" + algo, Timeout: time.Minute})
			}
			j := newVJob(n, 4, 1, func(rng *rand.Rand) int { return 1 + rng.Intn(5) })
			recvs := make([][]byte, n)
			errs := runRanks(comms, func(c *Comm) error {
				r := c.Rank()
				rc := j.recvCounts(r)
				if r == 3 {
					rc[1]-- // rank 3 expects one element less from rank 1
				}
				recvs[r] = j.recv(r)
				return c.AllToAllv(j.send(r), j.sendCounts(r), j.sdispls[r], recvs[r], rc, j.rdispls[r], Float32)
			})
			// A rank whose part was done before the failure reached it may
			// return without error, but then with every block right.
			for r, err := range errs {
				if err == nil && r != 3 {
					if err := j.check(r, recvs[r]); err != nil {
						t.Fatalf("rank %d returned without error: %v", r, err)
					}
				}
			}
			var oe *OpError
			if !errors.As(errs[3], &oe) || oe.Rank != 3 || oe.Op != "alltoallv" || !errors.Is(errs[3], ErrMismatch) {
				t.Fatalf("rank 3: %v, want a mismatch on rank 3's alltoallv", errs[3])
			}
			if algo != "pairwise" {
				// The sizes travel with the blocks: the destination names them.
				want := fmt.Sprintf("counts differ between ranks: rank 1 sends %d bytes to rank 3, which expects %d", 4*j.counts[1][3], 4*j.counts[1][3]-4)
				if msg := errs[3].Error(); !strings.Contains(msg, want) || oe.Peer != 1 {
					t.Fatalf("rank 3: %v", errs[3])
				}
				// The block of the wrong size was not written.
				blk := recvs[3][j.rdispls[3][1]*4 : (j.rdispls[3][1]+j.counts[1][3]-1)*4]
				for _, b := range blk {
					if b != 0xee {
						t.Fatalf("rank 3: the block from rank 1 was written: % x", blk)
					}
				}
			}
		})
	}
}

// wJob is an alltoallw: block i→k travels as counts[i][k] elements, sent
// as a strided vector (or contiguous) and received as another layout.
type wJob struct {
	*vJob
	stypes, rtypes [][]BlockType
	sdispB, rdispB [][]int // bytes
	sendB, recvB   []int   // buffer sizes, bytes
}

// newWJob makes every block a vector of runs of 1..3 elements with
// strides of run+gap, or contiguous, on each side independently.
func newWJob(n int, dt DataType, seed int64) *wJob {
	es := dt.Size()
	rng := rand.New(rand.NewSource(seed))
	j := &wJob{vJob: &vJob{n: n, es: es, seed: seed}}
	j.counts = make([][]int, n)
	for i := range n {
		j.counts[i] = make([]int, n)
	}
	layoutOf := func(elems int) BlockType {
		if elems == 0 || rng.Intn(3) == 0 {
			return Contiguous(dt, elems)
		}
		// elems = runs·blocklen: pick a divisor.
		for bl := 1 + rng.Intn(3); ; bl-- {
			if elems%bl == 0 {
				return BlockType{Type: dt, Count: elems / bl, BlockLen: bl, Stride: bl + rng.Intn(3)}
			}
		}
	}
	extent := func(t BlockType) int {
		if t.Count == 0 || t.BlockLen == 0 {
			return 0
		}
		return ((t.Count-1)*t.Stride + t.BlockLen) * es
	}
	j.stypes, j.rtypes = make([][]BlockType, n), make([][]BlockType, n)
	j.sdispB, j.rdispB = make([][]int, n), make([][]int, n)
	j.sendB, j.recvB = make([]int, n), make([]int, n)
	for i := range n {
		for k := range n {
			j.counts[i][k] = []int{0, 1, 2, 3, 6, 12}[rng.Intn(6)]
		}
	}
	place := func(types []BlockType) ([]int, int) {
		d := make([]int, n)
		off := 0
		for _, p := range rng.Perm(n) {
			off += es * rng.Intn(2)
			d[p] = off
			off += extent(types[p])
		}
		return d, off
	}
	for r := range n {
		j.stypes[r], j.rtypes[r] = make([]BlockType, n), make([]BlockType, n)
		for p := range n {
			j.stypes[r][p] = layoutOf(j.counts[r][p])
			j.rtypes[r][p] = layoutOf(j.counts[p][r])
		}
		j.sdispB[r], j.sendB[r] = place(j.stypes[r])
		j.rdispB[r], j.recvB[r] = place(j.rtypes[r])
	}
	return j
}

// at is the byte offset of element e of a block of type t at disp.
func (j *wJob) at(disp int, t BlockType, e int) int {
	return disp + (e/t.BlockLen*t.Stride+e%t.BlockLen)*j.es
}

func (j *wJob) sendBuf(r int) []byte {
	buf := make([]byte, j.sendB[r])
	for k := range j.n {
		for e := range j.counts[r][k] {
			j.put(buf[j.at(j.sdispB[r][k], j.stypes[r][k], e):], r, k, e)
		}
	}
	return buf
}

func (j *wJob) recvBuf(r int) []byte {
	buf := make([]byte, j.recvB[r])
	for i := range buf {
		buf[i] = 0xee
	}
	return buf
}

func (j *wJob) checkW(r int, got []byte) error {
	want := j.recvBuf(r)
	for i := range j.n {
		for e := range j.counts[i][r] {
			j.put(want[j.at(j.rdispB[r][i], j.rtypes[r][i], e):], i, r, e)
		}
	}
	if d := diffBytes(got, want, 1); d != "" {
		return fmt.Errorf("rank %d: %s", r, d)
	}
	return nil
}

// alltoallw with strided vectors on both sides, any order of blocks, at
// 1..9 ranks and every algorithm: each block lands in its own layout and
// nothing between runs is touched.
func TestAllToAllwStrided(t *testing.T) {
	for n := 1; n <= 9; n++ {
		for _, algo := range a2aAlgos {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo), func(t *testing.T) {
				comms := newLocal(t, n, Options{Algo: "alltoallw=" + algo, Timeout: time.Minute})
				for seed := range int64(3) {
					for _, dt := range []DataType{Float32, Int8, Float64} {
						j := newWJob(n, dt, seed)
						mustRanks(t, comms, func(c *Comm) error {
							r := c.Rank()
							got := j.recvBuf(r)
							if err := c.AllToAllw(j.sendBuf(r), j.sdispB[r], j.stypes[r], got, j.rdispB[r], j.rtypes[r]); err != nil {
								return err
							}
							return j.checkW(r, got)
						})
					}
				}
			})
		}
	}
}

// Bad alltoallw arguments are errors before anything is sent.
func TestAllToAllwBadArguments(t *testing.T) {
	c := newLocal(t, 2, Options{})[0]
	buf, out := make([]byte, 64), make([]byte, 64)
	f4 := func(count, bl, stride int) BlockType {
		return BlockType{Type: Float32, Count: count, BlockLen: bl, Stride: stride}
	}
	two := func(t BlockType) []BlockType { return []BlockType{t, t} }
	cases := []struct {
		why  string // in the error
		call func() error
	}{
		{"needs 2 displacements and types per side", func() error {
			return c.AllToAllw(buf, []int{0, 0}, []BlockType{f4(1, 1, 1)}, out, []int{0, 8}, two(f4(1, 1, 1)))
		}},
		{"unknown datatype 77", func() error {
			return c.AllToAllw(buf, []int{0, 8}, two(BlockType{Type: DataType(77), Count: 1, BlockLen: 1}), out, []int{0, 8}, two(f4(1, 1, 1)))
		}},
		{"negative", func() error {
			return c.AllToAllw(buf, []int{0, 8}, two(f4(2, 1, -1)), out, []int{0, 16}, two(f4(2, 1, 1)))
		}},
		{"runs overlap", func() error {
			return c.AllToAllw(buf, []int{0, 16}, two(f4(2, 2, 1)), out, []int{0, 16}, two(f4(2, 2, 1)))
		}},
		{"send block 1 ({Type:float32 Count:3 BlockLen:1 Stride:2} at byte 48) ends past the buffer", func() error {
			return c.AllToAllw(buf, []int{0, 48}, two(f4(3, 1, 2)), out, []int{0, 12}, two(f4(3, 1, 1)))
		}},
		{"ends past the buffer", func() error {
			return c.AllToAllw(buf, []int{0, 8}, two(f4(1<<62, 1<<62, 1<<62)), out, []int{0, 8}, two(f4(1, 1, 1)))
		}},
		{"receive blocks 0 and 1 overlap", func() error {
			return c.AllToAllw(buf, []int{0, 8}, two(f4(2, 1, 1)), out, []int{0, 4}, two(f4(2, 1, 1)))
		}},
		{"send block 1 overlaps receive block 0", func() error {
			return c.AllToAllw(buf, []int{0, 8}, two(f4(2, 1, 1)), buf[8:], []int{0, 24}, two(f4(2, 1, 1)))
		}},
		{"rank 0 sends itself 8 bytes but expects 4", func() error {
			return c.AllToAllw(buf, []int{0, 8}, two(f4(2, 1, 1)), out, []int{0, 8}, two(f4(1, 1, 1)))
		}},
	}
	for _, tc := range cases {
		if err := tc.call(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("got %v, want ErrInvalidArgument saying %q", err, tc.why)
		}
	}
}

// Interleaved strided receive blocks that share no byte are fine: rank
// i's elements land at every n-th place (a transpose).
func TestAllToAllwInterleaved(t *testing.T) {
	const n, per = 4, 3
	comms := newLocal(t, n, Options{Algo: "alltoallw=aggregate", Timeout: time.Minute})
	mustRanks(t, comms, func(c *Comm) error {
		r := c.Rank()
		send := make([]byte, n*per)
		sd, st, rd, rt := make([]int, n), make([]BlockType, n), make([]int, n), make([]BlockType, n)
		for k := range n {
			for e := range per {
				send[k*per+e] = byte(r*16 + k*4 + e)
			}
			sd[k], st[k] = k*per, Contiguous(Uint8, per)
			rd[k], rt[k] = k, BlockType{Type: Uint8, Count: per, BlockLen: 1, Stride: n}
		}
		got := make([]byte, n*per)
		if err := c.AllToAllw(send, sd, st, got, rd, rt); err != nil {
			return err
		}
		for e := range per {
			for i := range n {
				if want := byte(i*16 + r*4 + e); got[e*n+i] != want {
					return fmt.Errorf("rank %d: element %d of rank %d's block is %d, want %d", r, e, i, got[e*n+i], want)
				}
			}
		}
		return nil
	})
}

// Under the control tree, ranks that arrived go ahead without the late
// ones: the root decides group 0's sub-matrix while rank 4 has not called
// the collective. When rank 4 then aborts instead, every waiting rank
// fails with its reason, none hangs.
func TestAggregateTreeLateRankAborts(t *testing.T) {
	const n = 5 // groups {0,1,2} and {3,4}
	w := mem.NewWorld(n)
	decided := make(chan struct{})
	var once sync.Once
	w.Hook = func(from, to int, h transport.Header) error {
		if from == 0 && h.Step&exec.TagDown != 0 {
			once.Do(func() { close(decided) })
		}
		return nil
	}
	comms, err := newLocalWorld(w, nil, Options{Algo: "alltoallv=aggregate-tree", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Destroy()
		}
	})
	j := newVJob(n, 4, 3, func(rng *rand.Rand) int { return rng.Intn(4) })
	errs := make(chan error, n-1)
	for _, c := range comms[:n-1] {
		go func() {
			r := c.Rank()
			errs <- c.AllToAllv(j.send(r), j.sendCounts(r), j.sdispls[r], j.recv(r), j.recvCounts(r), j.rdispls[r], Float32)
		}()
	}
	select {
	case <-decided:
	case <-time.After(30 * time.Second):
		t.Fatal("no decision while rank 4 was away")
	}
	comms[n-1].Abort()
	for range n - 1 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrRemoteAbort) {
				t.Errorf("waiting rank: %v, want the abort", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a rank hangs after rank 4 aborted")
		}
	}
}

// overlappingBlocks finds an overlap exactly when two non-empty blocks
// overlap, by pairs for a few ranks and in offset order for more: checked
// against every pair on random layouts.
func TestOverlappingBlocks(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for trial := range 3000 {
		n := 1 + rng.Intn(20)
		l := make([]sched.Block, n)
		for i := range l {
			l[i] = sched.Block{Off: rng.Intn(8 * n), Len: rng.Intn(6)}
		}
		want := false
		for i := range l {
			for j := i + 1; j < n; j++ {
				a, b := l[i], l[j]
				want = want || a.Len > 0 && b.Len > 0 && a.Off < b.Off+b.Len && b.Off < a.Off+a.Len
			}
		}
		i, j, got := overlappingBlocks(l)
		if got != want {
			t.Fatalf("trial %d: %v: found %v, want %v", trial, l, got, want)
		}
		if got && (i >= j || l[i].Off >= l[j].Off+l[j].Len || l[j].Off >= l[i].Off+l[i].Len) {
			t.Fatalf("trial %d: %v: blocks %d and %d do not overlap", trial, l, i, j)
		}
	}
}
