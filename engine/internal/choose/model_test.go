package choose

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/schedtest"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology/cost"
)

// candidates are the entries the model compares for s (Chooser.Choose's).
func candidates(s Shape) []*Entry {
	var out []*Entry
	for _, a := range byColl[s.Coll] {
		if a.Build != nil && a.can(s) {
			out = append(out, a)
		}
	}
	return out
}

// onCluster is a model of c laid out as the engine lays it out, and the
// shape of a call of coll over bytes on it.
func onCluster(c cost.Cluster, bw float64, coll sched.Coll, bytes int) (*Model, Shape) {
	return NewModel(c.Params(sched.Params{}), bw), Shape{Coll: coll, Bytes: bytes, N: c.Ranks(), Hosts: c.Hosts, Even: true}
}

// walkedWhole is a model of c that walks every schedule whole, without a
// budget: the reference the projection is held to.
func walkedWhole(c cost.Cluster, bw float64) *Model {
	w := NewModel(c.Params(sched.Params{}), bw)
	w.regular, w.budget = false, 1<<62
	return w
}

// The model's choice on clusters of identical hosts, projected from small
// ones, is the choice of the walk of every schedule whole: on 256 ranks
// (1,024 without -short) of 8 a host, every collective the model chooses,
// at 4 KiB, 1 MiB and 64 MiB, the network's rate unknown (1, 10 and
// 100 Gbit/s) and, without -short, known.
func TestModelMatchesWalk(t *testing.T) {
	clusters := []cost.Cluster{{Hosts: 32, PerHost: 8}}
	colls := []sched.Coll{sched.AllReduce, sched.Reduce, sched.Broadcast, sched.AllGather, sched.ReduceScatter, sched.Barrier}
	switch {
	case raceEnabled: // no goroutine to watch: fewer walks
		clusters, colls = []cost.Cluster{{Hosts: 32, PerHost: 4}}, colls[:3]
	case !testing.Short():
		clusters = append(clusters, cost.Cluster{Hosts: 128, PerHost: 8})
	}
	rates := []float64{0}
	if !testing.Short() {
		rates = append(rates, 10e9/8)
	}
	for _, c := range clusters {
		for _, bw := range rates {
			for _, coll := range colls {
				if c.Hosts > 32 && coll != sched.AllReduce {
					continue
				}
				for _, b := range []int{4 << 10, 1 << 20, 64 << 20} {
					m, s := onCluster(c, bw, coll, b)
					cs := candidates(s)
					got, want := m.pick(s, cs), walkedWhole(c, bw).pick(s, cs)
					if got == nil || got != want {
						t.Errorf("%v, %g B/s, %s of %d B: projected %v, walked whole %v", c, bw, coll, b, name(got), name(want))
					}
				}
			}
		}
	}
}

func name(a *Entry) string {
	if a == nil {
		return "nothing"
	}
	return a.Name
}

// At 1,024 and 65,536 ranks of 8 a host on 10 Gbit/s the model picks what
// the projection of docs/scale.md finds fastest (build/bench/scaleproj):
// recursive doubling at 4 KiB, the double binary tree at 1 MiB; at
// 64 MiB the ring on 1,024 ranks and the tree on 65,536.
func TestModelAtScale(t *testing.T) {
	for _, tc := range []struct {
		ranks, bytes int
		want         string
	}{
		{1024, 4 << 10, "rd"}, {1024, 1 << 20, "dbtree"}, {1024, 64 << 20, "ring"},
		{65536, 4 << 10, "rd"}, {65536, 1 << 20, "dbtree"}, {65536, 64 << 20, "dbtree"},
	} {
		m, s := onCluster(cost.Cluster{Hosts: tc.ranks / 8, PerHost: 8}, 10e9/8, sched.AllReduce, tc.bytes)
		if got := (&Chooser{Model: m}).Choose(s); got.Name != tc.want {
			t.Errorf("%d ranks, %d B: %s, want %s", tc.ranks, tc.bytes, got.Name, tc.want)
		}
	}
}

