package choose

import (
	"math/rand"
	"testing"

	"github.com/gocoll/gocoll/engine/internal/schedtest"
	"github.com/gocoll/gocoll/engine/sched"
)

// Every schedule of the registry, validated and simulated over rank counts
// 1..17 (and 32), awkward counts, both ends of Avg and several roots; the
// hierarchical ones over hosts of several shapes, ranks in order or
// strided; the alltoallv ones over random layouts. The simulated result is
// the collective's definition, bitwise identical where it must be, without
// a deadlock. A new registry line is tested here without a new test line;
// an entry whose builder fails a call its rules let it run, or that could
// not be simulated at two ranks or more, fails the test.
func TestRegistrySchedules(t *testing.T) {
	for _, e := range Registry() {
		if e.Arena() {
			continue
		}
		t.Run(e.Coll.String()+"/"+e.Name, func(t *testing.T) {
			t.Parallel()
			covered := 0
			cases := registryCases(e.Coll, e.Hosts)
			if e.Virtual {
				cases = deviceCases(e.Coll)
			}
			for _, c := range cases {
				ran, err := simulateCase(e, c)
				if err != nil {
					t.Fatalf("n=%d count=%d root=%d avg=%v hosts=%v: %v", c.p.N, c.p.Count, c.p.Root, c.p.Avg, c.p.Hosts, err)
				}
				if ran && c.p.N >= 2 {
					covered++
				}
			}
			if covered == 0 {
				t.Fatal("not covered: no call of two ranks or more could be simulated")
			}
		})
	}
}

// A case is a call's parameters; layouts (alltoallv) are every rank's.
type registryCase struct {
	p       sched.Params
	layouts []sched.Params
	shape   Shape
}

func registryCases(coll sched.Coll, hosts bool) []registryCase {
	var out []registryCase
	if hosts {
		shapes := [][2]int{{1, 1}, {1, 4}, {2, 2}, {3, 2}, {4, 3}, {2, 1}, {4, 1}}
		for _, sh := range shapes {
			for _, strided := range []bool{false, true} {
				hs := schedtest.HostsOf(sh[0], sh[1], strided)
				n := sh[0] * sh[1]
				for _, count := range []int{0, 1, 5, 29} {
					for _, root := range []int{0, n - 1} {
						p := sched.Params{Coll: coll, N: n, ElemSize: 2, Count: count, Hosts: hs, Root: root, Avg: count%2 == 1, SegBytes: 6}
						out = append(out, registryCase{p: p, shape: Shape{Coll: coll, Bytes: 2 * count, N: n, Hosts: sh[0], Even: true}})
					}
				}
			}
		}
		// Uneven hosts, which the rules keep the hierarchical forms from.
		p := sched.Params{Coll: coll, N: 3, ElemSize: 1, Count: 3, Hosts: [][]int{{0, 1}, {2}}}
		return append(out, registryCase{p: p, shape: Shape{Coll: coll, Bytes: 3, N: 3, Hosts: 2}})
	}
	rng := rand.New(rand.NewSource(1))
	for _, n := range schedtest.RankCounts() {
		if coll == sched.AllToAllv {
			for range 4 {
				c := randomLayouts(rng, n)
				out = append(out, c)
			}
			continue
		}
		for _, count := range []int{0, 1, n - 1, 7, 37} {
			for _, avg := range []bool{false, true} {
				roots := []int{0}
				if coll == sched.Reduce || coll == sched.Broadcast {
					roots = []int{0, n - 1, n / 2}
				}
				for _, root := range roots {
					p := sched.Params{Coll: coll, N: n, ElemSize: 4, Count: max(count, 0), Root: root, Avg: avg, SegBytes: 12, Segments: 3}
					out = append(out, registryCase{p: p, shape: Shape{Coll: coll, Bytes: 4 * max(count, 0), N: n, Hosts: 1, Even: true}})
				}
			}
		}
	}
	return out
}

