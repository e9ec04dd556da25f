package kernel

import (
	"fmt"
	"sync"
	"unsafe"
)

// Reduction semantics (shared by Reduce, Reduce3 and ReferenceReduce):
//
//   - Integers: Sum and Prod wrap around (two's complement, like C unsigned
//     arithmetic and NCCL). Max/Min compare signed or unsigned per the type.
//   - Avg reduces exactly like Sum; the division by the number of
//     contributions happens once at the end, with DivideBy.
//   - Band, Bor, Bxor: bitwise and, or, exclusive or of the elements' bits,
//     on integer types and Bool; refused on floating-point types.
//   - Bool (torch's semantics, as ProcessGroupNCCL and Gloo implement them):
//     a byte is true when it is not 0; Sum, Max and Bor are logical or,
//     Prod, Min and Band logical and, Bxor logical exclusive or, and every
//     result byte is 0 or 1. Avg is refused. (A collective on a single rank
//     reduces nothing and copies its input as it is, as NCCL and Gloo do.)
//   - float32/float64: IEEE arithmetic, round to nearest even. Max/Min: if
//     either operand is NaN the result is NaN; Max(+0, -0) = +0 and
//     Min(+0, -0) = -0 whatever the order.
//   - float16/bfloat16: both elements are widened to float32 (exact), combined
//     in float32, and rounded once back to nearest even. Since float32 has at
//     least 2p+2 bits of precision for both formats (p = 11 and 8), this gives
//     the correctly rounded half/bfloat16 result for Sum and Prod. Max/Min pick
//     one of the operands bit-for-bit (same NaN and signed-zero rules).
//   - NaN results are canonicalised: every NaN a reduction produces is the
//     quiet NaN with sign clear and zero payload (0x7e00, 0x7fc0, 0x7fc00000,
//     0x7ff8000000000000). Hardware picks the payload of the *first* NaN
//     operand, and x86 produces a negative NaN for Inf-Inf, so without this a
//     op b and b op a could differ in their bits, and results would depend on
//     the CPU. With it, results are bitwise commutative and identical on every
//     architecture and code path (assembly or pure Go).
//
// Every operation is commutative bit-for-bit (a op b == b op a), and the same
// inputs always give the same bytes. Floating-point Sum/Prod are of course not
// associative: ranks must agree on an order to get identical results.
//
// Buffers are native-endian. dst may alias a or b exactly (same first byte);
// partial overlap is not supported.
//
// Alignment: the fast loops reinterpret the byte slices as typed slices, which
// requires each slice to start at an address aligned for the element type.
// When one is not, the data goes through an aligned scratch buffer in chunks
// (a few KiB at a time): correct and safe, somewhat slower. The amd64 assembly
// kernels accept any alignment and are used directly.

// Reduce sets dst[i] = dst[i] op src[i] for every element. len(dst) must equal
// len(src) and be a multiple of dt.Size(); invalid types, ops or lengths
// panic, and so does an op not defined on the type (check with CheckOp).
// Avg reduces like Sum (finish with DivideBy).
func Reduce(dst, src []byte, dt DataType, op RedOp) {
	Reduce3(dst, dst, src, dt, op)
}

// Reduce3 sets dst[i] = a[i] op b[i]. dst may alias a or b exactly. All three
// lengths must be equal. It saves a copy for out-of-place collectives.
func Reduce3(dst, a, b []byte, dt DataType, op RedOp) {
	checkArgs(dst, a, dt, op)
	if len(dst) != len(b) {
		panic(fmt.Sprintf("kernel: length mismatch: dst %d bytes, b %d bytes", len(dst), len(b)))
	}
	if len(dst) == 0 {
		return
	}
	n := len(dst) / dt.Size()
	k := &kernels.k[dt][op]
	pd := unsafe.Pointer(unsafe.SliceData(dst))
	pa := unsafe.Pointer(unsafe.SliceData(a))
	pb := unsafe.Pointer(unsafe.SliceData(b))
	if k.anyAlign || (uintptr(pd)|uintptr(pa)|uintptr(pb))&(elemAlign[dt]-1) == 0 {
		k.fn(pd, pa, pb, n)
		return
	}
	reduceViaScratch(k.fn, dst, a, b, dt.Size())
}

// kernFn computes d[i] = a[i] op b[i] for n elements. Unless the entry says
// anyAlign, the pointers are aligned for the element type.
type kernFn func(d, a, b unsafe.Pointer, n int)

type kernEntry struct {
	fn       kernFn
	anyAlign bool
}

