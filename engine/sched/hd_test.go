package sched

import "testing"

// TestHDSegmentCount: the automatic q stays within 1..8 and tracks size; a
// forced q is capped by the element count and hdMaxSeg.
func TestHDSegmentCount(t *testing.T) {
	h := &hd{es: 4}
	for _, tc := range []struct{ elems, want int }{{0, 1}, {1, 1}, {hdSegTarget / 4, 1}, {hdSegTarget/4 + 1, 2}, {100 * hdSegTarget, hdAutoMaxQ}} {
		if got := h.nseg(tc.elems); got != tc.want {
			t.Errorf("auto nseg(%d) = %d, want %d", tc.elems, got, tc.want)
		}
	}
	h.p.Segments = 1000
	for _, tc := range []struct{ elems, want int }{{0, 1}, {5, 5}, {10000, hdMaxSeg}} {
		if got := h.nseg(tc.elems); got != tc.want {
			t.Errorf("forced nseg(%d) = %d, want %d", tc.elems, got, tc.want)
		}
	}
}

// TestHDLayout: the final segments tile the buffer in order, and for
// reduce-scatter vrank v's segment is exactly the blocks of the ranks folded
// into it.
func TestHDLayout(t *testing.T) {
	for n := 1; n <= 17; n++ {
		for _, rs := range []bool{false, true} {
			f := newFold(n)
			h := &hd{f: f, es: 2, rs: rs, count: 3*n + 1, block: 6}
			total := h.count * h.es
			if rs {
				total = n * h.block
			}
			if h.off(0) != 0 || h.off(f.p) != total {
				t.Fatalf("n=%d rs=%v: segments span [%d,%d), want [0,%d)", n, rs, h.off(0), h.off(f.p), total)
			}
			for v := 0; v < f.p; v++ {
				if h.off(v) > h.off(v+1) {
					t.Fatalf("n=%d rs=%v: segment %d decreasing", n, rs, v)
				}
			}
			if !rs {
				continue
			}
			for r := 0; r < n; r++ {
				v := f.vrank(r)
				if v < 0 {
					v = f.vrank(r + 1)
				}
				if r*h.block < h.off(v) || (r+1)*h.block > h.off(v+1) {
					t.Fatalf("n=%d: block of rank %d outside segment of vrank %d", n, r, v)
				}
			}
		}
	}
}
