package kernel

import (
	"encoding/binary"
	"fmt"
	"math"
)

// ReferenceReduce sets dst[i] = dst[i] op src[i], one element at a time,
// decoding every element with encoding/binary (native byte order). It is
// deliberately simple and slow and serves as the oracle for tests, here and
// in other packages. It follows exactly the rules documented on Reduce,
// NaN canonicalisation included, and works for any alignment.
func ReferenceReduce(dst, src []byte, dt DataType, op RedOp) {
	checkArgs(dst, src, dt, op)
	ne := binary.NativeEndian
	sz := dt.Size()
	for i := 0; i+sz <= len(dst); i += sz {
		d, s := dst[i:i+sz], src[i:i+sz]
		switch dt {
		case Int8:
			d[0] = byte(refInteger(int64(int8(d[0])), int64(int8(s[0])), op))
		case Uint8:
			d[0] = byte(refInteger(uint64(d[0]), uint64(s[0]), op))
		case Bool:
			d[0] = refBool(d[0] != 0, s[0] != 0, op)
		case Int16:
			ne.PutUint16(d, uint16(refInteger(int64(int16(ne.Uint16(d))), int64(int16(ne.Uint16(s))), op)))
		case Int32:
			ne.PutUint32(d, uint32(refInteger(int64(int32(ne.Uint32(d))), int64(int32(ne.Uint32(s))), op)))
		case Uint32:
			ne.PutUint32(d, uint32(refInteger(uint64(ne.Uint32(d)), uint64(ne.Uint32(s)), op)))
		case Int64:
			ne.PutUint64(d, uint64(refInteger(int64(ne.Uint64(d)), int64(ne.Uint64(s)), op)))
		case Uint64:
			ne.PutUint64(d, refInteger(ne.Uint64(d), ne.Uint64(s), op))
		case Float32:
			r := refFloat32(math.Float32frombits(ne.Uint32(d)), math.Float32frombits(ne.Uint32(s)), op)
			ne.PutUint32(d, refCanon32(r))
		case Float64:
			r := refFloat64(math.Float64frombits(ne.Uint64(d)), math.Float64frombits(ne.Uint64(s)), op)
			bits := math.Float64bits(r)
			if math.IsNaN(r) {
				bits = canonNaN64
			}
			ne.PutUint64(d, bits)
		case Float16:
			r := refFloat32(Float16ToFloat32(ne.Uint16(d)), Float16ToFloat32(ne.Uint16(s)), op)
			h := Float32ToFloat16(r)
			if r != r {
				h = canonNaN16
			}
			ne.PutUint16(d, h)
		case Bfloat16:
			r := refFloat32(Bfloat16ToFloat32(ne.Uint16(d)), Bfloat16ToFloat32(ne.Uint16(s)), op)
			h := Float32ToBfloat16(r)
			if r != r {
				h = canonNaNbf
			}
			ne.PutUint16(d, h)
		}
	}
}

func refCanon32(r float32) uint32 {
	if r != r {
		return canonNaN32
	}
	return math.Float32bits(r)
}

// refBool: torch's rules, written out per op.
func refBool(a, b bool, op RedOp) byte {
	var r bool
	switch op {
	case Sum, Max, Bor:
		r = a || b
	case Prod, Min, Band:
		r = a && b
	case Bxor:
		r = a != b
	default:
		panic("unreachable")
	}
	if r {
		return 1
	}
	return 0
}

// refInteger folds two integers, signed (int64) or unsigned (uint64): the
// comparisons of Max and Min differ by type, the rest is the same bits.
func refInteger[T int64 | uint64](a, b T, op RedOp) T {
	switch op {
	case Band:
		return a & b
	case Bor:
		return a | b
	case Bxor:
		return a ^ b
	case Sum, Avg:
		return a + b // the caller truncates: wrap-around
	case Prod:
		return a * b
	case Max:
		return max(a, b)
	case Min:
		return min(a, b)
	}
	panic("unreachable")
}

// refFloat64 / refFloat32: NaN handling is left to the caller (any NaN is
// canonicalised afterwards), except that Max/Min must return a NaN if either
// operand is one.
func refFloat64(a, b float64, op RedOp) float64 {
	switch op {
	case Sum, Avg:
		return a + b
	case Prod:
		return a * b
	case Max, Min:
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		if a == 0 && b == 0 { // +0 vs -0: Max prefers +0, Min prefers -0
			sa, sb := math.Signbit(a), math.Signbit(b)
			neg := sa && sb
			if op == Min {
				neg = sa || sb
			}
			if neg {
				return math.Copysign(0, -1)
			}
			return 0
		}
		if (op == Max) == (a > b) {
			return a
		}
		return b
	}
	panic("unreachable")
}

func refFloat32(a, b float32, op RedOp) float32 {
	switch op {
	case Sum, Avg:
		return a + b
	case Prod:
		return a * b
	}
	// Max/Min: exact in float64, so reuse that.
	return float32(refFloat64(float64(a), float64(b), op))
}

func checkArgs(dst, src []byte, dt DataType, op RedOp) {
	if !dt.Valid() {
		panic(fmt.Sprintf("kernel: invalid data type %v", dt))
	}
	if !op.Valid() {
		panic(fmt.Sprintf("kernel: invalid reduction op %v", op))
	}
	if err := CheckOp(dt, op); err != nil {
		panic("kernel: " + err.Error())
	}
	if len(dst) != len(src) {
		panic(fmt.Sprintf("kernel: length mismatch: dst %d bytes, src %d bytes", len(dst), len(src)))
	}
	if len(dst)%dt.Size() != 0 {
		panic(fmt.Sprintf("kernel: length %d is not a multiple of %v size %d", len(dst), dt, dt.Size()))
	}
}
