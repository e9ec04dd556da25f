// Package transporttest is the test kit every transport.Transport runs: one
// set of conformance and fault scenarios (RunConformance, RunFaults) for the
// in-process, TCP and shared-memory transports, and one set of collective
// scenarios (RunGroup) for collective paths such as the shared-memory
// collectives, which exchange no messages. Like net/http/httptest or
// golang.org/x/net/nettest it is a normal package used only by tests.
//
// A transport's tests implement Maker: set up one rank (Prepare), and say
// in Caps where the transport legitimately differs from the others. Faults
// are injected through the interface (Abort, Close), by not reading (a
// Send that fills what the transport buffers blocks), and through optional
// hooks the Maker may implement with its package's internals: Killer (end a
// rank as a crash would), Watcher (run failure detection once, now), Waiter
// (is a call blocked?) and Residue (what a job left behind). Scenarios wait
// for events by polling with a deadline, never by sleeping: a deadline is
// only a bound on a hang, nothing asserts how fast something happened.
//
// Makers whose ranks can run in other processes (Caps.Processes) call Main
// (or MainGroup) from their package's TestMain: the kit re-executes the
// test binary to run a rank in a child process (see StartMesh).
package transporttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// Hang bounds every wait of a scenario: an event that has not happened by
// then never will (failure propagation takes a few of the transports'
// watch periods, far below it). Nothing is
// asserted about how fast an event happens.
const Hang = 15 * time.Second

// Config is what a Maker needs to set up one rank.
type Config struct {
	Rank, Size int
	// Job names the mesh, equal on its ranks and unique per mesh: 16 hex
	// digits (a Maker may decode it as an 8-byte communicator tag).
	Job string
	// Peers are the ranks this one connects to (this rank may be listed);
	// nil means all. Only used when Caps.Partial.
	Peers []int
}

// Tag decodes Job as an 8-byte communicator tag.
func (c Config) Tag() [8]byte {
	var tag [8]byte
	hex.Decode(tag[:], []byte(c.Job))
	return tag
}

// Setup is one rank between its creation and its connection to the others.
type Setup[T any] struct {
	// Addr is what the other ranks need to connect to this one.
	Addr string
	// Connect connects to the other ranks, given every rank's Addr (by
	// rank). The ranks of a mesh call it concurrently; it may block until
	// the others connect too.
	Connect func(ctx context.Context, addrs []string) (T, error)
	// Ready, when set, runs once every rank connected (shared-memory
	// transports unlink their files then).
	Ready func()
}

// Maker sets up the ranks of a transport for the kit.
type Maker interface {
	Caps() Caps
	Prepare(cfg Config) (Setup[transport.Transport], error)
}

// Caps describes a transport where transports legitimately differ.
type Caps struct {
	// Sizes are message sizes worth exchanging besides the kit's own (0, 1,
	// odd sizes, over 1 MiB): the boundaries of what the transport buffers.
	Sizes []int
	// Block is what makes a Send block when the receiver does not read.
	Block Block
	// Partial: Config.Peers is honoured, and a failure is relayed along a
	// chain of ranks that are not all connected to each other.
	Partial bool
	// Processes: ranks can run in child processes (the package's TestMain
	// calls Main).
	Processes bool
	// StreamBreaksOnMismatch: after a header mismatch the stream from that
	// peer is out of step, and later receives from it fail too (byte
	// streams leave the unexpected payload unread).
	StreamBreaksOnMismatch bool
	// PartialSends: a Send cut short (by its context) may have put part of
	// its message on the way; later Sends to that peer then fail with its
	// error. Otherwise the cut Send put nothing on the way and the stream
	// goes on.
	PartialSends bool
	// ReasonSurvivesCut: a receiver whose message was cut off by the
	// sender's abort still learns the abort's reason (a
	// *transport.RemoteAbortError), not only that the peer was lost.
	ReasonSurvivesCut bool
	// DeliversBeforeAbort: messages a rank sent before it aborted are
	// delivered to a receiver that asks for them before the abort is
	// reported.
	DeliversBeforeAbort bool
	// Closed is the error that calls made on, or pending during, a closed
	// transport wrap.
	Closed error
}

// Block says how to make a Send block: Msgs messages of Bytes each, sent to
// a rank that reads none of them, make the last Send block.
type Block struct{ Msgs, Bytes int }

// Killer ends rank tr in this process as a crash would end it: no goodbye,
// no abort message, the connections simply gone.
type Killer interface {
	Kill(tr transport.Transport)
}

// Watcher runs tr's background failure detection once, now (the scenarios
// then check what it concluded without waiting for its next tick).
type Watcher interface {
	Watch(tr transport.Transport)
}

// Waiter reports whether tr has a Send (send) or Recv to peer in progress
// that waits on the peer. Without it the kit waits until the call started.
type Waiter interface {
	Waiting(tr transport.Transport, peer int, send bool) bool
}

// Residue lists what a job left behind (files in /dev/shm) once all its
// ranks closed, aborted or died; the kit checks it is nothing.
type Residue interface {
	Leftovers(job string) []string
}

