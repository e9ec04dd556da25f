package main

import (
	"errors"
	"fmt"
	"math"
)

// The models of communicator setup and shrink at scale. They are
// formulas, not simulations: each phase is what the protocol's critical
// path costs given figures measured on real runs (build/scale), so that
// runs up to 1,024 ranks, which can be measured, say what 65,536 would
// take. Every input is a measured figure; nothing here is a default.

// InitParams are what the setup model takes, all measured.
//
// The setup assumed: every rank sends its address to one of Roots roots
// (rank r to root r mod Roots); the roots all-gather their parts (in
// ⌈log2 Roots⌉ steps, recursive doubling); each root then hands the whole
// table down a tree of degree FanOut over its share of the ranks (a
// FanOut of at least the share is a star: the root sends the table to
// each rank of its share itself, as gocoll's one root does; a member of
// a tree takes the table in, at ReadBandwidth, before it forwards it);
// then every rank connects the neighbours its first schedules need (ring and
// recursive doubling: 2 + log2 N of them, Neighbours overrides) and the
// rest lazily, which is not setup time. Relays is gocoll's tree as built
// (engine/bootstrap/relay.go): the root is not one of the ranks, its
// FanOut children and theirs relay the table, and each level's links are
// made (a handshake, a parent dialling its children at once) when the
// first table comes down.
type InitParams struct {
	// RootPerRank is the time a root spends per rank it serves (accept,
	// read and record one address), measured as root time over ranks.
	RootPerRank float64 `json:"root_per_rank_s"`
	// Hop is one control message's latency between ranks on two hosts.
	Hop float64 `json:"hop_s"`
	// Bandwidth is a rank's network bandwidth for the table, bytes/s.
	Bandwidth float64 `json:"bandwidth_Bps"`
	// ReadBandwidth, if positive, is the rate in bytes/s at which a rank
	// takes in a table it received (read, MAC, decode, check) before it
	// forwards it: once a level of a tree. Zero leaves it out (the star
	// rows, which were projected without it).
	ReadBandwidth float64 `json:"read_Bps,omitempty"`
	// AddrBytes is one rank's entry of the table.
	AddrBytes int `json:"addr_bytes"`
	// Handshake is one connection's setup (dial, accept, hello), as one
	// rank sees it; a rank connects its neighbours one after another.
	Handshake float64 `json:"handshake_s"`
	// Roots and FanOut shape the bootstrap.
	Roots  int `json:"roots"`
	FanOut int `json:"fan_out"`
	// Neighbours, if positive, replaces 2 + ⌈log2 N⌉ connections at setup.
	Neighbours int `json:"neighbours,omitempty"`
	// Relays: the tree is made of relay links during setup (see above).
	Relays bool `json:"relays,omitempty"`
}

// InitTime is the setup model's answer, phase by phase.
type InitTime struct {
	Gather  float64 // addresses to the roots, and the roots' all-gather
	Spread  float64 // the table down the fan-out trees
	Connect float64 // each rank's setup connections
	Total   float64
}

func (p InitParams) check() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"root_per_rank_s", p.RootPerRank}, {"hop_s", p.Hop}, {"handshake_s", p.Handshake}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("%s = %v: want a finite time ≥ 0", f.name, f.v))
		}
	}
	if !(p.Bandwidth > 0) || math.IsInf(p.Bandwidth, 0) {
		errs = append(errs, fmt.Errorf("bandwidth_Bps = %v: want > 0", p.Bandwidth))
	}
	if !(p.ReadBandwidth >= 0) || math.IsInf(p.ReadBandwidth, 0) {
		errs = append(errs, fmt.Errorf("read_Bps = %v: want > 0, or 0 to leave reading out", p.ReadBandwidth))
	}
	if p.AddrBytes < 1 || p.Roots < 1 || p.FanOut < 2 || p.Neighbours < 0 {
		errs = append(errs, fmt.Errorf("addr_bytes %d, roots %d, fan_out %d, neighbours %d: want ≥ 1, ≥ 1, ≥ 2, ≥ 0", p.AddrBytes, p.Roots, p.FanOut, p.Neighbours))
	}
	return errors.Join(errs...)
}

// log2ceil is ⌈log2 n⌉ (0 for n ≤ 1).
func log2ceil(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}

// levels is the depth of a tree of degree d over n nodes below its root:
// ⌈log_d(n)⌉ levels hold d + d² + … ≥ n - 1 nodes.
func levels(n, d int) int {
	k, reach, width := 0, 1, 1
	for reach < n {
		width *= d
		reach += width
		k++
	}
	return k
}

