// Package bootstrap lets the ranks of a job find each other before any
// communicator exists: a root service that N ranks contact to exchange a
// small blob each (listen address, host name, …), the 128-byte unique id
// that names the root and carries the job's secret, and the launcher
// environment (torchrun, Open MPI, Slurm) that says which rank a process is
// and where the root listens.
//
// The root serves one job. Round 0 (Join, Exchange) collects every rank's
// blob and sends all of them to every rank; the connections then stay open
// and the root serves further rounds (Client.AllGather) until every client
// has closed its connection, a rank leaves in the middle of a round, or a
// round does not complete within the root's timeout. Every connection is
// authenticated both ways with the tcp transport's handshake.
//
// A job of more than Fanout ranks gets its tables through a tree of
// relays, so that the root writes each table Fanout times rather than once
// per rank: ranks 0 to Fanout-1 get it from the root and forward the same
// bytes to theirs (rank i to ranks Fanout·(i+1) … Fanout·(i+1)+Fanout-1),
// who forward it further. Every rank still sends its blob, and gets any
// error verdict, over its own connection to the root. Each relay link is
// authenticated like a root connection (same secret and tag, each end
// checking the other's rank).
package bootstrap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// bootstrapTag is the communicator tag used in the bootstrap handshake: a
// communicator's own connections can never be confused with the root's.
var bootstrapTag = [8]byte{'G', 'C', 'B', 'O', 'O', 'T', 0, 1}

// RootRank is the root's identity in the handshake.
const RootRank = -1

const (
	// MaxRanks is the largest job the root serves.
	MaxRanks = 1 << 20
	// MaxBlob is the largest blob a rank may contribute to one round.
	MaxBlob = 1 << 20
	// maxTable bounds a table frame a client accepts.
	maxTable = 1 << 30
	// DefaultTimeout is the root's timeout when StartRoot is given 0.
	DefaultTimeout = 5 * time.Minute
	// writeTimeout bounds one reply to one client.
	writeTimeout = 10 * time.Second
	// Fanout is the relay tree's fan-out. A job of at most Fanout ranks is
	// a star (every rank is the root's child: nothing to relay); one of
	// one host's 8 accelerators stays one. At 1,024 ranks the tree is 4
	// levels deep, and the root and each relay write a table 8 times per
	// round.
	Fanout = 8
	// RelayFiles is the most descriptors a rank's relay role holds during
	// the rendezvous: its listener, its parent's link and its children's.
	RelayFiles = 2 + Fanout
)

// relayParent is the rank that forwards the tables to rank in a tree (-1:
// the root).
func relayParent(rank int) int { return rank/Fanout - 1 }

// relayChildren are the ranks that rank forwards the tables to, in a job
// of n ranks.
func relayChildren(rank, n int) []int {
	var kids []int
	for k := Fanout * (rank + 1); k < min(Fanout*(rank+2), n); k++ {
		kids = append(kids, k)
	}
	return kids
}

// ErrRendezvous: the root reported that the job could not rendezvous
// (missing ranks, disagreeing sizes, a rank that left); the text says which,
// and the error also wraps one of the causes below, the same on every rank
// the root told.
var ErrRendezvous = errors.New("rendezvous failed")

// Causes of a failed rendezvous; test with errors.Is. The root sends the
// cause with its verdict so that every rank reports the same one.
var (
	// ErrRankMissing: ranks did not join (or take part in a round) in time.
	ErrRankMissing = errors.New("ranks missing")
	// ErrSizeMismatch: ranks disagree on the job's size (or on the round).
	ErrSizeMismatch = errors.New("ranks disagree on the job")
	// ErrRankConflict: a rank joined twice, too late, or is out of range.
	ErrRankConflict = errors.New("rank duplicated or out of range")
	// ErrRankLeft: a rank closed its connection while the others waited.
	ErrRankLeft = errors.New("a rank left the job")
	// ErrAuth is tcp.ErrAuth: a missing rank's connections failed
	// authentication (a wrong secret), or this rank's did.
	ErrAuth = tcp.ErrAuth
)

// causes is the wire code of each cause (the byte after replyError).
var causes = []error{nil, ErrRankMissing, ErrSizeMismatch, ErrRankConflict, ErrRankLeft, ErrAuth}

