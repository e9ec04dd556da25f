package choose

import (
	"math"
	"math/bits"

	"github.com/gocoll/gocoll/engine/sched"
)

// The measured choice across hosts. The cost model sees what a schedule
// moves over which link, not how the executor overlaps its sends,
// receives and folds, so where it predicts two schedules about even (the
// ring and halving–doubling on two hosts move the same bytes) the one that
// runs faster depends on the machine. A communicator that spans hosts
// times those contenders once, when it is created, at the sizes of
// TuneSizes (the engine's tune.go: the protocol, the budget, the cache),
// and every rank keeps the same table. Unlike the one-host paths
// (shmcoll's choosePath), which fold in one order whichever runs, these
// schedules add in different orders: so the table is fixed before the
// first call and never changes during a job, and it is cached per host
// set, so that a rerun on the same hosts takes the same schedules and
// gives the same bytes.

// TuneSizes are the vector sizes a calibration times, smallest first: each
// stands for the calls within a factor of two of it (Measured.pick). The
// calibration stops before a size it predicts would overrun its budget,
// so on a slow link only the small ones are timed; calls above the
// largest timed class stay with the model.
var TuneSizes = []int{256 << 10, 1 << 20, 4 << 20, 16 << 20}

// contendWithin: a schedule is timed when the model predicts it within
// this factor of the fastest it predicts, at every rate it predicts at
// (the model's error where executors overlap differently is about this
// large: docs/tuning.md, "Across hosts").
// keepWithin: the model's pick stays unless a contender measured faster
// by more than this factor: the same rule against noise as shmcoll's
// slotsNum/slotsDen (where schedules run within the noise of each other,
// as all of them do on two hosts of one rank, three calls would otherwise
// pick one by chance).
const (
	contendWithin = 1.5
	keepWithin    = 0.9
)

// Measured is a calibration's table: for each TuneSizes class of AllReduce
// timed, the entry that runs it (nil: the class was not timed).
type Measured struct {
	AllReduce []*Entry // indexed like TuneSizes
}

// pick returns the measured entry for a call of shape s, or nil.
func (m *Measured) pick(s Shape) *Entry {
	if m == nil || s.Coll != sched.AllReduce {
		return nil
	}
	k := TuneClass(s.Bytes)
	if k < 0 || k >= len(m.AllReduce) {
		return nil
	}
	if a := m.AllReduce[k]; a != nil && a.Can(s) {
		return a
	}
	return nil
}

// TuneClass is the index of the TuneSizes entry within a factor of two of
// bytes (b/2 < bytes <= 2b), or -1.
func TuneClass(bytes int) int {
	if bytes <= 0 {
		return -1
	}
	l := bits.Len(uint(bytes - 1)) // ceil(log2(bytes))
	for k, b := range TuneSizes {
		lb := bits.Len(uint(b - 1))
		if l == lb || l == lb+1 {
			return k
		}
	}
	return -1
}

// Contenders are the AllReduce schedules worth timing for a call of
// bytes on the communicator's placement: those the model predicts within
// contendWithin of the fastest at every rate it predicts at, the model's
// pick first. Fewer than two: nothing to time (the model's pick stands).
func (ch *Chooser) Contenders(bytes int, s Shape) []*Entry {
	if ch.Model == nil {
		return nil
	}
	s.Coll, s.Bytes = sched.AllReduce, bytes
	var cands []*Entry
	for _, a := range byColl[s.Coll] {
		if a.Build != nil && a.can(s) {
			cands = append(cands, a)
		}
	}
	pick := ch.Model.pick(s, cands)
	if pick == nil {
		return nil
	}
	times := ch.Model.predict(s, cands)
	out := []*Entry{pick}
	for _, a := range cands {
		if a == pick || times[a] == nil {
			continue
		}
		ok := true
		for m, t := range times[a] {
			best := math.Inf(1)
			for _, ts := range times {
				if ts != nil {
					best = min(best, ts[m])
				}
			}
			ok = ok && t <= contendWithin*best
		}
		if ok {
			out = append(out, a)
		}
	}
	return out
}

// Decide is the rule that turns agreed times into a choice: times[i] is
// contender i's time (the least of its timed calls, each the slowest
// rank's), contenders[0] the model's pick, which stays unless another ran
// faster by more than keepWithin. Every rank passes the same agreed
// numbers, so every rank decides alike.
func Decide(contenders []*Entry, times []float64) *Entry {
	best := 0
	for i := range contenders {
		if times[i] < times[best] {
			best = i
		}
	}
	if best != 0 && times[best] < keepWithin*times[0] {
		return contenders[best]
	}
	return contenders[0]
}