// Init is the setup time of n ranks under p.
func Init(n int, p InitParams) (InitTime, error) {
	if n < 1 {
		return InitTime{}, fmt.Errorf("init model: %d ranks", n)
	}
	if err := p.check(); err != nil {
		return InitTime{}, fmt.Errorf("init model: %w", err)
	}
	roots := min(p.Roots, n)
	share := (n + roots - 1) / roots // ranks per root
	table := float64(n*p.AddrBytes) / p.Bandwidth
	var t InitTime
	// Each root serves its share one after another; the last address
	// arrives a hop after it was sent. Then recursive doubling among the
	// roots: each step a hop and, at the end, the whole table received.
	t.Gather = p.Hop + float64(share)*p.RootPerRank
	if roots > 1 {
		t.Gather += float64(log2ceil(roots))*p.Hop + table*float64(roots-1)/float64(roots)
	}
	// Down each root's tree: at every level a parent sends the whole
	// table to its children, FanOut of them or as many as its share
	// leaves (a star: share - 1), one after another on its link; below
	// the root a member first takes the table in (store and forward).
	children, depth := min(p.FanOut, share-1), levels(share, p.FanOut)
	if p.Relays {
		// The root above its share: FanOut children, the share below it.
		children, depth = min(p.FanOut, share), levels(share+1, p.FanOut)
	}
	t.Spread = float64(depth) * (p.Hop + float64(children)*table)
	if p.Relays && depth > 1 {
		t.Spread += float64(depth-1) * p.Handshake
	}
	if p.ReadBandwidth > 0 && depth > 1 {
		t.Spread += float64(depth-1) * float64(n*p.AddrBytes) / p.ReadBandwidth
	}
	k := p.Neighbours
	if k == 0 {
		k = 2 + log2ceil(n)
	}
	k = min(k, n-1)
	if k > 0 {
		t.Connect = p.Hop + float64(k)*p.Handshake
	}
	t.Total = t.Gather + t.Spread + t.Connect
	return t, nil
}

// ShrinkParams are what the shrink model takes, all measured.
//
// The shrink assumed: the survivors detect the failure (Detect), then
// agree on the survivors with a coordinator (package engine/agree:
// prepare/promise, propose/ack, commit — three round trips), the
// coordinator sending and receiving one message per member in each
// phase, each message naming the changes only (suspects, deaths, and
// the view as the members it leaves out: at most DeltaIDsPerMember ids
// per member and change, a change being the dead rank and each failed
// coordinator); a coordinator that fails costs its detection and
// ExtraRoundTrips more round trips (the simulation measured one to two);
// then the N-1 survivors set up a communicator with the addresses they
// already have (Init's Connect phase; Rebootstrap runs the whole Init
// instead, as gocoll's shrink does: its new rank 0 gathers the setup data
// and hands the table down a tree of fan-out 4, Init with one root and
// FanOut 4 — until f4425a4 it sent the table to every member itself, a
// star). WholeView is the agreement as it was until 2026-12-02
// (history): proposals and commits carried the whole view, N member ids
// each, about 2N² ids per ballot in all.
type ShrinkParams struct {
	// Detect is the time from the failure to the survivors' first
	// agreement message: a broken connection, or a timeout.
	Detect float64 `json:"detect_s"`
	// Hop is one control message's latency.
	Hop float64 `json:"hop_s"`
	// PerMessage is the coordinator's time per message sent or received
	// (encode, system call, decode), and PerID per member id carried.
	PerMessage float64 `json:"per_message_s"`
	PerID      float64 `json:"per_id_s"`
	// CoordFailures is how many coordinators fail during the agreement;
	// each costs Detect and ExtraRoundTrips round trips, and a ballot.
	CoordFailures   int     `json:"coord_failures"`
	ExtraRoundTrips float64 `json:"extra_round_trips"`
	// Setup is the new communicator's setup model.
	Setup       InitParams `json:"setup"`
	Rebootstrap bool       `json:"rebootstrap,omitempty"`
	// WholeView: the agreement's messages carry whole views (history).
	WholeView bool `json:"whole_view,omitempty"`
}

// DeltaIDsPerMember is the most member ids a ballot's messages between
// the coordinator and one member carry per change: the suspects in the
// prepare and the promise, the view's difference in the proposal and
// the commit, and with each the deaths known (SetMajority); without
// deaths BenchmarkCoordinator (engine/agree) counts 4.
const DeltaIDsPerMember = 8

// ShrinkTime is the shrink model's answer.
type ShrinkTime struct {
	Detect, Agree, Setup, Total float64
	Ballots                     int
	RoundTrips                  float64
}

// Shrink is the time n ranks take to shrink to n-1 under p.
func Shrink(n int, p ShrinkParams) (ShrinkTime, error) {
	if n < 2 {
		return ShrinkTime{}, fmt.Errorf("shrink model: %d ranks (one must survive)", n)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"detect_s", p.Detect}, {"hop_s", p.Hop}, {"per_message_s", p.PerMessage}, {"per_id_s", p.PerID}, {"extra_round_trips", p.ExtraRoundTrips}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return ShrinkTime{}, fmt.Errorf("shrink model: %s = %v: want a finite value ≥ 0", f.name, f.v)
		}
	}
	if p.CoordFailures < 0 || p.CoordFailures >= n-1 {
		return ShrinkTime{}, fmt.Errorf("shrink model: %d coordinator failures among %d ranks", p.CoordFailures, n)
	}
	m := float64(n - 1) // the members a coordinator talks to
	t := ShrinkTime{Ballots: 1 + p.CoordFailures}
	t.RoundTrips = 3 + float64(p.CoordFailures)*p.ExtraRoundTrips
	changes := float64(1 + p.CoordFailures)
	perBallot := 6*m*p.PerMessage + DeltaIDsPerMember*m*changes*p.PerID
	if p.WholeView {
		perBallot = 6*m*p.PerMessage + 2*m*m*p.PerID
	}
	t.Detect = p.Detect
	t.Agree = t.RoundTrips*2*p.Hop + float64(t.Ballots)*perBallot + float64(p.CoordFailures)*p.Detect
	setup, err := Init(n-1, p.Setup)
	if err != nil {
		return ShrinkTime{}, fmt.Errorf("shrink model: setup: %w", err)
	}
	t.Setup = setup.Connect
	if p.Rebootstrap {
		t.Setup = setup.Total
	}
	t.Total = t.Detect + t.Agree + t.Setup
	return t, nil
}
