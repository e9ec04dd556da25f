package agree

import (
	"os"
	"testing"
)

// TestQueryBeforeDecision is an open liveness question, found by
// TestScaleCrashStop while its failure detector told a member of a crash
// only when it timed out waiting on the crashed member (seed 779 at 64
// members; the test now also tells every live member eventually, as a
// full control mesh does). A Query that reaches a member before that
// member decides is dropped; a member that then decides by the
// coordinator's Commit answers it only once it learns that the
// coordinator failed (Down, as the next in line). Where only the
// coordinator's neighbours see it fail (a sparse control mesh), the
// querying member waits until its own timeout takes that live member for
// failed. It fails today; GOCOLL_TEST_AGREE_OPEN=1 runs it.
func TestQueryBeforeDecision(t *testing.T) {
	if os.Getenv("GOCOLL_TEST_AGREE_OPEN") == "" {
		t.Skip("open question (see the comment): GOCOLL_TEST_AGREE_OPEN=1 runs it")
	}
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
	if outs := n[1].Recv(0, to(commits, 1, Commit)); len(outs) != 0 {
		t.Logf("1 decided and sent %v", outs)
	}
	// Nothing is in flight; 1 is alive and decided, 2 waits for it.
	if !n[1].Done() {
		t.Fatal("1 did not decide")
	}
	if !n[2].Done() {
		t.Fatalf("member 2 waits for live member %v, which decided and will not answer its query unless it learns that 0 failed", n[2].Waiting())
	}
}
