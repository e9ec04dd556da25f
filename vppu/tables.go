// Package vppu virtualises the ranks of a job (docs/design/virtual-devices.md): a job is
// written against M virtual devices with a logical topology (ring, mesh,
// torus, tree, full); a placement maps them onto the ranks of a
// communicator, one or several per rank; routing tables are derived for
// both sides; and a migration maps the same virtual devices onto another
// set of ranks, moving their data, after which the job continues.
//
// The numbers do not depend on the placement: every reduction of a
// virtual communicator folds the M virtual contributions in one fixed
// order, device 0 first, so a job on 8 virtual devices gives the same bits
// on 8, 4 or 2 processes, and before and after a migration.
//
// Subpackages: resmap (who owns which part of a tensor, docs/design/resource-maps.md) and
// redist (moving a tensor between layouts, docs/design/redistribution.md).
package vppu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gocoll/gocoll/topology"
)

// Logical is a virtual topology: which virtual devices are neighbours.
type Logical struct {
	Kind string // "ring", "mesh", "torus", "tree", "full"
	Dims []int  // mesh and torus: A, B
	M    int    // virtual devices
}

// ParseLogical reads "ring", "mesh:AxB", "torus:AxB", "tree" or "full" for m
// virtual devices (mesh and torus need A·B = m; m 0 takes it from them).
func ParseLogical(spec string, m int) (Logical, error) {
	kind, arg, _ := strings.Cut(spec, ":")
	l := Logical{Kind: kind, M: m}
	switch kind {
	case "ring", "tree", "full":
		if arg != "" {
			n, err := strconv.Atoi(arg)
			if err != nil || n < 1 {
				return l, fmt.Errorf("vppu: %q: want %s or %s:M", spec, kind, kind)
			}
			if m == 0 {
				l.M = n
			} else if n != m {
				return l, fmt.Errorf("vppu: %q has %d devices, not %d", spec, n, m)
			}
		}
	case "mesh", "torus":
		as, bs, ok := strings.Cut(arg, "x")
		a, err1 := strconv.Atoi(as)
		b, err2 := strconv.Atoi(bs)
		if !ok || err1 != nil || err2 != nil || a < 1 || b < 1 {
			return l, fmt.Errorf("vppu: %q: want %s:AxB", spec, kind)
		}
		if m == 0 {
			l.M = a * b
		} else if a*b != m {
			return l, fmt.Errorf("vppu: %q has %d devices, not %d", spec, a*b, m)
		}
		l.Dims = []int{a, b}
	default:
		return l, fmt.Errorf("vppu: unknown logical topology %q (ring, mesh:AxB, torus:AxB, tree, full)", spec)
	}
	if l.M < 1 {
		return l, fmt.Errorf("vppu: %q: how many virtual devices? (%d)", spec, l.M)
	}
	return l, nil
}

func (l Logical) String() string {
	switch l.Kind {
	case "mesh", "torus":
		return fmt.Sprintf("%s:%dx%d", l.Kind, l.Dims[0], l.Dims[1])
	}
	return fmt.Sprintf("%s:%d", l.Kind, l.M)
}

// Neighbours is the virtual routing table (claims 1–3): for each virtual
// device, the devices it exchanges with, in increasing order — a ring's
// predecessor and successor, a mesh's (torus's, wrapping) four
// neighbours, a binary tree's parent and children (device 0 the root),
// everyone in full.
func (l Logical) Neighbours() [][]int {
	m := l.M
	out := make([][]int, m)
	add := func(v, w int) {
		if v != w && !slices.Contains(out[v], w) {
			out[v] = append(out[v], w)
		}
	}
	for v := 0; v < m; v++ {
		switch l.Kind {
		case "ring":
			add(v, (v+1)%m)
			add(v, (v+m-1)%m)
		case "mesh", "torus":
			a, b := l.Dims[0], l.Dims[1]
			i, j := v/b, v%b
			for _, d := range [][2]int{{-1, 0}, {1, 0}, {0, -1}, {0, 1}} {
				ni, nj := i+d[0], j+d[1]
				if l.Kind == "torus" {
					ni, nj = (ni+a)%a, (nj+b)%b
				} else if ni < 0 || ni >= a || nj < 0 || nj >= b {
					continue
				}
				add(v, ni*b+nj)
			}
		case "tree":
			if v > 0 {
				add(v, (v-1)/2)
			}
			for _, c := range []int{2*v + 1, 2*v + 2} {
				if c < m {
					add(v, c)
				}
			}
		case "full":
			for w := 0; w < m; w++ {
				add(v, w)
			}
		}
		slices.Sort(out[v])
	}
	return out
}

