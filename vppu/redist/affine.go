package redist

import (
	"fmt"
	"sort"
)

// Cyclic is a 1-D block-cyclic distribution: element g on processor
// ⌊g/B⌋ mod Procs (block = B).
type Cyclic struct {
	Procs int `json:"procs"`
	Block int `json:"block"`
}

func (c Cyclic) owner(g int) int { return g / c.Block % c.Procs }

// local is where element g lives on its owner: its blocks back to back.
func (c Cyclic) local(g int) int { return g/(c.Block*c.Procs)*c.Block + g%c.Block }

// Count is how many of the first n elements processor p holds.
func (c Cyclic) Count(p, n int) int {
	round := c.Block * c.Procs
	full := n / round * c.Block
	rest := n % round
	return full + min(max(rest-p*c.Block, 0), c.Block)
}

// Access is an affine index a·i + b.
type Access struct {
	A int `json:"a"`
	B int `json:"b"`
}

func (x Access) at(i int) int { return x.A*i + x.B }

// Affine describes the CSS paper's loop (docs/design/redistribution.md): FORALL i in [0, N): Dst(DstIndex(i)) = Src(SrcIndex(i)).
type Affine struct {
	Src      Cyclic `json:"src"` // B over Q
	Dst      Cyclic `json:"dst"` // A over P
	SrcIndex Access `json:"src_index"`
	DstIndex Access `json:"dst_index"`
	N        int    `json:"n"`
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	if a < 0 {
		return -a
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }

// Period is the loop's period: the owners of Src(SrcIndex(i)) and
// Dst(DstIndex(i)) repeat every Period iterations (equations 3–5 of
// the CSS paper: lcm(P·x, a1)/a1 for A, lcm(Q·y, a2)/a2 for B, and their
// lcm for the pair).
func (a Affine) Period() int {
	pa := lcm(a.Dst.Procs*a.Dst.Block, a.DstIndex.A) / a.DstIndex.A
	pb := lcm(a.Src.Procs*a.Src.Block, a.SrcIndex.A) / a.SrcIndex.A
	return lcm(pa, pb)
}

// Shift is Theorem 1's (m, n): advancing the loop by δ iterations, where
// δ moves B's index by whole blocks of y and A's by whole blocks of x,
// turns a message Q_i → P_j into Q_{i+m} → P_{j+n} of the same length.
func (a Affine) Shift() (m, n int) {
	dy := a.Src.Block / gcd(a.Src.Block, a.SrcIndex.A)
	dx := a.Dst.Block / gcd(a.Dst.Block, a.DstIndex.A)
	delta := lcm(dx, dy)
	m = a.SrcIndex.A * delta / a.Src.Block % a.Src.Procs
	n = a.DstIndex.A * delta / a.Dst.Block % a.Dst.Procs
	return m, n
}

func (a Affine) validate() error {
	switch {
	case a.Src.Procs < 1 || a.Dst.Procs < 1 || a.Src.Block < 1 || a.Dst.Block < 1:
		return fmt.Errorf("redist: distributions %+v → %+v need ≥ 1 processor and block", a.Src, a.Dst)
	case a.SrcIndex.A < 1 || a.DstIndex.A < 1 || a.SrcIndex.B < 0 || a.DstIndex.B < 0:
		return fmt.Errorf("redist: index maps %+v, %+v: want a ≥ 1 and b ≥ 0", a.SrcIndex, a.DstIndex)
	case a.N < 0:
		return fmt.Errorf("redist: loop count %d", a.N)
	}
	return nil
}

// com counts, for iterations [lo, hi), the elements each pair moves.
func (a Affine) com(lo, hi int) [][]int {
	com := make([][]int, a.Src.Procs)
	for i := range com {
		com[i] = make([]int, a.Dst.Procs)
	}
	for it := lo; it < hi; it++ {
		com[a.Src.owner(a.SrcIndex.at(it))][a.Dst.owner(a.DstIndex.at(it))]++
	}
	return com
}

// PlanAffine builds the plan of a.
func PlanAffine(a Affine) (*Plan, error) {
	if err := a.validate(); err != nil {
		return nil, err
	}
	q, p := a.Src.Procs, a.Dst.Procs
	// Lemma 1: k whole periods move k times one period's table.
	per := a.Period()
	k := a.N / per
	com := a.com(0, min(per, a.N))
	if k > 1 {
		for _, row := range com {
			for j := range row {
				row[j] *= k
			}
		}
	}
	if k >= 1 {
		rest := a.com(k*per, a.N)
		for i := range com {
			for j := range com[i] {
				com[i][j] += rest[i][j]
			}
		}
	}
	plan := &Plan{Q: q, P: p, COM: com, LowerBound: lowerBound(com, q, p), desc: a}
	if steps, ok := a.algorithm1(com); ok {
		plan.Steps, plan.Method = steps, "algorithm-1"
	} else {
		plan.Steps, plan.Method = schedule(com, q, p)
	}
	plan.mover = affineMover{a}
	return plan, nil
}

// algorithm1 is the CSS paper's Algorithm 1: sender 0's messages, in any
// order, form the first row of the schedule; by Theorem 1 sender k·m
// sends, in the same step, to receiver j + k·n a message of the same
// length. It applies when k·m reaches every sender (gcd(m, Q) = 1) and the
// receivers j + k·n of one step are distinct (P/gcd(n, P) ≥ Q), and when
// the table really has the recurrence's symmetry over the loop run (a
// partial period can break it; then it returns false).
func (a Affine) algorithm1(com [][]int) ([][]Msg, bool) {
	q, p := a.Src.Procs, a.Dst.Procs
	m, n := a.Shift()
	if gcd(m, q) != 1 || p/gcd(n, p) < q {
		return nil, false
	}
	var row0 []int
	for j, c := range com[0] {
		if c > 0 {
			row0 = append(row0, j)
		}
	}
	// Longest messages first.
	sort.SliceStable(row0, func(x, y int) bool { return com[0][row0[x]] > com[0][row0[y]] })
	steps := make([][]Msg, len(row0))
	for s, j0 := range row0 {
		for k := 0; k < q; k++ {
			i, j := k*m%q, (j0+k*n)%p
			if com[i][j] != com[0][j0] {
				return nil, false
			}
			steps[s] = append(steps[s], Msg{i, j, com[i][j]})
		}
		sort.Slice(steps[s], func(x, y int) bool { return steps[s][x].Src < steps[s][y].Src })
	}
	// Every non-zero entry must have been placed (rows hold as many
	// messages as row 0 under the recurrence).
	placed := 0
	for _, s := range steps {
		placed += len(s)
	}
	if placed != len(messages(com)) {
		return nil, false
	}
	return steps, true
}
