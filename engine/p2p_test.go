package engine

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// tagMsg is one message of tagExchange: rank from sends it to rank to.
type tagMsg struct {
	tag   int
	dt    DataType
	count int
	k     int // its rank among the messages with this tag between the pair
}

// tagMessages is what every rank sends to every other rank, in this order:
// tags out of order, one tag twice (its two messages must arrive in order),
// sizes from 0 to 1 MiB (the large one first, so that a receiver asking
// for a later tag has to keep it), several datatypes.
func tagMessages(from, to int) []tagMsg {
	return []tagMsg{
		{tag: 9, dt: Float32, count: 1 << 18},
		{tag: 3, dt: Int64, count: 5 + from},
		{tag: 0, dt: Uint8, count: 1 + to},
		{tag: 7, dt: Float64, count: 0},
		{tag: 3, dt: Int64, count: 5 + from, k: 1},
		{tag: MaxTag, dt: Bfloat16, count: 33},
		{tag: 1, dt: Int32, count: 1000 + 7*from + to},
	}
}

func tagPayload(from, to int, m tagMsg) []byte {
	b := make([]byte, m.count*m.dt.Size())
	for i := range b {
		b[i] = byte(from*31 + to*17 + m.tag*7 + m.k*5 + i)
	}
	return b
}

// tagExchange sends tagMessages from every rank to every other rank and
// receives them in another order on each rank (reversed, and rotated by
// the rank), all posted at once, then checks every byte. Shared by the
// in-process and the process tests.
func tagExchange(c *Comm) error {
	n, me := c.Size(), c.Rank()
	type pending struct {
		req       *Request
		buf, want []byte
		what      string
	}
	var reqs []pending
	for p := 0; p < n; p++ {
		if p == me {
			continue
		}
		for _, m := range tagMessages(me, p) {
			r, err := c.ISendTag(tagPayload(me, p, m), m.count, m.dt, p, m.tag)
			if err != nil {
				return err
			}
			reqs = append(reqs, pending{req: r, what: fmt.Sprintf("send tag %d to %d", m.tag, p)})
		}
	}
	for p := 0; p < n; p++ {
		if p == me {
			continue
		}
		ms := tagMessages(p, me)
		order := make([]tagMsg, 0, len(ms))
		for i := range ms {
			order = append(order, ms[(len(ms)-1-i+me)%len(ms)])
		}
		// Same-tag receives must keep their order: put k=0 before k=1.
		first := -1
		for i, m := range order {
			if m.tag == 3 {
				if first < 0 {
					first = i
				} else if order[first].k == 1 {
					order[first], order[i] = order[i], order[first]
				}
			}
		}
		for _, m := range order {
			buf := make([]byte, m.count*m.dt.Size())
			r, err := c.IRecvTag(buf, m.count, m.dt, p, m.tag)
			if err != nil {
				return err
			}
			reqs = append(reqs, pending{r, buf, tagPayload(p, me, m), fmt.Sprintf("recv tag %d #%d from %d", m.tag, m.k, p)})
		}
	}
	for _, p := range reqs {
		if err := p.req.Wait(); err != nil {
			return fmt.Errorf("%s: %w", p.what, err)
		}
		if p.want != nil && !bytes.Equal(p.buf, p.want) {
			return fmt.Errorf("%s: wrong data", p.what)
		}
	}
	// The streams are intact for the collectives that follow.
	b := make([]byte, 4)
	putF32(b, 1)
	if err := c.AllReduce(b, b, 1, Float32, Sum); err != nil {
		return err
	}
	want := make([]byte, 4)
	putF32(want, float32(n))
	if !bytes.Equal(b, want) {
		return fmt.Errorf("allreduce after the exchange: got % x", b)
	}
	return nil
}

func TestTaggedPointToPoint(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			comms := newLocal(t, n, Options{})
			mustRanks(t, comms, tagExchange)
		})
	}
}

// Blocking receives in the reverse order of the sends.
func TestTaggedBlockingReverse(t *testing.T) {
	comms := newLocal(t, 2, Options{})
	mustRanks(t, comms, func(c *Comm) error {
		b := make([]byte, 8)
		if c.Rank() == 0 {
			for tag := 1; tag <= 3; tag++ {
				b[0] = byte(tag)
				if err := c.SendTag(b, 8, Uint8, 1, tag); err != nil {
					return err
				}
			}
			return nil
		}
		for tag := 3; tag >= 1; tag-- {
			if err := c.RecvTag(b, 8, Uint8, 0, tag); err != nil {
				return err
			}
			if b[0] != byte(tag) {
				return fmt.Errorf("tag %d received the message of tag %d", tag, b[0])
			}
		}
		return nil
	})
}

// A receive completes as soon as its message is in, even while an earlier
// receive from the same peer (another tag) still waits: rank 1 needs tag
// 1's message before it can let rank 0 send tag 2.
func TestTaggedReceiveNotBehindEarlierTag(t *testing.T) {
	comms := newLocal(t, 2, Options{})
	mustRanks(t, comms, func(c *Comm) error {
		b := make([]byte, 4)
		if c.Rank() == 0 {
			if err := c.SendTag(b, 4, Uint8, 1, 1); err != nil {
				return err
			}
			if err := c.Recv(b, 4, Uint8, 1); err != nil {
				return err
			}
			return c.SendTag(b, 4, Uint8, 1, 2)
		}
		r2, err := c.IRecvTag(make([]byte, 4), 4, Uint8, 0, 2)
		if err != nil {
			return err
		}
		r1, err := c.IRecvTag(b, 4, Uint8, 0, 1)
		if err != nil {
			return err
		}
		if err := r1.Wait(); err != nil {
			return err
		}
		if err := c.Send(b, 4, Uint8, 0); err != nil {
			return err
		}
		return r2.Wait()
	})
}

