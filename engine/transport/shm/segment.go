//go:build linux

package shm

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

// Segment layout. Page 0 is the header (shmseg: identity, state, failure,
// and the layout words below); then one control block per inbound slot;
// then, page aligned, one ring of ringBytes per slot. The first hotSlots
// slots are the hot peers' (hotPeers): the file's pages up to the end of
// their rings are allocated at creation, the rest on first touch.
//
// All words are naturally aligned 64-bit words accessed with sync/atomic when
// they change after creation. Immutable fields are written before the magic
// is published (atomic store) and read after it was seen.
const (
	segMagic   uint64 = 0x4d4853_4c4c4f4347 // "GCOLLSHM" in little-endian byte order
	segVersion uint64 = 4                   // 3: in a memory file opened by descriptor; 4: hot slots
	pageSize          = shmseg.PageSize

	offSlots     = shmseg.OffLayout
	offRingBytes = shmseg.OffLayout + 8
	offDataOff   = shmseg.OffLayout + 16
	offHotSlots  = shmseg.OffLayout + 24

	ctrlOff   = pageSize
	ctrlBytes = 512 // four 128-byte lines, so that no two writers share a line (or an adjacent-line prefetch pair)

	ctlTail     = 0   // bytes written so far (producer); low 32 bits are the consumer's futex word
	ctlPeer     = 8   // rank of the producer (immutable)
	ctlHead     = 128 // bytes consumed so far (consumer); low 32 bits are the producer's futex word
	ctlConsWait = 256 // consumer sleeps on tail (consumer writes, producer reads)
	ctlProdWait = 384 // producer sleeps on head (producer writes, consumer reads)
)

// format is the ring segment's kind. A segment that cannot be found means
// the peer is gone: shmseg's default error is a *transport.PeerLostError
// naming it, which a shrink connecting the survivors needs to learn which
// rank died meanwhile and agree again without it.
var format = shmseg.Format{Magic: segMagic, Version: segVersion}

func dataOffset(slots int) int {
	return roundUp(ctrlOff+slots*ctrlBytes, pageSize)
}

