package choose

import (
	"strings"
	"testing"

	"github.com/gocoll/gocoll/engine/sched"
)

func ch(o Overrides) *Chooser { return &Chooser{Overrides: o} }

// GOCOLL_ALGO wins where it can run the call; otherwise the size rules
// and the measured thresholds choose.
func TestOverrides(t *testing.T) {
	for _, bad := range []string{"nope", "allreduce=bruck", "alltoall=ring", "nocoll=ring"} {
		if _, err := ParseOverrides(bad); err == nil || !strings.Contains(err.Error(), "unknown algorithm") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	spec, err := ParseOverrides("ring")
	if err != nil {
		t.Fatal(err)
	}
	if got := ch(spec).Choose(Shape{Coll: sched.AllReduce, Bytes: 4, N: 4}); got.Name != "ring" {
		t.Errorf("override: %s", got.Name)
	}
	if got := ch(spec).Choose(Shape{Coll: sched.AllToAll, Bytes: 4, N: 4}); got.Name == "ring" {
		t.Errorf("bare name applied to a collective without it")
	}
	if got := (&Chooser{}).Choose(Shape{Coll: sched.AllReduce, Bytes: 64 << 20, N: 3, Shm: true}); got.Name != "shm" {
		t.Errorf("all ranks on one host: %s, want shm", got.Name)
	}
	shmSpec, _ := ParseOverrides("shm")
	if got := ch(shmSpec).Choose(Shape{Coll: sched.AllReduce, Bytes: 4, N: 4}); got.Name != "rd" {
		t.Errorf("shm forced without shared memory: %s, want the automatic choice", got.Name)
	}
	hierSpec, _ := ParseOverrides("allreduce=hier")
	if got := ch(hierSpec).Choose(Shape{Coll: sched.AllReduce, Bytes: 4, N: 6, Hosts: 2, Even: false}); got.Name == "hier" {
		t.Errorf("hier forced on uneven hosts: %s, want the automatic choice", got.Name)
	}
	for _, tc := range []struct {
		s    Shape
		want string
	}{
		{Shape{Coll: sched.AllReduce, Bytes: 4 << 10, N: 4}, "rd"},
		{Shape{Coll: sched.AllReduce, Bytes: 1 << 20, N: 4}, "hd"},
		{Shape{Coll: sched.AllReduce, Bytes: 64 << 20, N: 3}, "ring"},
		{Shape{Coll: sched.AllReduce, Bytes: 1 << 20, N: 4, Hosts: 2, Even: true}, "hier"},
		{Shape{Coll: sched.AllReduce, Bytes: 4 << 10, N: 4, Hosts: 2, Even: true}, "rd"},
		{Shape{Coll: sched.AllToAll, Bytes: 64 * 8, N: 8}, "bruck"},
		{Shape{Coll: sched.AllToAll, Bytes: 1 << 20, N: 8}, "pairwise"},
		// Across hosts, the measured thresholds (docs/algorithms.md, "Choice").
		{Shape{Coll: sched.AllToAll, Bytes: 16 * 512, N: 16, Hosts: 4, Even: true}, "aggregate-leader"},
		{Shape{Coll: sched.AllToAll, Bytes: 16 * (2 << 10), N: 16, Hosts: 4, Even: true}, "aggregate-leader"},
		{Shape{Coll: sched.AllToAll, Bytes: 8 * (2 << 10), N: 8, Hosts: 2, Even: true}, "bruck"},
		{Shape{Coll: sched.AllToAll, Bytes: 8 * 256, N: 8, Hosts: 4, Even: true}, "bruck"},
		{Shape{Coll: sched.AllToAll, Bytes: 16 * (8 << 10), N: 16, Hosts: 2, Even: true}, "aggregate-leader"},
		{Shape{Coll: sched.AllToAll, Bytes: 8 * (16 << 10), N: 8, Hosts: 4, Even: true}, "pairwise"},
		{Shape{Coll: sched.AllToAll, Bytes: 8 * 64, N: 8, Hosts: 8, Even: true}, "bruck"},
		{Shape{Coll: sched.AllToAll, Bytes: 8 * (16 << 10), N: 8, Hosts: 8, Even: true}, "aggregate-leader"},
		{Shape{Coll: sched.AllToAll, Bytes: 8 * (1 << 20), N: 8, Hosts: 8, Even: true}, "pairwise"},
		{Shape{Coll: sched.AllToAll, Bytes: 8 * (2 << 10), N: 8, Hosts: 1}, "pairwise"},
		{Shape{Coll: sched.Broadcast, Bytes: 1 << 20, N: 4}, "pipeline"},
		{Shape{Coll: sched.Barrier, N: 4, Shm: true}, "shm"},
	} {
		if got := (&Chooser{}).Choose(tc.s); got.Name != tc.want {
			t.Errorf("%+v: %s, want %s", tc.s, got.Name, tc.want)
		}
	}
}

// A call over virtual devices takes its collective's virtual entries (the
// arena's chain only where the arena can fold it), whatever GOCOLL_ALGO
// says; a plain call never takes a virtual entry, and GOCOLL_ALGO cannot
// name one.
func TestVirtualChoice(t *testing.T) {
	if _, err := ParseOverrides("allreduce=virtual-chain"); err == nil {
		t.Error("GOCOLL_ALGO named a virtual entry")
	}
	ring, _ := ParseOverrides("ring")
	for _, tc := range []struct {
		s    Shape
		want string
	}{
		{Shape{Coll: sched.AllReduce, Bytes: 4, N: 4}, "virtual-chain"},
		{Shape{Coll: sched.AllReduce, Bytes: 4, N: 4, Shm: true}, "virtual-shm"},
		{Shape{Coll: sched.Reduce, Bytes: 4, N: 4, Shm: true}, "virtual-reduce"},
		{Shape{Coll: sched.ReduceScatter, Bytes: 4, N: 4}, "virtual-reducescatter"},
		{Shape{Coll: sched.AllGather, Bytes: 4, N: 4}, "virtual-allgather"},
		{Shape{Coll: sched.AllToAll, Bytes: 4, N: 4}, "virtual-alltoall"},
	} {
		if got := ch(ring).OverDevices(tc.s); got.Name != tc.want {
			t.Errorf("%+v: %s, want %s", tc.s, got.Name, tc.want)
		}
	}
	for _, coll := range sched.Colls() {
		for _, s := range []Shape{{Coll: coll, N: 4, Shm: true}, {Coll: coll, N: 4, Bytes: 1 << 20}, {Coll: coll, N: 4, Hosts: 2, Even: true}} {
			if got := (&Chooser{}).Choose(s); got.Virtual {
				t.Errorf("a plain call %+v took %s", s, got.Name)
			}
		}
	}
	for _, e := range Schedules() {
		if strings.HasPrefix(e.Name, "virtual") {
			t.Errorf("Schedules lists %s/%s", e.Coll, e.Name)
		}
	}
}