func causeCode(err error) byte {
	for i, c := range causes {
		if c != nil && c == err {
			return byte(i)
		}
	}
	return 0
}

func causeOf(code byte) error {
	if int(code) < len(causes) {
		return causes[code]
	}
	return nil
}

// Frames: u32 length (little endian), then the payload.
//
//	client → root  join   'J' | nranks u32 | blob
//	client → root  join   'T' | nranks u32 | relay port u16 | blob
//	client → root  round  'R' | round u32 | blob
//	root → client  table  0 | n u32 | n × (len u32 | bytes)
//	root → client  error  1 | cause u8 | text   (cause: index in causes, 0 unknown)
//	root → client  relays 2 | n u32 | n × (len u32 | "host:port")
//
// A rank that may have a relay parent (rank ≥ Fanout in a job of more than
// Fanout ranks) joins with 'T', naming the port it listens on for its
// parent (the host is the one the root sees it connect from). When every
// such rank did, the root sends its children the relays frame (every
// rank's relay address) and then each round's table; a relay forwards both
// to its children, dialling them when the relays frame arrives. A relay
// whose round fails sends its children an error frame saying why. Frames
// on a relay link are those of the root's connection, root → client.
const (
	frameJoin     = 'J'
	frameTreeJoin = 'T'
	frameRound    = 'R'
	replyTable    = 0
	replyError    = 1
	replyRelays   = 2
)

func writeFrame(c net.Conn, payload []byte) error {
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(payload)))
	bufs := net.Buffers{n[:], payload}
	_, err := bufs.WriteTo(c)
	return err
}

func readFrame(c net.Conn, max int) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if uint64(size) > uint64(max) {
		return nil, fmt.Errorf("frame of %d bytes exceeds the limit of %d", size, max)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, nil
}

func encodeTable(blobs [][]byte) []byte {
	size := 5
	for _, b := range blobs {
		size += 4 + len(b)
	}
	out := make([]byte, 5, size)
	out[0] = replyTable
	binary.LittleEndian.PutUint32(out[1:], uint32(len(blobs)))
	for _, b := range blobs {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

func decodeTable(p []byte) ([][]byte, error) {
	if len(p) < 5 || p[0] != replyTable {
		return nil, errors.New("malformed table")
	}
	n := binary.LittleEndian.Uint32(p[1:])
	p = p[5:]
	if uint64(n)*4 > uint64(len(p)) {
		return nil, errors.New("malformed table")
	}
	blobs := make([][]byte, n)
	for i := range blobs {
		if len(p) < 4 {
			return nil, errors.New("malformed table")
		}
		l := binary.LittleEndian.Uint32(p)
		p = p[4:]
		if uint64(l) > uint64(len(p)) {
			return nil, errors.New("malformed table")
		}
		blobs[i] = p[:l:l]
		p = p[l:]
	}
	if len(p) != 0 {
		return nil, errors.New("malformed table")
	}
	return blobs, nil
}

// encodeRelays is the relays frame of every rank's relay address.
func encodeRelays(addrs []string) []byte {
	blobs := make([][]byte, len(addrs))
	for i, a := range addrs {
		blobs[i] = []byte(a)
	}
	out := encodeTable(blobs)
	out[0] = replyRelays
	return out
}

func decodeRelays(p []byte) ([]string, error) {
	if len(p) < 1 || p[0] != replyRelays {
		return nil, errors.New("malformed relays")
	}
	blobs, err := decodeTable(append([]byte{replyTable}, p[1:]...))
	if err != nil {
		return nil, errors.New("malformed relays")
	}
	addrs := make([]string, len(blobs))
	for i, b := range blobs {
		addrs[i] = string(b)
	}
	return addrs, nil
}

func errorReply(cause error, text string) []byte {
	return append([]byte{replyError, causeCode(cause)}, text...)
}

// replyErr decodes an error reply into an error wrapping ErrRendezvous and
// its cause.
func replyErr(prefix string, reply []byte) error {
	if len(reply) < 2 {
		return fmt.Errorf("%s: %w: (no reason given)", prefix, ErrRendezvous)
	}
	if cause := causeOf(reply[1]); cause != nil {
		return fmt.Errorf("%s: %w (%w): %s", prefix, ErrRendezvous, cause, reply[2:])
	}
	return fmt.Errorf("%s: %w: %s", prefix, ErrRendezvous, reply[2:])
}
