package kernel

import (
	"encoding/binary"
	"math"
	"sync"
	"unsafe"
)

// Pure-Go reduction loops, d[i] = a[i] op b[i]. The hot ones are unrolled by
// 8 through array pointers ((*[8]T)(s)): the loop condition covers the bounds
// checks, and the compiler keeps the 8 values in registers. They compute all
// 8 results before storing any, so exact aliasing of d with a or b is
// harmless (the element-at-a-time loops read before they write, too).

type integer interface {
	~int8 | ~uint8 | ~int16 | ~int32 | ~uint32 | ~int64 | ~uint64
}

func slices3[T any](d, a, b unsafe.Pointer, n int) (D, A, B []T) {
	D = unsafe.Slice((*T)(d), n)
	// Reslicing to len(D) tells the compiler the lengths are equal, which
	// removes the bounds checks from the element-at-a-time loops.
	return D, unsafe.Slice((*T)(a), n)[:len(D)], unsafe.Slice((*T)(b), n)[:len(D)]
}

// ---- integers ----

func sumInt[T integer](d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[T](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]T)(D), (*[8]T)(A), (*[8]T)(B)
		r0, r1, r2, r3 := aa[0]+bb[0], aa[1]+bb[1], aa[2]+bb[2], aa[3]+bb[3]
		r4, r5, r6, r7 := aa[4]+bb[4], aa[5]+bb[5], aa[6]+bb[6], aa[7]+bb[7]
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = A[i] + B[i]
	}
}

// sumBytes is int8/uint8 Sum, 8 lanes per 64-bit word (SWAR): add the low 7
// bits of each byte (no carry can cross a byte), then fix each top bit with
// an XOR. Bytewise wrap-around, any alignment (the loads are
// encoding/binary's, which compile to single unaligned moves).
func sumBytes(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[byte](d, a, b, n)
	const h = 0x8080808080808080
	le := binary.LittleEndian
	for len(D) >= 32 && len(A) >= 32 && len(B) >= 32 {
		x0, x1, x2, x3 := le.Uint64(A), le.Uint64(A[8:]), le.Uint64(A[16:]), le.Uint64(A[24:])
		y0, y1, y2, y3 := le.Uint64(B), le.Uint64(B[8:]), le.Uint64(B[16:]), le.Uint64(B[24:])
		le.PutUint64(D, (x0&^h+y0&^h)^((x0^y0)&h))
		le.PutUint64(D[8:], (x1&^h+y1&^h)^((x1^y1)&h))
		le.PutUint64(D[16:], (x2&^h+y2&^h)^((x2^y2)&h))
		le.PutUint64(D[24:], (x3&^h+y3&^h)^((x3^y3)&h))
		D, A, B = D[32:], A[32:], B[32:]
	}
	for i := range D {
		D[i] = A[i] + B[i]
	}
}

// ---- bitwise ops on integers, and Bool ----

// bitwiseKernel is Band, Bor or Bxor on elements of size bytes: the bits do
// not care about the element width, so one loop over 64-bit words serves
// every integer type, at any alignment (encoding/binary's loads compile to
// single unaligned moves).
func bitwiseKernel(op RedOp, size int) kernFn {
	return func(d, a, b unsafe.Pointer, n int) { bitBytes(d, a, b, n*size, op) }
}

// bitBytes has one loop per op (a call per word would cost more than the op).
func bitBytes(d, a, b unsafe.Pointer, nb int, op RedOp) {
	D, A, B := slices3[byte](d, a, b, nb)
	le := binary.LittleEndian
	switch op {
	case Band:
		for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
			le.PutUint64(D, le.Uint64(A)&le.Uint64(B))
			D, A, B = D[8:], A[8:], B[8:]
		}
		for i := range D {
			D[i] = A[i] & B[i]
		}
	case Bor:
		for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
			le.PutUint64(D, le.Uint64(A)|le.Uint64(B))
			D, A, B = D[8:], A[8:], B[8:]
		}
		for i := range D {
			D[i] = A[i] | B[i]
		}
	case Bxor:
		for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
			le.PutUint64(D, le.Uint64(A)^le.Uint64(B))
			D, A, B = D[8:], A[8:], B[8:]
		}
		for i := range D {
			D[i] = A[i] ^ B[i]
		}
	default:
		panic("unreachable")
	}
}

