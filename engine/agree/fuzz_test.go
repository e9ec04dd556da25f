package agree

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzRecv: an agreement message as the control mesh decodes it (JSON,
// engine/internal/recovery), from any sender, to a member in each state a
// round passes through. What Check refuses (another base, a list not
// sorted or naming a non-member, an unknown kind) changes nothing and is
// not answered; nothing it lets through panics, sends a message Check
// would refuse, or ends in a view that leaves the member out or names a
// non-member.
func FuzzRecv(f *testing.F) {
	base := BaseOf(members(5))
	for _, m := range []Msg{
		{Kind: Prepare, Ballot: 2<<32 | 1, Base: base, Set: []int{0}},
		{Kind: Promise, Ballot: 1 << 32, Base: base, Set: []int{4}, Acc: []int{4}, AccBallot: 1 << 32},
		{Kind: Propose, Ballot: 1 << 32, Base: base, Set: []int{3}, Dead: []int{3}},
		{Kind: Propose, Ballot: 1 << 32, Base: base, Set: []int{1, 2}},
		{Kind: Ack, Ballot: 1 << 32, Base: base},
		{Kind: Commit, Base: base, Set: []int{2, 4}},
		{Kind: Commit, Base: base ^ 2, Set: []int{4}},
		{Kind: Nack, Ballot: 3<<32 | 2, Base: base},
		{Kind: Query, Base: base},
		{Kind: Excluded, Base: base},
		{Kind: NoQuorum, Base: base},
	} {
		b, err := json.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		for state := range uint8(5) {
			f.Add(b, state, uint8(1))
		}
	}
	f.Add([]byte(`{"Kind":5,"Base":1,"Set":[3,1]}`), uint8(4), uint8(2))
	f.Add([]byte(`{"Kind":3,"Set":[9],"Acc":[1],"AccBallot":0}`), uint8(1), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, state, from uint8) {
		var m Msg
		if json.Unmarshal(data, &m) != nil {
			return
		}
		if m.Base == 1 {
			m.Base = base // let the fuzzer reach past the base check
		}
		n := fuzzNode(t, int(state%5))
		sender := int(from%8) - 1 // -1 and 5, 6: not members
		susp, done := n.Suspects(), n.Done()
		err := n.Check(sender, m)
		outs := n.Recv(sender, m)
		if err != nil {
			if outs != nil || n.Done() != done || !slices.Equal(susp, n.Suspects()) {
				t.Fatalf("refused (%v), yet it answered %v or changed: done %v→%v, suspects %v→%v", err, outs, done, n.Done(), susp, n.Suspects())
			}
			return
		}
		for _, o := range outs {
			if o.To < 0 || o.To >= 5 || o.To == n.me {
				t.Fatalf("sent to %d: %+v", o.To, o.Msg)
			}
			if err := fuzzMember(t, o.To).Check(n.me, o.Msg); err != nil {
				t.Fatalf("sent what the receiver refuses: %v", err)
			}
		}
		if v, err := n.Result(); n.Done() && err == nil {
			if !slices.Contains(v, n.me) || !slices.IsSorted(v) || len(v) == 0 || v[0] < 0 || v[len(v)-1] > 4 {
				t.Fatalf("member %d decided %v", n.me, v)
			}
		}
	})
}

// fuzzNode is one of five members 0..4 (member 4 dead, SetMajority), by
// state: 0 member 1 before Start; 1 member 1 waiting on its coordinator;
// 2 coordinator 0 gathering promises; 3 coordinator 0 gathering acks; 4
// member 1 decided.
func fuzzNode(t *testing.T, state int) *Node {
	nodes := make([]*Node, 5)
	for i := range nodes {
		nodes[i] = fuzzMember(t, i)
	}
	to := func(outs []Out, dst int, k Kind) Msg {
		for _, o := range outs {
			if o.To == dst && o.Msg.Kind == k {
				return o.Msg
			}
		}
		t.Fatalf("no %v to %d in %v", k, dst, outs)
		return Msg{}
	}
	switch state {
	case 0:
		return nodes[1]
	case 1:
		nodes[1].Start()
		return nodes[1]
	}
	prep := nodes[0].Start()
	if state == 2 {
		return nodes[0]
	}
	var props []Out
	for i := 1; i <= 3; i++ {
		props = nodes[0].Recv(i, to(nodes[i].Recv(0, to(prep, i, Prepare)), 0, Promise))
	}
	if state == 3 {
		return nodes[0]
	}
	var commits []Out
	for i := 1; i <= 3; i++ {
		commits = nodes[0].Recv(i, to(nodes[i].Recv(0, to(props, i, Propose)), 0, Ack))
	}
	nodes[1].Recv(0, to(commits, 1, Commit))
	if !nodes[1].Done() {
		t.Fatal("member 1 did not decide")
	}
	return nodes[1]
}

// fuzzMember is member i of fuzzNode's five, fresh.
func fuzzMember(t *testing.T, i int) *Node {
	nd, err := New(i, members(5), nil)
	if err != nil {
		t.Fatal(err)
	}
	nd.SetMajority()
	nd.SetDead([]int{4})
	return nd
}
