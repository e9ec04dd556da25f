//go:build amd64 && !purego

#include "textflag.h"

// AVX2 reduction kernels: d[i] = a[i] op b[i] over nbytes bytes, nbytes a
// multiple of 32 (the Go wrapper does the tail). Any alignment is fine
// (unaligned loads and stores). d may alias a or b exactly: every block is
// loaded completely before it is stored.
//
// All have the Go signature func(d, a, b unsafe.Pointer, nbytes int).

#define ARGS \
	MOVQ d+0(FP), DI; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DX; \
	MOVQ nbytes+24(FP), CX

// Integer ops, no special values: 128 bytes per iteration, then 32.
#define INT_BODY(OP) \
	ARGS; \
loop128: \
	CMPQ CX, $128; \
	JB   loop32; \
	VMOVDQU (SI), Y0; \
	VMOVDQU 32(SI), Y1; \
	VMOVDQU 64(SI), Y2; \
	VMOVDQU 96(SI), Y3; \
	OP (DX), Y0, Y0; \
	OP 32(DX), Y1, Y1; \
	OP 64(DX), Y2, Y2; \
	OP 96(DX), Y3, Y3; \
	VMOVDQU Y0, (DI); \
	VMOVDQU Y1, 32(DI); \
	VMOVDQU Y2, 64(DI); \
	VMOVDQU Y3, 96(DI); \
	ADDQ $128, SI; \
	ADDQ $128, DX; \
	ADDQ $128, DI; \
	SUBQ $128, CX; \
	JMP  loop128; \
loop32: \
	CMPQ CX, $32; \
	JB   done; \
	VMOVDQU (SI), Y0; \
	OP (DX), Y0, Y0; \
	VMOVDQU Y0, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop32; \
done: \
	VZEROUPPER; \
	RET

TEXT ·addI8AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPADDB)

TEXT ·addI32AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPADDD)

TEXT ·addI64AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPADDQ)

TEXT ·mulI32AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMULLD)

TEXT ·addI16AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPADDW)

TEXT ·mulI16AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMULLW)

TEXT ·maxI16AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMAXSW)

TEXT ·minI16AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMINSW)

// Bitwise ops: the same for every integer width.
TEXT ·andAVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPAND)

TEXT ·orAVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPOR)

TEXT ·xorAVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPXOR)

// Bool: min(x, 1) per unsigned byte is 1 for every byte but 0 (truth),
// with Y15 holding 1 in every byte. or = truth(a|b), and =
// min(truth(a), b), xor = truth(a)^truth(b). STEP(R, T, OFF) computes the
// 32 result bytes at OFF into R (T is scratch).
#define BOOL_OR(R, T, OFF) \
	VMOVDQU OFF(SI), R; \
	VPOR OFF(DX), R, R; \
	VPMINUB Y15, R, R

#define BOOL_AND(R, T, OFF) \
	VMOVDQU OFF(SI), R; \
	VPMINUB Y15, R, R; \
	VPMINUB OFF(DX), R, R

#define BOOL_XOR(R, T, OFF) \
	VMOVDQU OFF(SI), R; \
	VPMINUB Y15, R, R; \
	VPMINUB OFF(DX), Y15, T; \
	VPXOR T, R, R

#define BOOL_BODY(STEP) \
	ARGS; \
	VPCMPEQB Y15, Y15, Y15; \
	VPABSB Y15, Y15; \
loop128: \
	CMPQ CX, $128; \
	JB   loop32; \
	STEP(Y0, Y4, 0); \
	STEP(Y1, Y5, 32); \
	STEP(Y2, Y6, 64); \
	STEP(Y3, Y7, 96); \
	VMOVDQU Y0, (DI); \
	VMOVDQU Y1, 32(DI); \
	VMOVDQU Y2, 64(DI); \
	VMOVDQU Y3, 96(DI); \
	ADDQ $128, SI; \
	ADDQ $128, DX; \
	ADDQ $128, DI; \
	SUBQ $128, CX; \
	JMP  loop128; \
loop32: \
	CMPQ CX, $32; \
	JB   done; \
	STEP(Y0, Y4, 0); \
	VMOVDQU Y0, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop32; \
