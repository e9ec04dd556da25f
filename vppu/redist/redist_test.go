package redist

import (
	"encoding/binary"
	"fmt"
	"math/rand"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu/resmap"
)

// The CSS paper's tables (docs/design/redistribution.md). Rows are senders Q_i (array B), columns
// receivers P_j (array A).
func TestDocumentExamples(t *testing.T) {
	cases := []struct {
		name   string
		a      Affine
		com    [][]int
		method string
		m, n   int
	}{
		{"example 1: A(3i+4) = B(2i+1), A cyclic(4) on 5, B cyclic(3) on 5",
			Affine{Src: Cyclic{5, 3}, Dst: Cyclic{5, 4}, SrcIndex: Access{2, 1}, DstIndex: Access{3, 4}, N: 60},
			[][]int{{2, 2, 3, 3, 2}, {3, 3, 2, 2, 2}, {2, 2, 2, 3, 3}, {2, 3, 3, 2, 2}, {3, 2, 2, 2, 3}},
			"algorithm-1", 3, 4},
		{"cyclic(3) to cyclic(4) on 5 + 5",
			Affine{Src: Cyclic{5, 3}, Dst: Cyclic{5, 4}, SrcIndex: Access{1, 0}, DstIndex: Access{1, 0}, N: 60},
			[][]int{{3, 3, 2, 2, 2}, {2, 2, 3, 3, 2}, {3, 2, 2, 2, 3}, {2, 3, 3, 2, 2}, {2, 2, 2, 3, 3}},
			"algorithm-1", 0, 0},
		{"example 3: A(2i+1) = B(3i+4), A cyclic(3) on 6, B cyclic(2) on 6",
			Affine{Src: Cyclic{6, 2}, Dst: Cyclic{6, 3}, SrcIndex: Access{3, 4}, DstIndex: Access{2, 1}, N: 36},
			[][]int{{1, 2, 1, 2, 1, 2}, {0, 0, 0, 0, 0, 0}, {1, 2, 1, 2, 1, 2}, {1, 2, 1, 2, 1, 2}, {0, 0, 0, 0, 0, 0}, {1, 2, 1, 2, 1, 2}},
			"", 3, 4},
	}
	for _, tc := range cases {
		p, err := PlanAffine(tc.a)
		if err != nil {
			t.Fatal(err)
		}
		got := p.COM
		if !reflect.DeepEqual(got, tc.com) {
			t.Errorf("%s: COM\n%v\nwant\n%v", tc.name, got, tc.com)
		}
		if err := p.Check(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.method != "" && p.Method != tc.method {
			t.Errorf("%s: method %s, want %s", tc.name, p.Method, tc.method)
		}
		if tc.m != 0 {
			if m, n := tc.a.Shift(); m%tc.a.Src.Procs != tc.m || n%tc.a.Dst.Procs != tc.n {
				t.Errorf("%s: Theorem 1's shift (%d, %d), the paper's (%d, %d) modulo the processors", tc.name, m, n, tc.m, tc.n)
			}
		}
		if p.Method == "algorithm-1" && len(p.Steps) != p.LowerBound {
			t.Errorf("%s: %d steps, lower bound %d", tc.name, len(p.Steps), p.LowerBound)
		}
	}
	// Example 3 cannot use Algorithm 1 (gcd(m, Q) = 3): it says which
	// method it used and stays contention free; the colouring fallback
	// keeps it at the bound.
	p, _ := PlanAffine(cases[2].a)
	if p.Method == "algorithm-1" || len(p.Steps) > p.LowerBound {
		t.Errorf("example 3: %s in %d steps (bound %d)", p.Method, len(p.Steps), p.LowerBound)
	}
}

// Random affine redistributions: COM sums to n, every message is sent
// once, no receiver or sender twice in a step; Algorithm 1 reaches the
// bound whenever it applies, and the fallback never exceeds it.
func TestAffineProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	alg1 := 0
	for trial := 0; trial < 400; trial++ {
		a := Affine{
			Src: Cyclic{1 + rng.Intn(9), 1 + rng.Intn(6)}, Dst: Cyclic{1 + rng.Intn(9), 1 + rng.Intn(6)},
			SrcIndex: Access{1 + rng.Intn(3), rng.Intn(5)}, DstIndex: Access{1 + rng.Intn(3), rng.Intn(5)},
			N: rng.Intn(400),
		}
		p, err := PlanAffine(a)
		if err != nil {
			t.Fatal(err)
		}
		if p.Elems() != a.N {
			t.Fatalf("%+v: COM holds %d elements, want %d", a, p.Elems(), a.N)
		}
		if want := a.com(0, a.N); !reflect.DeepEqual(p.COM, want) {
			t.Fatalf("%+v: the periodic COM differs from counting", a)
		}
		if err := p.Check(); err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
		if len(p.Steps) > p.LowerBound {
			t.Fatalf("%+v: %s took %d steps, more than the bound %d", a, p.Method, len(p.Steps), p.LowerBound)
		}
		if p.Method == "algorithm-1" {
			alg1++
		}
	}
	if alg1 < 20 {
		t.Fatalf("Algorithm 1 applied to only %d of 400 cases", alg1)
	}
}

