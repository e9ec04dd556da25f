package agree

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// BenchmarkCoordinator is the coordinator's work in one agreement of n
// live members and one dead one (a shrink by one rank): every message it
// receives decoded, handled, and every message it sends encoded, as the
// control mesh does (JSON, engine/ctl.go). The members' work and the
// delivery are not counted. It reports the coordinator's time per
// agreement (coord-ns/op), the messages it sent and received (msgs/op)
// and the member ids those carried (ids/op), from which a fit gives the
// time per message and per id (docs/scale.md, the shrink model).
func BenchmarkCoordinator(b *testing.B) {
	for _, n := range []int{64, 1024, 16384} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			var coord time.Duration
			var msgs, ids int
			for range b.N {
				c, m, k := coordinate(b, n)
				coord += c
				msgs += m
				ids += k
			}
			b.ReportMetric(float64(coord.Nanoseconds())/float64(b.N), "coord-ns/op")
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
			b.ReportMetric(float64(ids)/float64(b.N), "ids/op")
		})
	}
}

type wire struct {
	from, to int
	b        []byte
}

// coordinate runs one agreement among members 0..n (n dead, suspected by
// everyone) and returns the coordinator's (member 0's) time, messages and
// ids.
func coordinate(b *testing.B, n int) (time.Duration, int, int) {
	all := members(n + 1)
	nodes := make([]*Node, n)
	for i := range nodes {
		nd, err := New(i, all, []int{n})
		if err != nil {
			b.Fatal(err)
		}
		nd.SetMajority()
		nodes[i] = nd
	}
	var queue []wire
	var coord time.Duration
	msgs, ids := 0, 0
	post := func(from int, outs []Out) {
		for _, o := range outs {
			if o.To == n {
				continue // the dead member
			}
			if from == 0 {
				msgs++
				ids += len(o.Msg.Set) + len(o.Msg.Acc) + len(o.Msg.Dead)
			}
			data, err := json.Marshal(&o.Msg)
			if err != nil {
				b.Fatal(err)
			}
			queue = append(queue, wire{from, o.To, data})
		}
	}
	t0 := time.Now()
	post(0, nodes[0].Start())
	coord += time.Since(t0)
	for i := 1; i < n; i++ {
		post(i, nodes[i].Start())
	}
	for len(queue) > 0 {
		w := queue[0]
		queue = queue[1:]
		t0 := time.Now()
		var m Msg
		if err := json.Unmarshal(w.b, &m); err != nil {
			b.Fatal(err)
		}
		outs := nodes[w.to].Recv(w.from, m)
		if w.to != 0 {
			post(w.to, outs)
			continue
		}
		msgs++
		ids += len(m.Set) + len(m.Acc) + len(m.Dead)
		post(0, outs)
		coord += time.Since(t0)
	}
	for i, nd := range nodes {
		if v, err := nd.Result(); !nd.Done() || err != nil || len(v) != n {
			b.Fatalf("member %d: done %v, view of %d, %v", i, nd.Done(), len(v), err)
		}
	}
	return coord, msgs, ids
}
