package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func setupParams() InitParams {
	return InitParams{RootPerRank: 50e-6, Hop: 10e-6, Bandwidth: 1e9, AddrBytes: 64, Handshake: 200e-6, Roots: 4, FanOut: 4}
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.9g, want %.9g", what, got, want)
	}
}

// The init model's phases, worked out by hand for 1,024 ranks, 4 roots,
// fan-out 4: 256 ranks per root, a 64 KiB table (65.536 µs at 1 GB/s).
func TestInitByHand(t *testing.T) {
	got, err := Init(1024, setupParams())
	if err != nil {
		t.Fatal(err)
	}
	// 10 µs + 256 × 50 µs, then 2 doubling steps of 10 µs and ¾ of the table.
	near(t, "gather", got.Gather, 10e-6+256*50e-6+2*10e-6+0.75*65.536e-6)
	// 1+4+16+64+256 ≥ 256: 4 levels, each 10 µs + 4 tables.
	near(t, "spread", got.Spread, 4*(10e-6+4*65.536e-6))
	// 2 + log2(1024) = 12 neighbours, one after another.
	near(t, "connect", got.Connect, 10e-6+12*200e-6)
	near(t, "total", got.Total, got.Gather+got.Spread+got.Connect)
}

// More roots shorten the gather while the roots' per-rank work dominates;
// setup grows with the ranks; one rank connects nobody.
func TestInitShape(t *testing.T) {
	p := setupParams()
	prev := 0.0
	for _, n := range []int{1024, 4096, 16384, 65536} {
		got, err := Init(n, p)
		if err != nil {
			t.Fatal(err)
		}
		if got.Total <= prev {
			t.Errorf("%d ranks: %v s, not more than %v s at fewer", n, got.Total, prev)
		}
		prev = got.Total
	}
	one, _ := Init(65536, p)
	p.Roots = 64
	many, _ := Init(65536, p)
	if many.Gather >= one.Gather {
		t.Errorf("64 roots gather in %v s, 4 in %v s", many.Gather, one.Gather)
	}
	lone, err := Init(1, setupParams())
	if err != nil || lone.Connect != 0 || lone.Spread != 0 {
		t.Errorf("one rank: %+v, %v", lone, err)
	}
}

// A fan-out at least the ranks is a star, gocoll's one root: one level,
// the root sending the table to every other rank of its share, not to
// FanOut of them (the table's traffic through the root is quadratic).
func TestInitStar(t *testing.T) {
	p := setupParams()
	p.Roots, p.FanOut = 1, 1<<20
	for _, n := range []int{2, 1024, 65536} {
		got, err := Init(n, p)
		if err != nil {
			t.Fatal(err)
		}
		table := float64(n*p.AddrBytes) / p.Bandwidth
		near(t, fmt.Sprintf("star spread at %d ranks", n), got.Spread, p.Hop+float64(n-1)*table)
		near(t, fmt.Sprintf("star gather at %d ranks", n), got.Gather, p.Hop+float64(n)*p.RootPerRank)
	}
	// A tree whose last level is partial still charges FanOut sends a
	// level: the path to the last child is what counts.
	p.FanOut = 4
	got, _ := Init(6, p) // 1 + 4 + 1: two levels
	near(t, "partial tree", got.Spread, 2*(p.Hop+4*float64(6*p.AddrBytes)/p.Bandwidth))
}

// A tree's members below the root's children each take the table in
// before they forward it: one read a level but the first.
func TestInitTreeRead(t *testing.T) {
	p := setupParams()
	p.Roots, p.ReadBandwidth = 1, 0.5e9
	got, err := Init(1024, p)
	if err != nil {
		t.Fatal(err)
	}
	table := float64(1024*p.AddrBytes) / p.Bandwidth
	// 1+4+…+256+1024 ≥ 1024: 5 levels; 4 reads at half the bandwidth.
	near(t, "spread", got.Spread, 5*(p.Hop+4*table)+4*2*table)
	p.FanOut = 1 << 20 // a star: the one level has no read to wait for
	star, _ := Init(1024, p)
	near(t, "star spread", star.Spread, p.Hop+1023*table)
}

func TestInitBadParams(t *testing.T) {
	for _, tc := range []struct {
		edit func(*InitParams)
		want string
	}{
		{func(p *InitParams) { p.Hop = -1 }, "hop_s"},
		{func(p *InitParams) { p.RootPerRank = math.NaN() }, "root_per_rank_s"},
		{func(p *InitParams) { p.Bandwidth = 0 }, "bandwidth_Bps"},
		{func(p *InitParams) { p.ReadBandwidth = -1 }, "read_Bps"},
		{func(p *InitParams) { p.FanOut = 1 }, "fan_out"},
		{func(p *InitParams) { p.Roots = 0 }, "roots"},
	} {
		p := setupParams()
		tc.edit(&p)
		if _, err := Init(64, p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", p, err, tc.want)
		}
	}
	if _, err := Init(0, setupParams()); err == nil {
		t.Error("0 ranks: no error")
	}
}