// NewJob returns a fresh Config.Job.
func NewJob() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// AllRanks is 0, 1, …, n-1.
func AllRanks(n int) []int {
	rs := make([]int, n)
	for i := range rs {
		rs[i] = i
	}
	return rs
}

// prepared is one rank of a mesh being made, in this process or in a child.
type prepared[T any] struct {
	setup Setup[T]
	child *Child
}

// connectAll runs every in-process rank's Connect concurrently (children
// are told meanwhile, see StartMesh) and returns the results by rank.
func connectAll[T any](ctx context.Context, ps []prepared[T], addrs []string) ([]T, error) {
	out := make([]T, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for r, p := range ps {
		if p.child != nil {
			continue
		}
		wg.Go(func() { out[r], errs[r] = p.setup.Connect(ctx, addrs) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return out, fmt.Errorf("rank %d: connect: %w", r, err)
		}
	}
	return out, nil
}

// closer is what the kit closes at cleanup.
type closer interface{ Close() error }

// NewMesh makes n connected transports in this process (ranks are
// goroutines of the test). peers(r), when not nil, lists rank r's peers
// (Caps.Partial). They are closed, and the job checked for leftovers, at
// cleanup.
func NewMesh(t testing.TB, mk Maker, n int, peers func(r int) []int) []transport.Transport {
	t.Helper()
	ts, _ := startMesh(t, make([]string, n), func(cfg Config) (Setup[transport.Transport], error) {
		if peers != nil {
			cfg.Peers = peers(cfg.Rank)
		}
		return mk.Prepare(cfg)
	}, residueOf(mk))
	return ts
}

func residueOf(mk any) Residue {
	if r, ok := mk.(Residue); ok {
		return r
	}
	return nil
}

func isNil[T any](x T) bool {
	var zero T
	return any(x) == any(zero)
}

func checkResidue(t testing.TB, res Residue, job string) {
	t.Helper()
	if res == nil {
		return
	}
	if left := res.Leftovers(job); len(left) > 0 {
		t.Errorf("left behind by the job: %v", left)
	}
}

// ---- headers and payloads ----

// Hdr is the header of message seq of n bytes; the signature depends on n,
// so that a length mismatch is also a signature mismatch only when asked.
func Hdr(seq uint64, n int) transport.Header {
	return transport.Header{Kind: transport.KindData, Seq: seq, Sig: 0xfeed, Step: uint32(seq), Len: uint64(n)}
}

// pattern is random bytes that payloads are cut from.
var pattern = func() []byte {
	b := make([]byte, 8<<20)
	rand.NewChaCha8([32]byte{1}).Read(b)
	return b
}()

// Payload is the content of message k of size bytes from rank from to rank
// to: deterministic, and different for every message (a window of a
// random pattern, with the routing stamped in front).
func Payload(from, to, k, size int) []byte {
	b := make([]byte, size)
	off := (from*7919 + to*104729 + k*31) % 4096
	for i := 0; i < size; off = 0 {
		i += copy(b[i:], pattern[off:])
	}
	var stamp [16]byte
	binary.LittleEndian.PutUint32(stamp[0:], uint32(from))
	binary.LittleEndian.PutUint32(stamp[4:], uint32(to))
	binary.LittleEndian.PutUint32(stamp[8:], uint32(k))
	binary.LittleEndian.PutUint32(stamp[12:], uint32(size))
	copy(b, stamp[:])
	return b
}

// ---- waiting and checking ----

// Within waits for a pending call's result, failing the test if it is
// still pending after Hang.
func Within(t testing.TB, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(Hang):
		t.Fatalf("%s still pending after %v", what, Hang)
		return nil
	}
}

// WantAbortFrom checks that err is a *transport.RemoteAbortError naming rank
// origin with reason.
func WantAbortFrom(t testing.TB, what string, err error, origin int, reason string) {
	t.Helper()
	var rae *transport.RemoteAbortError
	if !errors.Is(err, transport.ErrRemoteAbort) || !errors.As(err, &rae) || rae.Peer != origin || rae.Reason != reason {
		t.Errorf("%s: got %v, want a RemoteAbortError from rank %d with reason %q", what, err, origin, reason)
	}
}

// WantLost checks that err is a *transport.PeerLostError naming rank origin.
func WantLost(t testing.TB, what string, err error, origin int) {
	t.Helper()
	var ple *transport.PeerLostError
	if !errors.Is(err, transport.ErrPeerLost) || !errors.As(err, &ple) || ple.Peer != origin {
		t.Errorf("%s: got %v, want a PeerLostError naming rank %d", what, err, origin)
	}
}

// wantNamed checks that err names rank origin as lost or aborted.
func wantNamed(t testing.TB, what string, err error, origin int) {
	t.Helper()
	var ple *transport.PeerLostError
	var rae *transport.RemoteAbortError
	switch {
	case errors.As(err, &rae) && rae.Peer == origin:
	case errors.As(err, &ple) && ple.Peer == origin:
	default:
		t.Errorf("%s: got %v, want an error naming rank %d as aborted or lost", what, err, origin)
	}
}

// call is a transport call running on its own goroutine.
type call struct {
	res     chan error
	started atomic.Bool
}

func goCall(f func() error) *call {
	c := &call{res: make(chan error, 1)}
	go func() {
		c.started.Store(true)
		c.res <- f()
	}()
	return c
}

// blocked waits until call c waits: until waiting says so when there is
// such a hook, else until c started and the scheduler ran others a while.
// A call that returns meanwhile fails the test.
func blocked(t testing.TB, c *call, what string, waiting func() bool) {
	t.Helper()
	deadline := time.Now().Add(Hang)
	for i := 0; ; i++ {
		select {
		case err := <-c.res:
			t.Fatalf("%s returned instead of waiting: %v", what, err)
		default:
		}
		if waiting != nil && waiting() {
			return
		}
		if waiting == nil && c.started.Load() {
			if i > 100 {
				return
			}
			runtime.Gosched()
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not waiting after %v", what, Hang)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// blockedOn is blocked for tr's call to peer, through mk's Waiter if any.
func blockedOn(t testing.TB, mk any, c *call, tr transport.Transport, peer int, send bool) {
	t.Helper()
	var waiting func() bool
	if w, ok := mk.(Waiter); ok {
		waiting = func() bool { return w.Waiting(tr, peer, send) }
	}
	blocked(t, c, fmt.Sprintf("rank %d's %s on rank %d", tr.Rank(), opName(send), peer), waiting)
}

// probeSeq numbers the empty probe messages of stopped (never sent).
const probeSeq = 1 << 40

// stopped waits until tr stopped by itself (it heard of a failure) and
// returns the error its calls fail with: it polls with short receives from
// peer, which never sends, so that tr is in no call most of the time.
func stopped(t testing.TB, tr transport.Transport, peer int) error {
	t.Helper()
	deadline := time.Now().Add(Hang)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		err := tr.Recv(ctx, peer, Hdr(probeSeq, 0), nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
	t.Fatalf("rank %d still running %v after the failure", tr.Rank(), Hang)
	return nil
}

// send sends every message of blk to peer, for a Send that blocks.
func sendBlock(ctx context.Context, tr transport.Transport, peer int, blk Block) error {
	data := make([]byte, blk.Bytes)
	for k := range max(blk.Msgs, 1) {
		if err := tr.Send(ctx, peer, Hdr(uint64(k), len(data)), data); err != nil {
			return err
		}
	}
	return nil
}

// blockOn starts tr's call that waits on peer (which neither reads nor
// sends): a Send that blocks, or a Recv.
func blockOn(t testing.TB, mk Maker, tr transport.Transport, peer int, send bool) *call {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*Hang)
	t.Cleanup(cancel)
	blk := mk.Caps().Block
	c := goCall(func() error {
		if send {
			return sendBlock(ctx, tr, peer, blk)
		}
		return tr.Recv(ctx, peer, Hdr(0, 8), make([]byte, 8))
	})
	blockedOn(t, mk, c, tr, peer, send)
	return c
}

func opName(send bool) string {
	if send {
		return "send"
	}
	return "recv"
}

var sendRecv = []bool{true, false}

// exchange runs one round of messages of every size in sizes between tr and
// each peer in peers, both directions at once, and checks their content.
func exchange(ctx context.Context, tr transport.Transport, peers []int, sizes []int, first int) error {
	var wg sync.WaitGroup
	errc := make(chan error, 2*len(peers))
	me := tr.Rank()
	for _, p := range peers {
		if p == me {
			continue
		}
		wg.Go(func() {
			for i, n := range sizes {
				k := first + i
				if err := tr.Send(ctx, p, Hdr(uint64(k), n), Payload(me, p, k, n)); err != nil {
					errc <- fmt.Errorf("rank %d: send #%d (%d B) to rank %d: %w", me, k, n, p, err)
					return
				}
			}
		})
		wg.Go(func() {
			for i, n := range sizes {
				k := first + i
				buf := make([]byte, n)
				if err := tr.Recv(ctx, p, Hdr(uint64(k), n), buf); err != nil {
					errc <- fmt.Errorf("rank %d: recv #%d (%d B) from rank %d: %w", me, k, n, p, err)
					return
				}
				if want := Payload(p, me, k, n); !bytes.Equal(buf, want) {
					errc <- fmt.Errorf("rank %d: recv #%d (%d B) from rank %d: wrong content", me, k, n, p)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// exchangeAll runs exchange between all the ranks of ts at once (nil: a
// rank left out).
func exchangeAll(ctx context.Context, ts []transport.Transport, sizes []int, first int) error {
	var peers []int
	for r, tr := range ts {
		if tr != nil {
			peers = append(peers, r)
		}
	}
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for _, r := range peers {
		wg.Go(func() { errs[r] = exchange(ctx, ts[r], peers, sizes, first) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// sizes is the kit's message sizes plus the Maker's, ascending, without
// repeats.
func sizes(c Caps) []int {
	return unique(append([]int{0, 1, 7, 4093, 65537, 1<<20 + 3}, c.Sizes...))
}

func unique(s []int) []int {
	slices.Sort(s)
	return slices.Compact(s)
}
