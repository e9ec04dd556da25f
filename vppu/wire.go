package vppu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// The wire formats of a migration and a recovery: what the ranks tell each
// other (all-gathered over the parent) before any buffer moves. A message
// is a kind byte, a version byte, then unsigned varints and
// length-prefixed strings. Decoding checks every count and length against
// the bytes left before it allocates, so a damaged or truncated message is
// an error, never a panic nor an allocation larger than the message.

const (
	wireVersion = 2
	kindMoves   = 'M' // a migration's buffer list (encodeMoves)
	kindRecover = 'R' // a recovery's description (encodeRecover)

	// maxWireInt bounds a device number and maxWireSize a buffer size:
	// larger values come only from a damaged message.
	maxWireInt  = math.MaxInt32
	maxWireSize = 1 << 50
)

// errDamaged is what every decoding failure wraps.
var errDamaged = errors.New("damaged message")

// bufDesc is one buffer a device takes along in a migration.
type bufDesc struct {
	Dev    int
	Name   string
	Size   int
	Shared bool // the rank's shared buffer, carried by this device (carriesShared)
}

// encodeMoves is the buffer list a rank sends before a migration.
func encodeMoves(ds []bufDesc) []byte {
	b := []byte{kindMoves, wireVersion}
	b = binary.AppendUvarint(b, uint64(len(ds)))
	for _, d := range ds {
		flags := byte(0)
		if d.Shared {
			flags = 1
		}
		b = binary.AppendUvarint(b, uint64(d.Dev))
		b = append(b, flags)
		b = appendString(b, d.Name)
		b = binary.AppendUvarint(b, uint64(d.Size))
	}
	return b
}

// decodeMoves is the inverse of encodeMoves.
func decodeMoves(msg []byte) ([]bufDesc, error) {
	r, err := newWireReader(msg, kindMoves)
	if err != nil {
		return nil, err
	}
	// An entry takes 4 bytes at least: device, flags, name length, size.
	n, err := r.count(4)
	if err != nil {
		return nil, err
	}
	ds := make([]bufDesc, n)
	for i := range ds {
		d := &ds[i]
		if d.Dev, err = r.int(maxWireInt); err != nil {
			return nil, err
		}
		flags, err := r.byte()
		if err != nil {
			return nil, err
		}
		if flags > 1 {
			return nil, fmt.Errorf("%w: flags %#x", errDamaged, flags)
		}
		d.Shared = flags == 1
		if d.Name, err = r.string(); err != nil {
			return nil, err
		}
		if d.Size, err = r.int(maxWireSize); err != nil {
			return nil, err
		}
	}
	return ds, r.end()
}

// encodeRecover is the description a rank sends at the start of a
// recovery. Name tables are written in name order, so equal descriptions
// encode equally.
func encodeRecover(d recoverDesc) []byte {
	b := []byte{kindRecover, wireVersion}
	b = binary.LittleEndian.AppendUint64(b, d.Logical)
	b = binary.AppendUvarint(b, uint64(d.M))
	b = binary.AppendUvarint(b, d.Step)
	var flags byte
	if d.Joined {
		flags |= 1
	}
	if d.Rebuild {
		flags |= 2
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(d.MinRanks))
	b = appendInts(b, d.Place)
	b = binary.AppendUvarint(b, uint64(len(d.Local)))
	for _, v := range d.Local {
		b = binary.AppendUvarint(b, uint64(v))
	}
	b = appendSizes(b, d.Shared)
	b = binary.AppendUvarint(b, uint64(len(d.Own)))
	for _, own := range d.Own {
		b = appendSizes(b, own)
	}
	return b
}