// Bool, 8 bytes per 64-bit word: truth(x) has 1 in every byte of x that is
// not 0 and 0 elsewhere — adding 0x7f to a byte's low 7 bits sets its top
// bit when any of them is set (no carry leaves the byte), OR-ing x brings
// in its own top bit, and the top bits move down to bit 0. "or" is
// truth(a|b), "and" truth(a)&truth(b), "xor" truth(a)^truth(b): every
// result byte is 0 or 1.

const lo7, ones = 0x7f7f7f7f7f7f7f7f, 0x0101010101010101

func truth(x uint64) uint64 { return ((x&lo7 + lo7) | x) >> 7 & ones }

func truthByte(x byte) byte {
	if x != 0 {
		return 1
	}
	return 0
}

// boolKernel: Sum, Max and Bor are or; Prod, Min and Band and; Bxor xor.
func boolKernel(op RedOp) kernFn {
	switch op {
	case Sum, Max, Bor:
		return orBool
	case Prod, Min, Band:
		return andBool
	case Bxor:
		return xorBool
	}
	panic("unreachable")
}

func orBool(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[byte](d, a, b, n)
	le := binary.LittleEndian
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		le.PutUint64(D, truth(le.Uint64(A)|le.Uint64(B)))
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = truthByte(A[i] | B[i])
	}
}

func andBool(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[byte](d, a, b, n)
	le := binary.LittleEndian
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		le.PutUint64(D, truth(le.Uint64(A))&truth(le.Uint64(B)))
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = truthByte(A[i]) & truthByte(B[i])
	}
}

func xorBool(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[byte](d, a, b, n)
	le := binary.LittleEndian
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		le.PutUint64(D, truth(le.Uint64(A))^truth(le.Uint64(B)))
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = truthByte(A[i]) ^ truthByte(B[i])
	}
}

func prodInt[T integer](d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[T](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]T)(D), (*[8]T)(A), (*[8]T)(B)
		r0, r1, r2, r3 := aa[0]*bb[0], aa[1]*bb[1], aa[2]*bb[2], aa[3]*bb[3]
		r4, r5, r6, r7 := aa[4]*bb[4], aa[5]*bb[5], aa[6]*bb[6], aa[7]*bb[7]
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = A[i] * B[i]
	}
}

func maxInt[T integer](d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[T](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]T)(D), (*[8]T)(A), (*[8]T)(B)
		r0, r1, r2, r3 := max(aa[0], bb[0]), max(aa[1], bb[1]), max(aa[2], bb[2]), max(aa[3], bb[3])
		r4, r5, r6, r7 := max(aa[4], bb[4]), max(aa[5], bb[5]), max(aa[6], bb[6]), max(aa[7], bb[7])
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = max(A[i], B[i])
	}
}

func minInt[T integer](d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[T](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]T)(D), (*[8]T)(A), (*[8]T)(B)
		r0, r1, r2, r3 := min(aa[0], bb[0]), min(aa[1], bb[1]), min(aa[2], bb[2]), min(aa[3], bb[3])
		r4, r5, r6, r7 := min(aa[4], bb[4]), min(aa[5], bb[5]), min(aa[6], bb[6]), min(aa[7], bb[7])
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = min(A[i], B[i])
	}
}

// ---- float32 / float64 Sum and Prod ----
//
// NaN canonicalisation costs almost nothing: after each block of 8 the
// results are summed; the sum is NaN if any result is (it may also be NaN
// from Inf + -Inf, a harmless false alarm), and only then is the block
// rescanned.

func sumF32(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[float32](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]float32)(D), (*[8]float32)(A), (*[8]float32)(B)
		r0, r1, r2, r3 := aa[0]+bb[0], aa[1]+bb[1], aa[2]+bb[2], aa[3]+bb[3]
		r4, r5, r6, r7 := aa[4]+bb[4], aa[5]+bb[5], aa[6]+bb[6], aa[7]+bb[7]
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		if t := ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)); t != t {
			canonF32(dd[:])
		}
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = A[i] + B[i]
	}
	canonF32(D)
}

func prodF32(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[float32](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]float32)(D), (*[8]float32)(A), (*[8]float32)(B)
		r0, r1, r2, r3 := aa[0]*bb[0], aa[1]*bb[1], aa[2]*bb[2], aa[3]*bb[3]
		r4, r5, r6, r7 := aa[4]*bb[4], aa[5]*bb[5], aa[6]*bb[6], aa[7]*bb[7]
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		if t := ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)); t != t {
			canonF32(dd[:])
		}
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = A[i] * B[i]
	}
	canonF32(D)
}

