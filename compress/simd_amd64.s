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
	PREFETCHT0 2048(SI)       // 2 KiB ahead: the next bucket at B = 512, loading while the caller draws
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

// DEQSTORE turns the 8 codes in the dwords of Y3 into lo + c·scale (Y0,
// Y1), adds the 8 floats at DI if R9 (add) is set, stores them at DI and
// advances DI.
#define DEQSTORE \
	VCVTDQ2PS Y3, Y3; \
	VMULPS    Y1, Y3, Y3; \
	VADDPS    Y0, Y3, Y3; \
	TESTQ     R9, R9; \
	JZ        2(PC); \
	VADDPS    (DI), Y3, Y3; \
	VMOVUPS   Y3, (DI); \
	ADDQ      $32, DI

// func dequantAsm(out []float32, codes []byte, lo, scale float32, bits uint, add bool)
TEXT ·dequantAsm(SB), NOSPLIT, $0-65
	MOVQ         out_base+0(FP), DI
	MOVQ         out_len+8(FP), CX
	MOVQ         codes_base+24(FP), SI
	VBROADCASTSS lo+48(FP), Y0
	VBROADCASTSS scale+52(FP), Y1
	MOVBQZX      add+64(FP), R9
	MOVQ         bits+56(FP), AX
	CMPQ         AX, $8
	JEQ          dq8
	CMPQ         AX, $4
	JEQ          dq4
	VMOVDQU      crumbShifts<>(SB), Y6
	VPBROADCASTD crumbMask<>(SB), Y7

dq2:
	MOVWLZX      (SI), AX
	VMOVD        AX, X3
	VPBROADCASTD X3, Y3
	VPSRLVD      Y6, Y3, Y3
	VPAND        Y7, Y3, Y3
	DEQSTORE
	ADDQ         $2, SI
	SUBQ         $8, CX
	JNZ          dq2
	VZEROUPPER
	RET

dq4:
	VMOVDQU      nibbleShifts<>(SB), Y6
	VPBROADCASTD nibbleMask<>(SB), Y7

dq4loop:
	VPBROADCASTD (SI), Y3
	VPSRLVD      Y6, Y3, Y3
	VPAND        Y7, Y3, Y3
	DEQSTORE
	ADDQ         $4, SI
	SUBQ         $8, CX
	JNZ          dq4loop
	VZEROUPPER
	RET

dq8:
	VPMOVZXBD (SI), Y3
	DEQSTORE
	ADDQ      $8, SI
	SUBQ      $8, CX
	JNZ       dq8
	VZEROUPPER
	RET

// func signAsm(bits []byte, x []float32, acc *[8]float64)
TEXT ·signAsm(SB), NOSPLIT, $0-56
	MOVQ      bits_base+0(FP), DI
	MOVQ      x_base+24(FP), SI
	MOVQ      x_len+32(FP), CX
	MOVQ      acc+48(FP), DX
	VMOVUPD   (DX), Y0         // lanes 0-3
	VMOVUPD   32(DX), Y1       // lanes 4-7
	VXORPS    Y7, Y7, Y7
	VPCMPEQD  Y6, Y6, Y6
	VPSRLD    $1, Y6, Y6       // 0x7fffffff

sloop:
	VMOVUPS      (SI), Y2
	VCMPPS       $0x11, Y7, Y2, Y3 // x < 0, quiet
	VMOVMSKPS    Y3, AX
	MOVB         AX, (DI)
	VANDPS       Y6, Y2, Y2        // |x|
	VCVTPS2PD    X2, Y4
	VEXTRACTF128 $1, Y2, X5
	VCVTPS2PD    X5, Y5
	VADDPD       Y4, Y0, Y0
	VADDPD       Y5, Y1, Y1
	ADDQ         $32, SI
	INCQ         DI
	SUBQ         $8, CX
	JNZ          sloop
	VMOVUPD      Y0, (DX)
	VMOVUPD      Y1, 32(DX)
	VZEROUPPER
	RET

// func unsignAsm(out []float32, bits []byte, sb uint32, add bool)
TEXT ·unsignAsm(SB), NOSPLIT, $0-53
	MOVQ         out_base+0(FP), DI
	MOVQ         out_len+8(FP), CX
	MOVQ         bits_base+24(FP), SI
	MOVL         sb+48(FP), AX
	VMOVD        AX, X0
	VPBROADCASTD X0, Y0
	MOVBQZX      add+52(FP), R9
	VMOVDQU      signShifts<>(SB), Y6
	VPBROADCASTD signMask<>(SB), Y7

uloop:
	MOVBLZX      (SI), AX
	VMOVD        AX, X3
	VPBROADCASTD X3, Y3
	VPSLLVD      Y6, Y3, Y3 // bit k of the byte to bit 31 of lane k
	VPAND        Y7, Y3, Y3
	VPOR         Y0, Y3, Y3
	TESTQ        R9, R9
	JZ           2(PC)
	VADDPS       (DI), Y3, Y3
	VMOVUPS      Y3, (DI)
	ADDQ         $32, DI
	INCQ         SI
	SUBQ         $8, CX
	JNZ          uloop
	VZEROUPPER
	RET