func TestTaggedSizeMismatch(t *testing.T) {
	// posted: the receive waits when the message comes; early: the message
	// is kept before the receive asks for it.
	for _, early := range []bool{false, true} {
		t.Run(fmt.Sprint("early=", early), func(t *testing.T) {
			comms := newLocal(t, 2, Options{})
			errs := runRanks(comms, func(c *Comm) error {
				if c.Rank() == 0 {
					if err := c.SendTag(make([]byte, 20), 5, Float32, 1, 4); err != nil {
						return err
					}
					return c.SendTag(make([]byte, 1), 1, Uint8, 1, 5)
				}
				if early {
					if err := c.RecvTag(make([]byte, 1), 1, Uint8, 0, 5); err != nil {
						return err
					}
				}
				return c.RecvTag(make([]byte, 24), 6, Float32, 0, 4)
			})
			err := errs[1]
			if !errors.Is(err, ErrMismatch) || !errors.Is(err, ErrInvalidUsage) {
				t.Fatalf("rank 1: %v, want a mismatch", err)
			}
			for _, s := range []string{"tag 4", "expects 6 × float32 (24 bytes)", "rank 0 sent 5 × float32 (20 bytes)"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("rank 1's error %q does not say %q", err, s)
				}
			}
			var oe *OpError
			if !errors.As(err, &oe) || oe.Op != "recv" || oe.Peer != 0 {
				t.Errorf("rank 1's error names %+v, want recv waiting for rank 0", oe)
			}
		})
	}
}

// A send that is not received before the receiver's next collective is a
// clear error, not data read as the collective's.
func TestUnreceivedSendBeforeCollective(t *testing.T) {
	comms := newLocal(t, 2, Options{})
	errs := runRanks(comms, func(c *Comm) error {
		b := make([]byte, 4)
		if c.Rank() == 0 {
			if err := c.SendTag(b, 1, Float32, 1, 7); err != nil {
				return err
			}
		}
		return c.AllReduce(b, b, 1, Float32, Sum)
	})
	if !errors.Is(errs[1], ErrMismatch) || !strings.Contains(errs[1].Error(), "point-to-point message that was not received") {
		t.Fatalf("rank 1: %v", errs[1])
	}
}

func TestTagArguments(t *testing.T) {
	comms := newLocal(t, 2, Options{})
	c := comms[0]
	b := make([]byte, 4)
	for _, tag := range []int{-1, MaxTag + 1} {
		if err := c.SendTag(b, 1, Float32, 1, tag); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("send tag %d: %v", tag, err)
		}
		if _, err := c.IRecvTag(b, 1, Float32, 1, tag); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("recv tag %d: %v", tag, err)
		}
	}
	// Nothing was sent: the communicator still works.
	mustRanks(t, comms, func(c *Comm) error { return c.Barrier() })
}

// A receive that times out while another receive reads the stream leaves
// cleanly (its buffer is not written afterwards).
func TestTaggedReceiveTimeout(t *testing.T) {
	comms := newLocal(t, 2, Options{Timeout: 50e6})
	errs := runRanks(comms, func(c *Comm) error {
		if c.Rank() == 0 {
			return nil
		}
		r1, err := c.IRecvTag(make([]byte, 4), 1, Float32, 0, 1)
		if err != nil {
			return err
		}
		r2, err := c.IRecvTag(make([]byte, 4), 1, Float32, 0, 2)
		if err != nil {
			return err
		}
		return errors.Join(r1.Wait(), r2.Wait())
	})
	if !errors.Is(errs[1], ErrTimeout) || !strings.Contains(errs[1].Error(), "waiting for rank 0") {
		t.Fatalf("rank 1: %v", errs[1])
	}
}

func FuzzEnvelope(f *testing.F) {
	b := make([]byte, envelopeLen)
	envelope{tag: 7, dt: Float32, count: 100}.encode(b)
	f.Add(b)
	f.Add(make([]byte, envelopeLen))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEnvelope(b)
		if err != nil {
			return
		}
		if e.tag < 0 || e.tag > MaxTag || !e.dt.Valid() || e.count < 0 || e.bytes() > maxP2PBytes {
			t.Fatalf("accepted %+v", e)
		}
		out := make([]byte, envelopeLen)
		e.encode(out)
		if e2, err := decodeEnvelope(out); err != nil || e2 != e {
			t.Fatalf("round trip %+v -> %+v, %v", e, e2, err)
		}
	})
}

// A failure of another rank than the one waited for names that rank (it
// read "recv … (peer rank 1): … rank 2 aborted").
func TestFailureNamesTheFailedRank(t *testing.T) {
	for _, op := range []func(c *Comm) error{
		func(c *Comm) error { return c.Recv(make([]byte, 4), 1, Float32, 1) },
		func(c *Comm) error { return c.AllReduce(make([]byte, 4), make([]byte, 4), 1, Float32, Sum) },
	} {
		comms := newLocal(t, 3, Options{})
		comms[2].Abort()
		err := op(comms[0])
		var oe *OpError
		if !errors.As(err, &oe) || oe.Peer != 2 || !errors.Is(err, ErrRemoteAbort) {
			t.Errorf("rank 0: %v, want an OpError naming rank 2", err)
		}
		if err != nil && strings.Contains(err.Error(), "(peer rank 1)") {
			t.Errorf("rank 0's error names rank 1: %v", err)
		}
	}
}
