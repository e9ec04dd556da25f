package vppu

import (
	"fmt"
	"slices"

	"github.com/gocoll/gocoll/engine"
)

// The recovery's decision, as a pure function: every rank all-gathers
// the ranks' descriptions (recoverDesc) and computes the same plan from
// them (planRecovery), which the executor (recover.go) then carries out.
// Nothing here does I/O, so the decision is table-tested without a
// process (plan_test.go).

// recoverDesc is what a rank tells the others at the start of a recovery
// (encodeRecover): what it holds and the options it was called with.
type recoverDesc struct {
	Logical  uint64 // logicalHash of its virtual topology
	M        int    // its number of virtual devices
	Step     uint64 // RecoverOptions.Step: the steps its shared state completed
	Joined   bool   // a joining process (Join): it holds no state
	Rebuild  bool   // it has a RecoverOptions.Rebuild
	MinRanks int    // RecoverOptions.MinRanks
	Place    []int  // RecoverOptions.Place; nil: none
	Local    []int
	Shared   map[string]int   // name → size
	Own      []map[string]int // per local device, name → size
}

// transfer is one registered buffer sent from one rank to another, in a
// migration or a recovery; both sides walk the same list in the same
// order.
type transfer struct {
	Dev      int // the device it belongs to (a shared buffer: the device it travels with)
	Name     string
	Size     int
	From, To int
	Shared   bool
}

// rebuild is a device's own buffer that cannot be copied (its process
// died, or its rank is a step behind), rebuilt by Rank at the settled step.
type rebuild struct {
	Dev  int
	Name string
	Size int
	Rank int  // the device's new host, which rebuilds it
	Kept bool // that rank holds the buffer already (it was the device's host)
}

// recoveryPlan is what every rank does in a recovery.
type recoveryPlan struct {
	Recovery
	Transfers []transfer // in the order both sides post them
	Rebuilds  []rebuild
}

// planRecovery decides a recovery from every rank's description (rank r
// of the new parent sent descs[r]). It fails, alike on every rank, on
// options that differ between members (they would wait for each other
// forever) and on state that cannot be restored. A joining process whose
// topology or options differ from the members' is refused (Refused) and
// given no device; the others go on.
func planRecovery(descs []recoverDesc) (recoveryPlan, error) {
	ref, refused, err := checkDescs(descs)
	if err != nil {
		return recoveryPlan{}, err
	}
	n, opts := len(descs), descs[ref]
	if live := n - len(refused); opts.MinRanks > 0 && live < opts.MinRanks {
		return recoveryPlan{}, fmt.Errorf("%w: %d process(es), the job needs at least %d", ErrTooFewRanks, live, opts.MinRanks)
	}
	h, err := holdings(descs, opts.M)
	if err != nil {
		return recoveryPlan{}, err
	}
	p := recoveryPlan{Recovery: Recovery{Step: h.step, Lost: h.lost(), Behind: h.behind, Refused: refused}}
	if opts.Place != nil {
		if err := checkRecoverPlace(opts.Place, opts.M, n, refused); err != nil {
			return recoveryPlan{}, err
		}
		p.Place = slices.Clone(Place(opts.Place))
	} else {
		p.Place = rebalanceAmong(h.owner, n, refused)
	}
	p.Rebuilds = h.rebuilds(p.Place)
	for _, b := range p.Rebuilds {
		if !descs[b.Rank].Rebuild {
			return recoveryPlan{}, fmt.Errorf("%w: device %d's own buffer %q cannot be copied (its process died or is a step behind) and rank %d, its new host, has no Rebuild: register it shared or rebuild it from (seed, device, step)", ErrStateLost, b.Dev, b.Name, b.Rank)
		}
	}
	p.Transfers = h.transfers(descs, p.Place)
	for _, x := range p.Transfers {
		p.Bytes += int64(x.Size)
	}
	return p, nil
}