// Place maps virtual devices to ranks.
type Place []int

// Block puts devices in contiguous runs on ranks 0..n-1 (runs differ by at
// most one device).
func Block(m, n int) Place {
	p := make(Place, m)
	for v := range p {
		p[v] = v * n / m
	}
	return p
}

// CyclicPlace deals devices to ranks 0..n-1 in turn.
func CyclicPlace(m, n int) Place {
	p := make(Place, m)
	for v := range p {
		p[v] = v % n
	}
	return p
}

// ParsePlace reads "block:N", "cyclic:N" or a comma list of ranks, one per
// virtual device.
func ParsePlace(spec string, m int) (Place, error) {
	kind, arg, found := strings.Cut(spec, ":")
	if found && (kind == "block" || kind == "cyclic") {
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("vppu: placement %q: want %s:N", spec, kind)
		}
		if kind == "block" {
			return Block(m, n), nil
		}
		return CyclicPlace(m, n), nil
	}
	var p Place
	for _, f := range strings.Split(spec, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 0 {
			return nil, fmt.Errorf("vppu: placement %q: want block:N, cyclic:N or a list of ranks", spec)
		}
		p = append(p, r)
	}
	if len(p) != m {
		return nil, fmt.Errorf("vppu: placement %q names %d ranks for %d virtual devices", spec, len(p), m)
	}
	return p, nil
}

// Edge is a virtual edge as the physical routing table carries it.
type Edge struct {
	From  int     `json:"from"`
	To    int     `json:"to"`
	Ranks [2]int  `json:"ranks"`
	Link  *string `json:"link"` // null: both devices on one rank (no link)
}

// Tables are the routing tables of a placement on a physical topology
// (claims 1–6): the virtual table, the physical one (every virtual edge
// with the ranks and the link that carry it), and the links it uses and
// leaves free for other jobs.
type Tables struct {
	Virtual  [][]int  `json:"virtual"`
	Physical []Edge   `json:"physical"`
	InUse    []string `json:"in_use"`
	Free     []string `json:"free"`
}

// RoutingTables derives the tables of logical l placed by place on the
// devices of g (rank r = device r). A virtual edge between devices on one
// rank stays local. Between two ranks it takes a direct link when there is
// one — of parallel links the one carrying the fewest edges so far, so the
// cube-mesh's doubled links serve two edges — and otherwise g's route,
// its links joined by ">".
func RoutingTables(l Logical, place Place, g *topology.Graph) (Tables, error) {
	if len(place) != l.M {
		return Tables{}, fmt.Errorf("vppu: placement of %d devices for %d virtual devices", len(place), l.M)
	}
	for v, r := range place {
		if _, ok := g.Node(r); !ok {
			return Tables{}, fmt.Errorf("vppu: virtual device %d is placed on rank %d, which is no device of %s", v, r, g.Name)
		}
	}
	t := Tables{Virtual: l.Neighbours(), Physical: []Edge{}, InUse: []string{}, Free: []string{}}
	used := map[int]int{} // link index → edges on it
	for v, ns := range t.Virtual {
		for _, w := range ns {
			e := Edge{From: v, To: w, Ranks: [2]int{place[v], place[w]}}
			if place[v] != place[w] {
				var direct []int
				for i, lk := range g.Links {
					if lk.A == place[v] && lk.B == place[w] || lk.A == place[w] && lk.B == place[v] {
						direct = append(direct, i)
					}
				}
				var id string
				if len(direct) > 0 {
					best := direct[0]
					for _, i := range direct[1:] {
						if used[i] < used[best] {
							best = i
						}
					}
					used[best]++
					id = g.Links[best].ID
				} else {
					path, err := g.Path(place[v], place[w])
					if err != nil {
						return Tables{}, fmt.Errorf("vppu: virtual edge %d→%d: %w", v, w, err)
					}
					for _, h := range path {
						used[h.Link]++
					}
					id = g.PathString(path)
				}
				e.Link = &id
			}
			t.Physical = append(t.Physical, e)
		}
	}
	for i, lk := range g.Links {
		if used[i] > 0 {
			t.InUse = append(t.InUse, lk.ID)
		} else {
			t.Free = append(t.Free, lk.ID)
		}
	}
	return t, nil
}