done: \
	VZEROUPPER; \
	RET

TEXT ·orBoolAVX2(SB), NOSPLIT, $0-32
	BOOL_BODY(BOOL_OR)

TEXT ·andBoolAVX2(SB), NOSPLIT, $0-32
	BOOL_BODY(BOOL_AND)

TEXT ·xorBoolAVX2(SB), NOSPLIT, $0-32
	BOOL_BODY(BOOL_XOR)

TEXT ·maxI8AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMAXSB)

TEXT ·minI8AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMINSB)

TEXT ·maxU8AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMAXUB)

TEXT ·minU8AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMINUB)

TEXT ·maxI32AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMAXSD)

TEXT ·minI32AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMINSD)

TEXT ·maxU32AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMAXUD)

TEXT ·minU32AVX2(SB), NOSPLIT, $0-32
	INT_BODY(VPMINUD)

// Float Sum/Prod with NaN canonicalisation. Y8 holds the canonical NaN.
// The main loop tests the 4 result vectors for NaN with 2 compares and only
// blends (fix128) when one is present.
#define FLOAT_BODY(OP, CMP, BLEND) \
	ARGS; \
loop128: \
	CMPQ CX, $128; \
	JB   loop32; \
	VMOVUPS (SI), Y0; \
	VMOVUPS 32(SI), Y1; \
	VMOVUPS 64(SI), Y2; \
	VMOVUPS 96(SI), Y3; \
	OP (DX), Y0, Y0; \
	OP 32(DX), Y1, Y1; \
	OP 64(DX), Y2, Y2; \
	OP 96(DX), Y3, Y3; \
	CMP $3, Y1, Y0, Y4; \
	CMP $3, Y3, Y2, Y5; \
	VPOR Y4, Y5, Y4; \
	VPTEST Y4, Y4; \
	JNZ  fix128; \
store128: \
	VMOVUPS Y0, (DI); \
	VMOVUPS Y1, 32(DI); \
	VMOVUPS Y2, 64(DI); \
	VMOVUPS Y3, 96(DI); \
	ADDQ $128, SI; \
	ADDQ $128, DX; \
	ADDQ $128, DI; \
	SUBQ $128, CX; \
	JMP  loop128; \
fix128: \
	CMP $3, Y0, Y0, Y4; \
	BLEND Y4, Y8, Y0, Y0; \
	CMP $3, Y1, Y1, Y4; \
	BLEND Y4, Y8, Y1, Y1; \
	CMP $3, Y2, Y2, Y4; \
	BLEND Y4, Y8, Y2, Y2; \
	CMP $3, Y3, Y3, Y4; \
	BLEND Y4, Y8, Y3, Y3; \
	JMP  store128; \
loop32: \
	CMPQ CX, $32; \
	JB   done; \
	VMOVUPS (SI), Y0; \
	OP (DX), Y0, Y0; \
	CMP $3, Y0, Y0, Y4; \
	BLEND Y4, Y8, Y0, Y0; \
	VMOVUPS Y0, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop32; \
done: \
	VZEROUPPER; \
	RET

#define NAN32 \
	MOVL $0x7fc00000, AX; \
	VMOVQ AX, X8; \
	VPBROADCASTD X8, Y8

#define NAN64 \
	MOVQ $0x7ff8000000000000, AX; \
	VMOVQ AX, X8; \
	VPBROADCASTQ X8, Y8

TEXT ·addF32AVX2(SB), NOSPLIT, $0-32
	NAN32
	FLOAT_BODY(VADDPS, VCMPPS, VBLENDVPS)

TEXT ·mulF32AVX2(SB), NOSPLIT, $0-32
	NAN32
	FLOAT_BODY(VMULPS, VCMPPS, VBLENDVPS)

TEXT ·addF64AVX2(SB), NOSPLIT, $0-32
	NAN64
	FLOAT_BODY(VADDPD, VCMPPD, VBLENDVPD)

TEXT ·mulF64AVX2(SB), NOSPLIT, $0-32
	NAN64
	FLOAT_BODY(VMULPD, VCMPPD, VBLENDVPD)

