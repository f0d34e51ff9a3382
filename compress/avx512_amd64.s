//go:build !purego

#include "go_asm.h"
#include "textflag.h"

// func rangeAVX512(x []float32) (lo, hi float32, nan bool)
//
// rangeAVX2 with 16 elements to a ZMM register: 64 per iteration while
// they last, their minimum and maximum taken as a tree, then 16 at a time.
// The lanes that saw a NaN are the bits of K1.
TEXT ·rangeAVX512(SB), NOSPLIT, $0-33
	MOVQ    x_base+0(FP), SI
	MOVQ    x_len+8(FP), CX
	VMOVUPS (SI), Z0          // running minimum
	VMOVAPS Z0, Z1            // running maximum
	VCMPPS  $3, Z0, Z0, K1    // lanes that saw a NaN (unordered)
	ADDQ    $64, SI
	SUBQ    $16, CX

rloop64:
	CMPQ    CX, $64
	JB      rloop16
	VMOVUPS (SI), Z3
	VMOVUPS 64(SI), Z4
	VMOVUPS 128(SI), Z5
	VMOVUPS 192(SI), Z6
	VMINPS  Z4, Z3, Z7
	VMAXPS  Z4, Z3, Z8
	VCMPPS  $3, Z4, Z3, K2 // unordered: either is a NaN
	VMINPS  Z6, Z5, Z9
	VMAXPS  Z6, Z5, Z10
	VCMPPS  $3, Z6, Z5, K3
	VMINPS  Z9, Z7, Z7
	VMAXPS  Z10, Z8, Z8
	KORW    K3, K2, K2
	VMINPS  Z7, Z0, Z0
	VMAXPS  Z8, Z1, Z1
	KORW    K2, K1, K1
	ADDQ    $256, SI
	SUBQ    $64, CX
	JMP     rloop64

rloop16:
	TESTQ   CX, CX
	JZ      rreduce
	VMOVUPS (SI), Z3
	VMINPS  Z3, Z0, Z0
	VMAXPS  Z3, Z1, Z1
	VCMPPS  $3, Z3, Z3, K2
	KORW    K2, K1, K1
	ADDQ    $64, SI
	SUBQ    $16, CX
	JMP     rloop16

// ZHALVE folds the 16 lanes of Z into lane 0 by OP (VMINPS or VMAXPS),
// halving: the high 256 bits against the low, then 128, 64 and 32.
#define ZHALVE(OP, Z) \
	VSHUFF32X4 $0x4e, Z, Z, Z3; \
	OP         Z3, Z, Z; \
	VSHUFF32X4 $0xb1, Z, Z, Z3; \
	OP         Z3, Z, Z; \
	VPERMILPS  $0x4e, Z, Z3; \
	OP         Z3, Z, Z; \
	VPERMILPS  $0xb1, Z, Z3; \
	OP         Z3, Z, Z

rreduce:
	ZHALVE(VMINPS, Z0)
	ZHALVE(VMAXPS, Z1)
	VMOVSS     X0, lo+24(FP)
	VMOVSS     X1, hi+28(FP)
	KORTESTW   K1, K1
	SETNE      nan+32(FP)
	VZEROUPPER
	RET

// func quantAsm512(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool)
//
// quantAsm with 16 elements to a ZMM register and AVX-512F instructions
// only. Each group of 16 elements becomes 16 codes, one per dword of Z3
// (ZPRE, then ZRAND or ZHALF, then the width's store), then 16, 8 or 4
// bytes of out: one loop per width and rounding mode. The arithmetic is
// quantAsm's, operation for operation.
TEXT ·quantAsm512(SB), NOSPLIT, $0-81
	MOVQ         out_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	VBROADCASTSS lo+48(FP), Z0
	VBROADCASTSS inv+52(FP), Z1
	MOVL         levels+56(FP), AX
	VPBROADCASTD AX, Z2
	MOVQ         bits+64(FP), BX
	MOVBLZX      nearest+80(FP), DX
	TESTL        DX, DX
	JNZ          nearest
	MOVL         $const_lane32Weyl, AX
	VPBROADCASTD AX, Z14
	VPMULLD      laneIndex<>(SB), Z14, Z10 // k·0x9e3779b9 in lane k
	MOVL         ctr+72(FP), AX
	VPBROADCASTD AX, Z9
	VPADDD       Z9, Z10, Z10              // the counters ctr + k·0x9e3779b9
	VPSLLD       $4, Z14, Z14              // their step, 16·0x9e3779b9
	MOVL         k1+76(FP), AX
	VPBROADCASTD AX, Z11
	MOVL         $const_lane32M1, AX
	VPBROADCASTD AX, Z12
	MOVL         $const_lane32M2, AX
	VPBROADCASTD AX, Z13
	MOVL         $0x33800000, AX           // float32 2^-24
	VPBROADCASTD AX, Z8
	CMPQ         BX, $8
	JEQ          rand8
	CMPQ         BX, $4
	JEQ          rand4
	JMP          rand2

nearest:
	MOVL         $0x3f000000, AX // float32 0.5
	VPBROADCASTD AX, Z8
	CMPQ         BX, $8
	JEQ          half8
	CMPQ         BX, $4
	JEQ          half4
	JMP          half2

