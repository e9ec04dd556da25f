package recovery

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// exchangeFanOut is the degree of the tree the setup table goes down
// (treeChildren): each member forwards it to at most this many others.
// Four keeps the depth (log4 N) and each member's sends on the critical
// path (four tables, one after another on its link) both small, and adds
// at most four connections a member dials.
const exchangeFanOut = 4

// Exchange is engine connect's exchange among view (ranks of the
// communicator being shrunk), over the control mesh, rooted at the view's
// lowest rank (the new communicator's rank 0): every member sends the root
// its blob; the root packs the table of all once (packTable) and sends it
// to its children in a tree of degree exchangeFanOut over view's order,
// each member forwarding the same bytes to its own children as soon as it
// has them. The root's work and bytes are those of exchangeFanOut tables,
// not of one table per member, and the table is log(N) hops from anyone.
// The blobs come to the root directly: one small message a member, on the
// connection the agreement's coordinator (the same rank) already has.
//
// A member waits for its parent; one whose parent, or any member above it,
// is found down or gave the round up fails at once with a LostError
// naming it, and so do the members below (whoever gives up tells every
// member, GaveUpOn). A member waits longer the deeper it is (treeWait),
// so that the one below a stalled member is the first to give up, and
// blames the stalled one rather than a parent that was waiting too.
func (s *Recoverer) Exchange(inst uint64, view []int) func(ctx context.Context, blob []byte) ([][]byte, error) {
	round := 0
	return func(ctx context.Context, blob []byte) ([][]byte, error) {
		round++
		idx := slices.Index(view, s.rank)
		switch {
		case idx < 0:
			return nil, fmt.Errorf("setup exchange: rank %d is not in the view %v", s.rank, view)
		case idx == 0:
			return s.exchangeRoot(ctx, inst, round, view, blob)
		}
		return s.exchangeMember(ctx, inst, round, view, idx, blob)
	}
}

// exchangeRoot is the root's part of an exchange round: gather every
// member's blob, then send the packed table down the tree.
func (s *Recoverer) exchangeRoot(ctx context.Context, inst uint64, round int, view []int, blob []byte) ([][]byte, error) {
	// A member silent for a timeout is lost like a dead one: the
	// agreement that follows leaves it out.
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	others := view[1:]
	missing := func() int {
		for _, p := range others {
			if _, ok := s.blobs[blobKey{inst, round, p}]; !ok {
				return p
			}
		}
		return -1
	}
	if err := s.awaitFrom(ctx, rctx, inst, others, missing, s.timeout); err != nil {
		return nil, err
	}
	s.mu.Lock()
	out := make([][]byte, len(view))
	out[0] = blob
	for i, p := range others {
		k := blobKey{inst, round, p}
		out[i+1] = s.blobs[k]
		delete(s.blobs, k)
	}
	s.mu.Unlock()
	if len(view) > 1 {
		s.forward(inst, round, view, 0, packTable(out))
	}
	return out, nil
}

// exchangeMember is a member's part of an exchange round: send the root
// this rank's blob, wait for the table from the parent, pass it on.
func (s *Recoverer) exchangeMember(ctx context.Context, inst uint64, round int, view []int, idx int, blob []byte) ([][]byte, error) {
	s.net.Send(view[0], Msg{Inst: inst, Round: round, Blob: blob})
	var path []int // this member's parent, its parent's, … the root
	for i := idx; i > 0; {
		i = treeParent(i, exchangeFanOut)
		path = append(path, view[i])
	}
	parent := path[0]
	wait := treeWait(s.timeout, len(path)-1)
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	k := blobKey{inst, round, parent}
	missing := func() int {
		if s.tables[k] == nil {
			return parent
		}
		return -1
	}
	if err := s.awaitFrom(ctx, rctx, inst, path, missing, wait); err != nil {
		return nil, err
	}
	s.mu.Lock()
	packed := s.tables[k]
	delete(s.tables, k)
	s.mu.Unlock()
	table, err := unpackTable(packed, len(view))
	if err != nil {
		return nil, &LostError{Peer: parent, Why: fmt.Sprintf("its setup table: %v", err)}
	}
	s.forward(inst, round, view, idx, packed)
	return table, nil
}

// forward sends the packed table to the children of view's member idx,
// the same bytes to each.
func (s *Recoverer) forward(inst uint64, round int, view []int, idx int, packed []byte) {
	lo, hi := treeChildren(idx, len(view), exchangeFanOut)
	for _, p := range view[lo:hi] {
		s.net.Send(p, Msg{Inst: inst, Round: round, Table: packed})
	}
}

// treeParent is the parent of index i > 0 in the tree of degree d over
// indices 0, 1, …: the children of i are d·i+1 … d·i+d.
func treeParent(i, d int) int { return (i - 1) / d }

// treeChildren is the range [lo, hi) of the children of index i among n
// in the tree of degree d (empty for a leaf).
func treeChildren(i, n, d int) (lo, hi int) {
	lo = min(d*i+1, n)
	return lo, min(lo+d, n)
}

