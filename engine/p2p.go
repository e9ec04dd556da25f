package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// Point-to-point messages carry a tag, as in MPI and torch.distributed: a
// receive with tag t takes the oldest message with tag t from its peer that
// no earlier receive took, so messages with different tags may be received
// in any order the receiver chooses, while messages with one tag stay in
// order. Send and Recv use tag 0.
//
// The transports deliver one ordered stream per peer and a receiver must
// name a message's length before reading it, so a message travels as two:
// an envelope (tag, datatype, count) of fixed size, then the payload. The
// receiving side reads the stream only while one of its receives waits, one
// reader at a time, for all of them: a message whose receive was posted
// lands in that receive's buffer; one that arrived early is kept (MPI's and
// Gloo's unexpected-message queue) until a receive asks for its tag. A
// Python matcher above an in-order stream could not do this without
// buffering every message.
//
// Reading happens only while a receive is in flight, and collectives wait
// for point-to-point operations issued before them, so the stream is never
// read ahead into a collective's messages.

// MaxTag is the largest tag a send or receive accepts (C's INT_MAX, so that
// every binding can pass any tag).
const MaxTag = math.MaxInt32

// envelopeLen is the size of an envelope: tag, count (8 bytes each) and
// datatype (4), padded.
const envelopeLen = 24

// envelopeSig marks envelopes in their headers (no collective has this
// signature's inputs), so that a receive meeting a collective's message
// reports a mismatch instead of reading it as an envelope.
var envelopeSig = signature(pointToPoint, 0, 0, 0, -1, "envelope")

// envelope describes the payload that follows it.
type envelope struct {
	tag   int
	dt    DataType
	count int
}

func (e envelope) bytes() int { return e.count * e.dt.Size() }

func (e envelope) encode(b []byte) {
	_ = b[envelopeLen-1]
	binary.LittleEndian.PutUint64(b[0:], uint64(e.tag))
	binary.LittleEndian.PutUint64(b[8:], uint64(e.count))
	binary.LittleEndian.PutUint32(b[16:], uint32(e.dt))
	clear(b[20:envelopeLen])
}

// maxP2PBytes bounds the payload an envelope may announce: a corrupt count
// must not make an early message allocate without limit.
const maxP2PBytes = 1 << 46

// decodeEnvelope parses an envelope received from a peer.
func decodeEnvelope(b []byte) (envelope, error) {
	if len(b) != envelopeLen {
		return envelope{}, fmt.Errorf("%w: envelope of %d bytes, want %d", transport.ErrProtocol, len(b), envelopeLen)
	}
	tag := binary.LittleEndian.Uint64(b[0:])
	count := binary.LittleEndian.Uint64(b[8:])
	dt := DataType(int32(binary.LittleEndian.Uint32(b[16:])))
	switch {
	case tag > MaxTag:
		return envelope{}, fmt.Errorf("%w: envelope with tag %d", transport.ErrProtocol, tag)
	case !dt.Valid():
		return envelope{}, fmt.Errorf("%w: envelope with datatype %d", transport.ErrProtocol, int32(dt))
	case count > maxP2PBytes/uint64(dt.Size()):
		return envelope{}, fmt.Errorf("%w: envelope announcing %d elements of %s", transport.ErrProtocol, count, dt)
	}
	return envelope{tag: int(tag), dt: dt, count: int(count)}, nil
}

func payloadSig(dt DataType, count int) uint64 { return signature(pointToPoint, dt, count, 0, -1, "") }

// inbox is the receiving end of one peer's point-to-point messages.
type inbox struct {
	mu      sync.Mutex
	seq     uint64        // number of the next message on the stream
	reading bool          // a receive is reading the stream for all of them
	posted  []*posting    // receives waiting for a message, oldest first
	early   []early       // messages no receive was waiting for, oldest first
	broken  error         // the stream failed: every receive fails with this
	wake    chan struct{} // closed (then replaced) whenever a read ends
}

// posting is a receive waiting in an inbox.
type posting struct {
	env     envelope // what it expects
	buf     []byte
	claimed bool // a reader is receiving its payload into buf
	done    bool
	err     error
}

