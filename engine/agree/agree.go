// Package agree decides which members of a communicator go on after some
// of them failed: a crash-stop fault-tolerant agreement on a view (a set of
// members), used by Comm.Shrink.
//
// It is Paxos in which a proposal needs the acknowledgment of every member
// of its view not known to have failed, instead of a majority's: the
// survivors of any number of failures can decide, and the price is that a
// member only wrongly suspected (a stopped process, a slow link) is fenced
// out rather than waited for. A round goes:
//
//  1. The coordinator, the lowest member it does not suspect, sends
//     Prepare(ballot, its suspects) to every member it does not suspect.
//     Each member that has promised no higher ballot adopts those
//     suspicions (it refuses their messages from then on: fencing) and
//     answers Promise(its own suspects, the view it last accepted and
//     with which ballot, or the view it decided).
//  2. The coordinator proposes the view accepted with the highest ballot,
//     or, if none was, every member that neither it nor any member
//     suspects: Propose(ballot, view). Each member of the view acknowledges
//     (Ack) unless it promised a higher ballot (Nack).
//  3. Once every member of the view has acknowledged or is known to have
//     failed, the view is decided: Commit(view) to the view's members.
//
// A member whose coordinator fails (or stays silent past the caller's
// timeout) suspects it and waits for the next lowest; if that is itself,
// it leads a round with a higher ballot. A decided member keeps answering
// (with Commit), so a coordinator that reached only some members before it
// failed leaves the decision to be found by the next. A member refused by
// another (it is suspected there: Excluded), or left out of a proposed or
// decided view, ends with ErrExcluded and decides nothing.
//
// Views travel as differences: a proposal, a commit or a promise names
// the members the view leaves out, against the instance's members (the
// base, which every member of the instance holds: New's list), and every
// message names its base (Base, a digest of that list). A member whose own
// base differs refuses the message (Check), never applying a difference to
// another list; so a ballot costs the coordinator O(members × changes) ids,
// not O(members²).
//
// The package is a deterministic state machine: no goroutines, clocks or
// I/O. The caller delivers messages (Recv) and failures (Down: a peer's
// connection broke, or it stayed silent past a timeout on a peer Waiting
// names) and sends what each call returns, in order, over FIFO links. That
// is what lets the tests run it under every kill schedule.
//
// Safety: two members that decide, decide the same view, provided failures
// are crash-stop and a member suspected by one is refused by every member
// that learns of it (as above). A wrongly suspected member is told it was
// excluded by any member it reaches; if every member it can reach has
// already gone, it cannot tell them from failed ones. A network partition
// is not a crash: each side takes the other for failed and decides its own
// view. SetQuorum closes that: with a quorum above half the members, a
// round goes on only when that many members promised and acknowledged, so
// that any two rounds share a member and Paxos's argument holds whatever
// the failures; the price is that fewer survivors than the quorum decide
// nothing (ErrNoQuorum). SetMajority keeps the closing and lowers the
// price: the quorum is a majority of the members not known dead (Dead: a
// process that ended, as a closed connection or a refused one shows, is
// no side of a partition), so two halves cut apart still cannot both go
// on, while survivors of kills, however many, still can (see
// docs/elastic.md).
package agree

import (
	"errors"
	"fmt"
	"slices"
)

// ErrExcluded: this member was left out of the view (it was suspected of
// having failed): it must not go on with the others.
var ErrExcluded = errors.New("excluded by the surviving members (suspected of having failed)")

// ErrNoQuorum: fewer members than the quorum (SetQuorum) could be reached.
var ErrNoQuorum = errors.New("too few members reachable for a quorum")

// Kind names a message.
type Kind uint8

