package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Profile adds up where a rank's training steps go, phase by phase
// (-profile): the per-step breakdown compares plain data parallelism with
// virtual devices on the same processes. A nil *Profile records nothing.
type Profile struct {
	Phases []string        `json:"phases"`
	Totals []time.Duration `json:"totals"`
	Steps  int             `json:"steps"`
	last   time.Time
}

// Phases of a step, as the two training loops name them.
const (
	phaseLoad      = "load"      // copying the shard's examples into the input tensors
	phaseBackward  = "backward"  // the forward and backward pass (Pass), all local devices
	phasePack      = "pack"      // plain: gradients into buckets, allreduces issued
	phaseAllReduce = "allreduce" // waiting for the (virtual) allreduce
	phaseUnpack    = "unpack"    // plain: averaged gradients out of the buckets
	phaseUpdate    = "update"    // the optimizer step(s)
)

func newProfile(on bool) *Profile {
	if !on {
		return nil
	}
	return &Profile{}
}

// Start begins timing at the top of a step's first phase.
func (p *Profile) Start() {
	if p != nil {
		p.last = time.Now()
	}
}

// Mark charges the time since the last mark to phase.
func (p *Profile) Mark(phase string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.Add(phase, now.Sub(p.last))
	p.last = now
}

// Add charges d to phase.
func (p *Profile) Add(phase string, d time.Duration) {
	if p == nil {
		return
	}
	for i, n := range p.Phases {
		if n == phase {
			p.Totals[i] += d
			return
		}
	}
	p.Phases = append(p.Phases, phase)
	p.Totals = append(p.Totals, d)
}

// Step counts one training step.
func (p *Profile) Step() {
	if p != nil {
		p.Steps++
	}
}

// Write prints one line: milliseconds per step of every phase, and their sum.
func (p *Profile) Write(w io.Writer, label string) {
	if p == nil || p.Steps == 0 {
		return
	}
	var parts []string
	var sum time.Duration
	for i, n := range p.Phases {
		parts = append(parts, fmt.Sprintf("%s %.3f", n, msPerStep(p.Totals[i], p.Steps)))
		sum += p.Totals[i]
	}
	fmt.Fprintf(w, "profile (%s, rank 0, ms per step over %d steps): %s = %.3f\n", label, p.Steps, strings.Join(parts, " + "), msPerStep(sum, p.Steps))
}

func msPerStep(d time.Duration, steps int) float64 {
	return 1e3 * d.Seconds() / float64(steps)
}
