package kernel

import (
	"fmt"
	"math/bits"
	"unsafe"
)

// DivideBy finishes an Avg: buf[i] = buf[i] / n for every element. n must be
// at least 1 (it is the number of contributions); anything else panics, as
// do invalid types and lengths that are not a multiple of dt.Size().
//
//   - Integers: truncating division, like C (and NCCL's avg on integers):
//     -7/2 = -3. Unsigned values are divided as unsigned.
//   - float32/float64: buf[i] / T(n), correctly rounded (when n is a power of
//     two the division is done as an exact multiplication by 1/n, which gives
//     the identical result). T(n) is itself rounded if n exceeds 2^24 (2^53).
//   - float16/bfloat16: widened to float32, divided by float32(n) there, and
//     rounded once back to nearest even.
//
// Bool has no average (it panics; CheckOp refuses Avg on it).
//
// NaN stays NaN: quiet, same sign and payload (the hardware's rule for
// float32/64; half types follow Float32ToFloat16). n == 1 leaves buf
// untouched. On amd64 the float types use AVX2/F16C kernels (bit-identical to
// the Go loops); misaligned buffers go through an aligned scratch buffer.
func DivideBy(buf []byte, dt DataType, n int) {
	if err := CheckOp(dt, Avg); err != nil {
		panic("kernel: DivideBy: " + err.Error())
	}
	if n < 1 {
		panic(fmt.Sprintf("kernel: DivideBy(%d): divisor must be >= 1", n))
	}
	if len(buf)%dt.Size() != 0 {
		panic(fmt.Sprintf("kernel: length %d is not a multiple of %v size %d", len(buf), dt, dt.Size()))
	}
	if n == 1 || len(buf) == 0 {
		return
	}
	p := unsafe.Pointer(unsafe.SliceData(buf))
	if uintptr(p)&(elemAlign[dt]-1) == 0 {
		divide(p, len(buf)/dt.Size(), dt, n)
		return
	}
	s := scratchPool.Get().(*scratch)
	sa := unsafe.Slice((*byte)(unsafe.Pointer(&s.a[0])), scratchBytes)
	for len(buf) > 0 {
		m := min(len(buf), scratchBytes)
		copy(sa, buf[:m])
		divide(unsafe.Pointer(&sa[0]), m/dt.Size(), dt, n)
		copy(buf[:m], sa[:m])
		buf = buf[m:]
	}
	scratchPool.Put(s)
}

func divide(p unsafe.Pointer, cnt int, dt DataType, n int) {
	switch dt {
	case Int8:
		divSmallSigned(unsafe.Slice((*int8)(p), cnt), n)
	case Uint8:
		divSmallUnsigned(unsafe.Slice((*uint8)(p), cnt), n)
	case Int16:
		divSmallSigned(unsafe.Slice((*int16)(p), cnt), n)
	case Int32:
		divSmallSigned(unsafe.Slice((*int32)(p), cnt), n)
	case Uint32:
		divSmallUnsigned(unsafe.Slice((*uint32)(p), cnt), n)
	case Int64:
		divInt64(unsafe.Slice((*int64)(p), cnt), n)
	case Uint64:
		divUint64(unsafe.Slice((*uint64)(p), cnt), n)
	case Float32:
		if kernels.asmDiv {
			p, cnt = divBulk(p, cnt, 4, float32(n), divF32Asm)
		}
		divFloat(unsafe.Slice((*float32)(p), cnt), n)
	case Float64:
		if kernels.asmDiv {
			p, cnt = divBulk(p, cnt, 8, float64(n), divF64Asm)
		}
		divFloat(unsafe.Slice((*float64)(p), cnt), n)
	case Float16:
		if kernels.asmDivF16 {
			p, cnt = divBulk(p, cnt, 2, float32(n), divF16Asm)
		}
		s := unsafe.Slice((*uint16)(p), cnt)
		d := float32(n)
		for i, h := range s {
			f := f16Widen(h) / d
			if f != f { // keep the payload, as documented
				s[i] = Float32ToFloat16(f)
				continue
			}
			s[i] = f32ToF16Canon(f) // inlinable; same rounding for non-NaN
		}
	case Bfloat16:
		if kernels.asmDiv {
			p, cnt = divBulk(p, cnt, 2, float32(n), divBF16Asm)
		}
		s := unsafe.Slice((*uint16)(p), cnt)
		f := float32(n)
		for i, h := range s {
			s[i] = Float32ToBfloat16(Bfloat16ToFloat32(h) / f)
		}
	}
}