// Float Max/Min on bit patterns (see maxMin32 in kernels_go.go): key(x) =
// x ^ ((x >>arith 31) >>logical 1) orders like the numbers with -0 < +0;
// pick b where key(b) > key(a) (Max) or key(a) > key(b) (Min); NaN if
// max(|a|,|b|) > Inf as integers. 32 bytes per iteration.
//   Y8 canonical NaN, Y11 0x7fffffff, Y12 0x7f800000.
#define MAXMIN32_BODY(PICK) \
	ARGS; \
	NAN32; \
	MOVL $0x7fffffff, AX; \
	VMOVQ AX, X11; \
	VPBROADCASTD X11, Y11; \
	MOVL $0x7f800000, AX; \
	VMOVQ AX, X12; \
	VPBROADCASTD X12, Y12; \
loop: \
	CMPQ CX, $32; \
	JB   done; \
	VMOVDQU (SI), Y0; \
	VMOVDQU (DX), Y1; \
	VPSRAD $31, Y0, Y2; \
	VPSRLD $1, Y2, Y2; \
	VPXOR Y0, Y2, Y2; \
	VPSRAD $31, Y1, Y3; \
	VPSRLD $1, Y3, Y3; \
	VPXOR Y1, Y3, Y3; \
	PICK; \
	VPBLENDVB Y4, Y1, Y0, Y5; \
	VPAND Y11, Y0, Y6; \
	VPAND Y11, Y1, Y7; \
	VPMAXUD Y6, Y7, Y6; \
	VPCMPGTD Y12, Y6, Y6; \
	VPBLENDVB Y6, Y8, Y5, Y5; \
	VMOVDQU Y5, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop; \
done: \
	VZEROUPPER; \
	RET

// VPCMPGTx src2, src1, dst: dst = src1 > src2. Y2 = key(a), Y3 = key(b).
#define PICK_MAX32 VPCMPGTD Y2, Y3, Y4
#define PICK_MIN32 VPCMPGTD Y3, Y2, Y4

TEXT ·maxF32AVX2(SB), NOSPLIT, $0-32
	MAXMIN32_BODY(PICK_MAX32)

TEXT ·minF32AVX2(SB), NOSPLIT, $0-32
	MAXMIN32_BODY(PICK_MIN32)

// 64-bit version: AVX2 has no 64-bit arithmetic shift, so the sign mask is
// 0 > x; and no unsigned 64-bit max, so each operand is tested for NaN.
//   Y8 canonical NaN, Y11 0x7fffffffffffffff, Y12 0x7ff0000000000000, Y13 0.
#define MAXMIN64_BODY(PICK) \
	ARGS; \
	NAN64; \
	MOVQ $0x7fffffffffffffff, AX; \
	VMOVQ AX, X11; \
	VPBROADCASTQ X11, Y11; \
	MOVQ $0x7ff0000000000000, AX; \
	VMOVQ AX, X12; \
	VPBROADCASTQ X12, Y12; \
	VPXOR Y13, Y13, Y13; \
loop: \
	CMPQ CX, $32; \
	JB   done; \
	VMOVDQU (SI), Y0; \
	VMOVDQU (DX), Y1; \
	VPCMPGTQ Y0, Y13, Y2; \
	VPSRLQ $1, Y2, Y2; \
	VPXOR Y0, Y2, Y2; \
	VPCMPGTQ Y1, Y13, Y3; \
	VPSRLQ $1, Y3, Y3; \
	VPXOR Y1, Y3, Y3; \
	PICK; \
	VPBLENDVB Y4, Y1, Y0, Y5; \
	VPAND Y11, Y0, Y6; \
	VPAND Y11, Y1, Y7; \
	VPCMPGTQ Y12, Y6, Y6; \
	VPCMPGTQ Y12, Y7, Y7; \
	VPOR Y6, Y7, Y6; \
	VPBLENDVB Y6, Y8, Y5, Y5; \
	VMOVDQU Y5, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop; \
done: \
	VZEROUPPER; \
	RET

#define PICK_MAX64 VPCMPGTQ Y2, Y3, Y4
#define PICK_MIN64 VPCMPGTQ Y3, Y2, Y4

