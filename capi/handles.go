package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu/redist"
)

// Handles are integers: (serial << kindBits) | kind. C sees them as the
// value of an opaque pointer that is never dereferenced; no Go pointer ever
// reaches C. Serials are never reused, so a handle below the next serial
// that is not in its table is one that was destroyed or freed.
const (
	kindBits    = 3
	kindMask    = 1<<kindBits - 1
	kindComm    = 1
	kindRequest = 2
	kindPlan    = 3
	kindVComm   = 4
)

// commState is a live communicator handle.
type commState struct {
	h uintptr
	c *engine.Comm

	mu      sync.Mutex
	lastErr *C.char // C copy of the last failure's text, nil if none
	closed  bool    // handle destroyed or aborted; lastErr freed
}

// setErr replaces the communicator's last-error text.
func (s *commState) setErr(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.lastErr != nil {
		C.free(unsafe.Pointer(s.lastErr))
	}
	s.lastErr = C.CString(msg)
}

// close frees the C memory the handle owns; later setErr calls are ignored.
func (s *commState) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastErr != nil {
		C.free(unsafe.Pointer(s.lastErr))
		s.lastErr = nil
	}
	s.closed = true
}

// waiter is an operation in flight: an engine request or a virtual
// communicator's.
type waiter interface {
	Test() (bool, error)
	Wait() error
	Done() <-chan struct{}
}

// reqState is a live request handle.
type reqState struct {
	r    waiter
	comm *commState // the communicator it was issued on (maybe closed since)
	name string     // the C function that started it
}

// alloc is a gocollMemAlloc allocation.
type alloc struct {
	c *engine.Comm
	b []byte
}

// handleTable holds every handle of the process. It is the only mutable
// package-level state of capi (an ABI of integer handles needs one table).
type handleTable struct {
	mu     sync.Mutex
	serial [kindMask + 1]uintptr // last serial issued per kind
	// comms is replaced, never changed, under mu: every collective looks
	// its communicator up, and a lock round trip there was a visible part
	// of a small call from C (docs/performance.md, per-call cost).
	comms atomic.Pointer[map[uintptr]*commState]
	// last is the communicator looked up last: a job calls on one or two,
	// and the map lookup showed in a small call's profile. takeComm
	// clears it, under mu, so it never outlives the table's entry.
	last   atomic.Pointer[commState]
	reqs   map[uintptr]*reqState
	allocs map[uintptr]alloc
	plans  map[uintptr]*redist.Plan
	vcomms map[uintptr]*vcommState
}

var handles = &handleTable{
	reqs:   map[uintptr]*reqState{},
	allocs: map[uintptr]alloc{},
	plans:  map[uintptr]*redist.Plan{},
	vcomms: map[uintptr]*vcommState{},
}

func (t *handleTable) addPlan(p *redist.Plan) uintptr {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.newHandle(kindPlan)
	t.plans[h] = p
	return h
}

func (t *handleTable) plan(h uintptr) (*redist.Plan, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.plans[h]; ok {
		return p, nil
	}
	return nil, t.classify(h, kindPlan, "plan")
}

func (t *handleTable) takePlan(h uintptr) (*redist.Plan, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.plans[h]
	if !ok {
		return nil, t.classify(h, kindPlan, "plan")
	}
	delete(t.plans, h)
	return p, nil
}

func (t *handleTable) newHandle(kind uintptr) uintptr {
	t.serial[kind]++
	return t.serial[kind]<<kindBits | kind
}

// addComm registers c and returns its handle.
func (t *handleTable) addComm(c *engine.Comm) *commState {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &commState{h: t.newHandle(kindComm), c: c}
	m := maps.Clone(t.commMap())
	if m == nil {
		m = map[uintptr]*commState{}
	}
	m[s.h] = s
	t.comms.Store(&m)
	return s
}

// commMap is the current table of communicators (nil before the first).
func (t *handleTable) commMap() map[uintptr]*commState {
	if m := t.comms.Load(); m != nil {
		return *m
	}
	return nil
}

// classify explains why h is not a live handle of kind.
func (t *handleTable) classify(h uintptr, kind uintptr, what string) error {
	switch {
	case h == 0:
		return argErr("%s is NULL", what)
	case h&kindMask != kind:
		return argErr("%#x is not a %s handle", h, what)
	case h>>kindBits <= t.serial[kind]:
		if kind == kindComm {
			return fmt.Errorf("%w: %s %#x was destroyed or aborted", engine.ErrDestroyed, what, h)
		}
		if kind == kindPlan || kind == kindVComm {
			return fmt.Errorf("%w: %s %#x was destroyed", engine.ErrInvalidUsage, what, h)
		}
		return fmt.Errorf("%w: %s %#x was already completed and freed (by gocollWait or a gocollTest that reported done)", engine.ErrInvalidUsage, what, h)
	default:
		return argErr("%#x is not a %s handle (never created)", h, what)
	}
}

// comm returns the live communicator h.
func (t *handleTable) comm(h uintptr) (*commState, error) {
	if s := t.last.Load(); s != nil && s.h == h {
		return s, nil
	}
	if s, ok := t.commMap()[h]; ok {
		t.last.Store(s)
		// A takeComm between the lookup and the store has cleared last
		// already: look again, so that a destroyed handle is never kept.
		if _, ok := t.commMap()[h]; !ok {
			t.last.CompareAndSwap(s, nil)
		}
		return s, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return nil, t.classify(h, kindComm, "communicator")
}

// takeComm removes the live communicator h from the table and returns it.
func (t *handleTable) takeComm(h uintptr) (*commState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.commMap()[h]
	if !ok {
		return nil, t.classify(h, kindComm, "communicator")
	}
	m := maps.Clone(t.commMap())
	delete(m, h)
	t.comms.Store(&m)
	t.last.CompareAndSwap(s, nil)
	return s, nil
}

func (t *handleTable) addRequest(r waiter, comm *commState, name string) uintptr {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.newHandle(kindRequest)
	t.reqs[h] = &reqState{r: r, comm: comm, name: name}
	return h
}

func (t *handleTable) request(h uintptr) (*reqState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.reqs[h]; ok {
		return s, nil
	}
	return nil, t.classify(h, kindRequest, "request")
}

// takeRequest removes the live request h from the table and returns it.
func (t *handleTable) takeRequest(h uintptr) (*reqState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.reqs[h]
	if !ok {
		return nil, t.classify(h, kindRequest, "request")
	}
	delete(t.reqs, h)
	return s, nil
}

func (t *handleTable) addAlloc(p uintptr, a alloc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.allocs[p] = a
}

func (t *handleTable) takeAlloc(p uintptr) (alloc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.allocs[p]
	if !ok {
		return alloc{}, argErr("%#x was not returned by gocollMemAlloc (or was freed already)", p)
	}
	delete(t.allocs, p)
	return a, nil
}

func (t *handleTable) addVComm(v *vcommState) uintptr {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.newHandle(kindVComm)
	t.vcomms[h] = v
	return h
}

func (t *handleTable) vcomm(h uintptr) (*vcommState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.vcomms[h]; ok {
		return v, nil
	}
	return nil, t.classify(h, kindVComm, "virtual communicator")
}

func (t *handleTable) takeVComm(h uintptr) (*vcommState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.vcomms[h]
	if !ok {
		return nil, t.classify(h, kindVComm, "virtual communicator")
	}
	delete(t.vcomms, h)
	return v, nil
}
