package agree

import (
	"slices"
	"testing"
)

// TestQueryBeforeDecision: a Query that reaches a member before it
// decides is answered once it decides (found by TestScaleCrashStop with a
// failure detector that tells a member of a crash only when it times out
// waiting on the crashed member, seed 779 at 64 members). Before, the
// member dropped it and, deciding by the coordinator's Commit, answered
// only once it learnt that the coordinator failed; where only the
// coordinator's neighbours see it fail (a sparse control mesh), the asker
// waited until its own timeout took that live member for failed.
func TestQueryBeforeDecision(t *testing.T) {
	all := []int{0, 1, 2}
	var n [3]*Node
	for i := range n {
		var err error
		if n[i], err = New(i, all, nil); err != nil {
			t.Fatal(err)
		}
	}
	to := func(outs []Out, dst int, k Kind) Msg {
		t.Helper()
		for _, o := range outs {
			if o.To == dst && o.Msg.Kind == k {
				return o.Msg
			}
		}
		t.Fatalf("no %v to %d in %v", k, dst, outs)
		return Msg{}
	}
	prep := n[0].Start()
	n[0].Recv(1, to(n[1].Start(), 0, Query)) // ignored: 0 has not decided
	n[0].Recv(2, to(n[2].Start(), 0, Query))
	n[0].Recv(1, to(n[1].Recv(0, to(prep, 1, Prepare)), 0, Promise))
	prop := n[0].Recv(2, to(n[2].Recv(0, to(prep, 2, Prepare)), 0, Promise))
	n[0].Recv(1, to(n[1].Recv(0, to(prop, 1, Propose)), 0, Ack))
	commits := n[0].Recv(2, to(n[2].Recv(0, to(prop, 2, Propose)), 0, Ack))
	// 0 decided and crashes: its Commit to 2 is lost, the one to 1 is slow.
	// 2 times out on 0 and asks 1, before 1 has the Commit.
	q := to(n[2].Down(0), 1, Query)
	if outs := n[1].Recv(2, q); len(outs) != 0 {
		t.Fatalf("1 answered a query before deciding: %v", outs)
	}
	answer := to(n[1].Recv(0, to(commits, 1, Commit)), 2, Commit)
	if !n[1].Done() {
		t.Fatal("1 did not decide")
	}
	n[2].Recv(1, answer)
	v1, _ := n[1].Result()
	v2, err := n[2].Result()
	if !n[2].Done() || err != nil || !slices.Equal(v1, v2) {
		t.Fatalf("member 2: done %v, view %v (%v), want %v", n[2].Done(), v2, err, v1)
	}
}
