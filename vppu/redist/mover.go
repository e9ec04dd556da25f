package redist

import (
	"fmt"
	"sort"

	"github.com/gocoll/gocoll/vppu/resmap"
)

// run is n consecutive elements at element offset off of a local buffer.
type run struct{ off, n int }

// runs collects offsets into runs, merging neighbours.
type runs []run

func (r *runs) add(off, n int) {
	if k := len(*r); k > 0 && (*r)[k-1].off+(*r)[k-1].n == off {
		(*r)[k-1].n += n
		return
	}
	*r = append(*r, run{off, n})
}

// A mover knows where a message's elements are: for sender i, per
// receiver, the runs of its local buffer in message order; for receiver
// j, per sender, the runs of its buffer they land in, in the same order.
// Packing and unpacking at the two ends is the only place strided data is
// touched.
type mover interface {
	sends(i int) map[int]runs
	recvs(j int) map[int]runs
	// srcCount and dstCount are how many elements sender i and receiver j
	// hold in their local buffers.
	srcCount(i int) int
	dstCount(j int) int
}

func (m affineMover) srcCount(i int) int {
	if m.a.N == 0 {
		return 0
	}
	return m.a.Src.Count(i, m.a.SrcIndex.at(m.a.N-1)+1)
}

func (m affineMover) dstCount(j int) int {
	if m.a.N == 0 {
		return 0
	}
	return m.a.Dst.Count(j, m.a.DstIndex.at(m.a.N-1)+1)
}

func (m mapMover) srcCount(i int) int { return m.src.Count(i) }
func (m mapMover) dstCount(j int) int { return m.dst.Count(j) }

// affineMover walks a processor's own elements in increasing global index
// (which, with a ≥ 1, is increasing loop index i, the message order).
type affineMover struct{ a Affine }

func (m affineMover) sends(i int) map[int]runs {
	a := m.a
	out := map[int]runs{}
	if a.N == 0 {
		return out
	}
	last := a.SrcIndex.at(a.N - 1)
	for k := 0; ; k++ {
		g0 := (k*a.Src.Procs + i) * a.Src.Block
		if g0 > last {
			break
		}
		for g := g0; g < g0+a.Src.Block && g <= last; g++ {
			d := g - a.SrcIndex.B
			if d < 0 || d%a.SrcIndex.A != 0 {
				continue
			}
			j := a.Dst.owner(a.DstIndex.at(d / a.SrcIndex.A))
			r := out[j]
			r.add(a.Src.local(g), 1)
			out[j] = r
		}
	}
	return out
}

func (m affineMover) recvs(j int) map[int]runs {
	a := m.a
	out := map[int]runs{}
	if a.N == 0 {
		return out
	}
	last := a.DstIndex.at(a.N - 1)
	for k := 0; ; k++ {
		g0 := (k*a.Dst.Procs + j) * a.Dst.Block
		if g0 > last {
			break
		}
		for g := g0; g < g0+a.Dst.Block && g <= last; g++ {
			d := g - a.DstIndex.B
			if d < 0 || d%a.DstIndex.A != 0 {
				continue
			}
			i := a.Src.owner(a.SrcIndex.at(d / a.DstIndex.A))
			r := out[i]
			r.add(a.Dst.local(g), 1)
			out[i] = r
		}
	}
	return out
}

// mapMover moves between two resource maps of one space: a message is the
// intersections of the sender's tiles with the receiver's, in (source
// tile, destination tile) order, each walked row-major.
type mapMover struct{ src, dst *resmap.Map }

// overlapping lists the tiles of m meeting box b, in increasing order.
func overlapping(m *resmap.Map, b resmap.Box) []int {
	if m.Segs != nil {
		var out []int
		for t := 0; t < m.NumTiles(); t++ {
			if _, ok := intersectBox(m.TileBox(t), b); ok {
				out = append(out, t)
			}
		}
		return out
	}
	nd := len(m.Extent)
	lo, hi := make([]int, nd), make([]int, nd)
	count := 1
	for d := 0; d < nd; d++ {
		lo[d], hi[d] = b.Lo[d]/m.Tile[d], (b.Hi[d]-1)/m.Tile[d]
		count *= hi[d] - lo[d] + 1
	}
	per := make([]int, nd) // tiles per dimension of the whole map
	for d := range per {
		per[d] = (m.Extent[d] + m.Tile[d] - 1) / m.Tile[d]
	}
	out := make([]int, 0, count)
	c := append([]int(nil), lo...)
	for {
		t := 0
		for d := 0; d < nd; d++ {
			t = t*per[d] + c[d]
		}
		out = append(out, t)
		d := nd - 1
		for d >= 0 {
			if c[d]++; c[d] <= hi[d] {
				break
			}
			c[d] = lo[d]
			d--
		}
		if d < 0 {
			return out
		}
	}
}