// A class's prediction walks the same small clusters whatever the hosts
// (no more operations at 65,536 ranks than at 2,048), within half the
// budget, for every collective the model chooses; a placement that is no
// cluster is walked whole and, at 1,024 ranks, passes the budget at
// 64 MiB, where the size rules choose.
func TestModelBounded(t *testing.T) {
	colls := []sched.Coll{sched.AllReduce, sched.Reduce, sched.Broadcast, sched.AllGather, sched.ReduceScatter, sched.Barrier}
	if raceEnabled {
		colls = colls[:3]
	}
	for _, coll := range colls {
		for _, b := range []int{4 << 10, 1 << 20, 64 << 20} {
			var work []int64
			for _, h := range []int{256, 1024, 8192} {
				m, s := onCluster(cost.Cluster{Hosts: h, PerHost: 8}, 0, coll, b)
				if m.pick(s, candidates(s)) == nil {
					t.Fatalf("%s of %d B on %d hosts: no pick", coll, b, h)
				}
				work = append(work, m.classes[modelKey{coll, sizeClass(b)}].work)
			}
			// Equal, or fewer where the blocks the small clusters keep
			// shrink with the hosts (the rings').
			if work[1] > work[0] || work[2] > work[1] || work[0] > modelBudget/2 {
				t.Errorf("%s of %d B: %v operations and visits at 2,048, 8,192 and 65,536 ranks (budget %d)", coll, b, work, modelBudget)
			}
		}
	}
	hosts := schedtest.HostsOf(128, 8, true)
	m := NewModel(sched.Params{N: 1024, Hosts: hosts}, 0)
	s := Shape{Coll: sched.AllReduce, Bytes: 64 << 20, N: 1024, Hosts: 128, Even: true}
	if a := m.pick(s, candidates(s)); a != nil {
		t.Errorf("1,024 strided ranks at 64 MiB: the model picked %s", a.Name)
	}
	if cl := m.classes[modelKey{s.Coll, sizeClass(s.Bytes)}]; !cl.over || cl.work > modelBudget {
		t.Errorf("1,024 strided ranks at 64 MiB: over %v after %d (budget %d)", cl.over, cl.work, modelBudget)
	}
	if got, want := (&Chooser{Model: m}).Choose(s), bySize(s); got != want {
		t.Errorf("over the budget: %s, the size rules %s", got.Name, want.Name)
	}
}

// Calls within a factor of two below a class's size share its prediction;
// Predicted sums the contenders' at the slowest rate.
func TestModelClasses(t *testing.T) {
	for _, tc := range []struct{ bytes, class int }{{0, 0}, {1, 0}, {2, 1}, {3, 2}, {4096, 12}, {4097, 13}, {3 << 20, 22}} {
		if got := sizeClass(tc.bytes); got != tc.class {
			t.Errorf("sizeClass(%d) = %d, want %d", tc.bytes, got, tc.class)
		}
	}
	m, s := onCluster(cost.Cluster{Hosts: 64, PerHost: 4}, 0, sched.AllReduce, 3<<20)
	cs := candidates(s)
	a := m.pick(s, cs)
	work := m.classes[modelKey{s.Coll, sizeClass(s.Bytes)}].work
	s.Bytes = 4 << 20
	if b := m.pick(s, cs); b != a || len(m.classes) != 1 || m.classes[modelKey{s.Coll, 22}].work != work {
		t.Errorf("3 and 4 MiB: %s and %s, %d classes", a.Name, b.Name, len(m.classes))
	}
	ch := &Chooser{Model: m}
	sum := 0.0
	for _, ts := range m.predict(s, cs[:2]) {
		sum += max(ts[0], ts[1], ts[2])
	}
	if got := ch.Predicted(4<<20, Shape{N: s.N, Hosts: s.Hosts, Even: true}, cs[:2]); got != sum || !(got > 0) {
		t.Errorf("Predicted %v, want %v", got, sum)
	}
	if got := (&Chooser{}).Predicted(4<<20, s, cs); got != 0 {
		t.Errorf("no model: Predicted %v", got)
	}
}

// cpuTime is the process's CPU time, user and system: what a prediction
// costs the rank whatever else the machine runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkModelClass is the CPU time of a class's first prediction (an
// allreduce, at 1, 10 and 100 Gbit/s) on a communicator of 8 ranks a host
// whose model has predicted another class (its small clusters' graphs
// made): cpu-ms/class, process CPU time, valid on a loaded machine.
func BenchmarkModelClass(b *testing.B) {
	for _, n := range []int{64, 256, 1024, 4096, 65536} {
		for _, bytes := range []int{4 << 10, 1 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("n=%d/bytes=%d", n, bytes), func(b *testing.B) {
				c := cost.Cluster{Hosts: n / 8, PerHost: 8}
				base := c.Params(sched.Params{})
				s := Shape{Coll: sched.AllReduce, Bytes: bytes, N: n, Hosts: c.Hosts, Even: true}
				cs := candidates(s)
				var cpu time.Duration
				for range b.N {
					m := NewModel(base, 0)
					warm := s
					warm.Bytes = 256
					m.pick(warm, cs)
					t0 := cpuTime()
					m.pick(s, cs)
					cpu += cpuTime() - t0
				}
				b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/class")
			})
		}
	}
}
