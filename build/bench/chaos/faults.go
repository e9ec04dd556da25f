package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine/hostiletest"
)

// armNext waits for the next fault's trigger; AfterPrev's is there already.
func (j *job) armNext() {
	j.armed = false
	if j.next >= len(j.rec.Schedule.Faults) {
		return
	}
	w := j.rec.Schedule.Faults[j.next].When
	if w.Phase == AfterPrev || (w.Phase == AtStep && j.progress >= w.N) {
		j.trigger()
	}
}

// trigger fires the next fault after its delay.
func (j *job) trigger() {
	j.armed = true
	i := j.next
	d := j.rec.Schedule.Faults[i].When.Delay
	time.AfterFunc(d, func() { j.fire <- func() { j.fireFault(i) } })
}

func (j *job) fireFault(i int) {
	f := j.rec.Schedule.Faults[i]
	detail := "no process to " + string(f.Kind) + " (" + f.Target.String() + ")"
	if p := j.resolve(f.Target); p != nil {
		detail = j.do(f, p)
	}
	j.say("chaos: fault %d (%s): %s", i+1, f, detail)
	j.next = i + 1
	j.armNext()
}

// do applies fault f to p and says what it did. The record learns what
// happened to p from that line (harnessLine), as a replay of the log does.
func (j *job) do(f Fault, p *Proc) string {
	who := fmt.Sprintf("%s (pid %d, rank %d now)", p.Name, p.Pid, p.rank)
	switch f.Kind {
	case Kill:
		if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil {
			return fmt.Sprintf("SIGKILL %s: %v", who, err)
		}
		return "SIGKILL " + who
	case Stop:
		if err := syscall.Kill(p.Pid, syscall.SIGSTOP); err != nil {
			return fmt.Sprintf("SIGSTOP %s: %v", who, err)
		}
		p.stoppedNow = true
		time.AfterFunc(f.Dur, func() {
			j.fire <- func() {
				if p.stoppedNow {
					syscall.Kill(p.Pid, syscall.SIGCONT)
					p.stoppedNow = false
					j.say("chaos: SIGCONT %s after %v", p.Name, f.Dur)
				}
			}
		})
		return fmt.Sprintf("SIGSTOP %s for %v", who, f.Dur)
	case Flood:
		return j.flood(f, p, who)
	case Slow:
		return j.slow(f, p, who)
	}
	return "unknown fault"
}

// flood holds f.Conns idle connections on p's listening ports (one of
// them, or spread over all) for f.Dur, as engine/hostiletest does.
func (j *job) flood(f Fault, p *Proc, who string) string {
	ports, err := hostiletest.ListeningPorts(p.Pid)
	if err != nil || len(ports) == 0 {
		return fmt.Sprintf("flood %s: no listening port (%v)", who, err)
	}
	slices.SortFunc(ports, func(a, b netip.AddrPort) int { return int(a.Port()) - int(b.Port()) })
	if f.Port >= 0 {
		ports = ports[f.Port%len(ports) : f.Port%len(ports)+1]
	}
	var targets []hostiletest.Target
	for k := range f.Conns {
		targets = append(targets, hostiletest.Target{Addr: hostiletest.Dialable(ports[k%len(ports)]), Proto: hostiletest.Gocoll, Rank: k % 64})
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.Dur)
	j.stopAll = append(j.stopAll, cancel)
	go func() {
		out := hostiletest.Hold(ctx, targets...).Wait()
		cancel()
		j.fire <- func() { j.say("chaos: flood of %s over: %s", p.Name, hostiletest.Summary(out)) }
	}()
	return fmt.Sprintf("flood %s: %d idle connections on %v for %v", who, f.Conns, ports, f.Dur)
}

// slow limits the link of p's emulated host to f.Rate for f.Dur.
func (j *job) slow(f Fault, p *Proc, who string) string {
	if j.hosts == nil || p.Host < 0 {
		return "slow link of " + who + ": not on an emulated host"
	}
	if err := j.hosts.limit(p.Host, f.Rate); err != nil {
		return fmt.Sprintf("slow link of host %d (%s): %v", p.Host, who, err)
	}
	time.AfterFunc(f.Dur, func() {
		j.fire <- func() {
			err := j.hosts.limit(p.Host, "")
			j.say("chaos: link of host %d back to its rate after %v (%v)", p.Host, f.Dur, err)
		}
	})
	return fmt.Sprintf("link of host %d (%s) at %s for %v", p.Host, who, f.Rate, f.Dur)
}

// resolve picks the process a target names among the live ones now.
func (j *job) resolve(t Target) *Proc {
	var members, joiners []*Proc
	for _, p := range j.rec.Procs {
		if p.gone || p.Killed || p.stoppedNow || p.Exit != "" {
			continue
		}
		if p.Joiner && !p.Admitted {
			joiners = append(joiners, p)
			continue
		}
		members = append(members, p)
	}
	// A shrink keeps the survivors' order and a grow appends: rank 0 is
	// the first live member in start order.
	var coord *Proc
	if len(members) > 0 {
		coord = members[0]
	}
	switch t.Role {
	case Coordinator:
		if coord != nil {
			return coord
		}
	case NonCoord:
		members = slices.DeleteFunc(members, func(p *Proc) bool { return p == coord })
	case Joiner:
		all := slices.DeleteFunc(slices.Clone(j.rec.Procs), func(p *Proc) bool { return !p.Joiner || p.gone || p.Killed || p.Exit != "" })
		if len(all) == 0 {
			return nil
		}
		return all[len(all)-1]
	}
	if len(members) == 0 {
		return nil
	}
	return members[t.Pick%len(members)]
}
