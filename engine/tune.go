package engine

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine/internal/choose"
	"github.com/gocoll/gocoll/engine/sched"
)

// The calibration of a communicator across hosts (GOCOLL_TUNE): why it
// exists and how a table is used is in engine/internal/choose/measured.go;
// here is how the ranks make one table together.
//
// One allreduce (MAX) comes first, on every communicator that spans hosts:
// whether any rank has it off (GOCOLL_TUNE=off, or GOCOLL_ALGO naming the
// allreduce), whether any asks to redo it, and rank 0's cached table, if
// it has one for this placement. Then, unless off or cached, for each size
// of choose.TuneSizes the model's contenders run one untimed and tuneReps
// timed calls each, in rounds; a second allreduce (MAX) makes every rank hold the
// slowest rank's time of each call, from which every rank decides alike
// (choose.Decide) and predicts the next size's cost (the first size's by
// the cost model), stopping before it would pass tuneBudget. Rank 0 writes
// the table to the cache. An error in any call fails the communicator's
// creation, as any failed call of the setup does.

const (
	tuneReps = 3
	// tuneBudget bounds the calibration's timed calls (what the ranks
	// agreed they took; the untimed first call of each is about one more):
	// a chooser rule, paid once per host set and CPU, not per job.
	tuneBudget = 500 * time.Millisecond
	// tuneVersion is part of the cache's key: a change to how a table is
	// made invalidates the tables made before.
	tuneVersion = 1
)

// TuneTable is a table cached by GOCOLL_TUNE: the key it was made for,
// the placement and CPU it was timed on, and the algorithm per size with
// the agreed times that chose it. gocoll-topo -tuned prints them.
type TuneTable struct {
	Key       string             `json:"key"`
	Made      string             `json:"made"`
	Placement string             `json:"placement"`
	CPU       string             `json:"cpu"`
	AllReduce map[string]string  `json:"allreduce"` // bytes → algorithm
	Times     map[string]TuneRow `json:"times,omitempty"`
}

// TuneRow is the agreed time of each contender at one size, in seconds.
type TuneRow map[string]float64

// tune calibrates c if it spans hosts (choose.Measured): every rank of a
// new communicator calls it before the communicator is returned.
func (c *Comm) tune() error { return c.tuneWithin(tuneBudget) }

// tuneWithin is tune with the timed calls bounded by budget.
func (c *Comm) tuneWithin(budget time.Duration) error {
	if c.choice.Model == nil || c.size < 2 {
		return nil
	}
	sizes := choose.TuneSizes
	// v: off, redo, cached, then rank 0's cached entry ID+1 per size.
	v := make([]int64, 3+len(sizes))
	if c.opts.Tune == "off" || c.choice.Overrides.Forces(sched.AllReduce) {
		v[0] = 1
	}
	if c.opts.Tune == "redo" {
		v[1] = 1
	}
	// Only rank 0 reads and writes the cache, so only it needs the key.
	key, desc, path := "", "", ""
	if c.rank == 0 {
		key, desc = c.tuneKey()
		if dir, err := TuneCacheDir(); err == nil {
			path = filepath.Join(dir, "tune-"+key+".json")
		}
		if v[0] == 0 && v[1] == 0 && path != "" {
			if ids, ok := readTune(path, key); ok {
				v[2] = 1
				copy(v[3:], ids)
			}
		}
	}
	if err := c.agreeMax(asBytes(v), len(v), Int64); err != nil {
		return fmt.Errorf("gocoll: rank %d: calibrating the allreduce across hosts: %w", c.rank, err)
	}
	if v[0] != 0 {
		return nil
	}
	m := &choose.Measured{AllReduce: make([]*choose.Entry, len(sizes))}
	if v[1] == 0 && v[2] != 0 {
		reg := choose.Registry()
		for k, id := range v[3:] {
			if id > 0 && int(id) <= len(reg) && reg[id-1].Coll == sched.AllReduce {
				m.AllReduce[k] = reg[id-1]
			}
		}
		c.choice.Measured = m
		c.log.Info("allreduce table from the cache", "file", path)
		return nil
	}
	file := TuneTable{Key: key, Placement: desc, CPU: cpuModel(), AllReduce: map[string]string{}, Times: map[string]TuneRow{}}
	if err := c.measure(m, &file, budget); err != nil {
		return fmt.Errorf("gocoll: rank %d: calibrating the allreduce across hosts: %w", c.rank, err)
	}
	c.choice.Measured = m
	if c.rank == 0 && path != "" {
		file.Made = time.Now().UTC().Format(time.RFC3339)
		if err := writeTune(path, file); err != nil {
			c.log.Warn("allreduce table not cached", "file", path, "err", err)
		}
	}
	return nil
}

// TuneCacheDir is where GOCOLL_TUNE's tables are cached: gocoll in the
// user's cache dir ($XDG_CACHE_HOME, else ~/.cache).
func TuneCacheDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "gocoll"), nil
}

// CachedTuneTables reads every table in TuneCacheDir, with the files'
// names; a file that is not a table is skipped.
func CachedTuneTables() (names []string, tables []TuneTable, err error) {
	dir, err := TuneCacheDir()
	if err != nil {
		return nil, nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "tune-*.json"))
	if err != nil {
		return nil, nil, err
	}
	for _, name := range files {
		var f TuneTable
		if b, err := os.ReadFile(name); err == nil && json.Unmarshal(b, &f) == nil && f.Key != "" {
			names, tables = append(names, name), append(tables, f)
		}
	}
	return names, tables, nil
}

