//go:build linux

package shmcoll

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gocoll/gocoll/engine/internal/shmseg"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
)

// Segment layout: page 0 is the header (shmseg: identity, state, failure,
// and the layout words below), page 1 the synchronisation page, then two
// data slots of slotBytes each (none when the communicator has one rank).
// Multi-byte fields are native-endian 64-bit words; immutable ones are
// written before the magic is published and read after it was seen.
const (
	segMagic   uint64 = 0x414e4552_41434f47 // "GOCARENA"
	segVersion uint64 = 7                   // 3: registered allocations are memory files named by descriptor; 4: so is the segment; 5: the store gate; 6: a counter per record; 7: AllToAllv's sizes lines after the slots
	pageSize          = shmseg.PageSize

	offSlotBytes = shmseg.OffLayout
	offDataOff   = shmseg.OffLayout + 8
	offSegBytes  = shmseg.OffLayout + 16
	offBase      = shmseg.OffLayout + 24 // address of this mapping in the creator's process (for the CMA probe)
	offCMA       = shmseg.OffLayout + 32 // cmaOK or cmaNo once the creator probed its peers: written before its first arrival

	syncOff    = pageSize
	syncArrive = 0 // two cache lines, for even and odd phases, each an arrival counter and a call record: written by the owner
	syncRecs   = 8 // the record's offset in its line
	syncLine   = 64
	syncWait   = 128 // peers sleeping on the arrival counter: written by the peers
	syncGate   = 192 // the store gate (Arena.claimStore): written by the owner and the peer that writes into its buffer
	dataOff    = 2 * pageSize
)

var format = shmseg.Format{Magic: segMagic, Version: segVersion}

// callID identifies a call; ranks compare it at every barrier.
type callID struct {
	seq, sig, nbytes, desc uint64
}