func intersectBox(a, b resmap.Box) (resmap.Box, bool) {
	out := resmap.Box{Lo: make([]int, len(a.Lo)), Hi: make([]int, len(a.Lo))}
	for d := range a.Lo {
		out.Lo[d], out.Hi[d] = max(a.Lo[d], b.Lo[d]), min(a.Hi[d], b.Hi[d])
		if out.Lo[d] >= out.Hi[d] {
			return resmap.Box{}, false
		}
	}
	return out, true
}

// rowsOf adds to r the runs of box b (rows along the last dimension) as
// laid out in tile t of m.
func rowsOf(r *runs, m *resmap.Map, t int, b resmap.Box) {
	tb := m.TileBox(t)
	nd := len(b.Lo)
	base := m.TileBase(t)
	c := append([]int(nil), b.Lo...)
	rowLen := b.Hi[nd-1] - b.Lo[nd-1]
	for {
		off := 0
		for d := 0; d < nd; d++ {
			off = off*(tb.Hi[d]-tb.Lo[d]) + c[d] - tb.Lo[d]
		}
		r.add(base+off, rowLen)
		d := nd - 2
		for d >= 0 {
			if c[d]++; c[d] < b.Hi[d] {
				break
			}
			c[d] = b.Lo[d]
			d--
		}
		if d < 0 {
			return
		}
	}
}

type pair struct {
	s, d int
	box  resmap.Box
}

func (m mapMover) pairsFrom(i int) []pair {
	var out []pair
	for s := 0; s < m.src.NumTiles(); s++ {
		if m.src.TileOwner(s) != i {
			continue
		}
		sb := m.src.TileBox(s)
		for _, d := range overlapping(m.dst, sb) {
			if b, ok := intersectBox(sb, m.dst.TileBox(d)); ok {
				out = append(out, pair{s, d, b})
			}
		}
	}
	return out
}

func (m mapMover) sends(i int) map[int]runs {
	out := map[int]runs{}
	for _, p := range m.pairsFrom(i) {
		j := m.dst.TileOwner(p.d)
		r := out[j]
		rowsOf(&r, m.src, p.s, p.box)
		out[j] = r
	}
	return out
}

func (m mapMover) recvs(j int) map[int]runs {
	var ps []pair
	for d := 0; d < m.dst.NumTiles(); d++ {
		if m.dst.TileOwner(d) != j {
			continue
		}
		db := m.dst.TileBox(d)
		for _, s := range overlapping(m.src, db) {
			if b, ok := intersectBox(db, m.src.TileBox(s)); ok {
				ps = append(ps, pair{s, d, b})
			}
		}
	}
	// The sender's order: by source tile, then destination tile.
	sort.Slice(ps, func(a, b int) bool {
		if ps[a].s != ps[b].s {
			return ps[a].s < ps[b].s
		}
		return ps[a].d < ps[b].d
	})
	out := map[int]runs{}
	for _, p := range ps {
		i := m.src.TileOwner(p.s)
		r := out[i]
		rowsOf(&r, m.dst, p.d, p.box)
		out[i] = r
	}
	return out
}

// Maps describes a general plan's two maps, for JSON.
type Maps struct {
	Src string `json:"src"`
	Dst string `json:"dst"`
}

// PlanMaps builds the plan that moves an array laid out by src into the
// layout dst (the same index space; devices are the two maps' own).
func PlanMaps(src, dst *resmap.Map) (*Plan, error) {
	if len(src.Extent) != len(dst.Extent) {
		return nil, fmt.Errorf("redist: spaces %v and %v differ", src.Extent, dst.Extent)
	}
	for d := range src.Extent {
		if src.Extent[d] != dst.Extent[d] {
			return nil, fmt.Errorf("redist: spaces %v and %v differ", src.Extent, dst.Extent)
		}
	}
	q, p := src.Devices, dst.Devices
	com := make([][]int, q)
	for i := range com {
		com[i] = make([]int, p)
	}
	mv := mapMover{src, dst}
	for i := 0; i < q; i++ {
		for _, pr := range mv.pairsFrom(i) {
			com[i][dst.TileOwner(pr.d)] += pr.box.Size()
		}
	}
	plan := &Plan{Q: q, P: p, COM: com, LowerBound: lowerBound(com, q, p), mover: mv,
		desc: Maps{src.String(), dst.String()}}
	plan.Steps, plan.Method = coloring(com, q, p), "coloring"
	if g := greedy(com, q, p); len(g) <= plan.LowerBound {
		plan.Steps, plan.Method = g, "coloring (greedy by length reached the bound)"
	}
	return plan, nil
}