// Per-lane shift counts and masks that unpack 8 codes from a broadcast
// dword: 2-bit codes, 4-bit codes, and sign bits moved to bit 31.
DATA crumbShifts<>+0(SB)/4, $0
DATA crumbShifts<>+4(SB)/4, $2
DATA crumbShifts<>+8(SB)/4, $4
DATA crumbShifts<>+12(SB)/4, $6
DATA crumbShifts<>+16(SB)/4, $8
DATA crumbShifts<>+20(SB)/4, $10
DATA crumbShifts<>+24(SB)/4, $12
DATA crumbShifts<>+28(SB)/4, $14
GLOBL crumbShifts<>(SB), RODATA|NOPTR, $32
DATA crumbMask<>+0(SB)/4, $3
GLOBL crumbMask<>(SB), RODATA|NOPTR, $4
DATA nibbleShifts<>+0(SB)/4, $0
DATA nibbleShifts<>+4(SB)/4, $4
DATA nibbleShifts<>+8(SB)/4, $8
DATA nibbleShifts<>+12(SB)/4, $12
DATA nibbleShifts<>+16(SB)/4, $16
DATA nibbleShifts<>+20(SB)/4, $20
DATA nibbleShifts<>+24(SB)/4, $24
DATA nibbleShifts<>+28(SB)/4, $28
GLOBL nibbleShifts<>(SB), RODATA|NOPTR, $32
DATA nibbleMask<>+0(SB)/4, $15
GLOBL nibbleMask<>(SB), RODATA|NOPTR, $4
DATA signShifts<>+0(SB)/4, $31
DATA signShifts<>+4(SB)/4, $30
DATA signShifts<>+8(SB)/4, $29
DATA signShifts<>+12(SB)/4, $28
DATA signShifts<>+16(SB)/4, $27
DATA signShifts<>+20(SB)/4, $26
DATA signShifts<>+24(SB)/4, $25
DATA signShifts<>+28(SB)/4, $24
GLOBL signShifts<>(SB), RODATA|NOPTR, $32
DATA signMask<>+0(SB)/4, $0x80000000
GLOBL signMask<>(SB), RODATA|NOPTR, $4

// Constants of the draws: the counter offsets k·golden of lanes k = 0..7,
// then the step 8·golden and mix64's two multipliers.
DATA drawOffsets<>+0(SB)/8, $0x0000000000000000
DATA drawOffsets<>+8(SB)/8, $0x9e3779b97f4a7c15
DATA drawOffsets<>+16(SB)/8, $0x3c6ef372fe94f82a
DATA drawOffsets<>+24(SB)/8, $0xdaa66d2c7ddf743f
DATA drawOffsets<>+32(SB)/8, $0x78dde6e5fd29f054
DATA drawOffsets<>+40(SB)/8, $0x1715609f7c746c69
DATA drawOffsets<>+48(SB)/8, $0xb54cda58fbbee87e
DATA drawOffsets<>+56(SB)/8, $0x538454127b096493
GLOBL drawOffsets<>(SB), RODATA|NOPTR, $64
DATA drawConsts<>+0(SB)/8, $0xf1bbcdcbfa53e0a8
DATA drawConsts<>+8(SB)/8, $0xbf58476d1ce4e5b9
DATA drawConsts<>+16(SB)/8, $0x94d049bb133111eb
GLOBL drawConsts<>(SB), RODATA|NOPTR, $24

// func drawAsm512(u []uint32, ctr uint64)
//
// Lane k of Z0 holds the counter of draw k of the next 8; each step applies
// mix64 up to its last multiply and keeps bits 40-63.
TEXT ·drawAsm512(SB), NOSPLIT, $0-32
	MOVQ         u_base+0(FP), DI
	MOVQ         u_len+8(FP), CX
	MOVQ         ctr+24(FP), AX
	VPBROADCASTQ AX, Z0
	VPADDQ       drawOffsets<>(SB), Z0, Z0
	VPBROADCASTQ drawConsts<>+0(SB), Z1
	VPBROADCASTQ drawConsts<>+8(SB), Z2
	VPBROADCASTQ drawConsts<>+16(SB), Z3

drawloop:
	VPSRLQ  $30, Z0, Z4
	VPXORQ  Z0, Z4, Z4
	VPMULLQ Z2, Z4, Z4
	VPSRLQ  $27, Z4, Z5
	VPXORQ  Z5, Z4, Z4
	VPMULLQ Z3, Z4, Z4
	VPSRLQ  $40, Z4, Z4
	VPMOVQD Z4, (DI)
	VPADDQ  Z1, Z0, Z0
	ADDQ    $32, DI
	SUBQ    $8, CX
	JNZ     drawloop
	VZEROUPPER
	RET