const (
	Prepare  Kind = 1 + iota // coordinator → member: Ballot, Set = its suspects
	Promise                  // member → coordinator: Ballot, Set = its suspects, Acc/AccBallot
	Propose                  // coordinator → member: Ballot, Set = the members the view leaves out
	Ack                      // member → coordinator: Ballot
	Commit                   // Set = the members the decided view leaves out
	Nack                     // member → coordinator: Ballot = the higher ballot it promised
	Excluded                 // the receiver is suspected by the sender: it is out
	Query                    // member → the coordinator it waits for: answered only once decided
	NoQuorum                 // coordinator → member: its round found no quorum; nothing is decided
)

func (k Kind) String() string {
	if k >= Prepare && k <= NoQuorum {
		return [...]string{"prepare", "promise", "propose", "ack", "commit", "nack", "excluded", "query", "no quorum"}[k-Prepare]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Msg is one message of the protocol. Its lists of members are sorted,
// without repeats, and name members of the instance only (Check).
type Msg struct {
	Kind   Kind
	Ballot uint64
	// Base identifies the members of the instance (BaseOf), against which
	// a view is a difference: a receiver with another refuses the message.
	Base uint64
	// Set: suspects (Prepare, Promise), or a view as the members it leaves
	// out (Propose, Commit).
	Set []int
	// Acc: Promise: the view last accepted, with ballot AccBallot, as the
	// members it leaves out (AccBallot 0: none was, and Acc is empty).
	Acc       []int
	AccBallot uint64
	Dead      []int // the members the sender knows dead (SetMajority), on every message that names suspects or a view
}

// Out is a message to send.
type Out struct {
	To  int
	Msg Msg
}

// Node is one member's state in one agreement.
type Node struct {
	me      int
	members []int  // sorted
	base    uint64 // BaseOf(members)
	susp    map[int]bool

	// Views are kept as the members they leave out (sorted), as they
	// travel.
	promised uint64 // highest ballot promised or accepted
	acc      []int  // view accepted at accB (accB 0: none)
	accB     uint64

	quorum   int          // members a round needs, itself included (0: every live one)
	majority bool         // the quorum is a majority of the members not known dead
	dead     map[int]bool // members known dead: their process ended
	heard    int          // members that answered the current phase, itself included
	done     bool
	view     []int // decided, in full
	viewOut  []int // decided, as the members it leaves out
	err      error
	leader   int // the member whose messages this one waits for (-1: none)
	leading  bool

	// The round this member leads.
	ballot  uint64
	phase   int          // 1: gathering promises, 2: gathering acks
	waiting map[int]bool // members whose answer the phase still needs
	best    []int        // highest accepted view gathered (bestB 0: none)
	bestB   uint64

	// queried: members that asked (Query) before this one decided; they
	// hear the decision as soon as it is made.
	queried map[int]bool

	out []Out
}

// New is member me's state in an agreement among members (me among them),
// starting with the members it already knows failed.
func New(me int, members []int, suspects []int) (*Node, error) {
	ms := slices.Clone(members)
	slices.Sort(ms)
	if len(ms) == 0 || !slices.Contains(ms, me) {
		return nil, fmt.Errorf("agree: member %d not among %v", me, members)
	}
	for i := 1; i < len(ms); i++ {
		if ms[i] == ms[i-1] {
			return nil, fmt.Errorf("agree: member %d listed twice", ms[i])
		}
	}
	n := &Node{me: me, members: ms, base: baseOfSorted(ms), susp: map[int]bool{}, leader: -1}
	for _, s := range suspects {
		if s != me && n.isMember(s) {
			n.susp[s] = true
		}
	}
	return n, nil
}

// BaseOf identifies a list of members (in any order): the base that views
// are differences against. It is never 0, so that a message without one
// is refused.
func BaseOf(members []int) uint64 {
	ms := slices.Clone(members)
	slices.Sort(ms)
	return baseOfSorted(ms)
}

// baseOfSorted chains a 64-bit mixer (MurmurHash3's finalizer) over the
// count and the ids: a digest that tells member lists apart, word by word,
// as cheaply as the list is long. It is no defence against forgery; the
// control mesh authenticates its peers.
func baseOfSorted(ms []int) uint64 {
	h := mix64(uint64(len(ms)) + 0x9e3779b97f4a7c15)
	for _, p := range ms {
		h = mix64(h ^ (uint64(p) + 0x9e3779b97f4a7c15))
	}
	return h | 1
}

func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Base is BaseOf the instance's members.
func (n *Node) Base() uint64 { return n.base }

// isMember: p is a member of the instance.
func (n *Node) isMember(p int) bool {
	_, ok := slices.BinarySearch(n.members, p)
	return ok
}

// leftOut: p is among out, a sorted list of members a view leaves out.
func leftOut(out []int, p int) bool {
	_, ok := slices.BinarySearch(out, p)
	return ok
}

// SetQuorum makes each round need q members (this one included) to
// promise and to acknowledge; call it before Start, with the same q on
// every member. More than half the members: no two views are ever decided,
// even across a network partition.
func (n *Node) SetQuorum(q int) { n.quorum = q }

// SetMajority makes each round need more than half of the members not
// known dead (this one included) to promise and to acknowledge; call it
// before Start, on every member. A member is known dead by Dead or
// SetDead, here or at a member that promised this one's round: that must
// mean its process ended (its connection closed, or nobody listens at its
// address), never only silence, or two sides of a partition could each
// take the other for dead.
func (n *Node) SetMajority() { n.majority = true }

// SetDead records, before Start, the members already known dead (they are
// suspected too).
func (n *Node) SetDead(ps []int) {
	for _, p := range ps {
		if p != n.me && n.isMember(p) {
			n.markDead(p)
			n.susp[p] = true
		}
	}
}

func (n *Node) markDead(p int) {
	if n.dead == nil {
		n.dead = map[int]bool{}
	}
	n.dead[p] = true
}

// Dead tells the member that p's process ended: Down, and p no longer
// counts towards SetMajority's quorum.
func (n *Node) Dead(p int) []Out {
	if p != n.me && n.isMember(p) {
		n.markDead(p)
	}
	return n.Down(p)
}

// need is how many members a round needs, itself included.
func (n *Node) need() int {
	if !n.majority {
		return n.quorum
	}
	return (len(n.members)-len(n.dead))/2 + 1
}

// deadList is n.dead, sorted.
func (n *Node) deadList() []int {
	var d []int
	for p := range n.dead {
		d = append(d, p)
	}
	slices.Sort(d)
	return d
}

// Start begins: the coordinator sends its first messages.
func (n *Node) Start() []Out {
	n.next()
	return n.flush()
}

// Done says whether this member finished: with the decided view, or with
// ErrExcluded.
func (n *Node) Done() bool { return n.done }

// Result is the decided view (sorted), or ErrExcluded.
func (n *Node) Result() ([]int, error) { return slices.Clone(n.view), n.err }

// Suspects are the members this one counts as failed, sorted.
func (n *Node) Suspects() []int {
	var s []int
	for p := range n.susp {
		s = append(s, p)
	}
	slices.Sort(s)
	return s
}

// Waiting lists the members whose silence should end in Down after the
// caller's timeout: those a coordinator awaits an answer from, or a
// member's coordinator. None once done.
func (n *Node) Waiting() []int {
	if n.done {
		return nil
	}
	if n.leading {
		var w []int
		for p := range n.waiting {
			w = append(w, p)
		}
		slices.Sort(w)
		return w
	}
	if n.leader >= 0 {
		return []int{n.leader}
	}
	return nil
}

// Leading says whether this member coordinates a round now.
func (n *Node) Leading() bool { return n.leading && !n.done }

// Down tells the member that p failed: its connection broke, or it was
// silent past the timeout. p is fenced from then on.
func (n *Node) Down(p int) []Out {
	if p == n.me || !n.isMember(p) || n.susp[p] {
		return nil
	}
	n.susp[p] = true
	if n.done {
		// Members that did not hear the decision wait for the next
		// coordinator: if that is this member, it tells them.
		if n.err == nil && n.coordinator() == n.me {
			for _, q := range n.view {
				if q != n.me && !n.susp[q] {
					n.send(q, Msg{Kind: Commit, Set: slices.Clone(n.viewOut)})
				}
			}
		}
		return n.flush()
	}
	if n.leading {
		if n.waiting[p] {
			delete(n.waiting, p)
			n.advance()
		}
		return n.flush()
	}
	if p == n.leader {
		n.leader = -1
	}
	n.next()
	return n.flush()
}

// Check says why this member refuses m from member from, if it does: a
// sender that is not another member, another base (the sender's members
// differ: a difference against them would mean other members here), an
// unknown kind, a list that is not sorted or names a non-member, or an
// accepted view without its ballot. Recv drops such a message unanswered,
// as if it were lost; callers check first to report it.
func (n *Node) Check(from int, m Msg) error {
	if from == n.me || !n.isMember(from) {
		return fmt.Errorf("agree: member %d: a message from %d, not another member", n.me, from)
	}
	if m.Base != n.base {
		return fmt.Errorf("agree: member %d: %v from %d is against base %#x, this member's is %#x (%d members): the two hold different member lists", n.me, m.Kind, from, m.Base, n.base, len(n.members))
	}
	if m.Kind < Prepare || m.Kind > NoQuorum {
		return fmt.Errorf("agree: member %d: a message of unknown %v from %d", n.me, m.Kind, from)
	}
	if m.AccBallot == 0 && len(m.Acc) > 0 {
		return fmt.Errorf("agree: member %d: %v from %d names an accepted view without its ballot", n.me, m.Kind, from)
	}
	for _, l := range []struct {
		name string
		ids  []int
	}{{"set", m.Set}, {"accepted view", m.Acc}, {"dead", m.Dead}} {
		for i, p := range l.ids {
			if i > 0 && p <= l.ids[i-1] || !n.isMember(p) {
				return fmt.Errorf("agree: member %d: %v from %d: its %s list is not sorted members of the instance (entry %d: %d)", n.me, m.Kind, from, l.name, i, p)
			}
		}
	}
	return nil
}

// Recv handles a message from member from; one that Check refuses is
// dropped.
func (n *Node) Recv(from int, m Msg) []Out {
	if n.Check(from, m) != nil {
		return nil
	}
	for _, d := range m.Dead {
		if d != n.me {
			n.markDead(d)
		}
	}
	if n.done {
		n.answerDone(from, m)
		return n.flush()
	}
	if n.susp[from] {
		// Fenced: a member that failed for this one must not take part,
		// and is told so when it asks. A decision is a fact, though, and
		// cannot differ from the one this member would reach.
		switch m.Kind {
		case Prepare, Propose:
			n.send(from, Msg{Kind: Excluded})
		case Commit:
			n.decide(m.Set)
		}
		return n.flush()
	}
	switch m.Kind {
	case Prepare:
		n.onPrepare(from, m)
	case Propose:
		n.onPropose(from, m)
	case Commit:
		n.decide(m.Set)
	case Excluded:
		n.exclude()
	case NoQuorum:
		if from == n.leader || n.leader < 0 {
			n.done, n.err = true, ErrNoQuorum
		}
	case Query:
		// Answered once decided: a member that decides by a Commit may
		// not learn that its coordinator failed, and the asker would
		// otherwise wait for its timeout on this live member.
		if n.queried == nil {
			n.queried = map[int]bool{}
		}
		n.queried[from] = true
	case Nack:
		n.onNack(m)
	case Promise:
		n.onPromise(from, m)
	case Ack:
		if !n.leading || n.phase != 2 || m.Ballot != n.ballot || !n.waiting[from] {
			break
		}
		delete(n.waiting, from)
		n.heard++
		n.advance()
	}
	return n.flush()
}

// onPrepare: a coordinator's first phase, as a member.
func (n *Node) onPrepare(from int, m Msg) {
	if m.Ballot < n.promised {
		n.send(from, Msg{Kind: Nack, Ballot: n.promised})
		return
	}
	if leftOut(m.Set, n.me) {
		n.exclude()
		return
	}
	n.follow(from, m.Ballot)
	n.suspectAll(m.Set)
	n.send(from, Msg{Kind: Promise, Ballot: m.Ballot, Set: n.Suspects(), Acc: slices.Clone(n.acc), AccBallot: n.accB})
}

// onPropose: a coordinator's second phase, as a member.
func (n *Node) onPropose(from int, m Msg) {
	if m.Ballot < n.promised {
		n.send(from, Msg{Kind: Nack, Ballot: n.promised})
		return
	}
	if leftOut(m.Set, n.me) {
		n.exclude()
		return
	}
	n.follow(from, m.Ballot)
	n.acc, n.accB = slices.Clone(m.Set), m.Ballot
	n.fenceOutside(m.Set)
	n.send(from, Msg{Kind: Ack, Ballot: m.Ballot})
}

// onNack: a member promised a higher ballot than the one this member
// leads.
func (n *Node) onNack(m Msg) {
	if !n.leading || m.Ballot <= n.ballot {
		return
	}
	// A member follows a coordinator with a higher ballot (it suspected
	// this one): wait for that one's messages.
	n.leading = false
	n.promised = max(n.promised, m.Ballot)
	n.leader = int(m.Ballot & 0xffffffff)
	if n.susp[n.leader] {
		n.leader = -1
		n.next()
	}
}

// onPromise: a member's answer to this coordinator's first phase.
func (n *Node) onPromise(from int, m Msg) {
	if !n.leading || n.phase != 1 || m.Ballot != n.ballot || !n.waiting[from] {
		return
	}
	delete(n.waiting, from)
	n.heard++
	n.suspectAll(m.Set)
	if m.AccBallot > n.bestB {
		n.best, n.bestB = slices.Clone(m.Acc), m.AccBallot
	}
	// Suspicions gathered from this answer may make others unneeded. The
	// round waits on no member suspected before (Down drops them), so
	// only those this answer names need a look: a walk over every member
	// waited for would cost the coordinator N per promise.
	for _, p := range m.Set {
		if n.susp[p] {
			delete(n.waiting, p)
		}
	}
	n.advance()
}

// suspectAll adopts another member's suspicions.
func (n *Node) suspectAll(set []int) {
	for _, s := range set {
		if s != n.me && n.isMember(s) {
			n.susp[s] = true
		}
	}
}

// answerDone answers a member after this one finished: with the decision,
// or by saying it is out.
func (n *Node) answerDone(from int, m Msg) {
	switch m.Kind {
	case Commit, Excluded, Nack, NoQuorum:
		return
	}
	switch {
	case errors.Is(n.err, ErrNoQuorum):
		n.send(from, Msg{Kind: NoQuorum})
	case n.err != nil:
		// Excluded itself: it may say nothing about the view.
	case n.susp[from] || leftOut(n.viewOut, from):
		n.send(from, Msg{Kind: Excluded})
	default:
		n.send(from, Msg{Kind: Commit, Set: slices.Clone(n.viewOut)})
	}
}

// follow makes this member a follower of from's ballot b.
func (n *Node) follow(from int, b uint64) {
	n.promised = b
	n.leader = from
	n.leading = false
}

// fenceOutside suspects the members a view leaves out (out).
func (n *Node) fenceOutside(out []int) {
	for _, p := range out {
		if p != n.me {
			n.susp[p] = true
		}
	}
}

// coordinator is the lowest member this one does not suspect.
func (n *Node) coordinator() int {
	for _, p := range n.members {
		if !n.susp[p] {
			return p
		}
	}
	return n.me
}

// next leads a round if this member is now the coordinator, else waits for
// the coordinator.
func (n *Node) next() {
	if n.done || n.leading {
		return
	}
	c := n.coordinator()
	if c != n.me {
		if n.leader < 0 || n.susp[n.leader] {
			// It may have decided already (and then sends nothing more
			// unprompted): ask.
			n.leader = c
			n.send(c, Msg{Kind: Query})
		}
		return
	}
	n.leader = -1
	n.leading = true
	round := n.promised>>32 + 1
	n.ballot = round<<32 | uint64(n.me)
	n.promised = n.ballot
	n.phase, n.heard = 1, 1
	n.best, n.bestB = slices.Clone(n.acc), n.accB
	n.waiting = map[int]bool{}
	for _, p := range n.members {
		if p != n.me && !n.susp[p] {
			n.waiting[p] = true
		}
	}
	susp := n.Suspects()
	for _, p := range n.members {
		if n.waiting[p] {
			n.send(p, Msg{Kind: Prepare, Ballot: n.ballot, Set: susp})
		}
	}
	n.advance()
}

// advance moves the round on once its phase heard from every member it
// needs.
func (n *Node) advance() {
	if !n.leading || n.done || len(n.waiting) > 0 {
		return
	}
	if n.heard < n.need() {
		// Nothing can be decided on this side: say so to the members
		// still here, who would otherwise each wait out a timeout on
		// their coordinator in turn.
		n.done, n.err, n.leading = true, ErrNoQuorum, false
		for _, p := range n.members {
			if p != n.me && !n.susp[p] {
				n.send(p, Msg{Kind: NoQuorum})
			}
		}
		return
	}
	if n.phase == 1 {
		// The view: the highest accepted one, else every member that
		// neither this one nor any member suspects.
		out := n.best
		if n.bestB == 0 {
			out = n.Suspects()
		}
		if leftOut(out, n.me) {
			n.exclude()
			return
		}
		n.phase, n.heard = 2, 1
		n.acc, n.accB = slices.Clone(out), n.ballot
		n.fenceOutside(out)
		for _, p := range n.members {
			if p != n.me && !n.susp[p] {
				n.waiting[p] = true
				n.send(p, Msg{Kind: Propose, Ballot: n.ballot, Set: slices.Clone(out)})
			}
		}
		n.advance()
		return
	}
	n.decide(n.acc)
}

// decide ends with the view that leaves out out (sorted); a coordinator
// tells its members.
func (n *Node) decide(out []int) {
	if n.done {
		return
	}
	if leftOut(out, n.me) {
		n.exclude()
		return
	}
	n.done, n.viewOut = true, slices.Clone(out)
	n.view = make([]int, 0, len(n.members)-len(out))
	k := 0 // both sorted: a merge, linear
	for _, p := range n.members {
		for k < len(out) && out[k] < p {
			k++
		}
		if k == len(out) || out[k] != p {
			n.view = append(n.view, p)
		}
	}
	n.fenceOutside(out)
	told := n.leading // a coordinator tells every member of the view
	if told {
		for _, p := range n.view {
			if p != n.me {
				n.send(p, Msg{Kind: Commit, Set: slices.Clone(out)})
			}
		}
	}
	n.leading = false
	for _, p := range n.members {
		if n.queried[p] && !(told && !leftOut(out, p)) {
			n.answerDone(p, Msg{Kind: Query})
		}
	}
	n.queried = nil
}

func (n *Node) exclude() {
	if n.done {
		return
	}
	n.done, n.err, n.leading = true, ErrExcluded, false
}

func (n *Node) send(to int, m Msg) {
	m.Base = n.base
	switch m.Kind {
	case Prepare, Promise, Propose, Commit:
		// Deaths travel with suspicions and views: a member that suspects
		// p because another did must also know whether p is dead, or it
		// would count p in its quorum and find none where the other does.
		if len(n.dead) > 0 {
			m.Dead = n.deadList()
		}
	}
	n.out = append(n.out, Out{To: to, Msg: m})
}

func (n *Node) flush() []Out {
	o := n.out
	n.out = nil
	return o
}