// measure times the contenders of each size into m and file.
func (c *Comm) measure(m *choose.Measured, file *TuneTable, budget time.Duration) error {
	sizes := choose.TuneSizes
	shape := choose.Shape{N: c.size, Hosts: len(c.layout.hosts), Even: c.layout.evenHosts}
	buf := make([]byte, slices.Max(sizes))
	orig := c.choice.Overrides
	defer func() { c.choice.Overrides = orig }()
	spent, last, lastSize := 0.0, 0.0, 0
	for k, size := range sizes {
		cs := c.choice.Contenders(size, shape)
		if len(cs) < 2 {
			continue
		}
		// What timing this size would take: from the last size timed
		// (4× the size, 4× the time) or, before any, from the model's
		// prediction at the slowest rate it predicts at, which bounds the
		// first size too on many ranks or a slow link. Every rank
		// computes the same, so all stop at the same size.
		est := float64(tuneReps+1) * c.choice.Predicted(size, shape, cs)
		if last > 0 {
			est = float64((tuneReps+1)*len(cs)) * last * float64(size) / float64(lastSize)
		}
		if spent+est > budget.Seconds() {
			break
		}
		// Round by round, every contender once per round (an untimed
		// round first), so that a burst of other work on the machine
		// slows one call of each rather than every call of one. Each call
		// starts from a barrier, as a job's calls start from the compute
		// between them: back to back, one call's tail would overlap the
		// next call's start, more for some schedules than for others.
		times := make([]float64, len(cs)*tuneReps)
		for r := -1; r < tuneReps; r++ {
			for i, a := range cs {
				c.choice.Overrides = orig
				if err := c.Barrier(); err != nil {
					return err
				}
				c.choice.Overrides = orig.Force(a)
				t0 := time.Now()
				if err := c.AllReduce(buf[:size], buf[:size], size/4, Float32, Sum); err != nil {
					return err
				}
				if r >= 0 {
					times[i*tuneReps+r] = time.Since(t0).Seconds()
				}
			}
		}
		c.choice.Overrides = orig
		if err := c.agreeMax(asBytes(times), len(times), Float64); err != nil {
			return err
		}
		best := make([]float64, len(cs))
		row := TuneRow{}
		for i, a := range cs {
			best[i] = slices.Min(times[i*tuneReps : (i+1)*tuneReps])
			row[a.Name] = best[i]
		}
		for _, t := range times {
			spent += t
		}
		m.AllReduce[k] = choose.Decide(cs, best)
		file.AllReduce[strconv.Itoa(size)] = m.AllReduce[k].Name
		file.Times[strconv.Itoa(size)] = row
		last, lastSize = slices.Min(best), size
	}
	c.log.Info("allreduce across hosts timed", "table", file.AllReduce, "seconds", spent)
	return nil
}

// agreeMax replaces b (n elements of dt) by its maximum over the ranks,
// by recursive doubling whatever GOCOLL_ALGO says (a maximum is the same
// whichever schedule takes it): ranks whose GOCOLL_ALGO differ must
// still agree here, to learn that one of them turns the calibration off.
func (c *Comm) agreeMax(b []byte, n int, dt DataType) error {
	orig := c.choice.Overrides
	defer func() { c.choice.Overrides = orig }()
	c.choice.Overrides = orig.Force(choose.Lookup(sched.AllReduce, "rd"))
	return c.AllReduce(b, b, n, dt, Max)
}

// tuneKey names what a table holds for: the placement (ranks per host,
// the hosts' names), this host's CPU, the settings that shape the
// schedules, the registry's algorithms and tuneVersion. desc is the
// placement in words.
func (c *Comm) tuneKey() (key, desc string) {
	var b strings.Builder
	for h, ranks := range c.layout.hosts {
		name := ""
		if h < len(c.layout.hostNames) {
			name = c.layout.hostNames[h]
		}
		fmt.Fprintf(&b, "%s:%d ", name, len(ranks))
	}
	desc = strings.TrimSpace(b.String())
	sum := sha256.Sum256(fmt.Appendf(nil, "%d|%s|%v|%s|%d|%d|%g|%s", tuneVersion, desc, c.layout.rings, cpuModel(),
		c.opts.Segments, c.opts.BruckRadix, c.opts.NetBandwidth, choose.Known()))
	return hex.EncodeToString(sum[:8]), desc
}

// readTune returns the entry IDs+1 per size of the table at path, if it
// is one for key.
func readTune(path, key string) ([]int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	var f TuneTable
	if json.Unmarshal(b, &f) != nil || f.Key != key {
		return nil, false
	}
	ids := make([]int64, len(choose.TuneSizes))
	for k, size := range choose.TuneSizes {
		if name, ok := f.AllReduce[strconv.Itoa(size)]; ok {
			a := choose.Lookup(sched.AllReduce, name)
			if a == nil {
				return nil, false
			}
			ids[k] = int64(a.ID + 1)
		}
	}
	return ids, true
}

// writeTune writes f to path whole or not at all (a rename), so that a
// job reading it never sees half a table.
func writeTune(path string, f TuneTable) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tune-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// cpuModel is this host's CPU as /proc/cpuinfo names it ("" if unknown).
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// asBytes views a vector of 8-byte numbers as its bytes, for a call's
// buffer.
func asBytes[T int64 | float64](v []T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*8)
}
