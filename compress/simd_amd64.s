//go:build !purego

#include "textflag.h"

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv() (eax, edx uint32)
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET

// func rangeAVX2(x []float32) (lo, hi float32, nan bool)
TEXT ·rangeAVX2(SB), NOSPLIT, $0-33
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	VMOVUPS (SI), Y0          // running minimum
	VMOVAPS Y0, Y1            // running maximum
	VCMPPS  $3, Y0, Y0, Y2    // lanes that saw a NaN (unordered)
	ADDQ    $32, SI
	SUBQ    $8, CX
	JZ      reduce

loop:
	PREFETCHT0 2048(SI)       // the next bucket, while the caller draws
	VMOVUPS (SI), Y3
	VMINPS  Y3, Y0, Y0
	VMAXPS  Y3, Y1, Y1
	VCMPPS  $3, Y3, Y3, Y4
	VORPS   Y4, Y2, Y2
	ADDQ    $32, SI
	SUBQ    $8, CX
	JNZ     loop

reduce:
	VEXTRACTF128 $1, Y0, X3
	VMINPS       X3, X0, X0
	VPERMILPS    $0x4e, X0, X3
	VMINPS       X3, X0, X0
	VPERMILPS    $0xb1, X0, X3
	VMINPS       X3, X0, X0
	VEXTRACTF128 $1, Y1, X3
	VMAXPS       X3, X1, X1
	VPERMILPS    $0x4e, X1, X3
	VMAXPS       X3, X1, X1
	VPERMILPS    $0xb1, X1, X3
	VMAXPS       X3, X1, X1
	VMOVSS       X0, lo+24(FP)
	VMOVSS       X1, hi+28(FP)
	VMOVMSKPS    Y2, AX
	TESTL        AX, AX
	SETNE        nan+32(FP)
	VZEROUPPER
	RET

// func quantAsm(out []byte, x []float32, u []uint32, lo, inv float32, levels int32, bits uint)
//
// Each group of 8 elements becomes 8 codes, one per byte of X3 (QUANT8),
// then 8, 4 or 2 bytes of out by the width.
TEXT ·quantAsm(SB), NOSPLIT, $0-96
	MOVQ         out_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	MOVQ         u_base+48(FP), DX
	VBROADCASTSS lo+72(FP), Y0
	VBROADCASTSS twoPow24<>(SB), Y8
	VBROADCASTSS inv+76(FP), Y1
	MOVL         levels+80(FP), AX
	VMOVD        AX, X2
	VPBROADCASTD X2, Y2
	MOVQ         bits+88(FP), AX
	CMPQ         AX, $8
	JEQ          loop8
	VMOVDQU      packNibbles<>(SB), X5
	CMPQ         AX, $4
	JEQ          loop4
	VMOVDQU      packCrumbs<>(SB), X6
	VMOVDQU      packCrumbPairs<>(SB), X7
	JMP          loop2

// QUANT8 sets the low 8 bytes of X3 to the codes of the 8 elements at SI
// with their draws at DX, and advances SI and DX: x − lo, times inv, plus
// r = u·2^-24, truncated, clamped to L, narrowed to bytes.
#define QUANT8 \
	VMOVUPS      (SI), Y3; \
	VSUBPS       Y0, Y3, Y3; \
	VMULPS       Y1, Y3, Y3; \
	VCVTDQ2PS    (DX), Y9; \
	VMULPS       Y8, Y9, Y9; \
	VADDPS       Y9, Y3, Y3; \
	VCVTTPS2DQ   Y3, Y3; \
	VPMINSD      Y2, Y3, Y3; \
	VEXTRACTI128 $1, Y3, X4; \
	VPACKUSDW    X4, X3, X3; \
	VPACKUSWB    X3, X3, X3; \
	ADDQ         $32, SI; \
	ADDQ         $32, DX

loop8:
	QUANT8
	VMOVQ X3, (DI)
	ADDQ  $8, DI
	SUBQ  $8, CX
	JNZ   loop8
	VZEROUPPER
	RET

loop4:
	QUANT8
	VPMADDUBSW X5, X3, X3 // c0 + 16·c1, … as words
	VPACKUSWB  X3, X3, X3
	VMOVD      X3, (DI)
	ADDQ       $4, DI
	SUBQ       $8, CX
	JNZ        loop4
	VZEROUPPER
	RET

loop2:
	QUANT8
	VPMADDUBSW X6, X3, X3 // c0 + 4·c1, … as words
	VPMADDWD   X7, X3, X3 // (c0 + 4·c1) + 16·(c2 + 4·c3), … as dwords
	VPACKUSDW  X3, X3, X3
	VPACKUSWB  X3, X3, X3
	VMOVD      X3, AX
	MOVW       AX, (DI)
	ADDQ       $2, DI
	SUBQ       $8, CX
	JNZ        loop2
	VZEROUPPER
	RET

// Multipliers that pack adjacent codes: bytes 1, 16 (nibbles); bytes 1, 4
// and then words 1, 16 (2-bit codes).
DATA packNibbles<>+0(SB)/8, $0x1001100110011001
DATA packNibbles<>+8(SB)/8, $0x1001100110011001
GLOBL packNibbles<>(SB), RODATA|NOPTR, $16
DATA packCrumbs<>+0(SB)/8, $0x0401040104010401
DATA packCrumbs<>+8(SB)/8, $0x0401040104010401
GLOBL packCrumbs<>(SB), RODATA|NOPTR, $16
DATA packCrumbPairs<>+0(SB)/8, $0x0010000100100001
DATA packCrumbPairs<>+8(SB)/8, $0x0010000100100001
GLOBL packCrumbPairs<>(SB), RODATA|NOPTR, $16
DATA twoPow24<>+0(SB)/4, $0x33800000 // float32 2^-24
GLOBL twoPow24<>(SB), RODATA|NOPTR, $4