// divBulk runs an assembly DivideBy kernel over the largest multiple of 32
// bytes of the cnt elements at p, asmChunk bytes per call (preemption), and
// returns what is left for the Go loop.
func divBulk[F float32 | float64](p unsafe.Pointer, cnt, size int, d F, fn func(unsafe.Pointer, int, F)) (unsafe.Pointer, int) {
	m := cnt * size &^ 31
	for off := 0; off < m; {
		c := min(m-off, asmChunk)
		fn(unsafe.Add(p, off), c, d)
		off += c
	}
	if m == cnt*size {
		return p, 0 // never form a pointer just past the end
	}
	return unsafe.Add(p, m), cnt - m/size
}

func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }

// divSmallSigned truncates toward zero (n >= 2) for 8-, 16- and 32-bit integers,
// without a hardware divide: q = |x| / n by multiplying with
// M = ceil(2^64 / n) and keeping the high 64 bits, exact for every 32-bit
// |x| and n < 2^32 (Lemire, Kaser, Kurz, "Faster remainder by direct
// computation", 2019), then the sign is put back.
func divSmallSigned[T ~int8 | ~int16 | ~int32](s []T, n int) {
	w := int(unsafe.Sizeof(T(0))) * 8
	if uint64(n) > uint64(1)<<(w-1) {
		// |x| <= -min(T) < n: every quotient is 0.
		clear(s)
		return
	}
	m := ^uint64(0)/uint64(n) + 1
	for i, x := range s {
		v := int64(x)
		sg := v >> 63 // 0 or -1
		q, _ := bits.Mul64(m, uint64((v^sg)-sg))
		s[i] = T((int64(q) ^ sg) - sg)
	}
}

func divSmallUnsigned[T ~uint8 | ~uint32](s []T, n int) {
	w := int(unsafe.Sizeof(T(0))) * 8
	if uint64(n) > uint64(1)<<w-1 {
		clear(s)
		return
	}
	m := ^uint64(0)/uint64(n) + 1
	for i, x := range s {
		q, _ := bits.Mul64(m, uint64(x))
		s[i] = T(q)
	}
}

// divInt64 truncates toward zero (n >= 2).
func divInt64(s []int64, n int) {
	if isPow2(n) {
		// Arithmetic shift rounds toward -inf; bias negatives by n-1 first.
		k := uint(bits.TrailingZeros64(uint64(n)))
		mask := int64(n - 1)
		for i, x := range s {
			s[i] = (x + (x>>63)&mask) >> k
		}
		return
	}
	d := int64(n)
	for i, x := range s {
		s[i] = x / d
	}
}

func divUint64(s []uint64, n int) {
	if isPow2(n) {
		k := uint(bits.TrailingZeros64(uint64(n)))
		for i, x := range s {
			s[i] = x >> k
		}
		return
	}
	d := uint64(n)
	for i, x := range s {
		s[i] = x / d
	}
}

func divFloat[T float32 | float64](s []T, n int) {
	if isPow2(n) {
		// 1/n is exact (a power of two well inside the normal range), and
		// x*(1/n) and x/n are the correctly rounded values of the same real
		// number: identical results, without the divide.
		r := 1 / T(n)
		for i := range s {
			s[i] *= r
		}
		return
	}
	d := T(n)
	for i := range s {
		s[i] /= d
	}
}
