package choose

import (
	"testing"

	"github.com/gocoll/gocoll/engine/sched"
)

// The size classes of a calibration's table: each timed size stands for
// the calls within a factor of two of it; outside, the model chooses.
func TestTuneClass(t *testing.T) {
	for _, tc := range []struct{ bytes, want int }{
		{0, -1}, {4, -1}, {128 << 10, -1}, {128<<10 + 1, 0}, {256 << 10, 0}, {512 << 10, 0},
		{512<<10 + 1, 1}, {1 << 20, 1}, {2 << 20, 1}, {2<<20 + 4, 2}, {8 << 20, 2},
		{8<<20 + 4, 3}, {16 << 20, 3}, {32 << 20, 3}, {32<<20 + 4, -1}, {1 << 30, -1},
	} {
		if got := TuneClass(tc.bytes); got != tc.want {
			t.Errorf("TuneClass(%d) = %d, want %d", tc.bytes, got, tc.want)
		}
	}
}

// The model's pick stays unless another contender ran faster by more than
// keepWithin; otherwise the fastest wins.
func TestDecide(t *testing.T) {
	ring, hd, hier := Lookup(sched.AllReduce, "ring"), Lookup(sched.AllReduce, "hd"), Lookup(sched.AllReduce, "hier")
	cs := []*Entry{ring, hd, hier}
	for _, tc := range []struct {
		times []float64
		want  *Entry
	}{
		{[]float64{1, 2, 3}, ring},
		{[]float64{1, 0.91, 3}, ring},    // within 10 %: the model's pick
		{[]float64{1, 0.89, 3}, hd},      // faster by more
		{[]float64{1, 0.85, 0.80}, hier}, // the fastest, not the first faster
		{[]float64{1, 1, 1}, ring},
	} {
		if got := Decide(cs, tc.times); got != tc.want {
			t.Errorf("Decide(%v) = %s, want %s", tc.times, got.Name, tc.want.Name)
		}
	}
}

// Contenders on two hosts of one rank: the model sees the ring and
// halving–doubling (and, at two ranks, every allreduce schedule) move the
// same bytes, so they are timed, its pick first. On one host (no model)
// nothing is.
func TestContenders(t *testing.T) {
	hosts := [][]int{{0}, {1}}
	ch := &Chooser{Model: NewModel(sched.Params{N: 2, Hosts: hosts}, 0)}
	s := Shape{N: 2, Hosts: 2, Even: true}
	cs := ch.Contenders(16<<20, s)
	names := map[string]bool{}
	for _, a := range cs {
		names[a.Name] = true
	}
	if len(cs) < 2 || !names["ring"] || !names["hd"] {
		t.Errorf("contenders at 16 MiB on %v: %v", hosts, names)
	}
	if cs[0] != ch.Model.pick(Shape{Coll: sched.AllReduce, Bytes: 16 << 20, N: 2, Hosts: 2, Even: true}, cs) {
		t.Errorf("the first contender %s is not the model's pick", cs[0].Name)
	}
	if cs := (&Chooser{}).Contenders(16<<20, Shape{N: 2}); cs != nil {
		t.Errorf("one host: %d contenders", len(cs))
	}
}

// A table's entry runs the calls of its class, unless GOCOLL_ALGO forces
// another or the ranks share memory; other classes and collectives keep
// the model's choice.
func TestMeasuredChoice(t *testing.T) {
	hosts := [][]int{{0}, {1}}
	ring, hd := Lookup(sched.AllReduce, "ring"), Lookup(sched.AllReduce, "hd")
	ch := &Chooser{Model: NewModel(sched.Params{N: 2, Hosts: hosts}, 0)}
	s := Shape{Coll: sched.AllReduce, N: 2, Hosts: 2, Even: true}
	model := map[int]*Entry{}
	for _, b := range []int{1 << 20, 64 << 20} {
		s.Bytes = b
		model[b] = ch.Choose(s)
	}
	other := ring
	if model[1<<20] == ring {
		other = hd
	}
	ch.Measured = &Measured{AllReduce: []*Entry{nil, other, nil, nil}}
	for _, tc := range []struct {
		bytes int
		want  *Entry
	}{{1 << 20, other}, {2 << 20, other}, {600 << 10, other}, {256 << 10, nil}, {64 << 20, model[64<<20]}} {
		s.Bytes = tc.bytes
		got := ch.Choose(s)
		if tc.want == nil {
			tc.want = (&Chooser{Model: ch.Model}).Choose(s)
		}
		if got != tc.want {
			t.Errorf("%d bytes: %s, want %s", tc.bytes, got.Name, tc.want.Name)
		}
	}
	s.Bytes = 1 << 20
	forced, _ := ParseOverrides("allreduce=dbtree")
	ch.Overrides = forced
	if got := ch.Choose(s); got.Name != "dbtree" {
		t.Errorf("GOCOLL_ALGO under a table: %s", got.Name)
	}
	ch.Overrides = Overrides{}
	if got := ch.Choose(Shape{Coll: sched.AllReduce, Bytes: 1 << 20, N: 2, Shm: true}); got.Name != "shm" {
		t.Errorf("shared memory under a table: %s", got.Name)
	}
	if got := ch.Choose(Shape{Coll: sched.AllGather, Bytes: 1 << 20, N: 2, Hosts: 2, Even: true}); got.Coll != sched.AllGather {
		t.Errorf("allgather took %s", got.Name)
	}
}
