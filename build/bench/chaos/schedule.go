package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Kind is what a fault does to its target.
type Kind string

const (
	Kill  Kind = "kill"  // SIGKILL
	Stop  Kind = "stop"  // SIGSTOP for Dur, then SIGCONT
	Flood Kind = "flood" // Conns idle TCP connections on the target's listening ports for Dur
	Slow  Kind = "slow"  // the target's host link limited to Rate for Dur (emulated hosts only)
)

// Role says which process a fault hits, resolved when it fires among the
// processes alive then, so that a replay hits the same one.
type Role string

const (
	Member      Role = "member"          // the Pick-th live member (start order, modulo their number)
	Coordinator Role = "coordinator"     // the live member that is rank 0 of the job now
	NonCoord    Role = "non-coordinator" // the Pick-th live member that is not
	Joiner      Role = "joiner"          // the latest replacement process
)

// Phase is the log event a trigger waits for (docs/elastic.md, "Chaos
// harness", lists the lines each matches).
type Phase string

const (
	AtStep            Phase = "step"             // the job's progress reached N (sgd steps, C calls)
	AfterPrev         Phase = "after"            // the previous fault fired
	OnFailed          Phase = "failed"           // a rank logged "communicator failed"
	OnShrink          Phase = "shrink"           // a rank logged that its shrink started
	OnAgreed          Phase = "agreed"           // a rank logged the agreement's view
	OnConnected       Phase = "connected"        // a rank connected a new communicator
	OnShrunk          Phase = "shrunk"           // a rank logged "shrunk"
	OnRecovered       Phase = "recovered"        // the job went on (sgd: "lost rank(s)"; C: a new VIEW)
	OnJoinerStarted   Phase = "joiner-started"   // a replacement process started
	OnJoinerConnected Phase = "joiner-connected" // the replacement connected the grown communicator
	OnAdmitted        Phase = "admitted"         // the job went on with the replacement
)

// Trigger is when a fault fires: the first event of Phase after the
// previous fault fired (for AtStep: once progress reaches N), then Delay.
type Trigger struct {
	Phase Phase
	N     int
	Delay time.Duration
}

// Target picks the process.
type Target struct {
	Role Role
	Pick int
}

// Fault is one step of a schedule.
type Fault struct {
	Kind   Kind
	Target Target
	When   Trigger
	Dur    time.Duration // Stop, Flood, Slow
	Conns  int           // Flood
	Port   int           // Flood: the index of the port among the target's listening ones; -1: all of them
	Rate   string        // Slow: tc tbf rate
}

// Schedule is everything one run does, a pure function of the seed and
// the planning settings: the same seed replays it.
type Schedule struct {
	Seed      uint64
	Workload  string // "sgd" or "c"
	Transport string // GOCOLL_TRANSPORT: "auto" (shared memory inside a host) or "tcp"
	Scenario  string
	Faults    []Fault
}

// planConfig is what a schedule depends on besides the seed.
type planConfig struct {
	Workload  string         // "sgd", "c", or "any": drawn from the seed
	Transport string         // "auto", "tcp", or "any": drawn from the seed
	Timeout   time.Duration  // GOCOLL_TIMEOUT of the job
	Steps     map[string]int // progress units of a run per workload (sgd steps, C calls); faults start in its first half
	Netns     bool           // emulated hosts: slow links can be drawn; floods cannot (the harness cannot reach the hosts)
}

// scenario builds the faults of one named scenario; at is the progress
// at which its first fault fires.
type scenario struct {
	name  string
	netns int // 0: any, 1: emulated hosts only, -1: loopback only
	build func(r *rand.Rand, p planConfig, at int) []Fault
}

