package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/proctest"
)

// anyMsgs is how many messages each sender sends to the receiver of a round
// of anySourceExchange; anyCount their int32 elements (first the sender's
// rank, then its message number, then filler derived from both).
const (
	anyMsgs  = 12
	anyCount = 1 << 12
)

func anyPayload(from, k int) []byte {
	b := make([]byte, 4*anyCount)
	binary.LittleEndian.PutUint32(b, uint32(from))
	binary.LittleEndian.PutUint32(b[4:], uint32(k))
	for i := 8; i < len(b); i++ {
		b[i] = byte(from*41 + k*13 + i)
	}
	return b
}

// anySourceExchange runs one round per rank: every other rank races to send
// anyMsgs messages with tag 4 to it (and, between them, messages with tag
// 5), while it takes the tag 4 ones from any source, half with blocking
// receives and half with non-blocking ones posted at once. Each message
// must be received exactly once, intact, from the sender reported, and
// each sender's in the order sent; the tag 5 ones go to receives naming
// their sender, posted before and waiting meanwhile. The senders go on to an allreduce as soon as they sent, so a
// receive from any source that read past the point-to-point messages
// would take the allreduce's instead. Shared by the in-process, process
// and emulated-host tests.
func anySourceExchange(c *Comm) error {
	n, me := c.Size(), c.Rank()
	for root := range n {
		if me != root {
			for k := range anyMsgs {
				if err := c.SendTag(anyPayload(me, k), anyCount, Int32, root, 4); err != nil {
					return fmt.Errorf("round %d: send %d: %w", root, k, err)
				}
				if k%4 == 1 {
					if err := c.SendTag([]byte{byte(me), byte(k)}, 2, Uint8, root, 5); err != nil {
						return fmt.Errorf("round %d: send tag 5: %w", root, err)
					}
				}
			}
		} else if err := anyReceive(c); err != nil {
			return fmt.Errorf("round %d: %w", root, err)
		}
		v := make([]byte, 8)
		binary.LittleEndian.PutUint64(v, uint64(me+1))
		if err := c.AllReduce(v, v, 1, Int64, Sum); err != nil {
			return fmt.Errorf("round %d: allreduce: %w", root, err)
		}
		if got, want := binary.LittleEndian.Uint64(v), uint64(n*(n+1)/2); got != want {
			return fmt.Errorf("round %d: allreduce after the receives gave %d, want %d", root, got, want)
		}
	}
	return nil
}

func anyReceive(c *Comm) error {
	n := c.Size()
	// The tag 5 receives, named by sender, wait beside the receives from any
	// source: the two kinds read the same streams by turns.
	type named struct {
		req    *Request
		buf    []byte
		src, k int
	}
	var tag5 []named
	for src := range n {
		if src == c.Rank() {
			continue
		}
		for k := range anyMsgs {
			if k%4 != 1 {
				continue
			}
			b := make([]byte, 2)
			r, err := c.IRecvTag(b, 2, Uint8, src, 5)
			if err != nil {
				return err
			}
			tag5 = append(tag5, named{r, b, src, k})
		}
	}
	total := (n - 1) * anyMsgs
	next := make([]int, n) // per sender: the message number expected next
	check := func(src int, b []byte) error {
		from, k := int(binary.LittleEndian.Uint32(b)), int(binary.LittleEndian.Uint32(b[4:]))
		if from != src {
			return fmt.Errorf("message from rank %d reported as from rank %d", from, src)
		}
		if k != next[src] {
			return fmt.Errorf("rank %d's message %d arrived when %d was due", src, k, next[src])
		}
		next[src]++
		if want := anyPayload(from, k); string(b) != string(want) {
			return fmt.Errorf("rank %d's message %d is corrupt", src, k)
		}
		return nil
	}
	for i := 0; i < total/2; i++ {
		b := make([]byte, 4*anyCount)
		src, err := c.RecvAny(b, anyCount, Int32, 4)
		if err != nil {
			return err
		}
		if err := check(src, b); err != nil {
			return err
		}
	}
	reqs := make([]*Request, total-total/2)
	bufs := make([][]byte, len(reqs))
	for i := range reqs {
		bufs[i] = make([]byte, 4*anyCount)
		r, err := c.IRecvAny(bufs[i], anyCount, Int32, 4)
		if err != nil {
			return err
		}
		reqs[i] = r
	}
	// Receives from any source with one tag complete in issue order, so
	// each sender's messages are checked in the order they came.
	for i, r := range reqs {
		if err := r.Wait(); err != nil {
			return err
		}
		if err := check(r.Source(), bufs[i]); err != nil {
			return err
		}
	}
	for src := range n {
		if src != c.Rank() && next[src] != anyMsgs {
			return fmt.Errorf("received %d messages from rank %d, want %d", next[src], src, anyMsgs)
		}
	}
	for _, m := range tag5 {
		if err := m.req.Wait(); err != nil {
			return err
		}
		if m.buf[0] != byte(m.src) || m.buf[1] != byte(m.k) {
			return fmt.Errorf("tag 5 message %d from rank %d reads %v", m.k, m.src, m.buf)
		}
	}
	return nil
}

