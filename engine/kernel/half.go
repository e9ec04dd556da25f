package kernel

import "math"

// IEEE 754 binary16 ("half", float16) and bfloat16 conversions.
//
// Widening (to float32) is exact for every bit pattern, NaN payloads
// included: the bits are moved, never computed, so a signalling NaN stays
// signalling. Narrowing (from float32) rounds to nearest, ties to even,
// produces subnormals and infinities where IEEE says so, and maps every NaN
// to a quiet NaN of the same sign that keeps the top payload bits (the quiet
// bit is forced, so a NaN whose payload lives only in the dropped low bits
// does not turn into an infinity). Consequently
// Float32ToFloat16(Float16ToFloat32(h)) == h for every h that is not a NaN,
// and == h|0x0200 for a NaN (likewise 0x0040 for bfloat16).

// Canonical NaNs produced by reductions (see Reduce). Sign clear, quiet bit
// set, payload zero.
const (
	canonNaN16  uint16 = 0x7e00
	canonNaNbf  uint16 = 0x7fc0
	canonNaN32  uint32 = 0x7fc00000
	canonNaN64  uint64 = 0x7ff8000000000000
	f16QuietBit uint16 = 0x0200
	bfQuietBit  uint16 = 0x0040
)

// Float16ToFloat32 widens an IEEE binary16 value to float32 exactly.
func Float16ToFloat32(h uint16) float32 {
	return math.Float32frombits(f16BitsToF32Bits(h))
}

func f16BitsToF32Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch exp {
	case 0x1f: // Inf / NaN: keep the payload bit-for-bit.
		return sign | 0x7f800000 | man<<13
	case 0:
		if man == 0 {
			return sign
		}
		// Subnormal: value is man * 2^-24. Normalise.
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		return sign | e<<23 | (man&0x3ff)<<13
	}
	return sign | (exp+127-15)<<23 | man<<13
}

// Float32ToFloat16 narrows f to IEEE binary16, rounding to nearest even.
func Float32ToFloat16(f float32) uint16 {
	x := math.Float32bits(f)
	if x&0x7fffffff > 0x7f800000 { // NaN: quiet, keep sign and top payload.
		return uint16(x>>16)&0x8000 | 0x7c00 | f16QuietBit | uint16(x>>13)&0x3ff
	}
	return f32BitsToF16Bits(x)
}

// f32BitsToF16Bits rounds a non-NaN float32 (given as bits) to binary16.
// The caller handles NaN; an input NaN yields an infinity or garbage.
func f32BitsToF16Bits(x uint32) uint16 {
	sign := uint16(x>>16) & 0x8000
	a := x & 0x7fffffff
	switch {
	case a >= 0x477ff000:
		// >= 65520 = max half (65504) + half an ulp (16): rounds to Inf
		// (65520 itself is a tie and max half has an odd mantissa).
		return sign | 0x7c00
	case a < 0x38800000:
		// Below the smallest normal half (2^-14): result is subnormal or
		// zero. Adding 0.5 (2^-1) aligns the binary point so that the
		// hardware's round-to-nearest-even float32 addition performs exactly
		// the rounding we want: the result's ulp is 2^-24, the half
		// subnormal quantum. Exact in float32 because a < 2^-14.
		const magic = 0x3f000000 // 0.5f
		r := math.Float32frombits(a) + math.Float32frombits(magic)
		return sign | uint16(math.Float32bits(r)-magic)
	}
	// Normal range: rebias the exponent and round the 13 dropped bits to
	// nearest even. A carry out of the mantissa correctly bumps the exponent
	// (up to Inf for values just below the threshold above).
	odd := (a >> 13) & 1
	a = a - (127-15)<<23 + 0xfff + odd
	return sign | uint16(a>>13)
}

// Bfloat16ToFloat32 widens a bfloat16 value to float32 exactly.
func Bfloat16ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Float32ToBfloat16 narrows f to bfloat16, rounding to nearest even; NaN
// stays NaN (quiet, same sign, top payload bits kept).
func Float32ToBfloat16(f float32) uint16 {
	x := math.Float32bits(f)
	if x&0x7fffffff > 0x7f800000 {
		return uint16(x>>16) | bfQuietBit
	}
	return f32BitsToBf16Bits(x)
}

// f32BitsToBf16Bits rounds a non-NaN float32 (given as bits) to bfloat16.
// Overflow carries into the exponent and yields Inf, as it should.
func f32BitsToBf16Bits(x uint32) uint16 {
	return uint16((x + 0x7fff + (x>>16)&1) >> 16)
}

// Reduction-side helpers: narrow with NaN canonicalised (see Reduce).

func f32ToBf16Canon(f float32) uint16 {
	if f != f {
		return canonNaNbf
	}
	return f32BitsToBf16Bits(math.Float32bits(f))
}
