//go:build linux

package shmcoll

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

// Segment layout: page 0 is the header, page 1 the synchronisation page,
// then two data slots of slotBytes each (none when the communicator has
// one rank). Multi-byte fields are native-endian 64-bit words; immutable ones
// are written before the magic is published and read after it was seen.
const (
	segMagic   uint64 = 0x414e4552_41434f47 // "GOCARENA"
	segVersion uint64 = 2
	pageSize          = 4096

	offMagic     = 0
	offVersion   = 8
	offTag       = 16
	offPid       = 24
	offStart     = 32 // creator's start time (/proc/<pid>/stat field 22)
	offRank      = 40
	offSize      = 48
	offSlotBytes = 56
	offDataOff   = 64
	offSegBytes  = 72
	offBase      = 80  // address of this mapping in the creator's process (for the CMA probe)
	offCMA       = 88  // cmaOK or cmaNo once the creator probed its peers: written before its first arrival
	offState     = 128 // own cache line: stateReady, stateClosed, stateAborted
	offFailKind  = 192 // failKind*, then origin rank, reason length: written before state
	offFailFrom  = 200
	offReasonLen = 208
	offReason    = 256 // reason text up to the end of the page
	maxReason    = pageSize - offReason

	syncOff    = pageSize
	syncArrive = 0   // arrival counter, then the two call records: written by the owner
	syncRecs   = 8   // 2 records of recordWords words
	syncWait   = 128 // peers sleeping on the arrival counter: written by the peers
	dataOff    = 2 * pageSize
)

const (
	stateReady   uint64 = 1
	stateClosed  uint64 = 2
	stateAborted uint64 = 3

	failAborted  uint64 = 1
	failLost     uint64 = 2
	failMismatch uint64 = 3
)

// callID identifies a call; ranks compare it at every barrier.
type callID struct {
	seq, sig, nbytes, desc uint64
}

// record is what a rank publishes for the call it runs at a phase: the
// call, and where its send buffer of the current piece lies when that is
// registered memory (reg: allocation id, 0 for none; regOff: byte offset of
// the piece in it), which peers then read in place, or, failing that, the
// buffer's address in this process (addr, 0 for none), which peers read
// with process_vm_readv. Without either, the data is in the rank's slot.
type record struct {
	id          callID
	reg, regOff uint64
	addr        uint64
}

const recordWords = int(unsafe.Sizeof(record{}) / 8)

// The table of registered allocations on the synchronisation page: regMax
// entries of (id, size), id 0 for a free entry; written by the owner (size,
// then id) under its allocation lock, read by peers mapping an allocation.
const (
	regTableOff = syncOff + 1024
	regMax      = (pageSize - 1024) / 16
)

func init() {
	if syncRecs+2*recordWords*8 > syncWait {
		panic("shmcoll: call records overflow their cache line")
	}
}

func segmentBytes(size, slot int) int {
	if size == 1 {
		return dataOff
	}
	return dataOff + 2*slot
}

// word returns the 64-bit word at off in m (off must be 8-aligned).
func word(m []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m[off]))
}

// segment is one rank's segment as mapped by this process.
type segment struct {
	rank    int
	m       []byte
	state   *atomic.Uint64
	arrive  *atomic.Uint64
	waiters *atomic.Uint64
	recs    [2]*record
	slots   [2][]byte
	proc    shmsync.Proc
	remote  bool // in another process: check its liveness while waiting
}

func newSegment(rank int, m []byte, slot int, proc shmsync.Proc) *segment {
	s := &segment{
		rank:    rank,
		m:       m,
		state:   word(m, offState),
		arrive:  word(m, syncOff+syncArrive),
		waiters: word(m, syncOff+syncWait),
		proc:    proc,
		remote:  proc.Pid != shmsync.Self().Pid,
	}
	for i := range s.recs {
		s.recs[i] = (*record)(unsafe.Pointer(&m[syncOff+syncRecs+i*recordWords*8]))
	}
	if len(m) > dataOff {
		s.slots[0] = m[dataOff : dataOff+slot : dataOff+slot]
		s.slots[1] = m[dataOff+slot : dataOff+2*slot : dataOff+2*slot]
	}
	return s
}

