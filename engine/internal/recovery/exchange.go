package recovery

import (
	"context"
	"fmt"
	"slices"

	"github.com/gocoll/gocoll/engine/transport"
)

// Exchange is engine connect's exchange among view (ranks of the
// communicator being shrunk), over the control mesh, through the view's
// lowest rank (the new communicator's rank 0): every member sends it its
// blob, it sends every member the table of all. A star rather than every member to every other: each
// member dials one peer, not N-1 (the root dials N-1), and the mesh stays
// as sparse as the agreement's.
func (s *Recoverer) Exchange(inst uint64, view []int) func(ctx context.Context, blob []byte) ([][]byte, error) {
	round := 0
	return func(ctx context.Context, blob []byte) ([][]byte, error) {
		round++
		me, root := s.rank, view[0]
		// A member silent for a timeout is lost like a dead one: the
		// agreement that follows leaves it out.
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		if me != root {
			s.net.Send(root, Msg{Inst: inst, Round: round, Blob: blob})
			k := blobKey{inst, round, root}
			missing := func() int {
				if s.tables[k] == nil {
					return root
				}
				return -1
			}
			if err := s.awaitFrom(ctx, rctx, inst, []int{root}, missing); err != nil {
				return nil, err
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			t := s.tables[k]
			delete(s.tables, k)
			if len(t) != len(view) {
				return nil, &LostError{Peer: root, Why: fmt.Sprintf("its setup table has %d entries for %d members", len(t), len(view))}
			}
			return t, nil
		}
		others := view[1:]
		missing := func() int {
			for _, p := range others {
				if _, ok := s.blobs[blobKey{inst, round, p}]; !ok {
					return p
				}
			}
			return -1
		}
		if err := s.awaitFrom(ctx, rctx, inst, others, missing); err != nil {
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
		for _, p := range others {
			s.net.Send(p, Msg{Inst: inst, Round: round, Table: out})
		}
		return out, nil
	}
}

// awaitFrom waits until missing() (called with mu held) finds no member
// of from still to answer, failing with a LostError when one of from is
// down or suspected, when a member gave up instance inst's setup (naming
// whom it lost), or when rctx ends first (blaming the first that has not
// answered); ctx's end is the shrink's own.
func (s *Recoverer) awaitFrom(ctx, rctx context.Context, inst uint64, from []int, missing func() int) error {
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
		lost, why = missing(), fmt.Sprintf("no setup data from it within %v", s.timeout)
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
