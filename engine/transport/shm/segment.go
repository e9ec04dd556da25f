//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport"
)

// Segment layout. Page 0 is the header; then one control block per inbound
// slot; then, page aligned, one ring of ringBytes per slot.
//
// All words are naturally aligned 64-bit words accessed with sync/atomic when
// they change after creation. Immutable fields are written before the magic
// is published (atomic store) and read after it was seen.
const (
	segMagic   uint64 = 0x4d4853_4c4c4f4347 // "GCOLLSHM" in little-endian byte order
	segVersion uint64 = 1
	pageSize          = 4096

	offMagic     = 0
	offVersion   = 8
	offTag       = 16
	offPid       = 24
	offStart     = 32 // creator's start time, /proc/<pid>/stat field 22
	offRank      = 40
	offSize      = 48
	offSlots     = 56
	offRingBytes = 64
	offDataOff   = 72
	offState     = 128 // own cache line: stateReady, stateClosed, stateAborted
	offReasonLen = 192
	offOrigin    = 200 // rank where the failure started, plus 1 (0: this rank)
	offCause     = 208 // causeAborted or causeLost
	offReason    = 256 // abort reason text up to the end of the page
	maxReason    = pageSize - offReason

	ctrlOff   = pageSize
	ctrlBytes = 512 // four 128-byte lines, so that no two writers share a line (or an adjacent-line prefetch pair)

	ctlTail     = 0   // bytes written so far (producer); low 32 bits are the consumer's futex word
	ctlPeer     = 8   // rank of the producer (immutable)
	ctlHead     = 128 // bytes consumed so far (consumer); low 32 bits are the producer's futex word
	ctlConsWait = 256 // consumer sleeps on tail (consumer writes, producer reads)
	ctlProdWait = 384 // producer sleeps on head (producer writes, consumer reads)
)

// What an aborted segment reports (offCause): the origin rank aborted with
// the reason, or was lost (its process died).
const (
	causeAborted uint64 = 0
	causeLost    uint64 = 1
)

const (
	stateInit    uint64 = 0
	stateReady   uint64 = 1
	stateClosed  uint64 = 2
	stateAborted uint64 = 3
)

func dataOffset(slots int) int {
	return roundUp(ctrlOff+slots*ctrlBytes, pageSize)
}

func segmentBytes(slots, ring int) int {
	return dataOffset(slots) + slots*ring
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

// word returns the 64-bit word at off in m (off must be 8-aligned).
func word(m []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m[off]))
}

// ring is one SPSC byte ring as seen by one side.
type ring struct {
	tail, head         *atomic.Uint64
	consWait, prodWait *atomic.Uint64
	data               []byte
	mask               uint64
	chunk              uint64 // most bytes copied before the counter is published
}

func makeRing(ctrl []byte, data []byte) ring {
	return ring{
		tail:     word(ctrl, ctlTail),
		head:     word(ctrl, ctlHead),
		consWait: word(ctrl, ctlConsWait),
		prodWait: word(ctrl, ctlProdWait),
		data:     data,
		mask:     uint64(len(data) - 1),
		chunk:    uint64(min(len(data)/4, 1<<20)),
	}
}

// createSegment creates, sizes, maps and pre-touches the rank's own segment
// and writes its header. slotPeers[i] is the rank that produces into slot i.
func createSegment(path string, tag [8]byte, rank, size int, slotPeers []int, ringBytes int) ([]byte, error) {
	n := segmentBytes(len(slotPeers), ringBytes)
	m, err := shmsync.CreateMapped(path, n)
	if err != nil {
		return nil, err
	}
	start, _ := shmsync.ProcStart(os.Getpid())
	binary.LittleEndian.PutUint64(m[offVersion:], segVersion)
	copy(m[offTag:offTag+8], tag[:])
	binary.LittleEndian.PutUint64(m[offPid:], uint64(os.Getpid()))
	binary.LittleEndian.PutUint64(m[offStart:], start)
	binary.LittleEndian.PutUint64(m[offRank:], uint64(rank))
	binary.LittleEndian.PutUint64(m[offSize:], uint64(size))
	binary.LittleEndian.PutUint64(m[offSlots:], uint64(len(slotPeers)))
	binary.LittleEndian.PutUint64(m[offRingBytes:], uint64(ringBytes))
	binary.LittleEndian.PutUint64(m[offDataOff:], uint64(dataOffset(len(slotPeers))))
	for i, p := range slotPeers {
		binary.LittleEndian.PutUint64(m[ctrlOff+i*ctrlBytes+ctlPeer:], uint64(p))
	}
	word(m, offState).Store(stateReady)
	word(m, offMagic).Store(segMagic) // publish
	return m, nil
}