// failure reads the failure a peer recorded; call after state() returned
// stateAborted.
func (s *segment) failure() (transport.Failure, uint64) {
	kind := word(s.m, offFailKind).Load()
	n := min(word(s.m, offReasonLen).Load(), maxReason)
	f := transport.Failure{
		Origin: int(word(s.m, offFailFrom).Load()),
		Lost:   kind == failLost,
		Reason: string(s.m[offReason : offReason+int(n)]),
	}
	return f, kind
}

// createSegment creates, sizes, maps and pre-touches the rank's segment
// and writes its header.
func createSegment(path string, tag [8]byte, rank, size, slot int) ([]byte, error) {
	n := segmentBytes(size, slot)
	m, err := shmsync.CreateMapped(path, n)
	if err != nil {
		return nil, err
	}
	me := shmsync.Self()
	ne := binary.NativeEndian
	ne.PutUint64(m[offVersion:], segVersion)
	copy(m[offTag:offTag+8], tag[:])
	ne.PutUint64(m[offPid:], uint64(me.Pid))
	ne.PutUint64(m[offStart:], me.Start)
	ne.PutUint64(m[offRank:], uint64(rank))
	ne.PutUint64(m[offSize:], uint64(size))
	ne.PutUint64(m[offSlotBytes:], uint64(slot))
	ne.PutUint64(m[offDataOff:], dataOff)
	ne.PutUint64(m[offSegBytes:], uint64(n))
	ne.PutUint64(m[offBase:], addrOf(m))
	word(m, offState).Store(stateReady)
	word(m, offMagic).Store(segMagic) // publish
	return m, nil
}

// openSegment maps the segment of rank peer at path and verifies that it
// belongs to this communicator and layout.
func openSegment(path string, tag [8]byte, peer, size, slot, pid int) (*segment, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, &transport.PeerLostError{Peer: peer, Reason: fmt.Sprintf("segment %s: %v", path, err)}
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
	if st.Size < dataOff {
		return nil, bad("file too small (%d bytes)", st.Size)
	}
	m, err := syscall.Mmap(fd, 0, int(st.Size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	ne := binary.NativeEndian
	magic := word(m, offMagic).Load()
	var gotTag [8]byte
	copy(gotTag[:], m[offTag:offTag+8])
	hpid := int(ne.Uint64(m[offPid:]))
	start := ne.Uint64(m[offStart:])
	want := segmentBytes(size, slot)
	var verr error
	switch {
	case magic != segMagic:
		verr = bad("bad magic %#x", magic)
	case ne.Uint64(m[offVersion:]) != segVersion:
		verr = bad("version %d, want %d", ne.Uint64(m[offVersion:]), segVersion)
	case gotTag != tag:
		verr = bad("communicator tag %x, want %x", gotTag, tag)
	case int(ne.Uint64(m[offRank:])) != peer:
		verr = bad("created by rank %d", ne.Uint64(m[offRank:]))
	case int(ne.Uint64(m[offSize:])) != size:
		verr = bad("communicator size %d, want %d", ne.Uint64(m[offSize:]), size)
	case int(ne.Uint64(m[offSlotBytes:])) != slot:
		verr = bad("slot size %d, this rank uses %d", ne.Uint64(m[offSlotBytes:]), slot)
	case ne.Uint64(m[offDataOff:]) != dataOff || int64(ne.Uint64(m[offSegBytes:])) != st.Size || st.Size != int64(want):
		verr = bad("layout: %d bytes, data at %d; want %d bytes", st.Size, ne.Uint64(m[offDataOff:]), want)
	case pid != 0 && hpid != pid:
		verr = bad("created by pid %d, peer reports pid %d", hpid, pid)
	}
	if verr != nil {
		syscall.Munmap(m)
		return nil, verr
	}
	return newSegment(peer, m, slot, shmsync.Proc{Pid: hpid, Start: start}), nil
}