// checkDescs finds the first member (not joining) and checks every rank
// against it: a member that differs fails the recovery everywhere (nobody
// can tell which is right), a joiner that differs is refused.
func checkDescs(descs []recoverDesc) (ref int, refused []int, err error) {
	ref = slices.IndexFunc(descs, func(d recoverDesc) bool { return !d.Joined })
	if ref < 0 {
		return 0, nil, fmt.Errorf("%w: every process is joining: none holds any device", ErrStateLost)
	}
	for r, d := range descs {
		if d.Joined && len(d.Local) > 0 || len(d.Own) != len(d.Local) {
			return 0, nil, fmt.Errorf("rank %d sent a damaged description", r)
		}
		what := differs(descs[ref], d)
		switch {
		case what == "":
		case d.Joined:
			refused = append(refused, r)
		default:
			return 0, nil, fmt.Errorf("%w: rank %d passed %s than rank %d: every rank must pass the same", engine.ErrInvalidArgument, r, what, ref)
		}
	}
	return ref, refused, nil
}

// differs names what of b is not as in a ("" when nothing).
func differs(a, b recoverDesc) string {
	switch {
	case a.Logical != b.Logical || a.M != b.M:
		return fmt.Sprintf("another virtual topology (%d devices, against %d)", b.M, a.M)
	case a.MinRanks != b.MinRanks:
		return fmt.Sprintf("another MinRanks (%d, against %d)", b.MinRanks, a.MinRanks)
	case !slices.Equal(a.Place, b.Place) || (a.Place == nil) != (b.Place == nil):
		return fmt.Sprintf("another Place (%v, against %v)", b.Place, a.Place)
	}
	return ""
}

// checkRecoverPlace checks an explicit placement on the new parent of n
// ranks, of which refused get nothing.
func checkRecoverPlace(place []int, m, n int, refused []int) error {
	if len(place) != m {
		return fmt.Errorf("%w: placement of %d devices for %d virtual devices", engine.ErrInvalidArgument, len(place), m)
	}
	for v, r := range place {
		if r < 0 || r >= n {
			return fmt.Errorf("%w: virtual device %d placed on rank %d of a %d-rank communicator", engine.ErrInvalidArgument, v, r, n)
		}
		if slices.Contains(refused, r) {
			return fmt.Errorf("%w: virtual device %d placed on rank %d, a joining process that was refused", engine.ErrInvalidArgument, v, r)
		}
	}
	return nil
}

// holding is who holds what, read from the descriptions.
type holding struct {
	owner    []int            // device → the rank holding it (-1: lost)
	own      []map[string]int // device → its own buffers (as its owner listed them)
	src      int              // the first rank holding the most advanced shared state
	step     uint64           // and its step
	shared   map[string]int   // that state's buffers
	behind   []int            // hosting ranks a step behind
	template map[string]int   // a lost device's own buffers: those of the lowest live device
}

func holdings(descs []recoverDesc, m int) (*holding, error) {
	h := &holding{owner: make([]int, m), own: make([]map[string]int, m), src: -1}
	for v := range h.owner {
		h.owner[v] = -1
	}
	for r, x := range descs {
		for k, v := range x.Local {
			if v < 0 || v >= m {
				return nil, fmt.Errorf("%w: rank %d hosts device %d of %d", engine.ErrInvalidArgument, r, v, m)
			}
			// A device two ranks claim (a migration that a death cut
			// short after some ranks switched to the new placement)
			// stays with the lower: both hold its state.
			if h.owner[v] < 0 {
				h.owner[v], h.own[v] = r, x.Own[k]
			}
		}
		if len(x.Local) > 0 && (h.src < 0 || x.Step > h.step) {
			h.src, h.step = r, x.Step
		}
	}
	if h.src < 0 {
		return nil, fmt.Errorf("%w: no process left holds any device", ErrStateLost)
	}
	h.shared = descs[h.src].Shared
	for v := range m {
		if h.owner[v] >= 0 {
			h.template = h.own[v]
			break
		}
	}
	for r, x := range descs {
		if len(x.Local) == 0 {
			continue
		}
		if x.Step+1 < h.step {
			return nil, fmt.Errorf("%w: rank %d is at step %d, rank %d at %d: more than one step apart", engine.ErrInvalidArgument, r, x.Step, h.src, h.step)
		}
		if x.Step < h.step {
			h.behind = append(h.behind, r)
		}
		if !equalSizes(x.Shared, h.shared) {
			return nil, fmt.Errorf("%w: rank %d's shared buffers differ from rank %d's", engine.ErrInvalidArgument, r, h.src)
		}
	}
	return h, nil
}

