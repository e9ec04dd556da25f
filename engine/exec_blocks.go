package engine

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/engine/transport"
)

// Block mode (sched.Schedule.Blocks): the schedule's ranges count whole
// blocks of an alltoallv or alltoallw, whose sizes only the ranks that
// send or receive them know. The executor finds a block's bytes from the
// call's layout (In and Work) or from what arrived (Tmp), writes the sizes
// in front of every message it sends, and reads them from every message it
// receives: a repacking rank forwards blocks it knows only from their
// messages, a destination checks each against the size it expects.
// Non-contiguous blocks (alltoallw's strided vectors) are packed when they
// leave the user's buffer and unpacked when they enter it, nowhere else.

// span is where a block lies in a user buffer: runs of n bytes, the first
// at off, each stride bytes after the one before (one run: contiguous).
type span struct{ off, n, runs, stride int }

func (s span) size() int { return s.n * s.runs }

func (s span) contiguous() bool { return s.runs <= 1 || s.stride == s.n }

// end is one past the last byte the span touches.
func (s span) end() int {
	if s.runs == 0 || s.n == 0 {
		return s.off
	}
	return s.off + (s.runs-1)*s.stride + s.n
}

// view is a contiguous span's bytes in buf.
func (s span) view(buf []byte) []byte { return buf[s.off : s.off+s.size()] }

// pack copies the span's bytes out of buf into dst (size() bytes).
func (s span) pack(dst, buf []byte) {
	if s.contiguous() {
		copy(dst, s.view(buf))
		return
	}
	for i := range s.runs {
		copy(dst[i*s.n:(i+1)*s.n], buf[s.off+i*s.stride:])
	}
}

// unpack copies src (size() bytes) into the span's place in buf.
func (s span) unpack(buf, src []byte) {
	if s.contiguous() {
		copy(s.view(buf), src)
		return
	}
	for i := range s.runs {
		copy(buf[s.off+i*s.stride:s.off+i*s.stride+s.n], src[i*s.n:])
	}
}

// blockLayout binds a block-mode schedule to a call: block i of send is
// the one for rank i, block i of recv where the one from rank i goes.
type blockLayout struct {
	send, recv []byte
	in, work   []span
	// AllToAllv's blocks in bytes, for the arena and the schedule's
	// parameters (in and work are made from them when a schedule runs).
	sendBlocks, recvBlocks []sched.Block
}

// blockState is what a block-mode run keeps besides the layout.
type blockState struct {
	lay *blockLayout
	tmp slotTable
	mu  sync.Mutex
	// held are buffers Tmp slots point into (received messages, packed
	// blocks), given back to the pool when the run ends.
	held [][]byte
}

func (b *blockState) hold(buf []byte) {
	b.mu.Lock()
	b.held = append(b.held, buf)
	b.mu.Unlock()
}

// slotTable holds Tmp's blocks, in pages that never move once made: a
// control-tree run learns how many it needs only as decisions come, while
// receives fill slots from their own goroutines. What a slot holds is
// ordered by the schedule's hazards, like bytes of a buffer.
type slotTable struct {
	mu    sync.Mutex
	pages []*[slotPage][]byte
}

const slotPage = 256

func (t *slotTable) at(i int) *[]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.pages) <= i/slotPage {
		t.pages = append(t.pages, new([slotPage][]byte))
	}
	return &t.pages[i/slotPage][i%slotPage]
}

// metaBytes is the size of a message's header of block sizes.
const metaBytes = 8

// blockSize is the size of unit i of buffer b.
func (r *runner) blockSize(b sched.Buf, i int) int {
	switch b {
	case sched.In:
		return r.blk.lay.in[i].size()
	case sched.Work:
		return r.blk.lay.work[i].size()
	}
	return len(*r.blk.tmp.at(i))
}

// blockBytes is unit i of buffer b as contiguous bytes: a view of the
// user's buffer, or a packed copy of a strided block (held until the run
// ends).
func (r *runner) blockBytes(b sched.Buf, i int) []byte {
	var sp span
	var buf []byte
	switch b {
	case sched.In:
		sp, buf = r.blk.lay.in[i], r.blk.lay.send
	case sched.Work:
		sp, buf = r.blk.lay.work[i], r.blk.lay.recv
	default:
		return *r.blk.tmp.at(i)
	}
	if sp.contiguous() {
		return sp.view(buf)
	}
	out := r.x.c.getScratch(sp.size())
	sp.pack(out, buf)
	r.blk.hold(out)
	return out
}