func TestRecvAnySource(t *testing.T) {
	for _, w := range worlds {
		for _, n := range []int{2, 3, 5} {
			t.Run(fmt.Sprintf("%s/n=%d", w.name, n), func(t *testing.T) {
				mustRanks(t, w.make(t, n, Options{}), anySourceExchange)
			})
		}
	}
}

// Messages of its tag that a receive naming their sender kept early (it
// read past them for another tag) are taken by a receive from any source,
// in their sender's order, before a later message from another peer.
func TestRecvAnySourceTakesKeptMessages(t *testing.T) {
	comms := newLocal(t, 3, Options{Timeout: 20 * time.Second})
	mustRanks(t, comms, func(c *Comm) error {
		b := make([]byte, 4)
		switch c.Rank() {
		case 1:
			for _, v := range []uint32{11, 12} {
				binary.LittleEndian.PutUint32(b, v)
				if err := c.SendTag(b, 1, Int32, 0, 2); err != nil {
					return err
				}
			}
			if err := c.SendTag(b, 1, Int32, 0, 3); err != nil {
				return err
			}
			return c.Barrier()
		case 2:
			if err := c.Barrier(); err != nil {
				return err
			}
			binary.LittleEndian.PutUint32(b, 21)
			return c.SendTag(b, 1, Int32, 0, 2)
		}
		if err := c.RecvTag(b, 1, Int32, 1, 3); err != nil {
			return err
		}
		if err := c.Barrier(); err != nil {
			return err
		}
		for _, want := range []struct{ src, v int }{{1, 11}, {1, 12}, {2, 21}} {
			src, err := c.RecvAny(b, 1, Int32, 2)
			if err != nil {
				return err
			}
			if v := int(binary.LittleEndian.Uint32(b)); src != want.src || v != want.v {
				return fmt.Errorf("got %d from rank %d, want %d from rank %d", v, src, want.v, want.src)
			}
		}
		return nil
	})
}

// A message of the wrong size is a clear error naming its sender, not a
// truncated buffer.
func TestRecvAnySourceSizeMismatch(t *testing.T) {
	comms := newLocal(t, 3, Options{})
	errs := runRanks(comms, func(c *Comm) error {
		switch c.Rank() {
		case 0:
			_, err := c.RecvAny(make([]byte, 24), 6, Float32, 4)
			return err
		case 2:
			return c.SendTag(make([]byte, 20), 5, Float32, 0, 4)
		}
		return nil
	})
	err := errs[0]
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("rank 0: %v, want a mismatch", err)
	}
	for _, s := range []string{"tag 4", "expects 6 × float32 (24 bytes)", "rank 2 sent 5 × float32 (20 bytes)"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("rank 0's error %q does not say %q", err, s)
		}
	}
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "recv" || oe.Peer != 2 {
		t.Errorf("rank 0's error names %+v, want recv from rank 2", oe)
	}
}