TEXT ·maxF64AVX2(SB), NOSPLIT, $0-32
	MAXMIN64_BODY(PICK_MAX64)

TEXT ·minF64AVX2(SB), NOSPLIT, $0-32
	MAXMIN64_BODY(PICK_MIN64)

// bfloat16 Sum/Prod, 16 elements (32 bytes) per iteration. A bfloat16 is the
// top half of a float32, so each 32-bit lane holds two: the even element
// becomes a float32 by shifting left 16, the odd one by masking off the low
// half. Combine in float32, canonicalise NaN (only when the NaN test fires),
// round to nearest even, (x + 0x7fff + ((x >> 16) & 1)), and put the two
// halves back together: no widening loads, packing or permutes.
//   Y8 canonical float32 NaN (rounds to 0x7fc0), Y9 0x7fff, Y10 1,
//   Y11 0xffff0000.
#define BF16_BODY(OP) \
	ARGS; \
	NAN32; \
	MOVL $0x7fff, AX; \
	VMOVQ AX, X9; \
	VPBROADCASTD X9, Y9; \
	MOVL $1, AX; \
	VMOVQ AX, X10; \
	VPBROADCASTD X10, Y10; \
	MOVL $0xffff0000, AX; \
	VMOVQ AX, X11; \
	VPBROADCASTD X11, Y11; \
loop: \
	CMPQ CX, $32; \
	JB   done; \
	VMOVDQU (SI), Y0; \
	VMOVDQU (DX), Y1; \
	VPSLLD $16, Y0, Y2; \
	VPAND Y11, Y0, Y0; \
	VPSLLD $16, Y1, Y3; \
	VPAND Y11, Y1, Y1; \
	OP Y3, Y2, Y2; \
	OP Y1, Y0, Y0; \
	VCMPPS $3, Y2, Y0, Y4; \
	VPTEST Y4, Y4; \
	JNZ  fix; \
round: \
	VPSRLD $16, Y2, Y4; \
	VPAND Y10, Y4, Y4; \
	VPADDD Y9, Y2, Y2; \
	VPADDD Y4, Y2, Y2; \
	VPSRLD $16, Y2, Y2; \
	VPSRLD $16, Y0, Y5; \
	VPAND Y10, Y5, Y5; \
	VPADDD Y9, Y0, Y0; \
	VPADDD Y5, Y0, Y0; \
	VPAND Y11, Y0, Y0; \
	VPOR Y2, Y0, Y0; \
	VMOVDQU Y0, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop; \
fix: \
	VCMPPS $3, Y2, Y2, Y4; \
	VBLENDVPS Y4, Y8, Y2, Y2; \
	VCMPPS $3, Y0, Y0, Y4; \
	VBLENDVPS Y4, Y8, Y0, Y0; \
	JMP  round; \
done: \
	VZEROUPPER; \
	RET

TEXT ·addBF16AVX2(SB), NOSPLIT, $0-32
	BF16_BODY(VADDPS)

TEXT ·mulBF16AVX2(SB), NOSPLIT, $0-32
	BF16_BODY(VMULPS)

// float16/bfloat16 Max/Min: the 16-bit version of MAXMIN32_BODY, on the bit
// patterns (no conversion needed: the result is one of the operands).
//   Y8 canonical NaN, Y11 0x7fff, Y12 the format's +Inf.
#define MAXMIN16_BODY(PICK, NANV, INFV) \
	ARGS; \
	MOVL NANV, AX; \
	VMOVQ AX, X8; \
	VPBROADCASTW X8, Y8; \
	MOVL $0x7fff, AX; \
	VMOVQ AX, X11; \
	VPBROADCASTW X11, Y11; \
	MOVL INFV, AX; \
	VMOVQ AX, X12; \
	VPBROADCASTW X12, Y12; \
