package engine

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/gocoll/gocoll/engine/flight"
	"github.com/gocoll/gocoll/engine/transport"
)

// DefaultFlightRecords is how many operations a communicator remembers when
// Options.FlightRecords is zero.
const DefaultFlightRecords = 256

// recorder is a communicator's flight recorder: its last operations in a
// ring allocated once, so that recording costs two uncontended lock
// round-trips per operation and no allocation. Everything that must be
// formatted (the error text, the datatype's name) is formatted when a dump
// is written, not when an operation runs.
type recorder struct {
	mu    sync.Mutex
	slots []slot
	n     uint64    // operations begun so far; numbers them from 1
	next  int       // the slot the next operation takes
	epoch time.Time // what the slots' times count from (Comm.mono)
}

type slotState uint8

const (
	slotEmpty slotState = iota
	slotRunning
	slotOK
	slotFailed
)

// slot is one operation. Its fields are fixed-size (strings point at the
// constant names of ops and algorithms).
type slot struct {
	n          uint64
	op, algo   string
	seq        uint64
	p2p        bool
	dt         DataType
	hasType    bool
	bytes      int64
	start, end time.Duration // since the communicator's epoch
	peer       int32
	state      slotState
	err        error
	live       *execCtx // while running: where its current peer is kept
}

func newRecorder(n int, epoch time.Time) *recorder {
	if n <= 0 {
		return nil
	}
	return &recorder{slots: make([]slot, n), epoch: epoch}
}

// begin records that r starts now as x; a nil recorder records nothing.
func (f *recorder) begin(x *execCtx, r *Request, now time.Duration) {
	if f == nil {
		return
	}
	f.mu.Lock()
	// Keep a running operation's slot: it is what a dump must show. Only
	// point-to-point operations can outlive a whole ring of later ones.
	i := f.next
	for k := 0; k < len(f.slots) && f.slots[i].state == slotRunning; k++ {
		i = (i + 1) % len(f.slots)
	}
	f.next = (i + 1) % len(f.slots)
	f.n++
	// Field by field: a slot literal is built aside and copied in whole.
	s := &f.slots[i]
	s.n, s.op, s.algo, s.seq, s.p2p = f.n, r.op, r.algo, x.seq&^p2pSeqBit, r.p2p()
	s.dt, s.hasType, s.bytes, s.start, s.end, s.peer = r.dt, r.hasType, int64(r.bytes), now, 0, int32(r.peer)
	s.state, s.err, s.live = slotRunning, nil, x
	x.slot, x.slotN = i, f.n
	f.mu.Unlock()
}

// end records x's outcome.
func (f *recorder) end(x *execCtx, err error, now time.Duration) {
	if f == nil {
		return
	}
	peer := x.waitedOn()
	if err != nil {
		peer = int32(namedPeer(err, int(peer)))
	}
	f.mu.Lock()
	if s := &f.slots[x.slot]; s.n == x.slotN {
		s.end, s.live, s.err = now, nil, err
		if peer >= 0 || !s.p2p {
			s.peer = peer
		}
		s.state = slotOK
		if err != nil {
			s.state = slotFailed
		}
	}
	f.mu.Unlock()
}

// namedPeer is the rank an error blames: the one that went away, else the
// one the failing wait was on, else def. (Only called on failure: errors.As
// allocates.)
func namedPeer(err error, def int) int {
	var lost *transport.PeerLostError
	if errors.As(err, &lost) {
		return lost.Peer
	}
	var oe *OpError
	if errors.As(err, &oe) && oe.Peer >= 0 {
		return oe.Peer
	}
	return def
}

// snapshot copies the ring out, oldest first.
func (f *recorder) snapshot(now time.Time) (recs []flight.Record, total uint64) {
	if f == nil {
		return []flight.Record{}, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	recs = make([]flight.Record, 0, len(f.slots))
	for i := range f.slots {
		s := &f.slots[i]
		if s.state == slotEmpty {
			continue
		}
		r := flight.Record{N: s.n, Op: s.op, Seq: s.seq, P2P: s.p2p, Bytes: s.bytes, Algo: s.algo,
			Start: f.epoch.Add(s.start), Peer: int(s.peer)}
		if s.hasType {
			r.Type = s.dt.String()
		}
		upTo := now
		switch s.state {
		case slotRunning:
			r.State = flight.StateInFlight
			if p := s.live.waitedOn(); p >= 0 {
				r.Peer = int(p)
			}
		case slotOK:
			r.State = flight.StateOK
		case slotFailed:
			r.State, r.Error = flight.StateError, s.err.Error()
		}
		if s.state != slotRunning {
			end := f.epoch.Add(s.end)
			r.End, upTo = &end, end
		}
		r.Micros = float64(upTo.Sub(r.Start).Nanoseconds()) / 1e3
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b flight.Record) int { return cmp.Compare(a.N, b.N) })
	return recs, f.n
}