// The colouring meets the bound on arbitrary tables, including ones where
// the greedy length heuristic does not.
func TestColoringMeetsBound(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	for trial := 0; trial < 300; trial++ {
		q, p := 1+rng.Intn(12), 1+rng.Intn(12)
		com := make([][]int, q)
		for i := range com {
			com[i] = make([]int, p)
			for j := range com[i] {
				if rng.Intn(3) == 0 {
					com[i][j] = 1 + rng.Intn(100)
				}
			}
		}
		steps := coloring(com, q, p)
		plan := &Plan{Q: q, P: p, COM: com, Steps: steps}
		if err := plan.Check(); err != nil {
			t.Fatal(err)
		}
		if len(steps) != lowerBound(com, q, p) {
			t.Fatalf("%d steps, bound %d", len(steps), lowerBound(com, q, p))
		}
	}
}

// run executes a plan on n in-process ranks: rank r plays sender r and
// receiver r; in[r] is its source buffer, the result its destination.
// strategies are the ways a plan can be run: CSS steps, and the two
// baselines of the benchmark.
var strategies = map[string]func(c *engine.Comm, p *Plan, src, dst []byte, dt engine.DataType) error{
	"css": func(c *engine.Comm, p *Plan, src, dst []byte, dt engine.DataType) error {
		return Redistribute(c, p, src, dst, dt)
	},
	"alltoallv": func(c *engine.Comm, p *Plan, src, dst []byte, dt engine.DataType) error {
		return RedistributeAllToAllv(c, p, src, dst, dt)
	},
	"naive": func(c *engine.Comm, p *Plan, src, dst []byte, dt engine.DataType) error {
		return RedistributeNaive(c, p, src, dst, dt)
	},
}

func execute(t *testing.T, p *Plan, n int, in [][]byte, dstLen func(r int) int, dt engine.DataType) [][]byte {
	t.Helper()
	var first [][]byte
	for name, run := range strategies {
		out := executeWith(t, run, p, n, in, dstLen, dt)
		if first == nil {
			first = out
			continue
		}
		for r := range out {
			if !reflect.DeepEqual(out[r], first[r]) {
				t.Fatalf("%s leaves rank %d with other data than the others", name, r)
			}
		}
	}
	return first
}

