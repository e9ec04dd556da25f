package cost

import (
	"fmt"
	"math"
	"testing"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
)

func builtin(t *testing.T, spec string) *topology.Graph {
	t.Helper()
	g, err := topology.Builtin(spec)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func predict(t *testing.T, g *topology.Graph, b sched.Builder, p sched.Params) Prediction {
	t.Helper()
	s, err := b(p)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := New(g).Predict(s)
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

// On a ring of devices the ring allreduce's time has a closed form: 2(N-1)
// steps, each one block of L/N bytes over one link, cut into k segments
// whose pipeline leaves 1/k of the latency and software cost unhidden
// behind the block's link time (or the other segments' software cost,
// whichever is longer), and in the first N-1 a reduction of L/N bytes.
func TestRingClosedForm(t *testing.T) {
	for _, n := range []int{3, 4, 8} {
		g := builtin(t, fmt.Sprintf("ring:%d", n))
		const l = 24 << 20 // every chunk the same size
		p := sched.Params{Coll: sched.AllReduce, N: n, ElemSize: 4, Count: l / 4}
		pr := predict(t, g, sched.RingAllReduce, p)
		// The model counts one message per send the schedule holds,
		// whatever size the ring cuts its blocks into.
		s, err := sched.RingAllReduce(p)
		if err != nil {
			t.Fatal(err)
		}
		var sends int64
		for rank := range n {
			for _, op := range s.Ops(rank) {
				if op.Kind == sched.Send {
					sends += int64(op.NSegs())
				}
			}
		}
		steps := int64(2 * n * (n - 1))
		if sends < steps || sends%steps != 0 || pr.Messages != sends {
			t.Fatalf("n=%d: %d messages, the schedule sends %d", n, pr.Messages, sends)
		}
		r := DefaultRates()
		link := g.Links[0]
		chunk := float64(l / n)
		segs := float64(sends / steps)
		step := (link.Latency+r.Message)/segs + max(chunk/link.Bandwidth, (segs-1)*r.Message)
		want := r.Call + 2*float64(n-1)*step + float64(n-1)*chunk/r.ReduceRate
		if math.Abs(pr.Seconds-want)/want > 1e-9 {
			t.Fatalf("n=%d: predicted %v, closed form %v (%v segments per step)", n, pr.Seconds, want, segs)
		}
	}
}

// Across hosts the model prefers what the hardware favours: the
// hierarchical allreduce over a flat ring when hosts hold several ranks
// and the network is the bottleneck; the two rings of the cube-mesh over
// one.
func TestModelOrdersAlgorithms(t *testing.T) {
	g := builtin(t, "cluster:2x2:250mbit")
	p := sched.Params{Coll: sched.AllReduce, N: 4, ElemSize: 4, Count: 4 << 20, Hosts: [][]int{{0, 1}, {2, 3}}}
	hier := predict(t, g, sched.HierAllReduce, p)
	flat := predict(t, g, sched.RingAllReduce, p)
	if ratio := flat.Seconds / hier.Seconds; ratio < 1.3 || ratio > 1.6 {
		t.Fatalf("2x2 hosts: flat ring %v, hierarchical %v: ratio %.2f, want about 1.5 (each host sends 1.5 L against L)", flat.Seconds, hier.Seconds, ratio)
	}
	// Links slower than a core's reductions, as between CPUs: then two
	// link-disjoint rings halve what each link carries.
	params := topology.DefaultParams()
	params.DevBandwidth = 2e9
	cm, err := topology.BuiltinWith("hybrid-cube-mesh", params)
	if err != nil {
		t.Fatal(err)
	}
	rs := cm.MaxDisjointRings()
	var rings [][]int
	for _, r := range rs.Rings {
		rings = append(rings, r.Order())
	}
	q := sched.Params{Coll: sched.AllReduce, N: 8, ElemSize: 4, Count: 16 << 20}
	one := predict(t, cm, sched.RingAllReduce, q)
	q.Rings = rings
	two := predict(t, cm, sched.RingAllReduce, q)
	if ratio := one.Seconds / two.Seconds; ratio < 1.5 {
		t.Fatalf("cube-mesh: one ring %v, two rings %v (ratio %.2f)", one.Seconds, two.Seconds, ratio)
	}
	// Small messages: latency decides, recursive doubling wins.
	small := sched.Params{Coll: sched.AllReduce, N: 16, ElemSize: 4, Count: 256}
	g16 := builtin(t, "cluster:4x4")
	if rd, ring := predict(t, g16, sched.RDAllReduce, small), predict(t, g16, sched.RingAllReduce, small); rd.Seconds >= ring.Seconds {
		t.Fatalf("1 KiB on 16 ranks: rd %v, ring %v", rd.Seconds, ring.Seconds)
	}
}

// The model walks large schedules without holding them.
func TestLargePrediction(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds")
	}
	g := builtin(t, "cluster:512x8")
	hosts := g.HostDevices()
	for _, b := range []sched.Builder{sched.HierAllReduce, sched.HDAllReduce} {
		pr := predict(t, g, b, sched.Params{Coll: sched.AllReduce, N: 4096, ElemSize: 4, Count: 16 << 20, Hosts: hosts})
		if !(pr.Seconds > 0) {
			t.Fatalf("%v", pr)
		}
	}
}
