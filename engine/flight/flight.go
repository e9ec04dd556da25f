// Package flight is the format of a communicator's flight-recorder dump
// (what engine.Comm writes on a failure, on SIGUSR1 or when asked) and the
// diagnosis that gocoll-doctor prints from the dumps of every rank of a job.
// It depends on nothing in the engine so that a dump can be read wherever
// it was copied to.
package flight

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// States of a record.
const (
	StateOK       = "ok"
	StateError    = "error"
	StateInFlight = "in flight"
)

// Dump is one rank's view of one communicator at one moment.
type Dump struct {
	Host   string    `json:"host"`
	Pid    int       `json:"pid"`
	Rank   int       `json:"rank"`
	Size   int       `json:"size"`
	Comm   string    `json:"comm,omitempty"` // communicator id, equal on every rank
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"` // what asked for the dump: "failure", "SIGUSR1", "request"
	// Error is the error that made the communicator unusable, if any.
	Error string `json:"error,omitempty"`
	// Capacity is the ring's size; Total counts the operations begun since
	// the communicator was made (Total > Capacity: the oldest were dropped).
	Capacity int    `json:"capacity"`
	Total    uint64 `json:"total"`
	// Records are the last operations, oldest first, those still running
	// included; InFlight repeats the running ones.
	Records  []Record `json:"records"`
	InFlight []Record `json:"in_flight"`
	File     string   `json:"-"` // where it was read from
}

// Record is one operation.
type Record struct {
	N     uint64     `json:"n"` // the communicator's n-th operation, from 1
	Op    string     `json:"op"`
	Seq   uint64     `json:"seq"`           // collective sequence number (per peer and direction for send and recv)
	P2P   bool       `json:"p2p,omitempty"` // a send or a receive
	Bytes int64      `json:"bytes"`         // what the collective moves, as the algorithm choice sees it
	Type  string     `json:"datatype,omitempty"`
	Algo  string     `json:"algo,omitempty"` // algorithm chosen
	Start time.Time  `json:"start"`
	End   *time.Time `json:"end,omitempty"`
	// Micros is how long it ran, or had run when the dump was written.
	Micros float64 `json:"elapsed_us"`
	// Peer is the rank it last waited for, or the rank its error names
	// (-1: none known; the shared-memory collectives wait on all at once).
	Peer  int    `json:"peer"`
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// Describe is a short phrase for the record: "allreduce #12 (4096 B float32, ring)".
func (r Record) Describe() string {
	var parts []string
	if r.Bytes > 0 || r.Type != "" {
		s := fmt.Sprintf("%d B", r.Bytes)
		if r.Type != "" {
			s += " " + r.Type
		}
		parts = append(parts, s)
	}
	if r.Algo != "" {
		parts = append(parts, r.Algo)
	}
	s := fmt.Sprintf("%s #%d", r.Op, r.Seq)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// FileName is the dump file of a rank: one per host, process, rank and
// communicator, so that every rank of a job can share one directory.
func FileName(host string, pid, rank int, comm string) string {
	name := fmt.Sprintf("gocoll-dump-%s-%d-r%d", sanitize(host), pid, rank)
	if comm != "" {
		name += "-c" + sanitize(comm)
	}
	return name + ".json"
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r < ' ' {
			return '_'
		}
		return r
	}, s)
}

// ReadDir reads every gocoll-dump-*.json in dir. Files that are not dumps
// are reported in the error but do not stop the others being read.
func ReadDir(dir string) ([]Dump, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "gocoll-dump-*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var dumps []Dump
	var bad []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		var d Dump
		if err := json.Unmarshal(b, &d); err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		d.File = p
		dumps = append(dumps, d)
	}
	if len(dumps) == 0 && len(bad) == 0 {
		return nil, fmt.Errorf("no gocoll-dump-*.json files in %s", dir)
	}
	if len(bad) > 0 {
		return dumps, fmt.Errorf("unreadable dumps: %s", strings.Join(bad, "; "))
	}
	return dumps, nil
}