// sameCall says whether two records name the same call: all but the path
// vote, which only the leader publishes (choosePath).
func sameCall(x, y callID) bool {
	x.desc &^= voteBits
	y.desc &^= voteBits
	return x == y
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
// entries of (id | fd<<32, size), 0 for a free entry; written by the owner (size,
// then id) under its allocation lock, read by peers mapping an allocation.
const (
	regTableOff = syncOff + 1024
	regMax      = (pageSize - 1024) / 16
)

func init() {
	if syncRecs+recordWords*8 > syncLine || syncArrive+2*syncLine > syncWait {
		panic("shmcoll: call records overflow their cache lines")
	}
	if offCMA+8 > shmseg.LayoutEnd {
		panic("shmcoll: layout words overflow the header's")
	}
}

func segmentBytes(size, slot int) int {
	if size == 1 {
		return dataOff
	}
	return dataOff + 2*slot + 2*vSizesBytes(size)
}

// vSizesBytes is the room of one buffer set's AllToAllv sizes lines, a
// cache line per rank (after the two slots, so that a slot's columns hold
// data only: with the lines in them, a block of a power-of-two size took
// one more piece than the columns' width suggests).
func vSizesBytes(size int) int { return roundUp(size*lineBytes, pageSize) }

// segment is one rank's segment as mapped by this process.
type segment struct {
	rank    int
	m       []byte
	state   *atomic.Uint64
	arrive  [2]*atomic.Uint64 // by phase parity (see arrived)
	waiters *atomic.Uint64
	gate    *atomic.Uint64
	recs    [2]*record
	slots   [2][]byte
	sizes   [2][]byte // AllToAllv's sizes lines, by buffer set
	proc    shmsync.Proc
	remote  bool // in another process: check its liveness while waiting
}

// arrived is the last phase the segment's owner arrived at.
//
// Phase p's record sits on one cache line with the counter a peer watches
// for p (arrive[p&1], which holds p-2 until the owner arrives): the
// peer's wait ends with the record already in its cache. With one
// counter and both records behind it, every odd phase's record was a
// second line to fetch from the owner's core after the wait.
func (s *segment) arrived() uint64 { return max(s.arrive[0].Load(), s.arrive[1].Load()) }

func newSegment(rank int, m []byte, slot int, proc shmsync.Proc) *segment {
	s := &segment{
		rank:    rank,
		m:       m,
		state:   shmseg.Header(m).State(),
		waiters: shmseg.Word(m, syncOff+syncWait),
		gate:    shmseg.Word(m, syncOff+syncGate),
		proc:    proc,
		remote:  proc.Pid != shmsync.Self().Pid,
	}
	for i := range s.recs {
		line := syncOff + syncArrive + i*syncLine
		s.arrive[i] = shmseg.Word(m, line)
		s.recs[i] = (*record)(unsafe.Pointer(&m[line+syncRecs]))
	}
	if len(m) > dataOff {
		s.slots[0] = m[dataOff : dataOff+slot : dataOff+slot]
		s.slots[1] = m[dataOff+slot : dataOff+2*slot : dataOff+2*slot]
		off, vs := dataOff+2*slot, (len(m)-dataOff-2*slot)/2
		s.sizes[0] = m[off : off+vs : off+vs]
		s.sizes[1] = m[off+vs : off+2*vs : off+2*vs]
	}
	return s
}

// createSegment creates, sizes, maps and pre-touches the rank's segment
// in a memory file and writes its header.
func createSegment(tag [8]byte, rank, size, slot int) ([]byte, int, error) {
	n := segmentBytes(size, slot)
	m, fd, err := format.Create(fmt.Sprintf("gocoll-arena-%x-%d", tag[:], rank), shmseg.ID{Tag: tag, Rank: rank, Size: size}, n)
	if err != nil {
		return nil, -1, err
	}
	ne := binary.NativeEndian
	ne.PutUint64(m[offSlotBytes:], uint64(slot))
	ne.PutUint64(m[offDataOff:], dataOff)
	ne.PutUint64(m[offSegBytes:], uint64(n))
	ne.PutUint64(m[offBase:], addrOf(m))
	format.Publish(m)
	return m, fd, nil
}

// populateRanks is the most ranks at which a rank maps its peers'
// segments (and registered buffers) populated, every page in its page
// tables at once, as the small jobs this package is tuned for always had
// them: no fault lands in the first collectives. With more ranks that
// would make every rank map all of every peer's memory at setup: page
// tables and setup work growing with the square of the ranks on the host.
// There a rank's page tables fill as it reads, with what the collectives
// touch: its chunk of each peer's slot in the reductions, all of them
// only in the gathers and all-to-alls.
const populateRanks = 8

// populate is the mmap flag that maps a peer's memory in a job of size
// ranks: populated up to populateRanks.
func populate(size int) int {
	if size <= populateRanks {
		return syscall.MAP_POPULATE
	}
	return 0
}

// openSegment maps the segment of rank peer that ref names and verifies
// that it belongs to this communicator and layout.
func openSegment(open shmsync.Opener, ref PeerInfo, tag [8]byte, peer, size, slot int) (*segment, error) {
	f, err := format.Open(open, ref, shmseg.ID{Tag: tag, Rank: peer, Size: size}, dataOff)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := f.Map(0, int(f.Size), syscall.PROT_READ|syscall.PROT_WRITE, populate(size))
	if err != nil {
		return nil, err
	}
	err = f.Check(m, ref.Pid)
	if err == nil {
		err = checkLayout(f, m, size, slot)
	}
	if err != nil {
		syscall.Munmap(m)
		return nil, err
	}
	return newSegment(peer, m, slot, shmseg.Header(m).Creator()), nil
}

// checkLayout verifies the layout words of the peer's segment m (file f)
// against this rank's: slot size, and so where the data lies and how large
// the file is.
func checkLayout(f *shmseg.File, m []byte, size, slot int) error {
	ne := binary.NativeEndian
	want := segmentBytes(size, slot)
	switch {
	case int(ne.Uint64(m[offSlotBytes:])) != slot:
		return f.Errorf("slot size %d, this rank uses %d", ne.Uint64(m[offSlotBytes:]), slot)
	case ne.Uint64(m[offDataOff:]) != dataOff || int64(ne.Uint64(m[offSegBytes:])) != f.Size || f.Size != int64(want):
		return f.Errorf("layout: %d bytes, data at %d; want %d bytes", f.Size, ne.Uint64(m[offDataOff:]), want)
	}
	return nil
}
