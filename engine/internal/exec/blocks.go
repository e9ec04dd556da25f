package exec

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

// Span is where a block lies in a user buffer: runs of n bytes, the first
// at off, each stride bytes after the one before (one run: contiguous).
type Span struct{ Off, N, Runs, Stride int }

func (s Span) Size() int { return s.N * s.Runs }

func (s Span) contiguous() bool { return s.Runs <= 1 || s.Stride == s.N }

// end is one past the last byte the Span touches.
func (s Span) end() int {
	if s.Runs == 0 || s.N == 0 {
		return s.Off
	}
	return s.Off + (s.Runs-1)*s.Stride + s.N
}

// view is a contiguous Span's bytes in buf.
func (s Span) view(buf []byte) []byte { return buf[s.Off : s.Off+s.Size()] }

// pack copies the Span's bytes out of buf into dst (Size() bytes).
func (s Span) pack(dst, buf []byte) {
	if s.contiguous() {
		copy(dst, s.view(buf))
		return
	}
	for i := range s.Runs {
		copy(dst[i*s.N:(i+1)*s.N], buf[s.Off+i*s.Stride:])
	}
}

// unpack copies src (Size() bytes) into the Span's place in buf.
func (s Span) unpack(buf, src []byte) {
	if s.contiguous() {
		copy(s.view(buf), src)
		return
	}
	for i := range s.Runs {
		copy(buf[s.Off+i*s.Stride:s.Off+i*s.Stride+s.N], src[i*s.N:])
	}
}

// Layout binds a block-mode schedule to a call: block i of send is
// the one for rank i, block i of recv where the one from rank i goes.
type Layout struct {
	Send, Recv []byte
	In, Work   []Span
	// AllToAllv's blocks in bytes, for the arena and the schedule's
	// parameters (In and Work are made from them when a schedule runs).
	SendBlocks, RecvBlocks []sched.Block
}

// blockState is what a block-mode run keeps besides the layout.
type blockState struct {
	lay *Layout
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
		return r.blk.lay.In[i].Size()
	case sched.Work:
		return r.blk.lay.Work[i].Size()
	}
	return len(*r.blk.tmp.at(i))
}

// blockBytes is unit i of buffer b as contiguous bytes: a view of the
// user's buffer, or a packed copy of a strided block (held until the run
// ends).
func (r *runner) blockBytes(b sched.Buf, i int) []byte {
	var sp Span
	var buf []byte
	switch b {
	case sched.In:
		sp, buf = r.blk.lay.In[i], r.blk.lay.Send
	case sched.Work:
		sp, buf = r.blk.lay.Work[i], r.blk.lay.Recv
	default:
		return *r.blk.tmp.at(i)
	}
	if sp.contiguous() {
		return sp.view(buf)
	}
	out := r.l.Pool().Get(sp.Size())
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
		sp := r.blk.lay.Work[i]
		if len(data) != sp.Size() {
			return r.l.PeerError(i, fmt.Errorf("%w: counts differ between ranks: rank %d sends %d bytes to rank %d, which expects %d bytes from it",
				transport.ErrMismatch, i, len(data), r.l.Rank(), sp.Size()))
		}
		sp.unpack(r.blk.lay.Recv, data)
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
	msg := r.l.Pool().Get(total)
	defer r.l.Pool().Put(msg)
	at := metaBytes * k
	for i := range k {
		u := o.Src.Off + i
		n := r.blockSize(o.Src.Buf, u)
		binary.LittleEndian.PutUint64(msg[metaBytes*i:], uint64(n))
		if o.Src.Buf == sched.Tmp {
			copy(msg[at:], *r.blk.tmp.at(u))
		} else {
			sp, buf := r.blk.lay.In[u], r.blk.lay.Send
			if o.Src.Buf == sched.Work {
				sp, buf = r.blk.lay.Work[u], r.blk.lay.Recv
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
		h, msg, err = r.l.RecvVar(o.Peer)
		if err == nil && h.Step != o.Tag {
			err = r.l.CheckStep(o.Peer, int(o.Tag), h)
		}
	}
	if err != nil {
		if msg != nil {
			r.l.Pool().Put(msg)
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
		r.l.Pool().Put(msg)
		return r.l.PeerError(peer, fmt.Errorf("%w: rank %d sent %d bytes for %d blocks' sizes", transport.ErrProtocol, peer, len(msg), k))
	}
	at := metaBytes * k
	for i := range k {
		n := binary.LittleEndian.Uint64(msg[metaBytes*i:])
		if n > uint64(len(msg)-at) {
			r.l.Pool().Put(msg)
			return r.l.PeerError(peer, fmt.Errorf("%w: rank %d sent a message whose block sizes add up to more than its %d bytes", transport.ErrProtocol, peer, len(msg)))
		}
		at += int(n)
	}
	if at != len(msg) {
		r.l.Pool().Put(msg)
		return r.l.PeerError(peer, fmt.Errorf("%w: rank %d sent %d bytes, its block sizes say %d", transport.ErrProtocol, peer, len(msg), at))
	}
	at = metaBytes * k
	for i := range k {
		n := int(binary.LittleEndian.Uint64(msg[metaBytes*i:]))
		if err := r.putBlock(dst.Buf, dst.Off+i, msg[at:at+n:at+n]); err != nil {
			r.l.Pool().Put(msg)
			return err
		}
		at += n
	}
	if dst.Buf == sched.Tmp {
		r.blk.hold(msg)
	} else {
		r.l.Pool().Put(msg)
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
func (b *blockState) release(p *Pool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.held {
		p.Put(h)
	}
	b.held = nil
}
