// Package resmap is the resource map of docs/design/resource-maps.md: which device owns which
// part of an N-dimensional index space (a tensor), and where each element
// lives in its owner's memory.
//
// A regular map cuts the space into tiles (the document's segments, each a
// grid with an extent and an offset; tiles at the far edges may be
// smaller), numbers them in row-major order, and assigns tile numbers to
// devices by blocks (contiguous runs, equal or weighted by device speed)
// or cyclically. That covers the document's decompositions of its 6×6
// example: row blocks (tiles of one element, block assignment), column
// blocks (tiles of whole columns), element cycles (tiles of one element,
// cyclic), block-cyclic (2×2 tiles, cyclic) and block-block (2×2 tiles,
// block); block-cyclic(x) along any dimension is tiles of x along it and
// the whole extent along the others. An irregular map is a list of boxes
// with owners. Owner lookup is O(1) for regular maps (one division per
// dimension; a binary search over devices for weighted blocks) and a search
// over boxes for irregular ones.
//
// A device stores its tiles back to back in tile order, each row-major:
// for 1-D block-cyclic(x) that is HPF's local layout (local index
// (g/(x·P))·x + g mod x).
package resmap

import (
	"fmt"
	"sort"
	"strings"
)

// Box is the part of the space [Lo, Hi) (per dimension).
type Box struct{ Lo, Hi []int }

// Size is the number of elements in b.
func (b Box) Size() int {
	n := 1
	for d := range b.Lo {
		n *= max(b.Hi[d]-b.Lo[d], 0)
	}
	return n
}

func (b Box) String() string { return fmt.Sprintf("%v-%v", b.Lo, b.Hi) }

// intersect returns a ∩ b and whether it is non-empty.
func intersect(a, b Box) (Box, bool) {
	out := Box{Lo: make([]int, len(a.Lo)), Hi: make([]int, len(a.Lo))}
	for d := range a.Lo {
		out.Lo[d], out.Hi[d] = max(a.Lo[d], b.Lo[d]), min(a.Hi[d], b.Hi[d])
		if out.Lo[d] >= out.Hi[d] {
			return Box{}, false
		}
	}
	return out, true
}

// Segment is a box and the device that owns it.
type Segment struct {
	Box
	Owner int
}

// Assign says how a regular map gives tile numbers to devices.
type Assign int

const (
	// Blocks: device d gets a contiguous run of tile numbers, in device
	// order (equal runs, or runs proportional to Weights).
	Blocks Assign = iota
	// Cyclic: tile t goes to device t mod Devices.
	Cyclic
)

// Map is a resource map. Build it with the constructors; it is read-only
// afterwards.
type Map struct {
	Extent  []int
	Devices int
	// Regular maps.
	Tile    []int
	Assign  Assign
	Weights []float64 // Blocks only: relative speeds (nil: equal)
	// Irregular maps: explicit segments.
	Segs []Segment

	tiles  []int // tiles per dimension
	ntiles int
	start  []int // Blocks: first tile of each device, plus ntiles
	base   []int // local offset of each tile in its owner's buffer (regular)
	counts []int // elements per device
}

// Regular builds a map of the space extent cut into tiles of tile (per
// dimension; a tile extent of 0 means the whole dimension), assigned to
// devices by a. weights (Blocks only, one per device, positive) make the
// runs proportional to device speeds.
func Regular(extent, tile []int, devices int, a Assign, weights []float64) (*Map, error) {
	if len(extent) == 0 || len(tile) != len(extent) {
		return nil, fmt.Errorf("resmap: %d tile extents for %d dimensions", len(tile), len(extent))
	}
	if devices < 1 {
		return nil, fmt.Errorf("resmap: %d devices", devices)
	}
	m := &Map{Extent: append([]int(nil), extent...), Devices: devices, Tile: make([]int, len(tile)), Assign: a}
	m.tiles = make([]int, len(extent))
	m.ntiles = 1
	for d, e := range extent {
		if e < 1 {
			return nil, fmt.Errorf("resmap: extent %d of dimension %d", e, d)
		}
		t := tile[d]
		if t == 0 {
			t = e
		}
		if t < 1 {
			return nil, fmt.Errorf("resmap: tile extent %d of dimension %d", tile[d], d)
		}
		m.Tile[d] = t
		m.tiles[d] = (e + t - 1) / t
		m.ntiles *= m.tiles[d]
	}
	switch a {
	case Blocks:
		if weights != nil {
			if len(weights) != devices {
				return nil, fmt.Errorf("resmap: %d weights for %d devices", len(weights), devices)
			}
			for i, w := range weights {
				if !(w > 0) {
					return nil, fmt.Errorf("resmap: weight %v of device %d, want > 0", w, i)
				}
			}
			m.Weights = append([]float64(nil), weights...)
		}
		m.start = blockStarts(m.ntiles, devices, m.Weights)
	case Cyclic:
		if weights != nil {
			return nil, fmt.Errorf("resmap: weights apply to block assignments only")
		}
	default:
		return nil, fmt.Errorf("resmap: unknown assignment %d", a)
	}
	m.layout()
	return m, nil
}

