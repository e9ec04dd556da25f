package vppu

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/engine"
)

// member is the description of a rank holding devices local at step,
// with shared "params" (64 bytes) and, per device, own "rng" (16 bytes)
// unless noOwn.
func member(m int, step uint64, local ...int) recoverDesc {
	d := recoverDesc{Logical: 7, M: m, Step: step, Rebuild: true, Local: local, Shared: map[string]int{}}
	if len(local) > 0 {
		d.Shared["params"] = 64
	}
	for range local {
		d.Own = append(d.Own, map[string]int{"rng": 16})
	}
	return d
}

func joiner(m int) recoverDesc {
	return recoverDesc{Logical: 7, M: m, Joined: true, Rebuild: true, Shared: map[string]int{}}
}

func with(d recoverDesc, f func(*recoverDesc)) recoverDesc {
	f(&d)
	return d
}

func shared(to int, dev int) transfer {
	return transfer{Dev: dev, Name: "params", Size: 64, From: 0, To: to, Shared: true}
}

// TestPlanRecovery: the recovery's decision from the ranks'
// descriptions, with no process: placement, the step settled, what moves,
// what is rebuilt, who is refused, and every refusal of bad input.
func TestPlanRecovery(t *testing.T) {
	for _, tc := range []struct {
		name    string
		descs   []recoverDesc
		want    recoveryPlan
		wantErr error
		errText string
	}{{
		name:  "healthy: nothing moves",
		descs: []recoverDesc{member(4, 9, 0, 1), member(4, 9, 2, 3)},
		want:  recoveryPlan{Recovery: Recovery{Step: 9, Place: Place{0, 0, 1, 1}}},
	}, {
		// Rank 3 of 4 died (devices 6, 7); rank 0 completed step 4's
		// reduction, ranks 1 and 2 did not.
		name:  "shrink: lost devices, a step ahead",
		descs: []recoverDesc{member(8, 5, 0, 1), member(8, 4, 2, 3), member(8, 4, 4, 5)},
		want: recoveryPlan{
			Recovery:  Recovery{Step: 5, Lost: []int{6, 7}, Behind: []int{1, 2}, Place: Place{0, 0, 1, 1, 2, 2, 0, 1}, Bytes: 128},
			Transfers: []transfer{shared(1, 2), shared(2, 4)},
			Rebuilds: []rebuild{
				{2, "rng", 16, 1, true}, {3, "rng", 16, 1, true}, {4, "rng", 16, 2, true}, {5, "rng", 16, 2, true},
				{6, "rng", 16, 0, false}, {7, "rng", 16, 1, false},
			},
		},
	}, {
		name:  "grow: the joiner gets devices, the state and their own buffers",
		descs: []recoverDesc{member(4, 3, 0, 1), member(4, 3, 2, 3), joiner(4)},
		want: recoveryPlan{
			Recovery:  Recovery{Step: 3, Place: Place{0, 0, 1, 2}, Bytes: 64 + 16},
			Transfers: []transfer{shared(2, 3), {Dev: 3, Name: "rng", Size: 16, From: 1, To: 2}},
		},
	}, {
		name:  "a joiner of another device count is refused, the members go on",
		descs: []recoverDesc{member(4, 3, 0, 1), member(4, 3, 2, 3), joiner(5)},
		want:  recoveryPlan{Recovery: Recovery{Step: 3, Place: Place{0, 0, 1, 1}, Refused: []int{2}}},
	}, {
		name: "a joiner with another MinRanks or Place is refused; a good one is admitted",
		descs: []recoverDesc{member(4, 3, 0, 1), with(joiner(4), func(d *recoverDesc) { d.MinRanks = 2 }), member(4, 3, 2, 3),
			joiner(4), with(joiner(4), func(d *recoverDesc) { d.Place = []int{0, 0, 0, 0} })},
		want: recoveryPlan{
			Recovery:  Recovery{Step: 3, Place: Place{0, 0, 2, 3}, Bytes: 64 + 16, Refused: []int{1, 4}},
			Transfers: []transfer{shared(3, 3), {Dev: 3, Name: "rng", Size: 16, From: 2, To: 3}},
		},
	}, {
		name:  "an explicit place",
		descs: []recoverDesc{with(member(4, 3, 0, 1), placed(1, 1, 0, 0)), with(member(4, 3, 2, 3), placed(1, 1, 0, 0))},
		want: recoveryPlan{
			Recovery: Recovery{Step: 3, Place: Place{1, 1, 0, 0}, Bytes: 64},
			Transfers: []transfer{{Dev: 0, Name: "rng", Size: 16, From: 0, To: 1}, {Dev: 1, Name: "rng", Size: 16, From: 0, To: 1},
				{Dev: 2, Name: "rng", Size: 16, From: 1, To: 0}, {Dev: 3, Name: "rng", Size: 16, From: 1, To: 0}},
		},
	}, {
		name:  "a device two ranks claim stays with the lower",
		descs: []recoverDesc{member(2, 1, 0, 1), member(2, 1, 1)},
		want:  recoveryPlan{Recovery: Recovery{Step: 1, Place: Place{0, 1}, Bytes: 16}, Transfers: []transfer{{Dev: 1, Name: "rng", Size: 16, From: 0, To: 1}}},
	}, {
		name:    "members with different MinRanks",
		descs:   []recoverDesc{member(4, 3, 0, 1), with(member(4, 3, 2, 3), func(d *recoverDesc) { d.MinRanks = 2 })},
		wantErr: engine.ErrInvalidArgument, errText: "rank 1 passed another MinRanks (2, against 0) than rank 0",
	}, {
		name:    "members with different places",
		descs:   []recoverDesc{with(member(4, 3, 0, 1), placed(0, 0, 1, 1)), member(4, 3, 2, 3)},
		wantErr: engine.ErrInvalidArgument, errText: "rank 1 passed another Place ([], against [0 0 1 1])",
	}, {
		name:    "members with different topologies",
		descs:   []recoverDesc{member(4, 3, 0, 1), with(member(4, 3, 2, 3), func(d *recoverDesc) { d.Logical = 8 })},
		wantErr: engine.ErrInvalidArgument, errText: "another virtual topology",
	}, {
		name:    "too few ranks",
		descs:   []recoverDesc{with(member(4, 3, 0, 1), minRanks(3)), with(member(4, 3, 2, 3), minRanks(3))},
		wantErr: ErrTooFewRanks,
	}, {
		name:    "a refused joiner does not count",
		descs:   []recoverDesc{with(member(4, 3, 0, 1), minRanks(3)), with(member(4, 3, 2, 3), minRanks(3)), joiner(4)},
		wantErr: ErrTooFewRanks, errText: "2 process(es), the job needs at least 3",
	}, {
		name:    "no Rebuild where a lost device lands",
		descs:   []recoverDesc{member(4, 3, 0), with(member(4, 3, 1), func(d *recoverDesc) { d.Rebuild = false })},
		wantErr: ErrStateLost, errText: "rank 1, its new host, has no Rebuild",
	}, {
		name:  "no Rebuild where none is needed",
		descs: []recoverDesc{with(member(4, 3, 0, 1, 2), noRebuild), with(member(4, 3, 3), noRebuild)},
		want:  recoveryPlan{Recovery: Recovery{Step: 3, Place: Place{0, 0, 1, 1}, Bytes: 16}, Transfers: []transfer{{Dev: 2, Name: "rng", Size: 16, From: 0, To: 1}}},
	}, {
		name:    "two steps apart",
		descs:   []recoverDesc{member(4, 5, 0, 1), member(4, 3, 2, 3)},
		wantErr: engine.ErrInvalidArgument, errText: "more than one step apart",
	}, {
		name:    "shared buffers differ",
		descs:   []recoverDesc{member(4, 3, 0, 1), with(member(4, 3, 2, 3), func(d *recoverDesc) { d.Shared = map[string]int{"params": 32} })},
		wantErr: engine.ErrInvalidArgument, errText: "shared buffers differ",
	}, {
		name:    "nobody holds a device",
		descs:   []recoverDesc{member(4, 3), member(4, 3)},
		wantErr: ErrStateLost,
	}, {
		name:    "every process joins",
		descs:   []recoverDesc{joiner(4), joiner(4)},
		wantErr: ErrStateLost,
	}, {
		name:    "a place out of range",
		descs:   []recoverDesc{with(member(4, 3, 0, 1), placed(0, 0, 1, -1)), with(member(4, 3, 2, 3), placed(0, 0, 1, -1))},
		wantErr: engine.ErrInvalidArgument, errText: "placed on rank -1",
	}, {
		name:    "a place on a refused joiner",
		descs:   []recoverDesc{with(member(4, 3, 0, 1), placed(0, 0, 1, 2)), with(member(4, 3, 2, 3), placed(0, 0, 1, 2)), joiner(4)},
		wantErr: engine.ErrInvalidArgument, errText: "a joining process that was refused",
	}, {
		name:    "a device out of range",
		descs:   []recoverDesc{member(4, 3, 0, 9)},
		wantErr: engine.ErrInvalidArgument, errText: "hosts device 9",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planRecovery(tc.descs)
			if tc.wantErr != nil || tc.errText != "" {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("error %v, want %v containing %q", err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func placed(p ...int) func(*recoverDesc) { return func(d *recoverDesc) { d.Place = p } }

func minRanks(n int) func(*recoverDesc) { return func(d *recoverDesc) { d.MinRanks = n } }

func noRebuild(d *recoverDesc) { d.Rebuild = false }

// TestPlanMoves: a migration's transfers from the ranks' buffer lists.
func TestPlanMoves(t *testing.T) {
	from, to := Place{0, 0, 1, 1}, Place{0, 1, 2, 2}
	lists := [][]byte{
		encodeMoves([]bufDesc{{Dev: 1, Name: "w", Size: 4}}),
		encodeMoves([]bufDesc{{Dev: 3, Name: "w", Size: 4}, {Dev: 2, Name: "w", Size: 4}, {Dev: 2, Name: "params", Size: 8, Shared: true}}),
		encodeMoves(nil),
	}
	got, err := planMoves(lists, from, to)
	if err != nil {
		t.Fatal(err)
	}
	want := []transfer{{1, "w", 4, 0, 1, false}, {2, "params", 8, 1, 2, true}, {2, "w", 4, 1, 2, false}, {3, "w", 4, 1, 2, false}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("moves %+v, want %+v", got, want)
	}
	// A rank listing a device it does not host, or a shared buffer a
	// device does not carry.
	for _, bad := range [][]bufDesc{{{Dev: 0, Name: "w", Size: 4}}, {{Dev: 3, Name: "params", Size: 8, Shared: true}}} {
		lists[1] = encodeMoves(bad)
		if _, err := planMoves(lists, from, to); err == nil || !strings.Contains(err.Error(), "rank 1 sent a damaged buffer list") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}