loop: \
	CMPQ CX, $32; \
	JB   done; \
	VMOVDQU (SI), Y0; \
	VMOVDQU (DX), Y1; \
	VPSRAW $15, Y0, Y2; \
	VPSRLW $1, Y2, Y2; \
	VPXOR Y0, Y2, Y2; \
	VPSRAW $15, Y1, Y3; \
	VPSRLW $1, Y3, Y3; \
	VPXOR Y1, Y3, Y3; \
	PICK; \
	VPBLENDVB Y4, Y1, Y0, Y5; \
	VPAND Y11, Y0, Y6; \
	VPAND Y11, Y1, Y7; \
	VPMAXUW Y6, Y7, Y6; \
	VPCMPGTW Y12, Y6, Y6; \
	VPBLENDVB Y6, Y8, Y5, Y5; \
	VMOVDQU Y5, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop; \
done: \
	VZEROUPPER; \
	RET

#define PICK_MAX16 VPCMPGTW Y2, Y3, Y4
#define PICK_MIN16 VPCMPGTW Y3, Y2, Y4

TEXT ·maxF16AVX2(SB), NOSPLIT, $0-32
	MAXMIN16_BODY(PICK_MAX16, $0x7e00, $0x7c00)

TEXT ·minF16AVX2(SB), NOSPLIT, $0-32
	MAXMIN16_BODY(PICK_MIN16, $0x7e00, $0x7c00)

TEXT ·maxBF16AVX2(SB), NOSPLIT, $0-32
	MAXMIN16_BODY(PICK_MAX16, $0x7fc0, $0x7f80)

TEXT ·minBF16AVX2(SB), NOSPLIT, $0-32
	MAXMIN16_BODY(PICK_MIN16, $0x7fc0, $0x7f80)

// float16 Sum/Prod with F16C: VCVTPH2PS widens exactly, VCVTPS2PH $0 rounds
// to nearest even (subnormals included; Go runs with MXCSR's defaults, no
// FTZ/DAZ). NaN canonicalised in float32 first (0x7fc00000 -> 0x7e00).
#define F16_BODY(OP) \
	ARGS; \
	NAN32; \
loop: \
	CMPQ CX, $32; \
	JB   done; \
	VCVTPH2PS (SI), Y0; \
	VCVTPH2PS 16(SI), Y1; \
	VCVTPH2PS (DX), Y2; \
	VCVTPH2PS 16(DX), Y3; \
	OP Y2, Y0, Y0; \
	OP Y3, Y1, Y1; \
	VCMPPS $3, Y0, Y0, Y4; \
	VBLENDVPS Y4, Y8, Y0, Y0; \
	VCMPPS $3, Y1, Y1, Y5; \
	VBLENDVPS Y5, Y8, Y1, Y1; \
	VCVTPS2PH $0, Y0, (DI); \
	VCVTPS2PH $0, Y1, 16(DI); \
	ADDQ $32, SI; \
	ADDQ $32, DX; \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop; \
done: \
	VZEROUPPER; \
	RET

TEXT ·addF16F16C(SB), NOSPLIT, $0-32
	F16_BODY(VADDPS)

TEXT ·mulF16F16C(SB), NOSPLIT, $0-32
	F16_BODY(VMULPS)

// DivideBy for float32/float64: p[i] /= d in place, nbytes a multiple of 32.
// VDIVPS/VDIVPD are correctly rounded, so this matches the scalar Go loop
// bit for bit.
// DI = p, CX = nbytes, Y9 = d broadcast.
#define DIV_BODY(DIVOP) \
loop128: \
	CMPQ CX, $128; \
	JB   loop32; \
	VMOVUPS (DI), Y0; \
	VMOVUPS 32(DI), Y1; \
	VMOVUPS 64(DI), Y2; \
	VMOVUPS 96(DI), Y3; \
	DIVOP Y9, Y0, Y0; \
	DIVOP Y9, Y1, Y1; \
	DIVOP Y9, Y2, Y2; \
	DIVOP Y9, Y3, Y3; \
	VMOVUPS Y0, (DI); \
	VMOVUPS Y1, 32(DI); \
	VMOVUPS Y2, 64(DI); \
	VMOVUPS Y3, 96(DI); \
	ADDQ $128, DI; \
	SUBQ $128, CX; \
	JMP  loop128; \