// Verdict is the diagnosis of one communicator.
type Verdict struct {
	Comm string `json:"comm,omitempty"`
	Size int    `json:"size"`
	// Op and Seq name the collective the job stopped at (the lowest
	// sequence number some rank was in or failed in); empty Op: none.
	Op   string `json:"op,omitempty"`
	Seq  uint64 `json:"seq"`
	What string `json:"what,omitempty"` // Describe() of it, from a rank that ran it
	// Absent are the ranks that did not arrive: they never started it
	// (their last collective is older) or left no dump; NoDump lists the
	// latter. Blamed are the ranks the waiting ranks named as their peer.
	Absent  []int `json:"absent"`
	NoDump  []int `json:"no_dump"`
	Waiting []int `json:"waiting"`
	Blamed  []int `json:"blamed"`
	// Last is what each rank with a dump did last, by rank.
	Last []RankLast `json:"last"`
	Text string     `json:"text"`
}

// RankLast is a rank's last operation.
type RankLast struct {
	Rank   int     `json:"rank"`
	Host   string  `json:"host"`
	Pid    int     `json:"pid"`
	Last   *Record `json:"last,omitempty"`
	Error  string  `json:"error,omitempty"`
	Reason string  `json:"reason"`
}

// Diagnose groups dumps by communicator and judges each, the one with
// the most ranks first. Of several dumps of one rank the latest counts.
func Diagnose(dumps []Dump) []Verdict {
	groups := map[string][]Dump{}
	for _, d := range dumps {
		groups[d.Comm] = append(groups[d.Comm], d)
	}
	var out []Verdict
	for comm, ds := range groups {
		out = append(out, diagnose(comm, ds))
	}
	sort.Slice(out, func(i, j int) bool {
		if len(out[i].Waiting) != len(out[j].Waiting) {
			return len(out[i].Waiting) > len(out[j].Waiting)
		}
		return out[i].Comm < out[j].Comm
	})
	return out
}

// rankView is what the diagnosis needs of one rank.
type rankView struct {
	d       Dump
	maxSeq  int64 // highest collective sequence begun, -1 if none
	byColl  map[uint64]Record
	lastRec *Record
}

func viewOf(d Dump) rankView {
	v := rankView{d: d, maxSeq: -1, byColl: map[uint64]Record{}}
	for i, r := range d.Records {
		if !r.P2P {
			v.byColl[r.Seq] = r
			if int64(r.Seq) > v.maxSeq {
				v.maxSeq = int64(r.Seq)
			}
		}
		v.lastRec = &d.Records[i]
	}
	return v
}

func diagnose(comm string, ds []Dump) Verdict {
	v := Verdict{Comm: comm, Absent: []int{}, NoDump: []int{}, Waiting: []int{}, Blamed: []int{}, Last: []RankLast{}}
	ranks := map[int]rankView{}
	for _, d := range ds {
		if d.Size > v.Size {
			v.Size = d.Size
		}
		if old, ok := ranks[d.Rank]; ok && old.d.Time.After(d.Time) {
			continue
		}
		ranks[d.Rank] = viewOf(d)
	}
	for r := 0; r < v.Size; r++ {
		if _, ok := ranks[r]; !ok {
			v.NoDump = append(v.NoDump, r)
		}
	}
	// The stuck collective: the lowest sequence number some rank is in or
	// failed in. Collectives run in issue order, so a rank whose last
	// collective is older never began it, even if its ring lost the record.
	stuck := int64(-1)
	for _, rv := range ranks {
		for seq, r := range rv.byColl {
			if r.State != StateOK && (stuck < 0 || int64(seq) < stuck) {
				stuck = int64(seq)
			}
		}
	}
	if stuck >= 0 {
		s := uint64(stuck)
		v.Seq = s
		blamed := map[int]bool{}
		for r := 0; r < v.Size; r++ {
			rv, ok := ranks[r]
			if !ok {
				continue
			}
			rec, has := rv.byColl[s]
			switch {
			case has && rec.State != StateOK:
				v.Waiting = append(v.Waiting, r)
				if v.Op == "" {
					v.Op, v.What = rec.Op, rec.Describe()
				}
				if rec.Peer >= 0 && rec.Peer != r {
					blamed[rec.Peer] = true
				}
			case rv.maxSeq < int64(s):
				v.Absent = append(v.Absent, r)
			}
		}
		v.Absent = append(v.Absent, v.NoDump...)
		slices.Sort(v.Absent)
		for p := range blamed {
			v.Blamed = append(v.Blamed, p)
		}
		slices.Sort(v.Blamed)
	}
	for r := 0; r < v.Size; r++ {
		rv, ok := ranks[r]
		if !ok {
			continue
		}
		v.Last = append(v.Last, RankLast{Rank: r, Host: rv.d.Host, Pid: rv.d.Pid, Last: rv.lastRec, Error: rv.d.Error, Reason: rv.d.Reason})
	}
	v.Text = v.paragraph()
	return v
}