func sumF64(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[float64](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]float64)(D), (*[8]float64)(A), (*[8]float64)(B)
		r0, r1, r2, r3 := aa[0]+bb[0], aa[1]+bb[1], aa[2]+bb[2], aa[3]+bb[3]
		r4, r5, r6, r7 := aa[4]+bb[4], aa[5]+bb[5], aa[6]+bb[6], aa[7]+bb[7]
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		if t := ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)); t != t {
			canonF64(dd[:])
		}
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = A[i] + B[i]
	}
	canonF64(D)
}

func prodF64(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[float64](d, a, b, n)
	for len(D) >= 8 && len(A) >= 8 && len(B) >= 8 {
		dd, aa, bb := (*[8]float64)(D), (*[8]float64)(A), (*[8]float64)(B)
		r0, r1, r2, r3 := aa[0]*bb[0], aa[1]*bb[1], aa[2]*bb[2], aa[3]*bb[3]
		r4, r5, r6, r7 := aa[4]*bb[4], aa[5]*bb[5], aa[6]*bb[6], aa[7]*bb[7]
		dd[0], dd[1], dd[2], dd[3], dd[4], dd[5], dd[6], dd[7] = r0, r1, r2, r3, r4, r5, r6, r7
		if t := ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)); t != t {
			canonF64(dd[:])
		}
		D, A, B = D[8:], A[8:], B[8:]
	}
	for i := range D {
		D[i] = A[i] * B[i]
	}
	canonF64(D)
}

func canonF32(s []float32) {
	for i, v := range s {
		if v != v {
			s[i] = math.Float32frombits(canonNaN32)
		}
	}
}

func canonF64(s []float64) {
	for i, v := range s {
		if v != v {
			s[i] = math.Float64frombits(canonNaN64)
		}
	}
}

// ---- Max / Min on IEEE bit patterns ----
//
// Max and Min of two floats is always one of them (or NaN), so they work on
// the raw bits, branch-free: key(x) maps the bits to a signed integer whose
// order is the numeric order, with -0 < +0 (flip the magnitude bits of
// negative numbers). The larger key wins; equal keys mean equal bits, so the
// result is commutative. NaN is tested separately (rare, predictable branch).

func key32(x uint32) int32 { return int32(x ^ uint32(int32(x)>>31)>>1) }
func key64(x uint64) int64 { return int64(x ^ uint64(int64(x)>>63)>>1) }
func key16(x uint16) int16 { return int16(x ^ uint16(int16(x)>>15)>>1) }

func maxF32(d, a, b unsafe.Pointer, n int) { maxMin32(d, a, b, n, false) }
func minF32(d, a, b unsafe.Pointer, n int) { maxMin32(d, a, b, n, true) }
func maxF64(d, a, b unsafe.Pointer, n int) { maxMin64(d, a, b, n, false) }
func minF64(d, a, b unsafe.Pointer, n int) { maxMin64(d, a, b, n, true) }

func maxMin32(d, a, b unsafe.Pointer, n int, isMin bool) {
	D, A, B := slices3[uint32](d, a, b, n)
	var flip int32 // keys are negated (bitwise) for Min, so max() picks the smaller
	if isMin {
		flip = -1
	}
	for i := range D {
		x, y := A[i], B[i]
		r := x
		if key32(y)^flip > key32(x)^flip {
			r = y
		}
		if max(x&0x7fffffff, y&0x7fffffff) > 0x7f800000 {
			r = canonNaN32
		}
		D[i] = r
	}
}

func maxMin64(d, a, b unsafe.Pointer, n int, isMin bool) {
	D, A, B := slices3[uint64](d, a, b, n)
	var flip int64
	if isMin {
		flip = -1
	}
	for i := range D {
		x, y := A[i], B[i]
		r := x
		if key64(y)^flip > key64(x)^flip {
			r = y
		}
		if max(x&(1<<63-1), y&(1<<63-1)) > 0x7ff0000000000000 {
			r = canonNaN64
		}
		D[i] = r
	}
}