type kernTable struct {
	k         [len(dtypeNames)][len(opNames)]kernEntry
	asmDiv    bool // DivideBy may use divF32Asm, divF64Asm, divBF16Asm
	asmDivF16 bool // and divF16Asm
}

// kernels is the table Reduce3 dispatches through. It is the pure-Go table
// with assembly overrides where the CPU supports them; tests swap it
// (usePath in reduce_test.go) to check both paths.
var kernels = buildKernels(haveAsm)

func buildKernels(asm bool) *kernTable {
	t := &kernTable{}
	for dt := range t.k {
		for op := range t.k[dt] {
			if CheckOp(DataType(dt), RedOp(op)) != nil {
				continue // no such type, or op undefined on it: checkArgs refuses it first
			}
			t.k[dt][op] = goKernel(DataType(dt), RedOp(op))
		}
	}
	if asm {
		addAsmKernels(t)
	}
	return t
}

func goKernel(dt DataType, op RedOp) kernEntry {
	if op == Avg {
		op = Sum
	}
	if op.IsBitwise() && dt != Bool {
		// The same bits whatever the width: whole words at any alignment.
		return kernEntry{fn: bitwiseKernel(op, dt.Size()), anyAlign: true}
	}
	switch dt {
	case Bool:
		return kernEntry{fn: boolKernel(op), anyAlign: true}
	case Int8, Uint8:
		if op == Sum {
			return kernEntry{fn: sumBytes, anyAlign: true}
		}
	}
	return kernEntry{fn: typedKernel(dt, op)}
}

func typedKernel(dt DataType, op RedOp) kernFn {
	switch dt {
	case Int8:
		return intKernel[int8](op)
	case Uint8:
		return intKernel[uint8](op)
	case Int16:
		return intKernel[int16](op)
	case Int32:
		return intKernel[int32](op)
	case Uint32:
		return intKernel[uint32](op)
	case Int64:
		return intKernel[int64](op)
	case Uint64:
		return intKernel[uint64](op)
	case Float32:
		return [...]kernFn{Sum: sumF32, Prod: prodF32, Max: maxF32, Min: minF32}[op]
	case Float64:
		return [...]kernFn{Sum: sumF64, Prod: prodF64, Max: maxF64, Min: minF64}[op]
	case Float16:
		return [...]kernFn{Sum: sumF16, Prod: prodF16, Max: maxF16, Min: minF16}[op]
	case Bfloat16:
		return [...]kernFn{Sum: sumBF16, Prod: prodBF16, Max: maxBF16, Min: minBF16}[op]
	}
	panic("unreachable")
}

func intKernel[T integer](op RedOp) kernFn {
	return [...]kernFn{Sum: sumInt[T], Prod: prodInt[T], Max: maxInt[T], Min: minInt[T]}[op]
}

var elemAlign = [len(dtypeNames)]uintptr{
	Int8: 1, Uint8: 1, Bool: 1,
	Int16:    unsafe.Alignof(int16(0)),
	Int32:    unsafe.Alignof(int32(0)),
	Uint32:   unsafe.Alignof(uint32(0)),
	Int64:    unsafe.Alignof(int64(0)),
	Uint64:   unsafe.Alignof(uint64(0)),
	Float16:  unsafe.Alignof(uint16(0)),
	Float32:  unsafe.Alignof(float32(0)),
	Float64:  unsafe.Alignof(float64(0)),
	Bfloat16: unsafe.Alignof(uint16(0)),
}

const scratchBytes = 4096

type scratch struct{ a, b [scratchBytes / 8]uint64 }

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// reduceViaScratch handles misaligned buffers: chunks of a and b are copied
// into 8-byte aligned scratch, reduced there, and the result copied to dst.
// Each chunk is read completely before dst is written, so exact aliasing of
// dst with a or b is fine.
func reduceViaScratch(fn kernFn, dst, a, b []byte, size int) {
	s := scratchPool.Get().(*scratch)
	sa := unsafe.Slice((*byte)(unsafe.Pointer(&s.a[0])), scratchBytes)
	sb := unsafe.Slice((*byte)(unsafe.Pointer(&s.b[0])), scratchBytes)
	for len(dst) > 0 {
		m := min(len(dst), scratchBytes) // scratchBytes is a multiple of every size
		copy(sa, a[:m])
		copy(sb, b[:m])
		fn(unsafe.Pointer(&sa[0]), unsafe.Pointer(&sa[0]), unsafe.Pointer(&sb[0]), m/size)
		copy(dst[:m], sa[:m])
		dst, a, b = dst[m:], a[m:], b[m:]
	}
	scratchPool.Put(s)
}