// The shrink model by hand: 1,024 ranks, one coordinator failure.
func TestShrinkByHand(t *testing.T) {
	p := ShrinkParams{Detect: 0.5, Hop: 10e-6, PerMessage: 5e-6, PerID: 10e-9, CoordFailures: 1, ExtraRoundTrips: 1.5, Setup: setupParams()}
	got, err := Shrink(1024, p)
	if err != nil {
		t.Fatal(err)
	}
	m := 1023.0
	perBallot := 6*m*5e-6 + 8*m*2*10e-9 // two changes: the dead rank, the failed coordinator
	if got.Ballots != 2 || got.RoundTrips != 4.5 {
		t.Errorf("%d ballots, %v round trips; want 2, 4.5", got.Ballots, got.RoundTrips)
	}
	near(t, "agree", got.Agree, 4.5*20e-6+2*perBallot+0.5)
	near(t, "setup", got.Setup, 10e-6+12*200e-6) // 2 + ⌈log2 1023⌉ neighbours
	near(t, "total", got.Total, 0.5+got.Agree+got.Setup)
	p.Rebootstrap = true
	again, _ := Shrink(1024, p)
	full, _ := Init(1023, p.Setup)
	near(t, "setup with a new bootstrap", again.Setup, full.Total)
	p.WholeView = true
	whole, _ := Shrink(1024, p)
	near(t, "agree with whole views", whole.Agree, 4.5*20e-6+2*(6*m*5e-6+2*m*m*10e-9)+0.5)
}

// Whole views (history) made the coordinator's ids quadratic in the
// ranks; as differences they are linear: twice the ranks, about twice the
// time (the round trips add a constant). The bounds below follow from the
// test's own PerID, not from a measurement.
func TestShrinkIDs(t *testing.T) {
	p := ShrinkParams{Hop: 10e-6, PerID: 10e-9, Setup: setupParams(), WholeView: true}
	got, err := Shrink(65536, p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Agree < 60 {
		t.Errorf("agreement with whole views %v s at 65,536 ranks with 10 ns per id, want over a minute", got.Agree)
	}
	p.WholeView = false
	half, _ := Shrink(32768, p)
	got, _ = Shrink(65536, p)
	if got.Agree > 0.01 || math.Abs(got.Agree/half.Agree-2) > 0.05 {
		t.Errorf("agreement with differences %v s at 65,536 ranks, %v s at 32,768: want under 10 ms, and linear", got.Agree, half.Agree)
	}
}

func TestShrinkBadParams(t *testing.T) {
	p := ShrinkParams{Hop: 10e-6, Setup: setupParams()}
	if _, err := Shrink(1, p); err == nil {
		t.Error("one rank: no error")
	}
	p.CoordFailures = 63
	if _, err := Shrink(64, p); err == nil {
		t.Error("63 coordinator failures among 64: no error")
	}
	p.CoordFailures, p.PerMessage = 0, -1
	if _, err := Shrink(64, p); err == nil || !strings.Contains(err.Error(), "per_message_s") {
		t.Errorf("negative per-message cost: %v", err)
	}
	p.PerMessage, p.Setup.Roots = 0, 0
	if _, err := Shrink(64, p); err == nil || !strings.Contains(err.Error(), "roots") {
		t.Errorf("a setup without roots: %v", err)
	}
}

// The relay tree as built: the root above the ranks, FanOut children
// each level, and a handshake for each level of relay links; a job of at
// most FanOut ranks is the star, with no relay link.
func TestInitRelays(t *testing.T) {
	p := setupParams()
	p.Roots, p.FanOut, p.Relays = 1, 8, true
	got, err := Init(1024, p)
	if err != nil {
		t.Fatal(err)
	}
	table := 1024 * 64 / 1e9
	// 8 + 64 + 512 < 1,024 ≤ 8 + … + 4,096: 4 levels, 3 of relay links.
	near(t, "spread", got.Spread, 4*(10e-6+8*table)+3*200e-6)
	small, err := Init(8, p)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "spread of 8 ranks", small.Spread, 10e-6+8*(8*64/1e9))
	p.FanOut = 1 << 20
	star, _ := Init(1024, p)
	if star.Spread <= 10*got.Spread {
		t.Errorf("a star's spread %v s is not far above the relays' %v s at 1,024 ranks", star.Spread, got.Spread)
	}
}
