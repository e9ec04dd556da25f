package agree

import (
	"slices"
	"strings"
	"testing"
)

// TestDeltaBaseMismatch: a view travels as the members it leaves out, so
// the same difference against another member list is another view. A
// member whose list differs from the sender's refuses the message (Check
// names both bases) and Recv drops it unanswered, changing nothing; so
// does a message without a base.
func TestDeltaBaseMismatch(t *testing.T) {
	four, err := New(0, members(4), nil)
	if err != nil {
		t.Fatal(err)
	}
	three, err := New(1, members(3), nil)
	if err != nil {
		t.Fatal(err)
	}
	if four.Base() == three.Base() || four.Base() != BaseOf([]int{3, 1, 0, 2}) {
		t.Fatalf("bases %#x and %#x; BaseOf in another order %#x", four.Base(), three.Base(), BaseOf([]int{3, 1, 0, 2}))
	}
	var prep Msg
	for _, o := range four.Start() {
		if o.To == 1 {
			prep = o.Msg
		}
	}
	if prep.Kind != Prepare || prep.Base != four.Base() {
		t.Fatalf("coordinator sent %+v to 1", prep)
	}
	for _, m := range []Msg{prep, {Kind: Commit, Base: four.Base(), Set: []int{2}}, {Kind: Commit, Set: []int{2}}} {
		err := three.Check(0, m)
		if err == nil || !strings.Contains(err.Error(), "base") {
			t.Errorf("%+v against another base: Check says %v", m, err)
		}
		if outs := three.Recv(0, m); outs != nil || three.Done() || len(three.Suspects()) > 0 {
			t.Errorf("%+v against another base: answered %v, done %v, suspects %v", m, outs, three.Done(), three.Suspects())
		}
	}
	// The same Commit against its own base is decided.
	if outs := three.Recv(0, Msg{Kind: Commit, Base: three.Base(), Set: []int{2}}); len(outs) != 0 {
		t.Fatalf("a member deciding by a commit sent %v", outs)
	}
	if v, err := three.Result(); !three.Done() || err != nil || !slices.Equal(v, []int{0, 1}) {
		t.Fatalf("decided %v, %v (done %v); want [0 1]", v, err, three.Done())
	}
}

// TestDeltaMalformed: lists out of order, repeated, or naming a
// non-member, an accepted view without its ballot, an unknown kind, a
// sender that is not another member: refused, and nothing changes.
func TestDeltaMalformed(t *testing.T) {
	n, err := New(1, members(5), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := n.Base()
	for _, c := range []struct {
		from int
		m    Msg
	}{
		{0, Msg{Kind: Commit, Base: b, Set: []int{3, 2}}},
		{0, Msg{Kind: Commit, Base: b, Set: []int{2, 2}}},
		{0, Msg{Kind: Commit, Base: b, Set: []int{5}}},
		{0, Msg{Kind: Propose, Ballot: 1 << 32, Base: b, Set: []int{-1}}},
		{0, Msg{Kind: Prepare, Ballot: 1 << 32, Base: b, Dead: []int{4, 3}}},
		{0, Msg{Kind: Promise, Ballot: 1 << 32, Base: b, Acc: []int{2}}},
		{0, Msg{Kind: 0, Base: b}},
		{0, Msg{Kind: NoQuorum + 1, Base: b}},
		{1, Msg{Kind: Commit, Base: b}},
		{7, Msg{Kind: Commit, Base: b}},
	} {
		if err := n.Check(c.from, c.m); err == nil {
			t.Errorf("from %d, %+v: accepted", c.from, c.m)
		}
		if outs := n.Recv(c.from, c.m); outs != nil || n.Done() || len(n.Suspects()) > 0 {
			t.Errorf("from %d, %+v: answered %v, done %v, suspects %v", c.from, c.m, outs, n.Done(), n.Suspects())
		}
	}
}