// paragraph says it in words, for the operator.
func (v Verdict) paragraph() string {
	var b strings.Builder
	name := "Communicator"
	if v.Comm != "" {
		name += " " + v.Comm
	}
	fmt.Fprintf(&b, "%s (%d ranks): ", name, v.Size)
	switch {
	case v.Op == "":
		b.WriteString("no rank was in or failed in a collective when it dumped; nothing points at a straggler. ")
	case len(v.Absent) > 0:
		fmt.Fprintf(&b, "%s did not arrive at %s", ranksWord(v.Absent), v.What)
		var why []string
		for _, r := range v.Absent {
			if slices.Contains(v.NoDump, r) {
				why = append(why, fmt.Sprintf("rank %d left no dump (its process died or could not write one)", r))
			}
		}
		if len(why) > 0 {
			b.WriteString(" — " + strings.Join(why, "; "))
		}
		b.WriteString(". ")
		if len(v.Waiting) > 0 {
			fmt.Fprintf(&b, "%s %s waiting for it", capital(ranksWord(v.Waiting)), wasWere(v.Waiting))
			if extra := without(v.Blamed, v.Absent); len(extra) > 0 {
				fmt.Fprintf(&b, " (and named %s)", ranksWord(extra))
			}
			b.WriteString(". ")
		}
	default:
		fmt.Fprintf(&b, "every rank reached %s, ", v.What)
		if len(v.Blamed) > 0 {
			fmt.Fprintf(&b, "and %s %s waiting on %s. ", ranksWord(v.Waiting), wasWere(v.Waiting), ranksWord(v.Blamed))
		} else {
			fmt.Fprintf(&b, "and %s %s still in it. ", ranksWord(v.Waiting), wasWere(v.Waiting))
		}
	}
	b.WriteString("Last operations: ")
	var lasts []string
	for r := 0; r < v.Size; r++ {
		lasts = append(lasts, v.lastOf(r))
	}
	b.WriteString(strings.Join(lasts, "; "))
	b.WriteString(".")
	return b.String()
}

func (v Verdict) lastOf(r int) string {
	for _, l := range v.Last {
		if l.Rank != r {
			continue
		}
		s := fmt.Sprintf("rank %d (%s pid %d) ", r, l.Host, l.Pid)
		if l.Last == nil {
			return s + "had run nothing"
		}
		rec := l.Last
		switch rec.State {
		case StateOK:
			s += fmt.Sprintf("completed %s in %s", rec.Describe(), micros(rec.Micros))
		case StateInFlight:
			s += fmt.Sprintf("was in %s for %s", rec.Describe(), micros(rec.Micros))
			if rec.Peer >= 0 {
				s += fmt.Sprintf(", waiting for rank %d", rec.Peer)
			}
		default:
			s += fmt.Sprintf("failed in %s after %s", rec.Describe(), micros(rec.Micros))
			if rec.Peer >= 0 {
				s += fmt.Sprintf(" naming rank %d", rec.Peer)
			}
			if rec.Error != "" {
				s += ": " + rec.Error
			}
		}
		return s
	}
	return fmt.Sprintf("rank %d unknown (no dump)", r)
}

func micros(us float64) string {
	return time.Duration(us * float64(time.Microsecond)).Round(time.Microsecond).String()
}

func without(a, b []int) []int {
	var out []int
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func wasWere(rs []int) string {
	if len(rs) == 1 {
		return "was"
	}
	return "were"
}

// ranksWord is "rank 2" or "ranks 0, 1 and 3".
func ranksWord(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