func segmentBytes(slots, ring int) int {
	return dataOffset(slots) + slots*ring
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

// ring is one SPSC byte ring as seen by one side.
type ring struct {
	tail, head         *atomic.Uint64
	consWait, prodWait *atomic.Uint64
	data               []byte
	mask               uint64
	chunk              uint64 // most bytes copied before the counter is published
}

// ringChunk is the most bytes a producer copies into a ring (or a consumer
// out of it) before publishing its counter. Small enough that the other
// side starts on the first chunk while this one copies the next, and
// below Go's memmove threshold for non-temporal stores (1 MiB), which
// would send the ring's lines to memory just before the consumer reads
// them. Measured on the 2-vCPU VM (BenchmarkPingPong and BenchmarkStream,
// MB/s, 1 s each, alternated; goroutines / processes): 1 MiB ping-pong
// 18,200-19,700 / 17,100-18,700 with 1 MiB chunks, 34,500-35,900 /
// 31,300-34,200 with 512 KiB, 42,900-50,500 / 38,700-44,800 with 128 KiB;
// 1 MiB streamed 40,300-42,900 / 40,300-41,500 against 51,900-54,400 /
// 51,000-54,200; 16 MiB 21,200-23,600 / 21,100-21,900 against
// 28,700-32,900 / 28,500-31,900. 64 and 32 KiB gained nothing more.
const ringChunk = 128 << 10

func makeRing(ctrl []byte, data []byte) ring {
	return ring{
		tail:     shmseg.Word(ctrl, ctlTail),
		head:     shmseg.Word(ctrl, ctlHead),
		consWait: shmseg.Word(ctrl, ctlConsWait),
		prodWait: shmseg.Word(ctrl, ctlProdWait),
		data:     data,
		mask:     uint64(len(data) - 1),
		chunk:    uint64(min(len(data)/4, ringChunk)),
	}
}

// createSegment creates, sizes and maps the rank's own segment in a memory
// file, pre-touches its header, control blocks and the rings of its first
// hot slots, and writes its header. slotPeers[i] is the rank that produces
// into slot i.
func createSegment(tag [8]byte, rank, size int, slotPeers []int, hot, ringBytes int) ([]byte, int, error) {
	n := segmentBytes(len(slotPeers), ringBytes)
	m, fd, err := format.CreateHot(fmt.Sprintf("gocoll-%x-%d", tag[:], rank), shmseg.ID{Tag: tag, Rank: rank, Size: size}, n, dataOffset(len(slotPeers))+hot*ringBytes)
	if err != nil {
		return nil, -1, err
	}
	ne := binary.NativeEndian
	ne.PutUint64(m[offSlots:], uint64(len(slotPeers)))
	ne.PutUint64(m[offRingBytes:], uint64(ringBytes))
	ne.PutUint64(m[offDataOff:], uint64(dataOffset(len(slotPeers))))
	ne.PutUint64(m[offHotSlots:], uint64(hot))
	for i, p := range slotPeers {
		ne.PutUint64(m[ctrlOff+i*ctrlBytes+ctlPeer:], uint64(p))
	}
	format.Publish(m)
	return m, fd, nil
}

// peerSegment is this rank's view of a peer's segment: the header and
// control pages, and the one ring in which this rank produces.
type peerSegment struct {
	hdr  []byte // [0, dataOff)
	data []byte // this rank's ring
	// proc is the creator, with its start time to tell it from a
	// process that reused its pid.
	proc shmsync.Proc
	ring ring
}

func (s *peerSegment) state() uint64 { return shmseg.Header(s.hdr).State().Load() }

// failure reads the failure a peer announced; call after state() returned
// shmseg.StateAborted.
func (s *peerSegment) failure() transport.Failure {
	f, _ := shmseg.Header(s.hdr).Failure()
	return f
}

func (s *peerSegment) unmap() {
	if s.data != nil {
		syscall.Munmap(s.data)
		s.data = nil
	}
	if s.hdr != nil {
		syscall.Munmap(s.hdr)
		s.hdr = nil
	}
}

// openSegment maps the peer's segment that ref names and verifies that it
// is the segment of rank peer of this communicator with a slot for rank
// self.
func openSegment(open shmsync.Opener, ref PeerInfo, tag [8]byte, self, peer, size int) (*peerSegment, error) {
	f, err := format.Open(open, ref, shmseg.ID{Tag: tag, Rank: peer, Size: size}, pageSize)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	page, err := f.Map(0, pageSize, syscall.PROT_READ, 0)
	if err != nil {
		return nil, err
	}
	// Read the immutable header from a first read-only look.
	ne := binary.NativeEndian
	err = f.Check(page, ref.Pid)
	creator := shmseg.Header(page).Creator()
	slots := int(ne.Uint64(page[offSlots:]))
	ringBytes := int(ne.Uint64(page[offRingBytes:]))
	dataOff := int(ne.Uint64(page[offDataOff:]))
	hot := int(ne.Uint64(page[offHotSlots:]))
	syscall.Munmap(page)
	switch {
	case err != nil:
		return nil, err
	case slots < 0 || slots > 1<<16 || ringBytes < MinRingBytes || ringBytes > MaxRingBytes ||
		ringBytes&(ringBytes-1) != 0 || dataOff != dataOffset(slots) || hot < 0 || hot > slots:
		return nil, f.Errorf("corrupt layout (slots %d, hot %d, ring %d, data at %d)", slots, hot, ringBytes, dataOff)
	case int64(segmentBytes(slots, ringBytes)) != f.Size:
		return nil, f.Errorf("file has %d bytes, layout needs %d", f.Size, segmentBytes(slots, ringBytes))
	}
	hdr, err := f.Map(0, dataOff, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_POPULATE)
	if err != nil {
		return nil, err
	}
	slot := -1
	for i := 0; i < slots; i++ {
		if int(ne.Uint64(hdr[ctrlOff+i*ctrlBytes+ctlPeer:])) == self {
			slot = i
			break
		}
	}
	if slot < 0 {
		syscall.Munmap(hdr)
		return nil, f.Errorf("no inbound ring for rank %d (not among its peers)", self)
	}
	// A cold ring's pages are allocated when the first message goes
	// through: populating its mapping now would allocate them.
	populate := 0
	if slot < hot {
		populate = syscall.MAP_POPULATE
	}
	data, err := f.Map(int64(dataOff+slot*ringBytes), ringBytes, syscall.PROT_READ|syscall.PROT_WRITE, populate)
	if err != nil {
		syscall.Munmap(hdr)
		return nil, err
	}
	s := &peerSegment{hdr: hdr, data: data, proc: creator}
	s.ring = makeRing(hdr[ctrlOff+slot*ctrlBytes:ctrlOff+(slot+1)*ctrlBytes], data)
	return s, nil
}