// p2pSeqBit marks the sequence numbers of sends and receives in message
// headers (they count per peer and direction, not with the collectives).
const p2pSeqBit = transport.PointToPoint

// state is the communicator's dump.
func (c *Comm) state(reason string) flight.Dump {
	now := time.Now()
	host, _ := os.Hostname()
	d := flight.Dump{Host: host, Pid: os.Getpid(), Rank: c.rank, Size: c.size, Comm: c.commID(),
		Time: now, Reason: reason, Capacity: len(c.flightSlots()), InFlight: []flight.Record{}}
	if err := c.AsyncError(); err != nil {
		d.Error = err.Error()
	}
	d.Records, d.Total = c.flight.snapshot(now)
	for _, r := range d.Records {
		if r.State == flight.StateInFlight {
			d.InFlight = append(d.InFlight, r)
		}
	}
	return d
}

func (c *Comm) flightSlots() []slot {
	if c.flight == nil {
		return nil
	}
	return c.flight.slots
}

func (c *Comm) commID() string {
	if c.id == 0 {
		return ""
	}
	return fmt.Sprintf("%016x", c.id)
}

// DumpState writes the flight recorder's contents as JSON (the format of
// package flight): the last operations, oldest first, and those in flight.
func (c *Comm) DumpState(w io.Writer) error {
	return c.writeState(w, "request")
}

func (c *Comm) writeState(w io.Writer, reason string) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	enc.SetEscapeHTML(false) // error texts hold "->"; people read these files
	if err := enc.Encode(c.state(reason)); err != nil {
		return fmt.Errorf("gocoll: dump state of rank %d: %w", c.rank, err)
	}
	return nil
}

// DumpStateFile writes the dump to Options.DumpDir (the temp dir when
// empty) as gocoll-dump-<host>-<pid>-r<rank>-c<comm>.json and returns its
// path. A later dump of the same communicator replaces it.
func (c *Comm) DumpStateFile() (string, error) {
	return c.dumpFile("request")
}

func (c *Comm) dumpFile(reason string) (string, error) {
	dir := c.opts.DumpDir
	if dir == "" {
		dir = os.TempDir()
	}
	host, _ := os.Hostname()
	path := filepath.Join(dir, flight.FileName(host, os.Getpid(), c.rank, c.commID()))
	// Write then rename, so that a reader (gocoll-doctor, or a person with
	// cat) never sees half a dump, even when dumps race (SIGUSR1 during a
	// failure).
	tmp, err := os.CreateTemp(dir, ".gocoll-dump-*")
	if err != nil {
		return "", fmt.Errorf("gocoll: dump state of rank %d: %w", c.rank, err)
	}
	err = c.writeState(tmp, reason)
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("gocoll: dump state of rank %d: %w", c.rank, cerr)
	}
	if err == nil {
		if err = os.Rename(tmp.Name(), path); err != nil {
			err = fmt.Errorf("gocoll: dump state of rank %d: %w", c.rank, err)
		}
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return path, nil
}

// dumpOnFailure writes the dump of the communicator's first failure (a
// timeout, an abort, a lost peer): the moment an operator wants to see.
func (c *Comm) dumpOnFailure() {
	if c.flight == nil {
		return
	}
	if path, err := c.dumpFile("failure"); err != nil {
		c.log.Warn("could not write the flight recorder's dump", "err", err)
	} else {
		c.log.Warn("flight recorder dumped", "path", path)
	}
}

// waitingFor notes the peer an operation waits on now (for dumps).
func (x *execCtx) waitingFor(peer int) { x.peer.Store(int32(peer) + 1) }

// waitedOn is the peer an operation waits on now, -1 for none.
func (x *execCtx) waitedOn() int32 { return x.peer.Load() - 1 }