// putBlock stores data as unit i of buffer b: Tmp keeps a reference, Work
// takes a copy in the user's layout after checking its size against the
// one this rank expects from rank i (its recvcounts[i] or recvtypes[i]).
func (r *runner) putBlock(b sched.Buf, i int, data []byte) error {
	switch b {
	case sched.Tmp:
		*r.blk.tmp.at(i) = data
		return nil
	case sched.Work:
		sp := r.blk.lay.work[i]
		if len(data) != sp.size() {
			return &peerError{peer: i, err: fmt.Errorf("%w: counts differ between ranks: rank %d sends %d bytes to rank %d, which expects %d bytes from it",
				ErrMismatch, i, len(data), r.x.rank(), sp.size())}
		}
		sp.unpack(r.blk.lay.recv, data)
		return nil
	}
	return fmt.Errorf("gocoll: block-mode schedule writes into %s", b)
}

// sendBlocks sends the units of o.Src as one message: their sizes, then
// their bytes.
func (r *runner) sendBlocks(o *sched.Op) error {
	k := o.Src.Len
	total := metaBytes * k
	for i := range k {
		total += r.blockSize(o.Src.Buf, o.Src.Off+i)
	}
	msg := r.x.c.getScratch(total)
	defer r.x.c.putScratch(msg)
	at := metaBytes * k
	for i := range k {
		u := o.Src.Off + i
		n := r.blockSize(o.Src.Buf, u)
		binary.LittleEndian.PutUint64(msg[metaBytes*i:], uint64(n))
		if o.Src.Buf == sched.Tmp {
			copy(msg[at:], *r.blk.tmp.at(u))
		} else {
			sp, buf := r.blk.lay.in[u], r.blk.lay.send
			if o.Src.Buf == sched.Work {
				sp, buf = r.blk.lay.work[u], r.blk.lay.recv
			}
			sp.pack(msg[at:at+n], buf)
		}
		at += n
	}
	return r.sendMsg(o.Peer, int(o.Tag), msg)
}

// recvBlocks receives the message of o (by tag in a matched run, else the
// next from the peer) and stores its blocks as the units of o.Dst.
func (r *runner) recvBlocks(o *sched.Op) error {
	var msg []byte
	var err error
	if r.mail != nil {
		msg, err = r.mailRecv(o.Peer, o.Tag)
	} else {
		var h transport.Header
		h, msg, err = r.x.recvVar(o.Peer)
		if err == nil && h.Step != o.Tag {
			want := r.x.header(int(o.Tag), int(h.Len))
			err = wrapPeer(o.Peer, transport.Check(o.Peer, want, h), r.x.c.opts.Timeout)
		}
	}
	if err != nil {
		if msg != nil {
			r.x.c.putScratch(msg)
		}
		return err
	}
	return r.deliver(o.Dst, o.Peer, msg)
}

// deliver parses a message of dst.Len blocks from peer into dst's units.
// The message buffer is held while Tmp slots point into it.
func (r *runner) deliver(dst sched.Range, peer int, msg []byte) error {
	k := dst.Len
	if len(msg) < metaBytes*k {
		r.x.c.putScratch(msg)
		return &peerError{peer: peer, err: fmt.Errorf("%w: rank %d sent %d bytes for %d blocks' sizes", transport.ErrProtocol, peer, len(msg), k)}
	}
	at := metaBytes * k
	for i := range k {
		n := binary.LittleEndian.Uint64(msg[metaBytes*i:])
		if n > uint64(len(msg)-at) {
			r.x.c.putScratch(msg)
			return &peerError{peer: peer, err: fmt.Errorf("%w: rank %d sent a message whose block sizes add up to more than its %d bytes", transport.ErrProtocol, peer, len(msg))}
		}
		at += int(n)
	}
	if at != len(msg) {
		r.x.c.putScratch(msg)
		return &peerError{peer: peer, err: fmt.Errorf("%w: rank %d sent %d bytes, its block sizes say %d", transport.ErrProtocol, peer, len(msg), at)}
	}
	at = metaBytes * k
	for i := range k {
		n := int(binary.LittleEndian.Uint64(msg[metaBytes*i:]))
		if err := r.putBlock(dst.Buf, dst.Off+i, msg[at:at+n:at+n]); err != nil {
			r.x.c.putScratch(msg)
			return err
		}
		at += n
	}
	if dst.Buf == sched.Tmp {
		r.blk.hold(msg)
	} else {
		r.x.c.putScratch(msg)
	}
	return nil
}

// copyBlocks moves units from o.Src to o.Dst: references into Tmp, bytes
// into the user's buffer.
func (r *runner) copyBlocks(o *sched.Op) error {
	for i := range o.Src.Len {
		if err := r.putBlock(o.Dst.Buf, o.Dst.Off+i, r.blockBytes(o.Src.Buf, o.Src.Off+i)); err != nil {
			return err
		}
	}
	return nil
}

// release gives the run's held buffers back to the pool.
func (b *blockState) release(c *Comm) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.held {
		c.putScratch(h)
	}
	b.held = nil
}
