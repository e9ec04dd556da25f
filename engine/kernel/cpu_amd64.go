//go:build amd64 && !purego

package kernel

// CPU feature detection without golang.org/x/sys/cpu: a CPUID/XGETBV stub.

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv() (eax, edx uint32)

var haveAVX2, haveF16C = detectCPU()

func detectCPU() (avx2, f16c bool) {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const (
		osxsave = 1 << 27
		avx     = 1 << 28
		f16cBit = 1 << 29
	)
	if ecx1&(osxsave|avx) != osxsave|avx {
		return false, false
	}
	// The OS must save the XMM (bit 1) and YMM (bit 2) state.
	if xcr0, _ := xgetbv(); xcr0&6 != 6 {
		return false, false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	avx2 = ebx7&(1<<5) != 0
	return avx2, avx2 && ecx1&f16cBit != 0
}