// treeWait is how long a member depth levels below the root's children
// waits for its table: the timeout the root may wait for a silent member
// and, per level above it, a quarter of that, in which a parent that gave
// up on its own parent tells it so. Without it the member below a stalled
// one would give up at the same moment as its parent does, and blame the
// parent, which was only waiting too.
func treeWait(timeout time.Duration, depth int) time.Duration {
	per := timeout / 4
	if per > 0 && depth > 0 && time.Duration(depth) > (math.MaxInt64-timeout)/per {
		return math.MaxInt64
	}
	return timeout + time.Duration(depth)*per
}

// packTable is the table of blobs as one message body: their count, then
// each one's length and bytes (uvarints). The root packs it once; every
// member forwards it as it came.
func packTable(table [][]byte) []byte {
	size := binary.MaxVarintLen64
	for _, b := range table {
		size += binary.MaxVarintLen64 + len(b)
	}
	out := make([]byte, 0, size)
	out = binary.AppendUvarint(out, uint64(len(table)))
	for _, b := range table {
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

// unpackTable is the table packTable packed, which must hold n blobs;
// each entry is a slice of b, not a copy.
func unpackTable(b []byte, n int) ([][]byte, error) {
	count, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, errors.New("no entry count")
	}
	if count != uint64(n) {
		return nil, fmt.Errorf("%d entries for %d members", count, n)
	}
	b = b[k:]
	out := make([][]byte, n)
	for i := range out {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, fmt.Errorf("entry %d cut short", i)
		}
		out[i], b = b[k:k+int(l):k+int(l)], b[k+int(l):]
	}
	if len(b) > 0 {
		return nil, fmt.Errorf("%d bytes past the last entry", len(b))
	}
	return out, nil
}

// awaitFrom waits until missing() (called with mu held) finds no member
// of from still to answer, failing with a LostError when one of from is
// down or suspected, when a member gave up instance inst's setup (naming
// whom it lost), or when rctx ends first (blaming the first that has not
// answered, said to have been silent for limit); ctx's end is the
// shrink's own.
func (s *Recoverer) awaitFrom(ctx, rctx context.Context, inst uint64, from []int, missing func() int, limit time.Duration) error {
	lost, why := -1, ""
	err := s.await(rctx, func() bool {
		if g := s.gaveUp[inst]; g != nil {
			lost, why = g.Peer, g.Why
			return true
		}
		for _, p := range from {
			if w, ok := s.down[p]; ok {
				lost, why = p, w
				return true
			}
			if s.suspect[p] {
				lost, why = p, "taken for failed"
				return true
			}
		}
		return missing() < 0
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		s.mu.Lock()
		lost, why = missing(), fmt.Sprintf("no setup data from it within %v", limit)
		if g := s.gaveUp[inst]; g != nil {
			// Word that a member gave up came as the wait ended: it
			// names whom it lost, which this rank's silence only guesses.
			lost, why = g.Peer, g.Why
		}
		s.mu.Unlock()
	}
	if lost >= 0 {
		return &LostError{Peer: lost, Why: why}
	}
	return nil
}

// Forget drops what the setup of instance inst left: it is over on every
// member once the agreement that confirms it decided.
func (s *Recoverer) Forget(inst uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.blobs {
		if k.inst == inst {
			delete(s.blobs, k)
		}
	}
	for k := range s.tables {
		if k.inst == inst {
			delete(s.tables, k)
		}
	}
	delete(s.gaveUp, inst)
}

// WhileUp is ctx, cancelled with a *LostError as its cause when a
// member of view is found down or taken for failed, or one gave up
// instance inst's setup (GaveUpOn): it will not connect, and whoever
// waits on it (for setup data or a connection) agrees again at once.
func (s *Recoverer) WhileUp(ctx context.Context, inst uint64, view []int) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &upWatch{inst: inst, view: view, cancel: cancel}
	s.mu.Lock()
	s.watches = append(s.watches, w)
	s.checkWatchesLocked()
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		s.watches = slices.DeleteFunc(s.watches, func(x *upWatch) bool { return x == w })
		s.mu.Unlock()
		cancel(nil)
	}
}

// upWatch is a setup among view waiting on WhileUp's context.
type upWatch struct {
	inst   uint64
	view   []int
	cancel context.CancelCauseFunc
}

// checkWatchesLocked cancels the setups whose view holds a member down or
// suspected, or that a member gave up. Called with mu held.
func (s *Recoverer) checkWatchesLocked() {
	for _, w := range s.watches {
		if g := s.gaveUp[w.inst]; g != nil {
			w.cancel(g)
			continue
		}
		for _, p := range w.view {
			if p == s.rank {
				continue
			}
			if why, ok := s.down[p]; ok {
				w.cancel(&LostError{Peer: p, Why: why})
				break
			}
			if s.suspect[p] {
				w.cancel(&LostError{Peer: p, Why: "taken for failed"})
				break
			}
		}
	}
}

// LostError: a member of the view went away (or was taken for failed)
// while the new communicator was being set up. peer is a rank of the
// communicator being shrunk.
type LostError struct {
	Peer int
	Why  string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("%v: rank %d: %s", transport.ErrPeerLost, e.Peer, e.Why)
}
func (e *LostError) Unwrap() error { return transport.ErrPeerLost }