// peerSegment is this rank's view of a peer's segment: the header and
// control pages, and the one ring in which this rank produces.
type peerSegment struct {
	hdr  []byte // [0, dataOff)
	data []byte // this rank's ring
	pid  int
	// start is the creator's start time, to tell it from a process that
	// reused its pid.
	start uint64
	ring  ring
}

func (s *peerSegment) state() uint64 { return word(s.hdr, offState).Load() }

// reason reads the abort reason a peer left in its header; call after
// state() returned stateAborted.
func (s *peerSegment) reason() string {
	n := word(s.hdr, offReasonLen).Load()
	if n > maxReason {
		n = maxReason
	}
	return string(s.hdr[offReason : offReason+int(n)])
}

// failure reads the failure a peer announced; call after state() returned
// stateAborted.
func (s *peerSegment) failure(peer int) transport.Failure {
	f := transport.Failure{Origin: peer, Reason: s.reason()}
	if o := word(s.hdr, offOrigin).Load(); o > 0 {
		f.Origin = int(o - 1)
	}
	f.Lost = word(s.hdr, offCause).Load() == causeLost
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

// openSegment maps the peer's segment at path and verifies that it is the
// segment of rank peer of this communicator with a slot for rank self.
func openSegment(path string, tag [8]byte, self, peer, size, pid int) (*peerSegment, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("%w: rank %d segment %s: %v", transport.ErrPeerLost, peer, path, err)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: rank %d segment %s: %s", transport.ErrProtocol, peer, path, fmt.Sprintf(format, a...))
	}
	if st.Size < pageSize {
		return nil, bad("file too small (%d bytes)", st.Size)
	}
	page, err := syscall.Mmap(fd, 0, pageSize, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	// Read the immutable header from a first read-only look.
	le := binary.LittleEndian
	magic := word(page, offMagic).Load()
	version := le.Uint64(page[offVersion:])
	var gotTag [8]byte
	copy(gotTag[:], page[offTag:offTag+8])
	hpid := int(le.Uint64(page[offPid:]))
	start := le.Uint64(page[offStart:])
	hrank := int(le.Uint64(page[offRank:]))
	hsize := int(le.Uint64(page[offSize:]))
	slots := int(le.Uint64(page[offSlots:]))
	ringBytes := int(le.Uint64(page[offRingBytes:]))
	dataOff := int(le.Uint64(page[offDataOff:]))
	syscall.Munmap(page)
	switch {
	case magic != segMagic:
		return nil, bad("bad magic %#x", magic)
	case version != segVersion:
		return nil, bad("version %d, want %d", version, segVersion)
	case gotTag != tag:
		return nil, bad("communicator tag %x, want %x", gotTag, tag)
	case hrank != peer:
		return nil, bad("created by rank %d", hrank)
	case hsize != size:
		return nil, bad("communicator size %d, want %d", hsize, size)
	case pid != 0 && hpid != pid:
		return nil, bad("created by pid %d, peer reports pid %d", hpid, pid)
	case slots < 0 || slots > 1<<16 || ringBytes < MinRingBytes || ringBytes > MaxRingBytes ||
		ringBytes&(ringBytes-1) != 0 || dataOff != dataOffset(slots):
		return nil, bad("corrupt layout (slots %d, ring %d, data at %d)", slots, ringBytes, dataOff)
	case int64(segmentBytes(slots, ringBytes)) != st.Size:
		return nil, bad("file has %d bytes, layout needs %d", st.Size, segmentBytes(slots, ringBytes))
	}
	hdr, err := syscall.Mmap(fd, 0, dataOff, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	slot := -1
	for i := 0; i < slots; i++ {
		if int(le.Uint64(hdr[ctrlOff+i*ctrlBytes+ctlPeer:])) == self {
			slot = i
			break
		}
	}
	if slot < 0 {
		syscall.Munmap(hdr)
		return nil, bad("no inbound ring for rank %d (not among its peers)", self)
	}
	data, err := syscall.Mmap(fd, int64(dataOff+slot*ringBytes), ringBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		syscall.Munmap(hdr)
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	s := &peerSegment{hdr: hdr, data: data, pid: hpid, start: start}
	s.ring = makeRing(hdr[ctrlOff+slot*ctrlBytes:ctrlOff+(slot+1)*ctrlBytes], data)
	return s, nil
}
