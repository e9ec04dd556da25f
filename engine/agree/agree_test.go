package agree

import (
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// event is a message, or (down) the end of the link after its sender
// crashed or was given up on: what a broken connection or a timeout tells
// the receiver, after everything the sender sent before.
type event struct {
	from, to int
	msg      Msg
	down     bool
	dead     bool // down because its process ended (a crash), not a cut
}

// sim runs n nodes over FIFO links in one deterministic order. Crashes are
// decided by choose, asked before each message a node sends (and once per
// node before it starts): true crashes it there, so a coordinator can die
// after telling only some members.
type sim struct {
	n       int
	nodes   []*Node
	alive   []bool
	paused  []bool // stopped: receives nothing, sends nothing (until resumed)
	held    []event
	queue   []event
	order   int        // 0: global FIFO; 1: the highest (to, from) link first; 2: random (rng)
	rng     *rand.Rand // order 2
	choose  func(node int) bool
	cut     func(from, to int) bool // a partition: messages across are lost
	crashes int
	steps   int
	trace   []string
}

func newSim(t *testing.T, n int, choose func(int) bool) *sim { return newSimQ(t, n, 0, choose) }

func newSimQ(t *testing.T, n, quorum int, choose func(int) bool) *sim {
	s := &sim{n: n, alive: make([]bool, n), paused: make([]bool, n), choose: choose}
	members := make([]int, n)
	for i := range members {
		members[i] = i
	}
	for i := 0; i < n; i++ {
		nd, err := New(i, members, nil)
		if err != nil {
			t.Fatal(err)
		}
		if quorum < 0 {
			nd.SetMajority()
		} else {
			nd.SetQuorum(quorum)
		}
		s.nodes = append(s.nodes, nd)
		s.alive[i] = true
	}
	return s
}

func (s *sim) crash(i int) {
	s.alive[i] = false
	s.crashes++
	s.trace = append(s.trace, fmt.Sprintf("crash %d", i))
	for j := 0; j < s.n; j++ {
		if j != i {
			s.queue = append(s.queue, event{from: i, to: j, down: true, dead: true})
		}
	}
}

// emit sends a node's messages until a crash decision stops it.
func (s *sim) emit(from int, outs []Out) {
	for _, o := range outs {
		if !s.alive[from] {
			return
		}
		if s.choose(from) {
			s.crash(from)
			return
		}
		s.trace = append(s.trace, fmt.Sprintf("%d→%d %v b=%x %v acc=%v", from, o.To, o.Msg.Kind, o.Msg.Ballot, o.Msg.Set, o.Msg.Acc))
		s.queue = append(s.queue, event{from: from, to: o.To, msg: o.Msg})
	}
}

// pick is the index of the next event to deliver: per-link FIFO always.
func (s *sim) pick() int {
	switch s.order {
	case 0:
		return 0
	case 1:
		best := 0
		for i, e := range s.queue {
			b := s.queue[best]
			if e.to > b.to || (e.to == b.to && e.from > b.from) {
				best = i
			}
		}
		return s.firstOfLink(best)
	default:
		return s.firstOfLink(s.rng.Intn(len(s.queue)))
	}
}

func (s *sim) firstOfLink(i int) int {
	for j := 0; j < i; j++ {
		if s.queue[j].from == s.queue[i].from && s.queue[j].to == s.queue[i].to {
			return j
		}
	}
	return i
}

func (s *sim) run(t *testing.T) {
	for i := 0; i < s.n; i++ {
		if s.choose(i) {
			s.crash(i)
		}
	}
	for i := 0; i < s.n; i++ {
		if s.alive[i] {
			s.emit(i, s.nodes[i].Start())
		}
	}
	s.drain(t)
}

func (s *sim) drain(t *testing.T) {
	for len(s.queue) > 0 {
		s.steps++
		if s.steps > 100000 {
			t.Fatalf("no end after %d deliveries:\n%s", s.steps, s.dump())
		}
		i := s.pick()
		e := s.queue[i]
		s.queue = slices.Delete(s.queue, i, i+1)
		if !s.alive[e.to] || (s.cut != nil && !e.down && s.cut(e.from, e.to)) {
			continue
		}
		if s.paused[e.to] || (s.paused[e.from] && !e.down) {
			s.held = append(s.held, e)
			continue
		}
		if e.down && e.dead {
			s.emit(e.to, s.nodes[e.to].Dead(e.from))
		} else if e.down {
			s.emit(e.to, s.nodes[e.to].Down(e.from))
		} else {
			s.emit(e.to, s.nodes[e.to].Recv(e.from, e.msg))
		}
	}
}

func (s *sim) dump() string {
	out := ""
	for _, l := range s.trace {
		out += l + "\n"
	}
	for i, nd := range s.nodes {
		v, err := nd.Result()
		out += fmt.Sprintf("node %d alive=%v done=%v view=%v err=%v susp=%v\n", i, s.alive[i], nd.Done(), v, err, nd.Suspects())
	}
	return out
}

// check asserts the invariants after a run with crashes only: every
// survivor decided (nobody was wrongly suspected, so nobody is excluded),
// all the same view, holding every survivor; and every node that decided
// before it crashed decided that view too (uniform agreement).
func (s *sim) check(t *testing.T, what string) {
	t.Helper()
	var want []int
	for i, nd := range s.nodes {
		if !nd.Done() {
			if s.alive[i] {
				t.Fatalf("%s: survivor %d never decided\n%s", what, i, s.dump())
			}
			continue
		}
		v, err := nd.Result()
		if err != nil {
			if s.alive[i] {
				t.Fatalf("%s: survivor %d excluded without being suspected: %v\n%s", what, i, err, s.dump())
			}
			continue
		}
		if want == nil {
			want = v
		} else if !slices.Equal(v, want) {
			t.Fatalf("%s: node %d decided %v, another %v\n%s", what, i, v, want, s.dump())
		}
	}
	for i := range s.nodes {
		if s.alive[i] && !slices.Contains(want, i) {
			t.Fatalf("%s: survivor %d not in the view %v\n%s", what, i, want, s.dump())
		}
	}
}

// explorer enumerates crash schedules depth first: a schedule is the list
// of answers to choose; a run replays a prefix and answers false beyond
// it, noting each point where true was possible.
type explorer struct {
	prefix  []bool
	pos     int
	options []bool // at each point of the last run: could it have crashed
}

func (x *explorer) choose(limit int, crashes *int) func(int) bool {
	return func(int) bool {
		var c bool
		if x.pos < len(x.prefix) {
			c = x.prefix[x.pos]
		}
		x.options = append(x.options, *crashes < limit)
		x.pos++
		return c
	}
}

// next moves to the next schedule; false when all were run.
func (x *explorer) next() bool {
	full := append(x.prefix[:0:0], x.prefix...)
	for len(full) < len(x.options) {
		full = append(full, false)
	}
	for i := len(full) - 1; i >= 0; i-- {
		if !full[i] && x.options[i] {
			x.prefix = append(full[:i:i], true)
			x.pos, x.options = 0, nil
			return true
		}
	}
	return false
}

// TestEveryKillSchedule runs 5 members under every crash schedule of at
// most 4 crashes (each member crashing or not before it starts and before
// each message it sends, the coordinator included, after any subset of its
// broadcast), in four delivery orders (two random ones, seeded), and checks agreement, termination
// and validity after each.
func TestEveryKillSchedule(t *testing.T) {
	n, limit := 5, 4
	if testing.Short() {
		limit = 2
	}
	everySchedule(t, n, limit, 0, 4)
}

// TestEveryKillScheduleMajority is TestEveryKillSchedule with a majority
// quorum (3 of 5) and up to 2 crashes, which leave a quorum: every
// survivor still decides, all the same view.
func TestEveryKillScheduleMajority(t *testing.T) {
	everySchedule(t, 5, 2, 3, 2)
}

// TestEveryKillScheduleDeadMajority is TestEveryKillSchedule with the
// quorum a majority of the members not known dead (SetMajority): crashes
// are deaths (connections close), so any number of them still leaves the
// survivors a quorum, and every survivor decides, all the same view.
func TestEveryKillScheduleDeadMajority(t *testing.T) {
	n, limit := 5, 4
	if testing.Short() {
		limit = 2
	}
	everySchedule(t, n, limit, -1, 4)
}

// everySchedule: quorum 0 is every live member, -1 SetMajority.
func everySchedule(t *testing.T, n, limit, quorum, orders int) {
	for order := 0; order < orders; order++ {
		x := &explorer{}
		runs := 0
		for {
			var s *sim
			crashes := 0
			choose := x.choose(limit, &crashes)
			s = newSimQ(t, n, quorum, func(i int) bool {
				c := choose(i)
				if c {
					crashes++
				}
				return c
			})
			s.order = order
			s.rng = rand.New(rand.NewSource(int64(order))) // the same every run: replays must repeat
			s.run(t)
			runs++
			s.check(t, fmt.Sprintf("order %d run %d schedule %v", order, runs, x.prefix))
			if !x.next() {
				break
			}
		}
		t.Logf("order %d: %d schedules", order, runs)
		if runs < 1000 && !testing.Short() && limit >= 4 {
			t.Fatalf("only %d schedules: the enumeration is broken", runs)
		}
	}
}

// TestStoppedMember pauses one member (its messages held, as a SIGSTOPped
// process's), lets the others give up on it, then resumes it: the others
// decide a view without it, and it ends excluded, never with another view.
func TestStoppedMember(t *testing.T) {
	for stopped := 0; stopped < 5; stopped++ {
		for after := 0; after < 13; after++ { // a coordinator sends 12: prepares, proposals, commits
			name := fmt.Sprintf("member %d stopped after %d sends", stopped, after)
			sent := 0
			var s *sim
			s = newSim(t, 5, func(i int) bool {
				if i == stopped && !s.paused[i] {
					if sent == after {
						s.paused[i] = true
						s.trace = append(s.trace, fmt.Sprintf("stop %d", i))
					}
					sent++
				}
				return false
			})
			s.run(t)
			// Everyone else times out on it (Down), decides, and the
			// member resumes.
			for j := 0; j < 5; j++ {
				if j != stopped && s.paused[stopped] {
					s.queue = append(s.queue, event{from: stopped, to: j, down: true})
				}
			}
			s.drain(t)
			s.paused[stopped] = false
			s.queue = append(s.queue, s.held...)
			s.held = nil
			s.drain(t)
			// A resumed member may still wait for a coordinator that
			// finished long ago: its timeout fires.
			for k := 0; k < 5 && !s.nodes[stopped].Done(); k++ {
				for _, p := range s.nodes[stopped].Waiting() {
					s.queue = append(s.queue, event{from: p, to: stopped, down: true})
				}
				s.drain(t)
			}
			var want []int
			for i, nd := range s.nodes {
				if !nd.Done() {
					t.Fatalf("%s: node %d not done\n%s", name, i, s.dump())
				}
				v, err := nd.Result()
				if err != nil {
					if i != stopped {
						t.Fatalf("%s: node %d excluded\n%s", name, i, s.dump())
					}
					continue
				}
				if want == nil {
					want = v
				} else if !slices.Equal(v, want) {
					t.Fatalf("%s: views %v and %v\n%s", name, v, want, s.dump())
				}
			}
			if len(want) < 4 {
				t.Fatalf("%s: view %v lost a running member\n%s", name, want, s.dump())
			}
		}
	}
}

func TestNewBadInput(t *testing.T) {
	if _, err := New(3, []int{0, 1, 2}, nil); err == nil {
		t.Fatal("a member outside the list was accepted")
	}
	if _, err := New(1, []int{0, 1, 1}, nil); err == nil {
		t.Fatal("a duplicate member was accepted")
	}
	nd, err := New(0, []int{0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	nd.Start()
	if v, err := nd.Result(); err != nil || !slices.Equal(v, []int{0}) {
		t.Fatalf("a lone member decided %v, %v", v, err)
	}
}

// partitioned runs n members cut into the groups side(i) says, each side
// taking the other for failed (its messages lost, its links down), timing
// out on whoever it waits for until nothing changes; it returns the views
// decided and the members that ended with ErrNoQuorum.
func partitioned(t *testing.T, n, quorum int, side func(int) int) (views map[string][]int, noQuorum int) {
	s := newSimQ(t, n, quorum, func(int) bool { return false })
	s.cut = func(a, b int) bool { return side(a) != side(b) }
	for a := 0; a < n; a++ {
		for b := 0; b < n; b++ {
			if side(a) != side(b) {
				s.queue = append(s.queue, event{from: a, to: b, down: true})
			}
		}
	}
	s.run(t)
	for k := 0; k < 3*n; k++ {
		for i, nd := range s.nodes {
			for _, p := range nd.Waiting() {
				s.queue = append(s.queue, event{from: p, to: i, down: true})
			}
		}
		s.drain(t)
	}
	views = map[string][]int{}
	for i, nd := range s.nodes {
		if !nd.Done() {
			t.Fatalf("member %d never finished\n%s", i, s.dump())
		}
		v, err := nd.Result()
		switch {
		case errors.Is(err, ErrNoQuorum):
			noQuorum++
		case err != nil:
			t.Fatalf("member %d: %v", i, err)
		default:
			views[fmt.Sprint(v)] = v
		}
	}
	return views, noQuorum
}

// TestPartition: without a quorum each side of a network partition decides
// its own view (what the majority quorum is for); with a majority quorum
// only a side holding a majority decides, and a tie decides nothing.
func TestPartition(t *testing.T) {
	twoThree := func(i int) int { return btoi(i >= 2) }
	if views, _ := partitioned(t, 5, 0, twoThree); len(views) != 2 {
		t.Fatalf("without a quorum: views %v, want one per side", views)
	}
	views, noQ := partitioned(t, 5, 3, twoThree)
	if len(views) != 1 || views["[2 3 4]"] == nil || noQ != 2 {
		t.Fatalf("majority of 5, sides 2|3: views %v, %d without quorum", views, noQ)
	}
	views, noQ = partitioned(t, 4, 3, twoThree)
	if len(views) != 0 || noQ != 4 {
		t.Fatalf("majority of 4, sides 2|2: views %v, %d without quorum", views, noQ)
	}
	// SetMajority: a cut is silence, not death, so it counts every member.
	views, noQ = partitioned(t, 5, -1, twoThree)
	if len(views) != 1 || views["[2 3 4]"] == nil || noQ != 2 {
		t.Fatalf("majority of the living, 5, sides 2|3: views %v, %d without quorum", views, noQ)
	}
	views, noQ = partitioned(t, 4, -1, twoThree)
	if len(views) != 0 || noQ != 4 {
		t.Fatalf("majority of the living, 4, sides 2|2: views %v, %d without quorum", views, noQ)
	}
}

// TestTwoOfFourKilled: a 4-member job that loses two members to kills
// (their connections close) still goes on under SetMajority, where a
// plain majority of 4 would need 3; with the two only silent (a possible
// partition, 2|2) it does not.
func TestTwoOfFourKilled(t *testing.T) {
	for _, silent := range []bool{false, true} {
		s := newSimQ(t, 4, -1, func(int) bool { return false })
		s.alive[0], s.alive[3] = false, false
		for _, j := range []int{1, 2} {
			s.queue = append(s.queue, event{from: 0, to: j, down: true, dead: !silent}, event{from: 3, to: j, down: true, dead: !silent})
		}
		for i := 1; i <= 2; i++ {
			s.emit(i, s.nodes[i].Start())
		}
		s.drain(t)
		for i := 1; i <= 2; i++ {
			v, err := s.nodes[i].Result()
			switch {
			case !s.nodes[i].Done():
				t.Fatalf("silent=%v: member %d never finished\n%s", silent, i, s.dump())
			case silent && !errors.Is(err, ErrNoQuorum):
				t.Errorf("silent=%v: member %d: %v %v, want no quorum", silent, i, v, err)
			case !silent && (err != nil || !slices.Equal(v, []int{1, 2})):
				t.Errorf("silent=%v: member %d: %v %v, want [1 2]", silent, i, v, err)
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
