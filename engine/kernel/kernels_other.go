//go:build !amd64 || purego

package kernel

import "unsafe"

// No assembly on this architecture (or with the purego build tag): the
// pure-Go kernels serve everything.

const haveAsm = false

const asmChunk = 256 << 10

func addAsmKernels(*kernTable) {}

func divF32Asm(unsafe.Pointer, int, float32)  { panic("unreachable") }
func divF64Asm(unsafe.Pointer, int, float64)  { panic("unreachable") }
func divF16Asm(unsafe.Pointer, int, float32)  { panic("unreachable") }
func divBF16Asm(unsafe.Pointer, int, float32) { panic("unreachable") }
