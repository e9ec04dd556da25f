//go:build amd64 && !purego

package kernel

import "unsafe"

// AVX2 (and F16C) kernels from kernels_amd64.s. Each processes nbytes bytes,
// a multiple of 32, at any alignment.

//go:noescape
func addI8AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addI32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addI64AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulI32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addI16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulI16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxI16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minI16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func andAVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func orAVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func xorAVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func orBoolAVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func andBoolAVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func xorBoolAVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxI8AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minI8AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxU8AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minU8AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxI32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minI32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxU32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minU32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addF32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulF32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addF64AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulF64AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxF32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minF32AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxF64AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minF64AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addBF16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulBF16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxF16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minF16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func maxBF16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func minBF16AVX2(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func addF16F16C(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func mulF16F16C(d, a, b unsafe.Pointer, nbytes int)

// haveAsm says whether the assembly kernels can run on this CPU.
var haveAsm = haveAVX2

type bulkFn func(d, a, b unsafe.Pointer, nbytes int)

//go:noescape
func divF32AVX2(p unsafe.Pointer, nbytes int, d float32)

//go:noescape
func divF64AVX2(p unsafe.Pointer, nbytes int, d float64)

//go:noescape
func divF16F16C(p unsafe.Pointer, nbytes int, d float32)

//go:noescape
func divBF16AVX2(p unsafe.Pointer, nbytes int, d float32)

// The DivideBy kernels divide nbytes (a multiple of 32) of p in place.
func divF32Asm(p unsafe.Pointer, nbytes int, d float32)  { divF32AVX2(p, nbytes, d) }
func divF64Asm(p unsafe.Pointer, nbytes int, d float64)  { divF64AVX2(p, nbytes, d) }
func divF16Asm(p unsafe.Pointer, nbytes int, d float32)  { divF16F16C(p, nbytes, d) }
func divBF16Asm(p unsafe.Pointer, nbytes int, d float32) { divBF16AVX2(p, nbytes, d) }

func addAsmKernels(t *kernTable) {
	if !haveAVX2 {
		return
	}
	t.asmDiv = true
	t.asmDivF16 = haveF16C
	set := func(dt DataType, op RedOp, bulk bulkFn) {
		t.k[dt][op] = kernEntry{fn: withTail(bulk, t.k[dt][op].fn, dt), anyAlign: true}
		if op == Sum && CheckOp(dt, Avg) == nil {
			t.k[dt][Avg] = t.k[dt][Sum]
		}
	}
	set(Int8, Sum, addI8AVX2)
	set(Uint8, Sum, addI8AVX2)
	set(Int32, Sum, addI32AVX2)
	set(Uint32, Sum, addI32AVX2)
	set(Int64, Sum, addI64AVX2)
	set(Uint64, Sum, addI64AVX2)
	set(Int16, Sum, addI16AVX2)
	set(Int16, Prod, mulI16AVX2)
	set(Int16, Max, maxI16AVX2)
	set(Int16, Min, minI16AVX2)
	for _, dt := range []DataType{Int8, Uint8, Int16, Int32, Uint32, Int64, Uint64} {
		set(dt, Band, andAVX2)
		set(dt, Bor, orAVX2)
		set(dt, Bxor, xorAVX2)
	}
	for _, op := range []RedOp{Sum, Max, Bor} {
		set(Bool, op, orBoolAVX2)
	}
	for _, op := range []RedOp{Prod, Min, Band} {
		set(Bool, op, andBoolAVX2)
	}
	set(Bool, Bxor, xorBoolAVX2)
	set(Int32, Prod, mulI32AVX2) // low 32 bits of the product: same for both
	set(Uint32, Prod, mulI32AVX2)
	set(Int8, Max, maxI8AVX2)
	set(Int8, Min, minI8AVX2)
	set(Uint8, Max, maxU8AVX2)
	set(Uint8, Min, minU8AVX2)
	set(Int32, Max, maxI32AVX2)
	set(Int32, Min, minI32AVX2)
	set(Uint32, Max, maxU32AVX2)
	set(Uint32, Min, minU32AVX2)
	set(Float32, Sum, addF32AVX2)
	set(Float32, Prod, mulF32AVX2)
	set(Float32, Max, maxF32AVX2)
	set(Float32, Min, minF32AVX2)
	set(Float64, Sum, addF64AVX2)
	set(Float64, Prod, mulF64AVX2)
	set(Float64, Max, maxF64AVX2)
	set(Float64, Min, minF64AVX2)
	set(Bfloat16, Sum, addBF16AVX2)
	set(Bfloat16, Prod, mulBF16AVX2)
	set(Bfloat16, Max, maxBF16AVX2)
	set(Bfloat16, Min, minBF16AVX2)
	set(Float16, Max, maxF16AVX2)
	set(Float16, Min, minF16AVX2)
	if haveF16C {
		set(Float16, Sum, addF16F16C)
		set(Float16, Prod, mulF16F16C)
	}
}

// asmChunk bounds the bytes one assembly call processes. Assembly functions
// are not preemptible; chunking leaves the scheduler and GC a preemption
// point every few tens of microseconds on huge buffers, at no measurable cost.
const asmChunk = 256 << 10

// withTail runs bulk on the largest multiple of 32 bytes and the pure-Go
// kernel on the rest (fewer than 32 bytes), through scratch if misaligned.
func withTail(bulk bulkFn, tail kernFn, dt DataType) kernFn {
	size := dt.Size()
	align := elemAlign[dt]
	return func(d, a, b unsafe.Pointer, n int) {
		nb := n * size
		m := nb &^ 31
		for off := 0; off < m; {
			c := min(m-off, asmChunk)
			bulk(unsafe.Add(d, off), unsafe.Add(a, off), unsafe.Add(b, off), c)
			off += c
		}
		if m == nb {
			return
		}
		// Only now, with bytes left, is d+m inside the buffers (a pointer
		// just past the end of an allocation is invalid in Go).
		d, a, b = unsafe.Add(d, m), unsafe.Add(a, m), unsafe.Add(b, m)
		if (uintptr(d)|uintptr(a)|uintptr(b))&(align-1) == 0 {
			tail(d, a, b, (nb-m)/size)
			return
		}
		r := nb - m
		reduceViaScratch(tail, unsafe.Slice((*byte)(d), r), unsafe.Slice((*byte)(a), r), unsafe.Slice((*byte)(b), r), size)
	}
}