func TestRecvAnySourceTimeoutAndArguments(t *testing.T) {
	comms := newLocal(t, 2, Options{Timeout: 50 * time.Millisecond})
	c := comms[0]
	b := make([]byte, 4)
	if _, err := c.RecvAny(b, 1, Float32, -1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("tag -1: %v", err)
	}
	if _, err := c.IRecvAny(b, 2, Float32, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("buffer too short: %v", err)
	}
	_, err := c.RecvAny(b, 1, Float32, 3)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "tag 3 from any rank") {
		t.Errorf("nothing sent: %v, want a timeout", err)
	}
	one := newLocal(t, 1, Options{})
	if _, err := one[0].RecvAny(b, 1, Float32, 0); !errors.Is(err, ErrInvalidUsage) {
		t.Errorf("one rank: %v", err)
	}
}

// Receives from any source across processes, over TCP and over shared
// memory.
func TestRecvAnySourceProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	roleProcesses(t, "anysource")
}

// Receives from any source across two emulated hosts (netns_test.go): each
// receiver takes messages over shared memory and TCP at once. Needs root;
// skipped otherwise.
func TestRecvAnySourceTwoHosts(t *testing.T) {
	h := newHosts(t, 2)
	kids := h.startRanks("anysource", 2, "GOCOLL_TIMEOUT=60s", "GOCOLL_DEBUG=INFO")
	waitRanks(t, kids, 2*time.Minute)
	for r, k := range kids {
		if k.Err != nil {
			t.Errorf("rank %d: %v\n%s", r, k.Err, lastLines(k.Out.String(), 30))
		} else if !strings.Contains(k.Out.String(), "shm_peers=1 tcp_peers=2") {
			t.Errorf("rank %d did not connect over both transports:\n%s", r, lastLines(k.Out.String(), 30))
		}
	}
	h.checkShm()
}

// Abort ends a receive from any source that nobody sends to at once, well
// before its timeout.
func TestRecvAnySourceAbort(t *testing.T) {
	comms := newLocal(t, 3, Options{Timeout: time.Minute})
	c := comms[0]
	r, err := c.IRecvAny(make([]byte, 4), 1, Float32, 0)
	if err != nil {
		t.Fatal(err)
	}
	proctest.Until(t, time.Minute, "receive from any source in flight", func() bool {
		return len(c.state("probe").InFlight) > 0
	})
	c.Abort()
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("receive from any source still waiting 30 s after Abort")
	}
	if err := r.Wait(); !errors.Is(err, ErrAborted) {
		t.Fatalf("after Abort: %v, want ErrAborted", err)
	}
	if src := r.Source(); src != -1 {
		t.Errorf("failed receive reports source %d", src)
	}
}

// BenchmarkPingPong is a round trip of 8 bytes between two ranks over
// shared memory, received from the named peer or from any source (which
// looks at the peers' streams without blocking on one).
func BenchmarkPingPong(b *testing.B) {
	for _, any := range []bool{false, true} {
		b.Run(map[bool]string{false: "named", true: "any"}[any], func(b *testing.B) {
			comms := newShm(b, 2, Options{})
			recv := func(c *Comm, buf []byte, peer int) error {
				if any {
					_, err := c.RecvAny(buf, 1, Int64, 0)
					return err
				}
				return c.Recv(buf, 1, Int64, peer)
			}
			b.ResetTimer()
			mustRanks(b, comms, func(c *Comm) error {
				buf := make([]byte, 8)
				peer := 1 - c.Rank()
				for range b.N {
					if c.Rank() == 0 {
						if err := c.Send(buf, 1, Int64, peer); err != nil {
							return err
						}
						if err := recv(c, buf, peer); err != nil {
							return err
						}
					} else {
						if err := recv(c, buf, peer); err != nil {
							return err
						}
						if err := c.Send(buf, 1, Int64, peer); err != nil {
							return err
						}
					}
				}
				return nil
			})
		})
	}
}