type early struct {
	env  envelope
	data []byte
}

func newInboxes(n int) []*inbox {
	in := make([]*inbox, n)
	for i := range in {
		in[i] = &inbox{wake: make(chan struct{})}
	}
	return in
}

// take removes and returns the oldest early message with tag, if any.
func (in *inbox) take(tag int) (early, bool) {
	for i, m := range in.early {
		if m.env.tag == tag {
			in.early = slices.Delete(in.early, i, i+1)
			return m, true
		}
	}
	return early{}, false
}

// claim removes and returns the oldest posted receive for tag, if any.
func (in *inbox) claim(tag int) *posting {
	for i, p := range in.posted {
		if p.env.tag == tag {
			in.posted = slices.Delete(in.posted, i, i+1)
			p.claimed = true
			return p
		}
	}
	return nil
}

func (in *inbox) unpost(p *posting) {
	if i := slices.Index(in.posted, p); i >= 0 {
		in.posted = slices.Delete(in.posted, i, i+1)
	}
}

// signal wakes the receives waiting for a read to end. Called with mu held.
func (in *inbox) signal() {
	close(in.wake)
	in.wake = make(chan struct{})
}

// breakWith fails every waiting receive, and every later one, with err.
// Called with mu held.
func (in *inbox) breakWith(err error) {
	if in.broken == nil {
		in.broken = err
	}
	for _, p := range in.posted {
		p.done, p.err = true, in.broken
	}
	in.posted = nil
}

// accepts checks that a message matched by tag is the one the receive
// expects (same datatype and count, as a collective's signature would).
func (p *posting) accepts(peer int, got envelope) error {
	want := p.env
	if got.dt == want.dt && got.count == want.count {
		return nil
	}
	return &peerError{peer: peer, err: fmt.Errorf("%w: recv from rank %d with tag %d expects %d × %s (%d bytes), rank %d sent %d × %s (%d bytes)",
		ErrMismatch, peer, want.tag, want.count, want.dt, want.bytes(), peer, got.count, got.dt, got.bytes())}
}

// recvTagged completes the receive p from peer: from an early message, or
// by waiting while this or another receive reads the stream.
func (x *execCtx) recvTagged(peer int, p *posting) error {
	c := x.c
	x.waitingFor(peer)
	in := c.p2p.inboxes[peer]
	in.mu.Lock()
	if in.broken != nil {
		err := in.broken
		in.mu.Unlock()
		return err
	}
	if m, ok := in.take(p.env.tag); ok {
		in.mu.Unlock()
		if err := p.accepts(peer, m.env); err != nil {
			return err
		}
		copy(p.buf, m.data)
		return nil
	}
	in.posted = append(in.posted, p)
	ctx := x.context()
	expired := false
	for !p.done {
		if in.broken != nil {
			in.unpost(p)
			p.done, p.err = true, in.broken
			break
		}
		if !in.reading {
			in.reading = true
			seq := in.seq
			in.mu.Unlock()
			err := x.readOne(peer, in, seq)
			in.mu.Lock()
			in.reading = false
			if err != nil {
				in.breakWith(err)
			}
			in.signal()
			continue
		}
		wake := in.wake
		in.mu.Unlock()
		if expired {
			<-wake // the reader fills p.buf: wait for it, bounded by its own deadline
		} else {
			select {
			case <-wake:
			case <-ctx.Done():
				expired = true
			}
		}
		in.mu.Lock()
		if expired && !p.claimed && !p.done {
			in.unpost(p)
			in.mu.Unlock()
			return wrapPeer(peer, ctx.Err(), c.opts.Timeout)
		}
	}
	in.mu.Unlock()
	return p.err
}