// decodeRecover is the inverse of encodeRecover (its maps are never nil).
func decodeRecover(msg []byte) (recoverDesc, error) {
	var d recoverDesc
	r, err := newWireReader(msg, kindRecover)
	if err != nil {
		return d, err
	}
	if len(r.b) < 8 {
		return d, fmt.Errorf("%w: truncated", errDamaged)
	}
	d.Logical, r.b = binary.LittleEndian.Uint64(r.b), r.b[8:]
	if d.M, err = r.int(maxWireInt); err != nil {
		return d, err
	}
	if d.Step, err = r.uvarint(); err != nil {
		return d, err
	}
	flags, err := r.byte()
	if err != nil {
		return d, err
	}
	if flags > 3 {
		return d, fmt.Errorf("%w: flags %#x", errDamaged, flags)
	}
	d.Joined, d.Rebuild = flags&1 != 0, flags&2 != 0
	if d.MinRanks, err = r.int(maxWireInt); err != nil {
		return d, err
	}
	if d.Place, err = r.ints(); err != nil {
		return d, err
	}
	n, err := r.count(1)
	if err != nil {
		return d, err
	}
	d.Local = make([]int, n)
	for i := range d.Local {
		if d.Local[i], err = r.int(maxWireInt); err != nil {
			return d, err
		}
	}
	if d.Shared, err = r.sizes(); err != nil {
		return d, err
	}
	// A table takes 1 byte at least (its count).
	if n, err = r.count(1); err != nil {
		return d, err
	}
	d.Own = make([]map[string]int, n)
	for i := range d.Own {
		if d.Own[i], err = r.sizes(); err != nil {
			return d, err
		}
	}
	return d, r.end()
}

// appendInts writes a list of ints that may be nil: its length plus one
// (0 for nil), then the values as signed varints (a caller's placement
// may hold anything; the plan refuses it with its value).
func appendInts(b []byte, xs []int) []byte {
	if xs == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(xs))+1)
	for _, x := range xs {
		b = binary.AppendVarint(b, int64(max(min(x, maxWireInt), -maxWireInt)))
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// appendSizes writes a name → size table in name order.
func appendSizes(b []byte, m map[string]int) []byte {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(m[name]))
	}
	return b
}

// wireReader consumes a message; every method fails on too few bytes.
type wireReader struct{ b []byte }

func newWireReader(msg []byte, kind byte) (*wireReader, error) {
	if len(msg) < 2 || msg[0] != kind {
		return nil, fmt.Errorf("%w: not a %q message", errDamaged, kind)
	}
	if msg[1] != wireVersion {
		return nil, fmt.Errorf("%w: version %d, this process reads %d", errDamaged, msg[1], wireVersion)
	}
	return &wireReader{msg[2:]}, nil
}

func (r *wireReader) uvarint() (uint64, error) {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		return 0, fmt.Errorf("%w: truncated or overlong number", errDamaged)
	}
	r.b = r.b[k:]
	return v, nil
}

// int reads a number of at most limit.
func (r *wireReader) int(limit int) (int, error) {
	v, err := r.uvarint()
	if err != nil {
		return 0, err
	}
	if v > uint64(limit) {
		return 0, fmt.Errorf("%w: %d out of range", errDamaged, v)
	}
	return int(v), nil
}

// count reads a number of entries of at least min bytes each: no more
// than the bytes left after it can hold.
func (r *wireReader) count(min int) (int, error) {
	v, err := r.uvarint()
	if err != nil {
		return 0, err
	}
	if v > uint64(len(r.b)/min) {
		return 0, fmt.Errorf("%w: %d entries in %d bytes", errDamaged, v, len(r.b))
	}
	return int(v), nil
}

// ints reads what appendInts wrote.
func (r *wireReader) ints() ([]int, error) {
	n, err := r.count(1)
	if err != nil || n == 0 {
		return nil, err
	}
	xs := make([]int, n-1)
	for i := range xs {
		v, k := binary.Varint(r.b)
		if k <= 0 || v > maxWireInt || v < -maxWireInt {
			return nil, fmt.Errorf("%w: bad or truncated number", errDamaged)
		}
		xs[i], r.b = int(v), r.b[k:]
	}
	return xs, nil
}

func (r *wireReader) byte() (byte, error) {
	if len(r.b) < 1 {
		return 0, fmt.Errorf("%w: truncated", errDamaged)
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c, nil
}

func (r *wireReader) string() (string, error) {
	n, err := r.count(1)
	if err != nil {
		return "", err
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s, nil
}

// sizes reads a name → size table; a name twice is damage.
func (r *wireReader) sizes() (map[string]int, error) {
	// An entry takes 2 bytes at least: name length, size.
	n, err := r.count(2)
	if err != nil {
		return nil, err
	}
	m := make(map[string]int, n)
	for range n {
		name, err := r.string()
		if err != nil {
			return nil, err
		}
		size, err := r.int(maxWireSize)
		if err != nil {
			return nil, err
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("%w: buffer %q listed twice", errDamaged, name)
		}
		m[name] = size
	}
	return m, nil
}

func (r *wireReader) end() error {
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d bytes past the end", errDamaged, len(r.b))
	}
	return nil
}