loop32: \
	CMPQ CX, $32; \
	JB   done; \
	VMOVUPS (DI), Y0; \
	DIVOP Y9, Y0, Y0; \
	VMOVUPS Y0, (DI); \
	ADDQ $32, DI; \
	SUBQ $32, CX; \
	JMP  loop32; \
done: \
	VZEROUPPER; \
	RET

// func divF32AVX2(p unsafe.Pointer, nbytes int, d float32)
TEXT ·divF32AVX2(SB), NOSPLIT, $0-20
	MOVQ p+0(FP), DI
	MOVQ nbytes+8(FP), CX
	VBROADCASTSS d+16(FP), Y9
	DIV_BODY(VDIVPS)

// func divF64AVX2(p unsafe.Pointer, nbytes int, d float64)
TEXT ·divF64AVX2(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), DI
	MOVQ nbytes+8(FP), CX
	VBROADCASTSD d+16(FP), Y9
	DIV_BODY(VDIVPD)

// func divF16F16C(p unsafe.Pointer, nbytes int, d float32)
// float16 DivideBy: widen exactly, divide in float32, round once (RNE).
TEXT ·divF16F16C(SB), NOSPLIT, $0-20
	MOVQ p+0(FP), DI
	MOVQ nbytes+8(FP), CX
	VBROADCASTSS d+16(FP), Y9

f16loop:
	CMPQ CX, $32
	JB   f16done
	VCVTPH2PS (DI), Y0
	VCVTPH2PS 16(DI), Y1
	VDIVPS    Y9, Y0, Y0
	VDIVPS    Y9, Y1, Y1
	VCVTPS2PH $0, Y0, (DI)
	VCVTPS2PH $0, Y1, 16(DI)
	ADDQ      $32, DI
	SUBQ      $32, CX
	JMP       f16loop

f16done:
	VZEROUPPER
	RET

// func divBF16AVX2(p unsafe.Pointer, nbytes int, d float32)
// bfloat16 DivideBy with the even/odd-lane trick of BF16_BODY. NaN lanes
// (already quiet: VDIVPS quiets them) are truncated instead of rounded, so
// they stay NaN with their sign, like Float32ToBfloat16.
//   Y9 d, Y10 0x7fff, Y11 1, Y12 0xffff0000.
TEXT ·divBF16AVX2(SB), NOSPLIT, $0-20
	MOVQ         p+0(FP), DI
	MOVQ         nbytes+8(FP), CX
	VBROADCASTSS d+16(FP), Y9
	MOVL         $0x7fff, AX
	VMOVQ        AX, X10
	VPBROADCASTD X10, Y10
	MOVL         $1, AX
	VMOVQ        AX, X11
	VPBROADCASTD X11, Y11
	MOVL         $0xffff0000, AX
	VMOVQ        AX, X12
	VPBROADCASTD X12, Y12

bfloop:
	CMPQ    CX, $32
	JB      bfdone
	VMOVDQU (DI), Y0
	VPSLLD  $16, Y0, Y2
	VPAND   Y12, Y0, Y0
	VDIVPS  Y9, Y2, Y2
	VDIVPS  Y9, Y0, Y0

	// even lanes: Y2 += (0x7fff + ((Y2 >> 16) & 1)) unless NaN; >> 16
	VPSRLD $16, Y2, Y4
	VPAND  Y11, Y4, Y4
	VPADDD Y10, Y4, Y4
	VCMPPS $3, Y2, Y2, Y5
	VPANDN Y4, Y5, Y4
	VPADDD Y4, Y2, Y2
	VPSRLD $16, Y2, Y2

	// odd lanes: same, keep the high half
	VPSRLD $16, Y0, Y4
	VPAND  Y11, Y4, Y4
	VPADDD Y10, Y4, Y4
	VCMPPS $3, Y0, Y0, Y5
	VPANDN Y4, Y5, Y4
	VPADDD Y4, Y0, Y0
	VPAND  Y12, Y0, Y0

	VPOR    Y2, Y0, Y0
	VMOVDQU Y0, (DI)
	ADDQ    $32, DI
	SUBQ    $32, CX
	JMP     bfloop

bfdone:
	VZEROUPPER
	RET