// readOne reads message seq of peer's stream: into the buffer of the oldest
// receive posted for its tag, else into an early message.
func (x *execCtx) readOne(peer int, in *inbox, seq uint64) error {
	var eb [envelopeLen]byte
	h := transport.Header{Kind: transport.KindData, Seq: seq | p2pSeqBit, Sig: envelopeSig, Len: envelopeLen}
	if err := x.recvHeader(peer, h, eb[:]); err != nil {
		return err
	}
	env, err := decodeEnvelope(eb[:])
	if err != nil {
		return &peerError{peer: peer, err: err}
	}
	in.mu.Lock()
	p := in.claim(env.tag)
	in.mu.Unlock()
	var dst []byte
	if p != nil {
		if err := p.accepts(peer, env); err != nil {
			in.mu.Lock()
			p.done, p.err = true, err
			in.mu.Unlock()
			return err
		}
		dst = p.buf
	} else {
		dst = make([]byte, env.bytes())
	}
	if len(dst) > 0 {
		h = transport.Header{Kind: transport.KindData, Seq: seq | p2pSeqBit, Sig: payloadSig(env.dt, env.count), Step: 1, Len: uint64(len(dst))}
		err = x.recvHeader(peer, h, dst)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if err != nil {
		if p != nil {
			p.done, p.err = true, err
		}
		return err
	}
	in.seq = seq + 1
	if p == nil {
		// Its receive may have been posted while the payload came in.
		if p = in.claim(env.tag); p == nil {
			in.early = append(in.early, early{env, dst})
			return nil
		}
		if err := p.accepts(peer, env); err != nil {
			p.done, p.err = true, err
			return err
		}
		copy(p.buf, dst)
	}
	p.done = true
	return nil
}

// sendTagged sends env's envelope, then its payload.
func (x *execCtx) sendTagged(peer int, env envelope, data []byte) error {
	var eb [envelopeLen]byte
	env.encode(eb[:])
	h := transport.Header{Kind: transport.KindData, Seq: x.seq, Sig: envelopeSig, Len: envelopeLen}
	if err := x.sendHeader(peer, h, eb[:]); err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	h = transport.Header{Kind: transport.KindData, Seq: x.seq, Sig: payloadSig(env.dt, env.count), Step: 1, Len: uint64(len(data))}
	return x.sendHeader(peer, h, data)
}

func checkTag(tag int) error {
	if tag < 0 || tag > MaxTag {
		return invalidArg("tag %d out of range [0,%d]", tag, MaxTag)
	}
	return nil
}

// Send sends count elements to peer with tag 0 (see SendTag).
//
//gocoll:forms
func (c *Comm) sendReq(r *Request, buf []byte, count int, dt DataType, peer int) error {
	return c.p2pReq(r, true, buf, count, dt, peer, 0)
}

// SendTag sends count elements to peer, which receives them with a RecvTag
// of the same tag, count and type. Messages to one peer leave in issue
// order; the receiver may take messages of different tags in any order. A
// send may wait until the peer posts a receive from this rank (any tag).
//
//gocoll:forms
func (c *Comm) sendTagReq(r *Request, buf []byte, count int, dt DataType, peer, tag int) error {
	return c.p2pReq(r, true, buf, count, dt, peer, tag)
}

// Recv receives count elements from peer's Send (tag 0; see RecvTag).
//
//gocoll:forms
func (c *Comm) recvReq(r *Request, buf []byte, count int, dt DataType, peer int) error {
	return c.p2pReq(r, false, buf, count, dt, peer, 0)
}

// RecvTag receives into buf the oldest message from peer with tag that no
// earlier receive took. Its count and type must be the sender's: a
// difference fails with ErrMismatch (and, as every failure, ends the
// communicator). Receives with different tags from one peer complete in
// whatever order their messages arrive; receives with one tag, in issue order.
//
//gocoll:forms
func (c *Comm) recvTagReq(r *Request, buf []byte, count int, dt DataType, peer, tag int) error {
	return c.p2pReq(r, false, buf, count, dt, peer, tag)
}

// p2pReq makes r a send of buf to peer, or a receive of it from peer.
func (c *Comm) p2pReq(r *Request, send bool, buf []byte, count int, dt DataType, peer, tag int) error {
	op := "recv"
	if send {
		op = "send"
	}
	if err := firstErr(checkType(dt), c.checkRank("peer", peer), checkTag(tag), checkBuf(op, buf, count, dt)); err != nil {
		return err
	}
	if peer == c.rank && send {
		return fmt.Errorf("%w: send to self (rank %d) would never be received", ErrInvalidUsage, peer)
	}
	if peer == c.rank {
		return fmt.Errorf("%w: receive from self (rank %d) would never complete", ErrInvalidUsage, peer)
	}
	buf = buf[:count*dt.Size()]
	env := envelope{tag: tag, dt: dt, count: count}
	sig := payloadSig(dt, count)
	*r = Request{op: op, peer: peer, tag: tag, isSend: send, dt: dt, hasType: true, bytes: len(buf)}
	if send {
		r.run = func(x *execCtx) error {
			x.sig, x.bytes = sig, len(buf)
			return x.sendTagged(peer, env, buf)
		}
	} else {
		r.run = func(x *execCtx) error {
			x.sig, x.bytes = sig, len(buf)
			return x.recvTagged(peer, &posting{env: env, buf: buf})
		}
	}
	return nil
}

// AnySource, as the peer of a receive, takes a message from whichever peer
// sends one first (MPI_ANY_SOURCE; see RecvAny).
const AnySource = -1

// RecvAny receives into buf the first message with tag that arrives from
// any peer and that no receive naming its sender is waiting for, and
// returns the sender's rank. Messages from one sender are taken in the
// order they were sent; which sender comes first when several sent is
// unspecified. Count and type must be the sender's, as for RecvTag: a
// difference fails with ErrMismatch. Receives from any source with one tag
// complete in issue order.
func (c *Comm) RecvAny(buf []byte, count int, dt DataType, tag int) (int, error) {
	src := -1
	var r Request
	if err := c.run(&r, c.recvAnyReq(&r, buf, count, dt, tag, func(s int) { src = s })); err != nil {
		return -1, err
	}
	return src, nil
}

// IRecvAny is the non-blocking RecvAny: it returns once the operation is
// queued; the request's Source names the sender once it finished.
func (c *Comm) IRecvAny(buf []byte, count int, dt DataType, tag int) (*Request, error) {
	var r Request
	return c.start(&r, c.recvAnyReq(&r, buf, count, dt, tag, nil))
}

// RecvAnyOp prepares a RecvAny without issuing it (see Op). got, when not
// nil, is called with the sender's rank before the operation completes
// (the started request's Source has it too).
func (c *Comm) RecvAnyOp(buf []byte, count int, dt DataType, tag int, got func(source int)) (o Op) {
	o.c = c
	o.err = c.recvAnyReq(&o.r, buf, count, dt, tag, got)
	return
}

func (c *Comm) recvAnyReq(r *Request, buf []byte, count int, dt DataType, tag int, got func(int)) error {
	if err := firstErr(checkType(dt), checkTag(tag), checkBuf("recv", buf, count, dt)); err != nil {
		return err
	}
	if c.size < 2 {
		return fmt.Errorf("%w: receive from any source on a communicator of one rank would never complete", ErrInvalidUsage)
	}
	pk, ok := c.tr.(transport.Peeker)
	if !ok {
		return fmt.Errorf("%w: this communicator's transport cannot receive from any source", ErrInvalidUsage)
	}
	buf = buf[:count*dt.Size()]
	env := envelope{tag: tag, dt: dt, count: count}
	sig := payloadSig(dt, count)
	src := new(int)
	*r = Request{op: "recv", peer: -1, anySrc: true, src: src, tag: tag, dt: dt, hasType: true, bytes: len(buf), run: func(x *execCtx) error {
		x.sig, x.bytes = sig, len(buf)
		peer, err := x.recvAny(pk, &posting{env: env, buf: buf})
		if err != nil {
			return err
		}
		*src = peer
		if got != nil {
			got(peer)
		}
		return nil
	}}
	return nil
}

// Polling of a receive from any source: after a round that found nothing
// it yields the processor for up to anySpin (a reply that is on its way
// comes within a few microseconds, sooner than a timer wakes), then sleeps
// between rounds, doubling from anyPollMin to anyPollMax, so an idle wait
// costs little CPU.
const (
	anySpin    = 50 * time.Microsecond
	anyPollMin = 20 * time.Microsecond
	anyPollMax = time.Millisecond
)

// recvAny completes p from the first peer with a message for it. A
// transport reader blocks until its peer sends, and what a peer sends next
// may be a collective's message that this receive must leave unread (a
// collective issued later on this rank reads it), so it never waits on one
// peer: it takes an early message for its tag if one was kept, else reads
// from every peer whose stream is idle and holds a point-to-point envelope
// at its front (Peek), and sleeps when none does. A message read for
// another tag is kept as any receive keeps it. Peers are visited from the
// one after the last sender, so no sender is starved.
func (x *execCtx) recvAny(pk transport.Peeker, p *posting) (int, error) {
	c := x.c
	ctx := x.context()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	pause := time.Duration(0)
	idleSince := time.Now()
	for {
		read, live := false, 0
		var lost error
		first := int(c.p2p.anyNext.Load())
		for i := range c.size {
			peer := (first + i) % c.size
			if peer == c.rank {
				continue
			}
			in := c.p2p.inboxes[peer]
			in.mu.Lock()
			if in.broken != nil {
				lost = in.broken
				in.mu.Unlock()
				continue
			}
			live++
			if m, ok := in.take(p.env.tag); ok {
				in.mu.Unlock()
				c.p2p.anyNext.Store(int64(peer + 1))
				if err := p.accepts(peer, m.env); err != nil {
					return peer, err
				}
				copy(p.buf, m.data)
				return peer, nil
			}
			if in.reading {
				in.mu.Unlock()
				continue
			}
			in.reading = true
			seq := in.seq
			in.mu.Unlock()
			var err error
			h, ok := pk.Peek(peer)
			envelopeNext := ok && h.Kind == transport.KindData && h.Seq == seq|p2pSeqBit && h.Sig == envelopeSig
			if envelopeNext || ok && h.Kind == transport.KindAbort {
				// (An abort is read for its reason, which fails the receive.)
				read = true
				err = x.readOne(peer, in, seq)
			}
			in.mu.Lock()
			in.reading = false
			if err != nil {
				in.breakWith(err)
			}
			// Receives that found this reader at work wait for its end
			// (a look that read nothing need not wake anyone else).
			if read || err != nil || len(in.posted) > 0 {
				in.signal()
			}
			in.mu.Unlock()
			if err != nil {
				return peer, err
			}
		}
		if live == 0 {
			return -1, lost
		}
		if read {
			pause, idleSince = 0, time.Now()
			continue
		}
		if err := ctx.Err(); err == nil && time.Since(idleSince) < anySpin {
			runtime.Gosched()
			continue
		}
		pause = min(max(2*pause, anyPollMin), anyPollMax)
		if timer == nil {
			timer = time.NewTimer(pause)
		} else {
			timer.Reset(pause)
		}
		x.waitingFor(-1)
		select {
		case <-timer.C:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return -1, fmt.Errorf("%w after %v waiting for a message with tag %d from any rank", ErrTimeout, c.opts.Timeout, p.env.tag)
			}
			return -1, ctx.Err()
		}
	}
}

// p2pKey names a chain of point-to-point operations that run one after
// the other: the sends to a peer (its stream is written in issue order),
// and the receives from a peer with one tag (matched in issue order).
// Receives with different tags run side by side.
type p2pKey struct {
	peer int
	send bool
	tag  int
}

// pruneChains forgets finished chains once there are many (a program
// may use a new tag every step) on a communicator of n ranks. Called by
// the worker only.
func (s *p2pState) pruneChains(n int) {
	if len(s.chain) < 2*n+64 {
		return
	}
	for k, done := range s.chain {
		select {
		case <-done:
			delete(s.chain, k)
		default:
		}
	}
}

// p2pState is a communicator's point-to-point bookkeeping.
type p2pState struct {
	// Sequence numbers, under execMu: stream messages sent per peer,
	// receives issued per peer and from any source (they name the
	// operations in flight records).
	sendSeq, recvSeq []uint64
	anySeq           uint64
	anyNext          atomic.Int64 // where a receive from any source starts looking
	wg               sync.WaitGroup
	chain            map[p2pKey]chan struct{} // done channel of each chain's last operation (worker only)
	inboxes          []*inbox                 // per peer: tag matching of received messages
}