// maxMin16 serves float16 (inf = 0x7c00) and bfloat16 (inf = 0x7f80).
func maxMin16(d, a, b unsafe.Pointer, n int, isMin bool, inf, nan uint16) {
	D, A, B := slices3[uint16](d, a, b, n)
	var flip int16
	if isMin {
		flip = -1
	}
	for i := range D {
		x, y := A[i], B[i]
		r := x
		if key16(y)^flip > key16(x)^flip {
			r = y
		}
		if max(x&0x7fff, y&0x7fff) > inf {
			r = nan
		}
		D[i] = r
	}
}

func maxF16(d, a, b unsafe.Pointer, n int)  { maxMin16(d, a, b, n, false, 0x7c00, canonNaN16) }
func minF16(d, a, b unsafe.Pointer, n int)  { maxMin16(d, a, b, n, true, 0x7c00, canonNaN16) }
func maxBF16(d, a, b unsafe.Pointer, n int) { maxMin16(d, a, b, n, false, 0x7f80, canonNaNbf) }
func minBF16(d, a, b unsafe.Pointer, n int) { maxMin16(d, a, b, n, true, 0x7f80, canonNaNbf) }

// ---- float16 / bfloat16 Sum and Prod: widen, combine in float32, round once ----

// f16Widen is Float16ToFloat32 made small enough to inline, with selects
// rather than unpredictable branches (after Giesen): rebias the exponent with
// one add, fix Inf/NaN with a second, and normalise zero/subnormals with one
// exact float subtraction.
func f16Widen(h uint16) float32 {
	o := uint32(h&0x7fff)<<13 + (127-15)<<23
	sub := math.Float32bits(math.Float32frombits(o+1<<23) - math.Float32frombits(113<<23))
	if o >= (31+127-15)<<23 { // Inf/NaN: exponent all ones
		o += (128 - 16) << 23
	}
	if o < (1+127-15)<<23 { // zero/subnormal
		o = sub
	}
	return math.Float32frombits(o | uint32(h&0x8000)<<16)
}

// f32ToF16Canon narrows like Float32ToFloat16 (see f32BitsToF16Bits) but
// canonicalises NaN; small enough to inline.
func f32ToF16Canon(f float32) uint16 {
	x := math.Float32bits(f)
	a := x & 0x7fffffff
	r := (a - (127-15)<<23 + 0xfff + (a>>13)&1) >> 13 // normal range
	if a < 0x38800000 {
		r = math.Float32bits(math.Float32frombits(a)+0.5) - 0x3f000000
	}
	if a >= 0x477ff000 {
		r = 0x7c00
	}
	r |= (x >> 16) & 0x8000
	if a > 0x7f800000 {
		r = uint32(canonNaN16)
	}
	return uint16(r)
}

// f16Table maps every float16 bit pattern to its float32 value (256 KiB),
// built on first use. Two loads beat ~12 instructions per widening by 2.5x;
// short runs (the assembly kernels' tails) don't build or touch it.
var f16Table = sync.OnceValue(func() *[65536]float32 {
	t := new([65536]float32)
	for i := range t {
		t[i] = f16Widen(uint16(i))
	}
	return t
})

const f16TableMin = 256 // elements; below this, widen arithmetically

func sumF16(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[uint16](d, a, b, n)
	if n < f16TableMin {
		for i := range D {
			D[i] = f32ToF16Canon(f16Widen(A[i]) + f16Widen(B[i]))
		}
		return
	}
	t := f16Table()
	for i := range D {
		D[i] = f32ToF16Canon(t[A[i]] + t[B[i]])
	}
}

func prodF16(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[uint16](d, a, b, n)
	if n < f16TableMin {
		for i := range D {
			D[i] = f32ToF16Canon(f16Widen(A[i]) * f16Widen(B[i]))
		}
		return
	}
	t := f16Table()
	for i := range D {
		D[i] = f32ToF16Canon(t[A[i]] * t[B[i]])
	}
}

func sumBF16(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[uint16](d, a, b, n)
	for i := range D {
		D[i] = f32ToBf16Canon(Bfloat16ToFloat32(A[i]) + Bfloat16ToFloat32(B[i]))
	}
}

func prodBF16(d, a, b unsafe.Pointer, n int) {
	D, A, B := slices3[uint16](d, a, b, n)
	for i := range D {
		D[i] = f32ToBf16Canon(Bfloat16ToFloat32(A[i]) * Bfloat16ToFloat32(B[i]))
	}
}