// ZPRE sets Z3 to t = (x − lo)·inv of the 16 elements at SI, a
// subtraction and then a multiplication, each rounded, and advances SI. It
// prefetches 8 KiB ahead, a line per step, as quantAsm's QLOAD4 does.
#define ZPRE \
	VMOVUPS    (SI), Z3; \
	VSUBPS     Z0, Z3, Z3; \
	VMULPS     Z1, Z3, Z3; \
	PREFETCHT0 8192(SI); \
	ADDQ       $64, SI

// ZRAND adds r = u·2^-24 to Z3, u the top 24 bits of draw32 of the
// counters in Z10 (rng.go's hash32: Z11 = k1, Z12 and Z13 the multipliers),
// and advances the counters by 16·0x9e3779b9 (Z14). VPTERNLOGD $0x96 is
// the three-way xor x ^ x>>15 ^ k1. The product u·2^-24 is exact, so the
// fused add rounds as an add does.
#define ZRAND \
	VPSRLD      $16, Z10, Z9; \
	VPXORD      Z10, Z9, Z9; \
	VPMULLD     Z12, Z9, Z9; \
	VPSRLD      $15, Z9, Z15; \
	VPTERNLOGD  $0x96, Z11, Z15, Z9; \
	VPMULLD     Z13, Z9, Z9; \
	VPSRLD      $16, Z9, Z15; \
	VPXORD      Z15, Z9, Z9; \
	VPSRLD      $8, Z9, Z9; \
	VCVTDQ2PS   Z9, Z9; \
	VFMADD231PS Z8, Z9, Z3; \
	VPADDD      Z14, Z10, Z10

// ZHALF adds r = 0.5 to Z3.
#define ZHALF \
	VADDPS Z8, Z3, Z3

// ZST8, ZST4 and ZST2 truncate Z3 to codes, clamp them to L and store them
// at 8, 4 or 2 bits each, and count the 16 elements off CX. ZST8 clamps by
// VPMOVUSDB's unsigned saturation to L = 255.
#define ZST8 \
	VCVTTPS2DQ Z3, Z3; \
	VPMOVUSDB  Z3, (DI); \
	ADDQ       $16, DI; \
	SUBQ       $16, CX

// ZST4: each qword's two codes c0, c1 (dwords) become c0 + 16·c1 in its
// low byte, which VPMOVQB stores.
#define ZST4 \
	VCVTTPS2DQ Z3, Z3; \
	VPMINSD    Z2, Z3, Z3; \
	VPSRLQ     $28, Z3, Z4; \
	VPORQ      Z4, Z3, Z3; \
	VPMOVQB    Z3, (DI); \
	ADDQ       $8, DI; \
	SUBQ       $16, CX

// ZST2: each qword's two codes become c0 + 4·c1 in its low dword
// (VPMOVQD keeps those, in Y3, zeroing the high half of Z3), then pairs of
// those are packed as ZST4 packs codes, to the low 4 bytes of X3.
#define ZST2 \
	VCVTTPS2DQ Z3, Z3; \
	VPMINSD    Z2, Z3, Z3; \
	VPSRLQ     $30, Z3, Z4; \
	VPORQ      Z4, Z3, Z3; \
	VPMOVQD    Z3, Y3; \
	VPSRLQ     $28, Z3, Z4; \
	VPORQ      Z4, Z3, Z3; \
	VPMOVQB    Z3, X3; \
	VMOVD      X3, (DI); \
	ADDQ       $4, DI; \
	SUBQ       $16, CX

rand8:
	ZPRE
	ZRAND
	ZST8
	JNZ  rand8
	JMP  done

rand4:
	ZPRE
	ZRAND
	ZST4
	JNZ  rand4
	JMP  done

rand2:
	ZPRE
	ZRAND
	ZST2
	JNZ  rand2
	JMP  done

half8:
	ZPRE
	ZHALF
	ZST8
	JNZ   half8
	JMP   done

half4:
	ZPRE
	ZHALF
	ZST4
	JNZ   half4
	JMP   done

half2:
	ZPRE
	ZHALF
	ZST2
	JNZ   half2

done:
	VZEROUPPER
	RET

// laneIndex holds the dwords 0..15: lane k's index in a group.
DATA laneIndex<>+0(SB)/4, $0
DATA laneIndex<>+4(SB)/4, $1
DATA laneIndex<>+8(SB)/4, $2
DATA laneIndex<>+12(SB)/4, $3
DATA laneIndex<>+16(SB)/4, $4
DATA laneIndex<>+20(SB)/4, $5
DATA laneIndex<>+24(SB)/4, $6
DATA laneIndex<>+28(SB)/4, $7
DATA laneIndex<>+32(SB)/4, $8
DATA laneIndex<>+36(SB)/4, $9
DATA laneIndex<>+40(SB)/4, $10
DATA laneIndex<>+44(SB)/4, $11
DATA laneIndex<>+48(SB)/4, $12
DATA laneIndex<>+52(SB)/4, $13
DATA laneIndex<>+56(SB)/4, $14
DATA laneIndex<>+60(SB)/4, $15
GLOBL laneIndex<>(SB), RODATA|NOPTR, $64