// deviceCases are calls over virtual devices: block, cyclic and random
// placements of 1 to 9 devices on 1 to 6 ranks (every device's rank a
// root of the reduce), and for the allreduce also its form that stops at
// the chain's last rank (Coll Reduce, VirtualRoot), which the engine
// follows with the arena's broadcast.
func deviceCases(coll sched.Coll) []registryCase {
	rng := rand.New(rand.NewSource(7))
	var out []registryCase
	for n := 1; n <= 6; n++ {
		for m := 1; m <= 9; m += 2 {
			block, cyclic, random := make([]int, m), make([]int, m), make([]int, m)
			for v := range m {
				block[v], cyclic[v], random[v] = v*n/m, v%n, rng.Intn(n)
			}
			for _, devices := range [][]int{block, cyclic, random} {
				for _, count := range []int{0, 1, 6} {
					p := sched.Params{Coll: coll, N: n, ElemSize: 4, Count: count, Root: -1, Avg: count%2 == 0, SegBytes: 8, Devices: devices}
					shape := Shape{Coll: coll, Bytes: 4 * count, N: n, Hosts: 1, Even: true}
					ps := []sched.Params{p}
					switch coll {
					case sched.Reduce:
						ps = ps[:0]
						for _, r := range devices {
							p.Root = r
							ps = append(ps, p)
						}
					case sched.AllReduce:
						p.Coll, p.Root = sched.Reduce, sched.VirtualRoot(devices)
						ps = append(ps, p)
					}
					for _, p := range ps {
						out = append(out, registryCase{p: p, shape: shape})
					}
				}
			}
		}
	}
	return out
}

// simulateCase builds e's schedule for c and simulates it. ran is false
// where the builder refused a call the rules do not let e run.
func simulateCase(e *Entry, c registryCase) (ran bool, err error) {
	if c.layouts == nil {
		s, err := e.Build(c.p)
		if err != nil {
			if !e.Can(c.shape) {
				return false, nil
			}
			return false, err
		}
		_, err = sched.Simulate(s, c.p)
		return true, err
	}
	// Each rank builds its program from its own layouts; a block-mode
	// schedule does not depend on them.
	parts := make([]*sched.Schedule, len(c.layouts))
	for r, p := range c.layouts {
		s, err := e.Build(p)
		if err != nil {
			return false, err
		}
		if s.Blocks {
			_, err = sched.Simulate(s, p)
			return true, err
		}
		parts[r] = s
	}
	_, err = sched.Simulate(sched.PerRank(parts), c.layouts[0], c.layouts...)
	return true, err
}

// randomLayouts is an alltoallv of n ranks in which each sends each a
// random number of 2-byte elements (often none), the blocks at random
// displacements with gaps, in any order (rng nil: seeded by n).
func randomLayouts(rng *rand.Rand, n int) registryCase {
	if rng == nil {
		rng = rand.New(rand.NewSource(int64(n)))
	}
	counts := make([][]int, n) // counts[i][j]: elements i sends j
	for i := range counts {
		counts[i] = make([]int, n)
		for j := range counts[i] {
			if rng.Intn(3) > 0 {
				counts[i][j] = rng.Intn(5)
			}
		}
	}
	ps := make([]sched.Params, n)
	for r := range n {
		send, recv := make([]sched.Block, n), make([]sched.Block, n)
		so, ro := 0, 0
		for _, j := range rng.Perm(n) {
			so += rng.Intn(2)
			send[j] = sched.Block{Off: so * 2, Len: counts[r][j] * 2}
			so += counts[r][j]
		}
		for _, i := range rng.Perm(n) {
			recv[i] = sched.Block{Off: ro * 2, Len: counts[i][r] * 2}
			ro += counts[i][r] + rng.Intn(2)
		}
		ps[r] = sched.Params{Coll: sched.AllToAllv, N: n, ElemSize: 2, SendBlocks: send, RecvBlocks: recv, Mine: r}
	}
	return registryCase{p: ps[0], layouts: ps, shape: Shape{Coll: sched.AllToAllv, N: n, Hosts: 1, Even: true}}
}
