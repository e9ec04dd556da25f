package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/kernel"
)

// Correctness check, the nccl-tests way: every rank fills its input with
// values that depend only on (seed, rank, element index), so any rank can
// recompute any other rank's input; the expected output is computed here
// element by element from those values with plain Go arithmetic (not with
// the engine's kernels) and compared byte for byte with what the collective
// produced. The values are chosen so that every result is exact whatever
// order the ranks are combined in:
//
//   - moved data (broadcast, allgather, alltoall, alltoallv, sendrecv) and
//     Max/Min: pseudo-random integers exactly representable in the type
//     (all bit patterns of the integer types; |v| <= 256 bfloat16, 2048
//     float16, 2^24 float32, 2^53 float64);
//   - Sum: integers small enough that no partial sum of n of them rounds
//     (floats); integer types use all bit patterns (the sum wraps, and
//     wrapping commutes with the truncation to the type's width);
//   - Avg: like Sum, but small enough that the integer sum does not wrap, so
//     the final division is well defined (truncation toward zero for
//     integers; for floats sum/n correctly rounded in the type, half types
//     via float32 and one rounding, as the engine documents);
//   - Prod: ±1 and ±2 for floats (powers of two: exact until 2^14), odd
//     integers of all widths for integer types (wrapping product).
//   - Band, Bor, Bxor: all bit patterns of the integer types;
//   - bool: bytes 0, 1 and 2 (2 is true too), every result 0 or 1.

type kind int

const (
	signedInt kind = iota
	unsignedInt
	floating
	boolean
)

func kindOf(dt engine.DataType) kind {
	switch dt {
	case engine.Int8, engine.Int16, engine.Int32, engine.Int64:
		return signedInt
	case engine.Uint8, engine.Uint32, engine.Uint64:
		return unsignedInt
	case engine.Bool:
		return boolean
	}
	return floating
}

// exactLimit is the largest integer magnitude up to which every integer is
// representable in a floating type.
func exactLimit(dt engine.DataType) int64 {
	switch dt {
	case engine.Bfloat16:
		return 256
	case engine.Float16:
		return 2048
	case engine.Float32:
		return 1 << 24
	}
	return 1 << 53
}

// pattern is the input of one check: value(rank, i) for every rank.
type pattern struct {
	dt    engine.DataType
	es    int
	op    engine.RedOp
	n     int
	full  bool  // integer types: all 64 random bits (truncated on store)
	odd   bool  // integer Prod: force odd values
	prod  bool  // float Prod: ±1, ±2
	lo    int64 // otherwise: uniform in [lo, hi]
	hi    int64
	seeds []uint64 // per rank
}

const seedBase = 0x5eed_c011_0000_0001

