package resmap

import (
	"strings"
	"testing"
)

// mustOf turns a constructor's (map, error) into the map, failing t.
func mustOf(t *testing.T) func(*Map, error) *Map {
	return func(m *Map, err error) *Map {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

// owned lists, per device (1-based in the document), the elements 0..35
// of the source's 6×6 matrix it holds, numbered row by row.
func owned(m *Map) [][]int {
	out := make([][]int, m.Devices)
	for e := 0; e < 36; e++ {
		d := m.Owner([]int{e / 6, e % 6})
		out[d] = append(out[d], e)
	}
	return out
}

// segmentsOf lists, per device, the document's 2×2 segments 20(1)…20(9)
// (numbered row by row from 1) whose elements it holds.
func segmentsOf(m *Map) [][]int {
	out := make([][]int, m.Devices)
	for s := 0; s < 9; s++ {
		d := m.Owner([]int{s / 3 * 2, s % 3 * 2})
		out[d] = append(out[d], s+1)
	}
	return out
}

func span(lo, hi int) []int {
	var s []int
	for i := lo; i <= hi; i++ {
		s = append(s, i)
	}
	return s
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The worked examples of the source (docs/design/resource-maps.md): the 6×6 matrix of elements 0..35 under
// each decomposition, for Q = 3 and Q = 4 compute nodes.
func TestDocumentExamples(t *testing.T) {
	must := mustOf(t)
	e := []int{6, 6}
	// Row block, Q = 3: elements 0–11, 12–23, 24–35; Q = 4: 0–8, 9–17, 18–26, 27–35.
	for q, want := range map[int][][]int{3: {span(0, 11), span(12, 23), span(24, 35)}, 4: {span(0, 8), span(9, 17), span(18, 26), span(27, 35)}} {
		got := owned(must(Regular(e, []int{1, 1}, q, Blocks, nil)))
		for d := range want {
			if !equal(got[d], want[d]) {
				t.Errorf("row block Q=%d: node %d holds %v, want %v", q, d+1, got[d], want[d])
			}
		}
	}
	// Column block, Q = 3: columns 0–1, 2–3, 4–5, i.e. segments 1,4,7 / 2,5,8 / 3,6,9.
	cb := segmentsOf(must(Block(e, 1, 3)))
	for d, want := range [][]int{{1, 4, 7}, {2, 5, 8}, {3, 6, 9}} {
		if !equal(cb[d], want) {
			t.Errorf("column block Q=3: node %d holds segments %v, want %v", d+1, cb[d], want)
		}
	}
	// Row cyclic: elements q·k + d on node d+1.
	for _, q := range []int{3, 4} {
		got := owned(must(Regular(e, []int{1, 1}, q, Cyclic, nil)))
		for d := 0; d < q; d++ {
			for _, el := range got[d] {
				if el%q != d {
					t.Errorf("row cyclic Q=%d: element %d on node %d", q, el, d+1)
				}
			}
		}
	}
	// Block-cyclic over the 2×2 segments: Q=3: 1,4,7 / 2,5,8 / 3,6,9; Q=4: 1,5,9 / 2,6 / 3,7 / 4,8.
	for q, want := range map[int][][]int{3: {{1, 4, 7}, {2, 5, 8}, {3, 6, 9}}, 4: {{1, 5, 9}, {2, 6}, {3, 7}, {4, 8}}} {
		got := segmentsOf(must(Regular(e, []int{2, 2}, q, Cyclic, nil)))
		for d := range want {
			if !equal(got[d], want[d]) {
				t.Errorf("block-cyclic Q=%d: node %d holds segments %v, want %v", q, d+1, got[d], want[d])
			}
		}
	}
	// Block-block, Q = 3: segments 1–3, 4–6, 7–9.
	bb := segmentsOf(must(Regular(e, []int{2, 2}, 3, Blocks, nil)))
	for d, want := range [][]int{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}} {
		if !equal(bb[d], want) {
			t.Errorf("block-block Q=3: node %d holds segments %v, want %v", d+1, bb[d], want)
		}
	}
	// Segment 20(2): extent {2,2}, offset {0,1} in segment units, i.e.
	// elements 2, 3, 8, 9.
	m := must(Regular(e, []int{2, 2}, 3, Blocks, nil))
	if b := m.TileBox(1); !equal(b.Lo, []int{0, 2}) || !equal(b.Hi, []int{2, 4}) {
		t.Errorf("segment 20(2) is %v", b)
	}
}

// Every element has exactly one owner and one place in its owner's buffer.
func TestLayoutsAreBijections(t *testing.T) {
	must := mustOf(t)
	e := []int{5, 7, 3}
	maps := []*Map{
		must(Block(e, 1, 4)), must(BlockCyclic(e, 2, 2, 2)), must(CyclicAlong(e, 0, 3)),
		must(Regular(e, []int{2, 3, 2}, 5, Cyclic, nil)), must(Weighted(e, 0, []float64{1, 2, 0.5})),
	}
	for _, m := range maps {
		seen := make([]map[int]bool, m.Devices)
		for d := range seen {
			seen[d] = map[int]bool{}
		}
		for i := 0; i < e[0]; i++ {
			for j := 0; j < e[1]; j++ {
				for k := 0; k < e[2]; k++ {
					idx := []int{i, j, k}
					d, off := m.Owner(idx), m.LocalOffset(idx)
					if off < 0 || off >= m.Count(d) || seen[d][off] {
						t.Fatalf("%v: element %v at offset %d of device %d (holds %d)", m, idx, off, d, m.Count(d))
					}
					seen[d][off] = true
				}
			}
		}
	}
}

func TestIrregularAndErrors(t *testing.T) {
	must := mustOf(t)
	e := []int{4, 4}
	seg := func(lo0, lo1, hi0, hi1, o int) Segment {
		return Segment{Box: Box{Lo: []int{lo0, lo1}, Hi: []int{hi0, hi1}}, Owner: o}
	}
	m := must(Irregular(e, 2, []Segment{seg(0, 0, 4, 1, 1), seg(0, 1, 2, 4, 0), seg(2, 1, 4, 4, 1)}))
	if got := m.Owners(); got != "1 0 0 0\n1 0 0 0\n1 1 1 1\n1 1 1 1\n" {
		t.Fatalf("owners:\n%s", got)
	}
	for _, tc := range []struct {
		segs []Segment
		want string
	}{
		{[]Segment{seg(0, 0, 4, 2, 0), seg(0, 1, 4, 4, 1)}, "overlap"},
		{[]Segment{seg(0, 0, 4, 2, 0)}, "do not cover"},
		{[]Segment{seg(0, 0, 4, 4, 2)}, "device 2 of 2"},
		{[]Segment{seg(0, 0, 5, 4, 0)}, "outside the space"},
	} {
		if _, err := Irregular(e, 2, tc.segs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.segs, err, tc.want)
		}
	}
	if _, err := Regular(e, []int{2}, 2, Blocks, nil); err == nil {
		t.Error("a tile of the wrong rank was accepted")
	}
	if _, err := Weighted(e, 0, []float64{1, 0}); err == nil {
		t.Error("a zero weight was accepted")
	}
}

// Reweighting between steps: a device that took twice as long for the
// same share gets about half as much.
func TestReweight(t *testing.T) {
	must := mustOf(t)
	m := must(Weighted([]int{300, 8}, 0, []float64{1, 1, 1}))
	r, err := Reweight(m, []float64{1, 2, 1})
	if err != nil {
		t.Fatal(err)
	}
	if c := []int{r.Count(0) / 8, r.Count(1) / 8, r.Count(2) / 8}; c[0] != 120 || c[1] != 60 || c[2] != 120 {
		t.Fatalf("rows after reweighting: %v, want 120 60 120", c)
	}
}