// blockStarts cuts n tiles into runs for devices: equal (sizes differ by at
// most one, floor(d·n/D)), or proportional to weights, rounded so that the
// runs still add up to n.
func blockStarts(n, devices int, weights []float64) []int {
	s := make([]int, devices+1)
	if weights == nil {
		for d := range s {
			s[d] = d * n / devices
		}
		return s
	}
	total := 0.0
	for _, w := range weights {
		total += w
	}
	acc := 0.0
	for d := range weights {
		s[d] = int(acc/total*float64(n) + 0.5)
		acc += weights[d]
	}
	s[devices] = n
	return s
}

// Irregular builds a map from explicit segments; they must cover the space
// exactly, without overlap.
func Irregular(extent []int, devices int, segs []Segment) (*Map, error) {
	m := &Map{Extent: append([]int(nil), extent...), Devices: devices, Segs: append([]Segment(nil), segs...)}
	total := 1
	for _, e := range extent {
		total *= e
	}
	sum := 0
	for i, s := range segs {
		if len(s.Lo) != len(extent) || len(s.Hi) != len(extent) {
			return nil, fmt.Errorf("resmap: segment %d has %d/%d bounds for %d dimensions", i, len(s.Lo), len(s.Hi), len(extent))
		}
		for d := range extent {
			if s.Lo[d] < 0 || s.Hi[d] > extent[d] || s.Lo[d] >= s.Hi[d] {
				return nil, fmt.Errorf("resmap: segment %d %v is empty or outside the space %v", i, s.Box, extent)
			}
		}
		if s.Owner < 0 || s.Owner >= devices {
			return nil, fmt.Errorf("resmap: segment %d belongs to device %d of %d", i, s.Owner, devices)
		}
		for j := 0; j < i; j++ {
			if b, ok := intersect(s.Box, segs[j].Box); ok {
				return nil, fmt.Errorf("resmap: segments %d %v and %d %v overlap in %v", j, segs[j].Box, i, s.Box, b)
			}
		}
		sum += s.Size()
	}
	if sum != total {
		return nil, fmt.Errorf("resmap: the segments hold %d of the space's %d elements: they do not cover it", sum, total)
	}
	m.layout()
	return m, nil
}

// NumTiles is the number of tiles (regular) or segments (irregular).
func (m *Map) NumTiles() int {
	if m.Segs != nil {
		return len(m.Segs)
	}
	return m.ntiles
}

// TileBox is tile (or segment) t's box.
func (m *Map) TileBox(t int) Box {
	if m.Segs != nil {
		return m.Segs[t].Box
	}
	b := Box{Lo: make([]int, len(m.Extent)), Hi: make([]int, len(m.Extent))}
	for d := len(m.Extent) - 1; d >= 0; d-- {
		c := t % m.tiles[d]
		t /= m.tiles[d]
		b.Lo[d] = c * m.Tile[d]
		b.Hi[d] = min(b.Lo[d]+m.Tile[d], m.Extent[d])
	}
	return b
}

// TileOwner is the device of tile t.
func (m *Map) TileOwner(t int) int {
	if m.Segs != nil {
		return m.Segs[t].Owner
	}
	if m.Assign == Cyclic {
		return t % m.Devices
	}
	if m.Weights == nil {
		return ((t+1)*m.Devices - 1) / m.ntiles
	}
	return sort.SearchInts(m.start, t+1) - 1
}

// Tile returns the tile (or segment) holding idx.
func (m *Map) TileOf(idx []int) int {
	if m.Segs != nil {
		for i, s := range m.Segs {
			in := true
			for d := range idx {
				in = in && s.Lo[d] <= idx[d] && idx[d] < s.Hi[d]
			}
			if in {
				return i
			}
		}
		return -1
	}
	t := 0
	for d, x := range idx {
		t = t*m.tiles[d] + x/m.Tile[d]
	}
	return t
}

// Owner is the device holding element idx.
func (m *Map) Owner(idx []int) int { return m.TileOwner(m.TileOf(idx)) }

// layout fixes where each tile starts in its owner's buffer.
func (m *Map) layout() {
	n := m.NumTiles()
	m.base = make([]int, n)
	m.counts = make([]int, m.Devices)
	for t := 0; t < n; t++ {
		o := m.TileOwner(t)
		m.base[t] = m.counts[o]
		m.counts[o] += m.TileBox(t).Size()
	}
}

// Count is the number of elements device d holds (the length of its local
// buffer, in elements).
func (m *Map) Count(d int) int { return m.counts[d] }

// TileBase is the element offset of tile t in its owner's buffer.
func (m *Map) TileBase(t int) int { return m.base[t] }