func mix64(x uint64) uint64 { // splitmix64 finaliser
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// newPattern: reduce tells whether the data goes through a reduction with op.
func newPattern(dt engine.DataType, op engine.RedOp, reduce bool, n int, salt uint64) *pattern {
	p := &pattern{dt: dt, es: dt.Size(), op: op, n: n, seeds: make([]uint64, n)}
	for r := range p.seeds {
		p.seeds[r] = mix64(seedBase ^ salt ^ uint64(r+1)*0x9e3779b97f4a7c15)
	}
	k := kindOf(dt)
	if !reduce {
		op = engine.Max // any value representable exactly will do
	}
	switch {
	case k != floating && op == engine.Avg:
		// no wrap-around in the sum: |v| <= maxPositive/n
		var top int64
		switch dt {
		case engine.Int8:
			top = 127
		case engine.Int16:
			top = math.MaxInt16
		case engine.Uint8:
			top = 255
		case engine.Int32:
			top = math.MaxInt32
		case engine.Uint32:
			top = math.MaxUint32
		default:
			top = 1 << 62
		}
		p.hi = top / int64(n)
		if k == signedInt {
			p.lo = -p.hi
		}
	case k == boolean:
		p.hi = 2 // 0 false; 1 and 2 true (any byte but 0 is)
	case k != floating:
		p.full = true
		p.odd = op == engine.Prod
	case op == engine.Prod:
		p.prod = true
	case op == engine.Sum || op == engine.Avg:
		p.hi = exactLimit(dt) / int64(n)
		p.lo = -p.hi
	default: // moved data, Max, Min
		p.hi = exactLimit(dt)
		p.lo = -p.hi
	}
	return p
}

func (p *pattern) raw(rank, i int) uint64 {
	return mix64(p.seeds[rank] + uint64(i)*0xd1b54a32d192ed03)
}

// intValue is the value of element i on rank, for integer types, already
// truncated to the type's width (sign- or zero-extended back to int64).
func (p *pattern) intValue(rank, i int) int64 {
	h := p.raw(rank, i)
	var v int64
	if p.full {
		v = int64(h)
		if p.odd {
			v |= 1
		}
	} else {
		v = p.lo + int64(h%uint64(p.hi-p.lo+1))
	}
	return p.norm(v)
}

func (p *pattern) floatValue(rank, i int) float64 {
	h := p.raw(rank, i)
	if p.prod {
		v := 1.0
		if (h>>1)&3 == 0 && rank < 14 { // at most 2^14: fits every float type
			v = 2
		}
		if h&1 == 1 {
			v = -v
		}
		return v
	}
	return float64(p.lo + int64(h%uint64(p.hi-p.lo+1)))
}

// norm truncates v to the integer type's width.
func (p *pattern) norm(v int64) int64 {
	switch p.dt {
	case engine.Int8:
		return int64(int8(v))
	case engine.Uint8, engine.Bool:
		return int64(uint8(v))
	case engine.Int16:
		return int64(int16(v))
	case engine.Int32:
		return int64(int32(v))
	case engine.Uint32:
		return int64(uint32(v))
	}
	return v
}

// put stores the value of element i of rank into dst (es bytes).
func (p *pattern) put(dst []byte, rank, i int) {
	if kindOf(p.dt) != floating {
		putInt(dst, p.dt, p.intValue(rank, i))
		return
	}
	putFloat(dst, p.dt, p.floatValue(rank, i))
}

func putInt(dst []byte, dt engine.DataType, v int64) {
	switch dt.Size() {
	case 1:
		dst[0] = byte(v)
	case 2:
		binary.NativeEndian.PutUint16(dst, uint16(v))
	case 4:
		binary.NativeEndian.PutUint32(dst, uint32(v))
	default:
		binary.NativeEndian.PutUint64(dst, uint64(v))
	}
}

// putFloat stores v, which must be exact in dt (or, for Avg, already the
// float32 value to round once).
func putFloat(dst []byte, dt engine.DataType, v float64) {
	switch dt {
	case engine.Float16:
		binary.NativeEndian.PutUint16(dst, kernel.Float32ToFloat16(float32(v)))
	case engine.Bfloat16:
		binary.NativeEndian.PutUint16(dst, kernel.Float32ToBfloat16(float32(v)))
	case engine.Float32:
		binary.NativeEndian.PutUint32(dst, math.Float32bits(float32(v)))
	default:
		binary.NativeEndian.PutUint64(dst, math.Float64bits(v))
	}
}

// fill writes count elements of rank's input, starting at element index
// first of the rank's sequence, into buf.
func (p *pattern) fill(buf []byte, rank, first, count int) {
	for i := 0; i < count; i++ {
		p.put(buf[i*p.es:(i+1)*p.es], rank, first+i)
	}
}

// putReduced stores into dst the reduction over all ranks of element i of
// their inputs.
func (p *pattern) putReduced(dst []byte, i int) {
	n := p.n
	if kindOf(p.dt) == boolean {
		acc := p.intValue(0, i) != 0
		for r := 1; r < n; r++ {
			x := p.intValue(r, i) != 0
			switch p.op {
			case engine.Sum, engine.Max, engine.Bor:
				acc = acc || x
			case engine.Prod, engine.Min, engine.Band:
				acc = acc && x
			case engine.Bxor:
				acc = acc != x
			}
		}
		dst[0] = 0
		if acc {
			dst[0] = 1
		}
		return
	}
	if kindOf(p.dt) != floating {
		acc := p.intValue(0, i)
		for r := 1; r < n; r++ {
			x := p.intValue(r, i)
			switch p.op {
			case engine.Band:
				acc &= x
			case engine.Bor:
				acc |= x // of sign- (zero-) extended values: still extended
			case engine.Bxor:
				acc ^= x
			case engine.Sum, engine.Avg:
				acc = p.norm(acc + x)
			case engine.Prod:
				acc = p.norm(acc * x)
			case engine.Max:
				if p.less(acc, x) {
					acc = x
				}
			case engine.Min:
				if p.less(x, acc) {
					acc = x
				}
			}
		}
		if p.op == engine.Avg {
			if p.dt == engine.Uint64 {
				acc = int64(uint64(acc) / uint64(n))
			} else {
				acc /= int64(n) // Go truncates toward zero, like C
			}
		}
		putInt(dst, p.dt, acc)
		return
	}
	acc := p.floatValue(0, i)
	for r := 1; r < n; r++ {
		x := p.floatValue(r, i)
		switch p.op {
		case engine.Sum, engine.Avg:
			acc += x // exact: small integers
		case engine.Prod:
			acc *= x // exact: powers of two
		case engine.Max:
			acc = math.Max(acc, x)
		case engine.Min:
			acc = math.Min(acc, x)
		}
	}
	if p.op == engine.Avg {
		if p.dt == engine.Float64 {
			acc /= float64(n)
		} else {
			// float32 division, correctly rounded; half types round once more
			acc = float64(float32(acc) / float32(n))
		}
	}
	putFloat(dst, p.dt, acc)
}

func (p *pattern) less(a, b int64) bool {
	if p.dt == engine.Uint64 {
		return uint64(a) < uint64(b)
	}
	return a < b // narrower unsigned types are zero-extended by norm
}

// checker compares outputs with expectations and counts wrong elements.
type checker struct {
	dt    engine.DataType
	rank  int
	what  string
	log   io.Writer // first few mismatches go here (stderr)
	shown int
	// breakExpect corrupts the expectation of the first element checked:
	// the self-test of the checker (-break-check).
	breakExpect bool
}

// verify checks count elements of out; expect(i, dst) writes the expected
// bytes of element i into dst.
func (k *checker) verify(out []byte, count int, expect func(i int, dst []byte)) int64 {
	es := k.dt.Size()
	var want [8]byte
	var wrong int64
	for i := 0; i < count; i++ {
		w := want[:es]
		expect(i, w)
		if k.breakExpect && i == 0 {
			w[0] ^= 1
		}
		got := out[i*es : (i+1)*es]
		if !bytes.Equal(got, w) {
			if k.shown < 3 && k.log != nil {
				fmt.Fprintf(k.log, "[rank %d] %s: element %d = %s, expected %s\n", k.rank, k.what, i, formatElem(k.dt, got), formatElem(k.dt, w))
				k.shown++
			}
			wrong++
		}
	}
	return wrong
}

func formatElem(dt engine.DataType, b []byte) string {
	ne := binary.NativeEndian
	switch dt {
	case engine.Int8:
		return fmt.Sprint(int8(b[0]))
	case engine.Uint8, engine.Bool:
		return fmt.Sprint(b[0])
	case engine.Int16:
		return fmt.Sprint(int16(ne.Uint16(b)))
	case engine.Int32:
		return fmt.Sprint(int32(ne.Uint32(b)))
	case engine.Uint32:
		return fmt.Sprint(ne.Uint32(b))
	case engine.Int64:
		return fmt.Sprint(int64(ne.Uint64(b)))
	case engine.Uint64:
		return fmt.Sprint(ne.Uint64(b))
	case engine.Float16:
		return fmt.Sprintf("%g (%#04x)", kernel.Float16ToFloat32(ne.Uint16(b)), ne.Uint16(b))
	case engine.Bfloat16:
		return fmt.Sprintf("%g (%#04x)", kernel.Bfloat16ToFloat32(ne.Uint16(b)), ne.Uint16(b))
	case engine.Float32:
		return fmt.Sprintf("%g (%#08x)", math.Float32frombits(ne.Uint32(b)), ne.Uint32(b))
	}
	return fmt.Sprintf("%g (%#016x)", math.Float64frombits(ne.Uint64(b)), ne.Uint64(b))
}
