package recovery

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// GrowTag is the handshake tag a joiner of the communicator tagged tag
// presents.
func GrowTag(tag [8]byte) [8]byte {
	sum := sha256.Sum256(append([]byte("gocoll-grow\x00"), tag[:]...))
	var t [8]byte
	copy(t[:], sum[:])
	return t
}

// isGrowHello reads the start of a client hello and tells whether it
// presents tag; the bytes read are put back for the handshake.
func isGrowHello(c *replayConn, tag [8]byte, deadline time.Time) bool {
	var head [16]byte
	c.SetReadDeadline(deadline)
	n, _ := io.ReadFull(c.Conn, head[:])
	c.replay(head[:n])
	return n == 16 && [8]byte(head[8:16]) == tag
}

// replayConn is an accepted connection whose first bytes may be read
// twice.
type replayConn struct {
	net.Conn
	pre []byte
}

func (r *replayConn) replay(b []byte) { r.pre = append(r.pre, b...) }

func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.pre) > 0 {
		n := copy(p, r.pre)
		r.pre = r.pre[n:]
		return n, nil
	}
	return r.Conn.Read(p)
}

// pruneJoiners drops the processes waiting to join that went away (a
// replacement killed while it waited), so that they are neither counted
// nor admitted. Called with mu held.
func (s *Recoverer) pruneJoiners() {
	s.joiners = slices.DeleteFunc(s.joiners, func(j *Conn) bool {
		if j.gone() {
			j.Close()
			return true
		}
		return false
	})
}

// Joiners is how many processes wait to join (on rank 0: elsewhere none
// reach this rank), once those that went away are dropped.
func (s *Recoverer) Joiners() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneJoiners()
	return len(s.joiners)
}

// TakeJoiners waits until n processes wait to join, or ctx ends (then it
// says how many there were), and takes the first n, in the order they
// asked: the caller closes them.
func (s *Recoverer) TakeJoiners(ctx context.Context, n int) ([]*Conn, int, error) {
	if err := s.await(ctx, func() bool { s.pruneJoiners(); return len(s.joiners) >= n }); err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return nil, len(s.joiners), err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	joiners := s.joiners[:n:n]
	s.joiners = s.joiners[n:]
	return joiners, n, nil
}

// NewConn is the authenticated control connection over c, whose
// handshake (tcp.ClientHandshakeSession, this end dialling) gave key: a
// joining process's to rank 0.
func NewConn(c net.Conn, key []byte) *Conn { return &Conn{Conn: c, key: key, dialled: true} }

// GrowExchange is engine connect's exchange for Grow, through rank 0:
// members send their blob over the control mesh, joiners over their
// connection; rank 0 sends everyone the whole set.
func (s *Recoverer) GrowExchange(inst uint64, joiners []*Conn, size int) func(ctx context.Context, blob []byte) ([][]byte, error) {
	round := 0
	return func(ctx context.Context, blob []byte) ([][]byte, error) {
		round++
		if s.rank != 0 {
			s.net.Send(0, Msg{Inst: inst, Round: round, Blob: blob})
			var all [][]byte
			err := s.await(ctx, func() bool {
				if _, down := s.down[0]; down {
					return true
				}
				k := blobKey{inst, -round, 0}
				if b, ok := s.blobs[k]; ok {
					delete(s.blobs, k)
					m, err := decodeGrowAll(b)
					if err == nil && len(m) == size {
						all = m
					}
					return true
				}
				return false
			})
			if err != nil {
				return nil, err
			}
			if all == nil {
				return nil, fmt.Errorf("%w: rank 0 went away while the communicator grew", transport.ErrPeerLost)
			}
			return all, nil
		}
		all := make([][]byte, size)
		all[0] = blob
		err := s.await(ctx, func() bool {
			for p := 1; p < s.size; p++ {
				if _, down := s.down[p]; down {
					return true
				}
				if _, ok := s.blobs[blobKey{inst, round, p}]; !ok {
					return false
				}
			}
			return true
		})
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		for p := 1; p < s.size; p++ {
			k := blobKey{inst, round, p}
			b, ok := s.blobs[k]
			if !ok {
				s.mu.Unlock()
				return nil, &LostError{Peer: p, Why: s.down[p]}
			}
			all[p] = b
			delete(s.blobs, k)
		}
		s.mu.Unlock()
		for i, j := range joiners {
			j.SetReadDeadline(time.Now().Add(s.timeout))
			m, err := j.ReadMsg()
			if err != nil || m.Round != round {
				return nil, fmt.Errorf("%w: joining process %d: %v", transport.ErrPeerLost, s.size+i, err)
			}
			all[s.size+i] = m.Blob
		}
		enc := encodeGrowAll(all)
		for p := 1; p < s.size; p++ {
			s.net.Send(p, Msg{Inst: inst, Round: -round, Blob: enc})
		}
		for i, j := range joiners {
			j.SetWriteDeadline(time.Now().Add(s.timeout))
			if err := j.WriteMsg(Msg{Round: round, Grow: &GrowMsg{All: all}}); err != nil {
				return nil, fmt.Errorf("%w: joining process %d: %v", transport.ErrPeerLost, s.size+i, err)
			}
		}
		return all, nil
	}
}

func encodeGrowAll(all [][]byte) []byte {
	var b []byte
	for _, x := range all {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x)))
		b = append(b, x...)
	}
	return b
}

func decodeGrowAll(b []byte) ([][]byte, error) {
	var all [][]byte
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errors.New("truncated")
		}
		n := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if n > len(b) {
			return nil, errors.New("truncated")
		}
		all = append(all, b[:n:n])
		b = b[n:]
	}
	return all, nil
}