// LocalOffset is where element idx lives in its owner's buffer.
func (m *Map) LocalOffset(idx []int) int {
	t := m.TileOf(idx)
	b := m.TileBox(t)
	off := 0
	for d := range idx {
		off = off*(b.Hi[d]-b.Lo[d]) + idx[d] - b.Lo[d]
	}
	return m.base[t] + off
}

// Segments lists every tile with its owner.
func (m *Map) Segments() []Segment {
	out := make([]Segment, m.NumTiles())
	for t := range out {
		out[t] = Segment{m.TileBox(t), m.TileOwner(t)}
	}
	return out
}

// String describes the map.
func (m *Map) String() string {
	if m.Segs != nil {
		return fmt.Sprintf("irregular %v over %d devices (%d segments)", m.Extent, m.Devices, len(m.Segs))
	}
	kind := "blocks"
	if m.Assign == Cyclic {
		kind = "cyclic"
	}
	if m.Weights != nil {
		kind = fmt.Sprintf("weighted blocks %v", m.Weights)
	}
	return fmt.Sprintf("%v in tiles %v, %s over %d devices", m.Extent, m.Tile, kind, m.Devices)
}

// Owners draws a 2-D map as a grid of owner numbers (tests, docs).
func (m *Map) Owners() string {
	if len(m.Extent) != 2 {
		return m.String()
	}
	var b strings.Builder
	for i := 0; i < m.Extent[0]; i++ {
		for j := 0; j < m.Extent[1]; j++ {
			if j > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d", m.Owner([]int{i, j}))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// along is a tile shape that cuts dimension dim into pieces of x and keeps
// the others whole.
func along(extent []int, dim, x int) ([]int, error) {
	if dim < 0 || dim >= len(extent) {
		return nil, fmt.Errorf("resmap: dimension %d of a %d-dimensional space", dim, len(extent))
	}
	t := make([]int, len(extent))
	t[dim] = x
	return t, nil
}

// Block gives each device a contiguous band of dimension dim (bands differ
// by at most one index).
func Block(extent []int, dim, devices int) (*Map, error) {
	t, err := along(extent, dim, 1)
	if err != nil {
		return nil, err
	}
	return Regular(extent, t, devices, Blocks, nil)
}

// BlockCyclic deals bands of x indices of dimension dim to the devices in
// turn: element g (along dim) lives on device ⌊g/x⌋ mod devices.
func BlockCyclic(extent []int, dim, devices, x int) (*Map, error) {
	t, err := along(extent, dim, x)
	if err != nil {
		return nil, err
	}
	return Regular(extent, t, devices, Cyclic, nil)
}

// Cyclic is BlockCyclic with bands of one index.
func CyclicAlong(extent []int, dim, devices int) (*Map, error) {
	return BlockCyclic(extent, dim, devices, 1)
}

// BlockBlock cuts a 2-D space into a p×q grid of blocks, block (i, j) on
// device i·q + j.
func BlockBlock(extent []int, p, q int) (*Map, error) {
	if len(extent) != 2 || p < 1 || q < 1 {
		return nil, fmt.Errorf("resmap: block-block needs a 2-D space and a grid, got %v and %dx%d", extent, p, q)
	}
	tile := []int{(extent[0] + p - 1) / p, (extent[1] + q - 1) / q}
	return Regular(extent, tile, p*q, Cyclic, nil)
}

// Weighted gives each device a band of dimension dim proportional to its
// weight (its speed): the source's load balancing, decided before a step
// instead of by stealing during it.
func Weighted(extent []int, dim int, weights []float64) (*Map, error) {
	t, err := along(extent, dim, 1)
	if err != nil {
		return nil, err
	}
	return Regular(extent, t, len(weights), Blocks, weights)
}

// Reweight returns m's weighted-band map rebalanced from the time each
// device took for its share in the last step: a device's new weight is
// the elements it processed per second, so a device that was slow gets a
// smaller band next time and all are expected to finish together.
// The source lets idle nodes steal queued work; between training steps
// the same balance is reached by moving the boundaries instead.
func Reweight(m *Map, seconds []float64) (*Map, error) {
	if m.Segs != nil || m.Assign != Blocks || len(seconds) != m.Devices {
		return nil, fmt.Errorf("resmap: reweighting needs a block map and one time per device (%d)", m.Devices)
	}
	dim := -1
	for d, t := range m.Tile {
		if t == 1 && m.Extent[d] > 1 {
			dim = d
		}
	}
	if dim < 0 {
		return nil, fmt.Errorf("resmap: %v is not a band map", m)
	}
	w := make([]float64, m.Devices)
	for d, s := range seconds {
		if !(s > 0) {
			return nil, fmt.Errorf("resmap: device %d took %v s", d, s)
		}
		w[d] = max(float64(m.Count(d)), 1) / s
	}
	return Weighted(m.Extent, dim, w)
}