var scenarios = []scenario{
	{"kill", 0, func(r *rand.Rand, p planConfig, at int) []Fault {
		return []Fault{kill(anyMember(r), step(r, at))}
	}},
	{"kill-in-phase", 0, func(r *rand.Rand, p planConfig, at int) []Fault {
		// A second death inside each phase of the recovery.
		phases := []Phase{OnFailed, OnShrink, OnAgreed, OnConnected, OnShrunk, OnRecovered}
		return []Fault{kill(anyMember(r), step(r, at)), kill(nonCoordOr(r), on(r, phases[r.IntN(len(phases))], 30))}
	}},
	{"stop-past-timeout", 0, func(r *rand.Rand, p planConfig, at int) []Fault {
		return []Fault{stop(coordOr(r), step(r, at), long(r, p))}
	}},
	{"stop-short", 0, func(r *rand.Rand, p planConfig, at int) []Fault {
		return []Fault{stop(coordOr(r), step(r, at), scale(p.Timeout, 0.1+0.3*r.Float64()))}
	}},
	{"kill-then-pause-coordinator", 0, func(r *rand.Rand, p planConfig, at int) []Fault {
		// The second split brain: a rank dies, the coordinator is
		// paused past the timeout while the others recover.
		phases := []Phase{OnFailed, OnShrink, AfterPrev}
		return []Fault{kill(Target{Role: NonCoord, Pick: r.IntN(64)}, step(r, at)),
			stop(Target{Role: Coordinator}, on(r, phases[r.IntN(len(phases))], 20), long(r, p))}
	}},
	{"flood-then-kill", -1, func(r *rand.Rand, p planConfig, at int) []Fault {
		// The first split brain: idle connections hold a rank's
		// ports, then another rank dies.
		return []Fault{flood(r, p, coordOr(r), step(r, at)),
			kill(Target{Role: NonCoord, Pick: r.IntN(64)}, Trigger{Phase: AfterPrev, Delay: ms(50 + r.IntN(450))})}
	}},
	{"flood", -1, func(r *rand.Rand, p planConfig, at int) []Fault {
		return []Fault{flood(r, p, anyMember(r), step(r, at))}
	}},
	{"kill-joiner", 0, func(r *rand.Rand, p planConfig, at int) []Fault {
		phases := []Phase{OnJoinerStarted, OnRecovered, OnJoinerConnected, OnAdmitted}
		ph := phases[r.IntN(len(phases))]
		d := 20
		if ph == OnRecovered {
			d = 300 // the replacement is then waiting in Join or in the grow
		}
		return []Fault{kill(anyMember(r), step(r, at)), kill(Target{Role: Joiner}, on(r, ph, d))}
	}},
	{"slow-link-then-kill", 1, func(r *rand.Rand, p planConfig, at int) []Fault {
		f := Fault{Kind: Slow, Target: anyMember(r), When: step(r, at), Dur: scale(p.Timeout, 2+2*r.Float64()),
			Rate: []string{"2mbit", "5mbit", "20mbit"}[r.IntN(3)]}
		return []Fault{f, kill(anyMember(r), Trigger{Phase: AfterPrev, Delay: ms(100 + r.IntN(900))})}
	}},
	{"mixed", 0, mixed},
}

// mixed chains two or three faults drawn from every kind.
func mixed(r *rand.Rand, p planConfig, at int) []Fault {
	n := 2 + r.IntN(2)
	var fs []Fault
	for i := range n {
		when := step(r, at)
		if i > 0 {
			phases := []Phase{AfterPrev, OnFailed, OnShrink, OnAgreed, OnConnected, OnShrunk, OnRecovered}
			when = on(r, phases[r.IntN(len(phases))], 200)
		}
		kinds := []Kind{Kill, Kill, Stop}
		if !p.Netns {
			kinds = append(kinds, Flood)
		}
		switch k := kinds[r.IntN(len(kinds))]; k {
		case Kill:
			fs = append(fs, kill(anyMember(r), when))
		case Stop:
			d := long(r, p)
			if r.IntN(2) == 0 {
				d = scale(p.Timeout, 0.1+0.3*r.Float64())
			}
			fs = append(fs, stop(coordOr(r), when, d))
		case Flood:
			fs = append(fs, flood(r, p, coordOr(r), when))
		}
	}
	return fs
}