func executeWith(t *testing.T, run func(c *engine.Comm, p *Plan, src, dst []byte, dt engine.DataType) error, p *Plan, n int, in [][]byte, dstLen func(r int) int, dt engine.DataType) [][]byte {
	t.Helper()
	comms, err := engine.NewLocalComms(n, engine.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	out := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range comms {
		out[r] = make([]byte, dstLen(r)*dt.Size())
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = run(c, p, in[r], out[r], dt)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

func putU32(b []byte, i int, v uint32) { binary.LittleEndian.PutUint32(b[4*i:], v) }
func getU32(b []byte, i int) uint32    { return binary.LittleEndian.Uint32(b[4*i:]) }

// Executing an affine plan moves every element to where the loop says.
func TestAffineExecution(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	for trial := 0; trial < 30; trial++ {
		q, pp := 1+rng.Intn(5), 1+rng.Intn(5)
		a := Affine{Src: Cyclic{q, 1 + rng.Intn(4)}, Dst: Cyclic{pp, 1 + rng.Intn(4)},
			SrcIndex: Access{1 + rng.Intn(2), rng.Intn(3)}, DstIndex: Access{1 + rng.Intn(2), rng.Intn(3)}, N: 1 + rng.Intn(200)}
		plan, err := PlanAffine(a)
		if err != nil {
			t.Fatal(err)
		}
		n := max(q, pp)
		srcLen := a.SrcIndex.at(a.N-1) + 1
		dstLen := a.DstIndex.at(a.N-1) + 1
		in := make([][]byte, n)
		for r := range in {
			in[r] = make([]byte, 4*a.Src.Count(r, srcLen))
		}
		for g := 0; g < srcLen; g++ {
			putU32(in[a.Src.owner(g)], a.Src.local(g), uint32(g+1))
		}
		out := execute(t, plan, n, in, func(r int) int { return a.Dst.Count(r, dstLen) }, engine.Uint32)
		for it := 0; it < a.N; it++ {
			g, want := a.DstIndex.at(it), uint32(a.SrcIndex.at(it)+1)
			if got := getU32(out[a.Dst.owner(g)], a.Dst.local(g)); got != want {
				t.Fatalf("trial %d %+v: A[%d] = %d, want B[%d]", trial, a, g, got, want-1)
			}
		}
	}
}

// General maps: 2-D and 3-D layouts into each other, regular and
// irregular, with every element checked.
func TestMapExecution(t *testing.T) {
	mk := func(m *resmap.Map, err error) *resmap.Map {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	e2 := []int{7, 9}
	maps2 := []*resmap.Map{
		mk(resmap.Block(e2, 0, 3)),
		mk(resmap.Block(e2, 1, 4)),
		mk(resmap.BlockCyclic(e2, 1, 4, 2)),
		mk(resmap.CyclicAlong(e2, 0, 2)),
		mk(resmap.BlockBlock(e2, 2, 2)),
		mk(resmap.Regular(e2, []int{3, 4}, 3, resmap.Cyclic, nil)),
		mk(resmap.Weighted(e2, 0, []float64{1, 3, 2})),
		mk(resmap.Irregular(e2, 2, []resmap.Segment{
			{Box: resmap.Box{Lo: []int{0, 0}, Hi: []int{7, 4}}, Owner: 1},
			{Box: resmap.Box{Lo: []int{0, 4}, Hi: []int{7, 9}}, Owner: 0}})),
	}
	e3 := []int{4, 3, 5}
	maps3 := []*resmap.Map{mk(resmap.Block(e3, 2, 3)), mk(resmap.BlockCyclic(e3, 0, 2, 1)), mk(resmap.Regular(e3, []int{2, 2, 2}, 4, resmap.Blocks, nil))}
	for _, group := range [][]*resmap.Map{maps2, maps3} {
		for _, src := range group {
			for _, dst := range group {
				plan, err := PlanMaps(src, dst)
				if err != nil {
					t.Fatal(err)
				}
				if err := plan.Check(); err != nil {
					t.Fatalf("%v → %v: %v", src, dst, err)
				}
				if len(plan.Steps) != plan.LowerBound {
					t.Fatalf("%v → %v: %d steps, bound %d", src, dst, len(plan.Steps), plan.LowerBound)
				}
				n := max(src.Devices, dst.Devices)
				in := make([][]byte, n)
				for r := range in {
					if r < src.Devices {
						in[r] = make([]byte, 8*src.Count(r))
					}
				}
				forEach(src.Extent, func(idx []int, lin int) {
					binary.LittleEndian.PutUint64(in[src.Owner(idx)][8*src.LocalOffset(idx):], uint64(lin+1))
				})
				out := execute(t, plan, n, in, func(r int) int {
					if r < dst.Devices {
						return dst.Count(r)
					}
					return 0
				}, engine.Float64)
				forEach(dst.Extent, func(idx []int, lin int) {
					if got := binary.LittleEndian.Uint64(out[dst.Owner(idx)][8*dst.LocalOffset(idx):]); got != uint64(lin+1) {
						t.Fatalf("%v → %v: element %v is %d, want %d", src, dst, idx, got, lin+1)
					}
				})
			}
		}
	}
}

func forEach(extent []int, fn func(idx []int, lin int)) {
	idx := make([]int, len(extent))
	total := 1
	for _, e := range extent {
		total *= e
	}
	for lin := 0; lin < total; lin++ {
		rem := lin
		for d := len(extent) - 1; d >= 0; d-- {
			idx[d] = rem % extent[d]
			rem /= extent[d]
		}
		fn(idx, lin)
	}
}

func ExamplePlan_json() {
	p, _ := PlanAffine(Affine{Src: Cyclic{2, 1}, Dst: Cyclic{2, 2}, SrcIndex: Access{1, 0}, DstIndex: Access{1, 0}, N: 4})
	b, _ := p.MarshalJSON()
	fmt.Println(string(b))
	// Output:
	// {"from":{"src":{"procs":2,"block":1},"dst":{"procs":2,"block":2},"src_index":{"a":1,"b":0},"dst_index":{"a":1,"b":0},"n":4},"q":2,"p":2,"com":[[1,1],[1,1]],"steps":[[{"src":0,"dst":0,"elems":1},{"src":1,"dst":1,"elems":1}],[{"src":0,"dst":1,"elems":1},{"src":1,"dst":0,"elems":1}]],"method":"algorithm-2","lower_bound":2}
}