func (h *holding) lost() []int {
	var out []int
	for v, r := range h.owner {
		if r < 0 {
			out = append(out, v)
		}
	}
	return out
}

// needsRebuild: device v's own buffers cannot be copied, since its
// process is gone or a step behind.
func (h *holding) needsRebuild(v int) bool {
	return h.owner[v] < 0 || slices.Contains(h.behind, h.owner[v])
}

// rebuilds lists the own buffers rebuilt on their new host, in device
// then name order.
func (h *holding) rebuilds(place Place) []rebuild {
	var out []rebuild
	for v := range h.owner {
		if !h.needsRebuild(v) {
			continue
		}
		names := h.template
		if h.owner[v] >= 0 {
			names = h.own[v]
		}
		for _, name := range sortedKeys(names) {
			out = append(out, rebuild{Dev: v, Name: name, Size: names[name], Rank: place[v], Kept: h.owner[v] == place[v]})
		}
	}
	return out
}

// transfers lists, in the order both sides post them, the shared state
// sent to each new host without it (or a step behind), then the own
// buffers of live devices that change process.
func (h *holding) transfers(descs []recoverDesc, place Place) []transfer {
	var out []transfer
	names := sortedKeys(h.shared)
	for r, x := range descs {
		first := slices.Index(place, r) // the device the shared state travels with
		if first < 0 || len(x.Local) > 0 && x.Step == h.step {
			continue
		}
		for _, name := range names {
			out = append(out, transfer{Dev: first, Name: name, Size: h.shared[name], From: h.src, To: r, Shared: true})
		}
	}
	for v, r := range h.owner {
		if r < 0 || r == place[v] || h.needsRebuild(v) {
			continue
		}
		for _, name := range sortedKeys(h.own[v]) {
			out = append(out, transfer{Dev: v, Name: name, Size: h.own[v][name], From: r, To: place[v]})
		}
	}
	return out
}

// rebalanceAmong is Rebalance over the n ranks less the refused ones,
// which get no device.
func rebalanceAmong(owner []int, n int, refused []int) Place {
	if len(refused) == 0 {
		return Rebalance(owner, n)
	}
	var ranks []int // index among the eligible → rank
	index := make([]int, n)
	for r := range n {
		index[r] = -1
		if !slices.Contains(refused, r) {
			index[r] = len(ranks)
			ranks = append(ranks, r)
		}
	}
	o := make([]int, len(owner))
	for v, r := range owner {
		o[v] = -1
		if r >= 0 {
			o[v] = index[r] // a refused joiner holds nothing
		}
	}
	place := Rebalance(o, len(ranks))
	for v, i := range place {
		place[v] = ranks[i]
	}
	return place
}

// Rebalance is the placement Recover chooses on n processes when devices
// were on owner (owner[v] a process of the new communicator, or -1 for a
// lost device): each process ends with ⌊M/n⌋ or ⌈M/n⌉ devices, the
// larger share going to the processes that hold most already (lowest
// first); each process keeps its lowest devices up to its share, and the
// rest, lost devices included, fill the processes below their share in
// rank order.
func Rebalance(owner []int, n int) Place {
	m := len(owner)
	count := make([]int, n)
	for _, r := range owner {
		if r >= 0 && r < n {
			count[r]++
		}
	}
	order := make([]int, n)
	for r := range order {
		order[r] = r
	}
	slices.SortStableFunc(order, func(a, b int) int { return count[b] - count[a] })
	share := make([]int, n)
	for i, r := range order {
		share[r] = m / n
		if i < m%n {
			share[r]++
		}
	}
	place := make(Place, m)
	held := make([]int, n)
	var homeless []int
	for v, r := range owner {
		if r >= 0 && r < n && held[r] < share[r] {
			place[v] = r
			held[r]++
		} else {
			homeless = append(homeless, v)
		}
	}
	r := 0
	for _, v := range homeless {
		for held[r] >= share[r] {
			r++
		}
		place[v] = r
		held[r]++
	}
	return place
}

func equalSizes(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