// plan draws the schedule of seed.
func plan(seed uint64, p planConfig) Schedule {
	r := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos"
	// Both are drawn whatever is asked, so that a seed's faults do not
	// depend on -workload and -transport.
	s := Schedule{Seed: seed, Workload: []string{"sgd", "c"}[r.IntN(2)], Transport: []string{"auto", "tcp"}[r.IntN(2)]}
	if p.Workload != "any" && p.Workload != "" {
		s.Workload = p.Workload
	}
	if p.Transport != "any" && p.Transport != "" {
		s.Transport = p.Transport
	}
	var pool []scenario
	for _, sc := range scenarios {
		if sc.netns == 0 || (sc.netns == 1) == p.Netns {
			pool = append(pool, sc)
		}
	}
	sc := pool[r.IntN(len(pool))]
	s.Scenario = sc.name
	// The first fault lands in the first half of the run, after a tenth of
	// it: training is under way and there is time left to recover and grow.
	// (Drawn as a fraction, so that the draws after it do not depend on
	// the run's length.)
	at := max(1, int(float64(p.Steps[s.Workload])*(0.1+0.4*r.Float64())))
	s.Faults = sc.build(r, p, at)
	return s
}

func kill(t Target, w Trigger) Fault { return Fault{Kind: Kill, Target: t, When: w} }

func stop(t Target, w Trigger, d time.Duration) Fault {
	return Fault{Kind: Stop, Target: t, When: w, Dur: d}
}

func flood(r *rand.Rand, p planConfig, t Target, w Trigger) Fault {
	port := -1
	if r.IntN(2) == 0 {
		port = r.IntN(8)
	}
	return Fault{Kind: Flood, Target: t, When: w, Conns: 20 + r.IntN(45), Port: port, Dur: scale(p.Timeout, 2+2*r.Float64())}
}

func step(r *rand.Rand, at int) Trigger { return Trigger{Phase: AtStep, N: at, Delay: ms(r.IntN(20))} }

func on(r *rand.Rand, ph Phase, maxDelayMS int) Trigger {
	return Trigger{Phase: ph, Delay: ms(r.IntN(maxDelayMS + 1))}
}

func anyMember(r *rand.Rand) Target { return Target{Role: Member, Pick: r.IntN(64)} }

// coordOr is the coordinator half of the time: pausing or flooding rank
// 0 is where the agreement is weakest.
func coordOr(r *rand.Rand) Target {
	if r.IntN(2) == 0 {
		return Target{Role: Coordinator}
	}
	return anyMember(r)
}

func nonCoordOr(r *rand.Rand) Target {
	if r.IntN(3) == 0 {
		return Target{Role: Coordinator}
	}
	return Target{Role: NonCoord, Pick: r.IntN(64)}
}

// long is a pause past the timeout: 1.5 to 2.5 of it.
func long(r *rand.Rand, p planConfig) time.Duration { return scale(p.Timeout, 1.5+r.Float64()) }

func scale(d time.Duration, f float64) time.Duration {
	return (time.Duration(float64(d)*f) / time.Millisecond) * time.Millisecond
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func (t Target) String() string {
	if t.Role == Member || t.Role == NonCoord {
		return fmt.Sprintf("%s#%d", t.Role, t.Pick)
	}
	return string(t.Role)
}

func (w Trigger) String() string {
	s := "on " + string(w.Phase)
	switch w.Phase {
	case AtStep:
		s = fmt.Sprintf("at step %d", w.N)
	case AfterPrev:
		s = "after the previous"
	}
	if w.Delay > 0 {
		s += fmt.Sprintf(" +%v", w.Delay)
	}
	return s
}

func (f Fault) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", f.Kind, f.Target, f.When)
	switch f.Kind {
	case Stop:
		fmt.Fprintf(&b, " for %v", f.Dur)
	case Flood:
		port := "all ports"
		if f.Port >= 0 {
			port = fmt.Sprintf("port #%d", f.Port)
		}
		fmt.Fprintf(&b, " (%d idle connections, %s, for %v)", f.Conns, port, f.Dur)
	case Slow:
		fmt.Fprintf(&b, " (link at %s for %v)", f.Rate, f.Dur)
	}
	return b.String()
}

// Job says what ran: "sgd over tcp".
func (s Schedule) Job() string { return s.Workload + " over " + s.Transport }

func (s Schedule) String() string {
	parts := make([]string, len(s.Faults))
	for i, f := range s.Faults {
		parts[i] = f.String()
	}
	return fmt.Sprintf("%s: %s", s.Scenario, strings.Join(parts, "; "))
}
