package flight

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func rec(n, seq uint64, state string, peer int) Record {
	return Record{N: n, Op: "allreduce", Seq: seq, Bytes: 64, Type: "float32", Algo: "ring", Peer: peer, State: state}
}

// Every rank reached the collective and some wait on a peer that is there
// too (a slow or stopped rank): the verdict names whom they wait on and
// blames no absent rank.
func TestDiagnoseAllArrived(t *testing.T) {
	now := time.Now()
	ds := []Dump{
		{Rank: 0, Size: 2, Comm: "x", Time: now, Records: []Record{rec(1, 0, StateOK, 1), rec(2, 1, StateInFlight, 1)}},
		{Rank: 1, Size: 2, Comm: "x", Time: now, Records: []Record{rec(1, 0, StateOK, 0), rec(2, 1, StateInFlight, -1)}},
	}
	vs := Diagnose(ds)
	if len(vs) != 1 {
		t.Fatal(vs)
	}
	v := vs[0]
	if v.Seq != 1 || len(v.Absent) != 0 || !slices.Equal(v.Waiting, []int{0, 1}) || !slices.Equal(v.Blamed, []int{1}) {
		t.Errorf("%+v", v)
	}
	if !strings.Contains(v.Text, "every rank reached allreduce #1") || !strings.Contains(v.Text, "waiting on rank 1") {
		t.Error(v.Text)
	}
}

// Of two dumps of one rank the later counts; point-to-point records do not
// count as collectives.
func TestDiagnoseLatestDumpAndP2P(t *testing.T) {
	t0 := time.Now()
	p2p := Record{N: 3, Op: "send", Seq: 9, P2P: true, Peer: 0, State: StateInFlight}
	ds := []Dump{
		{Rank: 0, Size: 2, Time: t0, Records: []Record{rec(1, 0, StateOK, 1), rec(2, 1, StateError, 1)}},
		{Rank: 1, Size: 2, Time: t0, Records: []Record{rec(1, 0, StateInFlight, 0)}},
		{Rank: 1, Size: 2, Time: t0.Add(time.Second), Records: []Record{rec(1, 0, StateOK, 0), p2p}},
	}
	v := Diagnose(ds)[0]
	if v.Seq != 1 || !slices.Equal(v.Absent, []int{1}) || !slices.Equal(v.Waiting, []int{0}) {
		t.Errorf("%+v", v)
	}
	if !strings.Contains(v.Text, "rank 1 did not arrive at allreduce #1") || !strings.Contains(v.Text, "was in send #9") {
		t.Error(v.Text)
	}
}

func TestFileName(t *testing.T) {
	if got := FileName("a/b", 7, 3, "c0ffee"); got != "gocoll-dump-a_b-7-r3-cc0ffee.json" {
		t.Error(got)
	}
	if got := FileName("h", 7, 3, ""); got != "gocoll-dump-h-7-r3.json" {
		t.Error(got)
	}
}
