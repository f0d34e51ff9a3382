//go:build !purego

#include "textflag.h"

// FOLD32 sets the low lane of X(a) to the reference fold of the 32
// partial sums in Z(a) (lanes 0..15) and Z(b) (lanes 16..31): lane l gets
// lane l+16, then l+8, l+4, l+2, l+1. T, TY, TX are a scratch register.
#define FOLD32(za, ya, xa, zb, ty, tx) \
	VADDPS        zb, za, za; \
	VEXTRACTF64X4 $1, za, ty; \
	VADDPS        ty, ya, ya; \
	VEXTRACTF128  $1, ya, tx; \
	VADDPS        tx, xa, xa; \
	VPERMILPS     $0x4e, xa, tx; \
	VADDPS        tx, xa, xa; \
	VPERMILPS     $0xb1, xa, tx; \
	VADDPS        tx, xa, xa

// ROW4 adds the products of the vectors Z8, Z9 of a row of m with
// p[i,k..k+3] at (BX) to the accumulators Z0..Z7 (two per k).
#define ROW4 \
	VBROADCASTSS (BX), Z10; \
	VBROADCASTSS 4(BX), Z11; \
	VBROADCASTSS 8(BX), Z12; \
	VBROADCASTSS 12(BX), Z13; \
	VMULPS       Z10, Z8, Z14; \
	VADDPS       Z14, Z0, Z0; \
	VMULPS       Z10, Z9, Z15; \
	VADDPS       Z15, Z1, Z1; \
	VMULPS       Z11, Z8, Z16; \
	VADDPS       Z16, Z2, Z2; \
	VMULPS       Z11, Z9, Z17; \
	VADDPS       Z17, Z3, Z3; \
	VMULPS       Z12, Z8, Z18; \
	VADDPS       Z18, Z4, Z4; \
	VMULPS       Z12, Z9, Z19; \
	VADDPS       Z19, Z5, Z5; \
	VMULPS       Z13, Z8, Z20; \
	VADDPS       Z20, Z6, Z6; \
	VMULPS       Z13, Z9, Z21; \
	VADDPS       Z21, Z7, Z7

// ROW1 is ROW4 for one k: p[i,k] at (BX), accumulators Z0, Z1.
#define ROW1 \
	VBROADCASTSS (BX), Z10; \
	VMULPS       Z10, Z8, Z14; \
	VADDPS       Z14, Z0, Z0; \
	VMULPS       Z10, Z9, Z15; \
	VADDPS       Z15, Z1, Z1

// TADD4 adds Z0..Z7 to the pair of vectors at (AX) of the rows k..k+3 of
// t (R12 bytes apart). It uses BX.
#define TADD4 \
	VADDPS  (AX), Z0, Z0; \
	VMOVUPS Z0, (AX); \
	VADDPS  64(AX), Z1, Z1; \
	VMOVUPS Z1, 64(AX); \
	VADDPS  (AX)(R12*1), Z2, Z2; \
	VMOVUPS Z2, (AX)(R12*1); \
	VADDPS  64(AX)(R12*1), Z3, Z3; \
	VMOVUPS Z3, 64(AX)(R12*1); \
	VADDPS  (AX)(R12*2), Z4, Z4; \
	VMOVUPS Z4, (AX)(R12*2); \
	VADDPS  64(AX)(R12*2), Z5, Z5; \
	VMOVUPS Z5, 64(AX)(R12*2); \
	LEAQ    (AX)(R12*2), BX; \
	VADDPS  (BX)(R12*1), Z6, Z6; \
	VMOVUPS Z6, (BX)(R12*1); \
	VADDPS  64(BX)(R12*1), Z7, Z7; \
	VMOVUPS Z7, 64(BX)(R12*1)

// TADD1 is TADD4 for one k.
#define TADD1 \
	VADDPS  (AX), Z0, Z0; \
	VMOVUPS Z0, (AX); \
	VADDPS  64(AX), Z1, Z1; \
	VMOVUPS Z1, 64(AX)

#define ZERO8 \
	VPXORD Z0, Z0, Z0; \
	VPXORD Z1, Z1, Z1; \
	VPXORD Z2, Z2, Z2; \
	VPXORD Z3, Z3, Z3; \
	VPXORD Z4, Z4, Z4; \
	VPXORD Z5, Z5, Z5; \
	VPXORD Z6, Z6, Z6; \
	VPXORD Z7, Z7, Z7

// BLOCKROWS sets CX to the rows of the block: min(32, R8).
#define BLOCKROWS \
	MOVQ    $32, CX; \
	CMPQ    R8, CX; \
	CMOVQLT R8, CX

// DSTART sets Z0, Z1 (qa) and Z2, Z3 (qo) to the products of the pair of
// vectors at (AX) and (BX) with p[i,0] at (R11).
#define DSTART \
	VBROADCASTSS (R11), Z8; \
	VMULPS       (AX), Z8, Z0; \
	VMULPS       64(AX), Z8, Z1; \
	VMULPS       (BX), Z8, Z2; \
	VMULPS       64(BX), Z8, Z3

// DSTEP adds to Z0..Z3 the products of the next k: the pairs a row of qt
// (R10 bytes) further, p[i,k] 4 bytes further.
#define DSTEP \
	ADDQ         R10, AX; \
	ADDQ         R10, BX; \
	ADDQ         $4, R11; \
	VBROADCASTSS (R11), Z8; \
	VMULPS       (AX), Z8, Z9; \
	VADDPS       Z9, Z0, Z0; \
	VMULPS       64(AX), Z8, Z10; \
	VADDPS       Z10, Z1, Z1; \
	VMULPS       (BX), Z8, Z11; \
	VADDPS       Z11, Z2, Z2; \
	VMULPS       64(BX), Z8, Z12; \
	VADDPS       Z12, Z3, Z3

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

// func mulQAsm(p, m, qt *float32, rows, cols, ld, r, pairs, k1, k2 int)
//
// Row by row, k by k in groups of 4 while 4 are left, then one by one:
// the row is streamed once per group, each pair of vectors of it
// multiplied by the group's columns of Q (rows of qt) into two
// accumulators per k (Z0..Z7), which FOLD32 then adds up.
//
// Registers: SI the row of m, DI the row's p[i,k], BX qt's row k,
// R8 rows left, R9 a row of m in bytes, R10 a row of qt in bytes,
// R11 3·R10, R12 ks left, AX and DX the running m and qt, CX pairs left.
TEXT ·mulQAsm(SB), NOSPLIT, $0-80
	MOVQ  p+0(FP), DI
	MOVQ  m+8(FP), SI
	MOVQ  rows+24(FP), R8
	MOVQ  cols+32(FP), R9
	SHLQ  $2, R9
	MOVQ  ld+40(FP), R10
	SHLQ  $2, R10
	LEAQ  (R10)(R10*2), R11
	MOVQ  k1+64(FP), AX
	KMOVW AX, K1
	MOVQ  k2+72(FP), AX
	KMOVW AX, K2

qrow:
	MOVQ qt+16(FP), BX
	MOVQ r+48(FP), R12

qk4:
	CMPQ   R12, $4
	JLT    qk1
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	MOVQ   SI, AX
	MOVQ   BX, DX
	MOVQ   pairs+56(FP), CX
	TESTQ  CX, CX
	JZ     qk4tail

qk4loop:
	VMOVUPS (AX), Z8
	VMOVUPS 64(AX), Z9
	VMULPS  (DX), Z8, Z10
	VADDPS  Z10, Z0, Z0
	VMULPS  64(DX), Z9, Z11
	VADDPS  Z11, Z1, Z1
	VMULPS  (DX)(R10*1), Z8, Z12
	VADDPS  Z12, Z2, Z2
	VMULPS  64(DX)(R10*1), Z9, Z13
	VADDPS  Z13, Z3, Z3
	VMULPS  (DX)(R10*2), Z8, Z14
	VADDPS  Z14, Z4, Z4
	VMULPS  64(DX)(R10*2), Z9, Z15
	VADDPS  Z15, Z5, Z5
	VMULPS  (DX)(R11*1), Z8, Z16
	VADDPS  Z16, Z6, Z6
	VMULPS  64(DX)(R11*1), Z9, Z17
	VADDPS  Z17, Z7, Z7
	ADDQ    $128, AX
	ADDQ    $128, DX
	DECQ    CX
	JNZ     qk4loop

qk4tail:
	KORTESTW  K1, K2
	JZ        qk4fold
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	VMULPS    (DX), Z8, Z10
	VADDPS    Z10, Z0, K1, Z0
	VMULPS    64(DX), Z9, Z11
	VADDPS    Z11, Z1, K2, Z1
	VMULPS    (DX)(R10*1), Z8, Z12
	VADDPS    Z12, Z2, K1, Z2
	VMULPS    64(DX)(R10*1), Z9, Z13
	VADDPS    Z13, Z3, K2, Z3
	VMULPS    (DX)(R10*2), Z8, Z14
	VADDPS    Z14, Z4, K1, Z4
	VMULPS    64(DX)(R10*2), Z9, Z15
	VADDPS    Z15, Z5, K2, Z5
	VMULPS    (DX)(R11*1), Z8, Z16
	VADDPS    Z16, Z6, K1, Z6
	VMULPS    64(DX)(R11*1), Z9, Z17
	VADDPS    Z17, Z7, K2, Z7

qk4fold:
	FOLD32(Z0, Y0, X0, Z1, Y8, X8)
	FOLD32(Z2, Y2, X2, Z3, Y9, X9)
	FOLD32(Z4, Y4, X4, Z5, Y10, X10)
	FOLD32(Z6, Y6, X6, Z7, Y11, X11)
	VMOVSS X0, (DI)
	VMOVSS X2, 4(DI)
	VMOVSS X4, 8(DI)
	VMOVSS X6, 12(DI)
	ADDQ   $16, DI
	LEAQ   (BX)(R10*4), BX
	SUBQ   $4, R12
	JMP    qk4

qk1:
	TESTQ  R12, R12
	JZ     qnext
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	MOVQ   SI, AX
	MOVQ   BX, DX
	MOVQ   pairs+56(FP), CX
	TESTQ  CX, CX
	JZ     qk1tail

qk1loop:
	VMOVUPS (AX), Z8
	VMOVUPS 64(AX), Z9
	VMULPS  (DX), Z8, Z10
	VADDPS  Z10, Z0, Z0
	VMULPS  64(DX), Z9, Z11
	VADDPS  Z11, Z1, Z1
	ADDQ    $128, AX
	ADDQ    $128, DX
	DECQ    CX
	JNZ     qk1loop

qk1tail:
	KORTESTW  K1, K2
	JZ        qk1fold
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	VMULPS    (DX), Z8, Z10
	VADDPS    Z10, Z0, K1, Z0
	VMULPS    64(DX), Z9, Z11
	VADDPS    Z11, Z1, K2, Z1

qk1fold:
	FOLD32(Z0, Y0, X0, Z1, Y8, X8)
	VMOVSS X0, (DI)
	ADDQ   $4, DI
	ADDQ   R10, BX
	DECQ   R12
	JMP    qk1

qnext:
	ADDQ R9, SI
	DECQ R8
	JNZ  qrow
	VZEROUPPER
	RET

// func mulTPAsm(t, m, p *float32, rows, cols, ld, r, pairs, k1, k2 int)
//
// Block of 32 rows by block, k by k in groups of 4 while 4 are left, then
// one by one, pair of vectors by pair: the pair's columns of the block's
// rows times p[i,k] summed in the accumulators Z0..Z7 (two per k), row by
// row, then added to t's rows k (TADD4, TADD1). A block is read once per
// group of ks, from cache after the first.
//
// Registers: SI the block's first row of m, R13 its first row of p, R14
// p[b,k], DI t's row k, R8 rows left, R9 a row of m in bytes, R10 a row of
// p in bytes (4r), R12 a row of t in bytes, DX the pair's offset in the
// rows, R11 pairs left, AX and BX the running m and p, CX rows left in
// the block.
TEXT ·mulTPAsm(SB), NOSPLIT, $0-80
	MOVQ  m+8(FP), SI
	MOVQ  p+16(FP), R13
	MOVQ  rows+24(FP), R8
	MOVQ  cols+32(FP), R9
	SHLQ  $2, R9
	MOVQ  ld+40(FP), R12
	SHLQ  $2, R12
	MOVQ  r+48(FP), R10
	SHLQ  $2, R10
	MOVQ  k1+64(FP), AX
	KMOVW AX, K1
	MOVQ  k2+72(FP), AX
	KMOVW AX, K2

tblock:
	MOVQ t+0(FP), DI
	MOVQ R13, R14

tk4:
	MOVQ  R14, AX
	SUBQ  R13, AX
	ADDQ  $16, AX
	CMPQ  AX, R10
	JGT   tk1
	XORQ  DX, DX
	MOVQ  pairs+56(FP), R11
	TESTQ R11, R11
	JZ    tk4tail

tk4pair:
	ZERO8
	LEAQ (SI)(DX*1), AX
	MOVQ R14, BX
	BLOCKROWS

tk4row:
	VMOVUPS (AX), Z8
	VMOVUPS 64(AX), Z9
	ROW4
	ADDQ    R9, AX
	ADDQ    R10, BX
	DECQ    CX
	JNZ     tk4row
	LEAQ    (DI)(DX*1), AX
	TADD4
	ADDQ    $128, DX
	DECQ    R11
	JNZ     tk4pair

tk4tail:
	KORTESTW K1, K2
	JZ       tk4next
	ZERO8
	LEAQ     (SI)(DX*1), AX
	MOVQ     R14, BX
	BLOCKROWS

tk4trow:
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	ROW4
	ADDQ      R9, AX
	ADDQ      R10, BX
	DECQ      CX
	JNZ       tk4trow
	LEAQ      (DI)(DX*1), AX
	TADD4

tk4next:
	LEAQ (DI)(R12*4), DI
	ADDQ $16, R14
	JMP  tk4

tk1:
	MOVQ  R14, AX
	SUBQ  R13, AX
	CMPQ  AX, R10
	JGE   tnext
	XORQ  DX, DX
	MOVQ  pairs+56(FP), R11
	TESTQ R11, R11
	JZ    tk1tail

tk1pair:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	LEAQ   (SI)(DX*1), AX
	MOVQ   R14, BX
	BLOCKROWS

tk1row:
	VMOVUPS (AX), Z8
	VMOVUPS 64(AX), Z9
	ROW1
	ADDQ    R9, AX
	ADDQ    R10, BX
	DECQ    CX
	JNZ     tk1row
	LEAQ    (DI)(DX*1), AX
	TADD1
	ADDQ    $128, DX
	DECQ    R11
	JNZ     tk1pair

tk1tail:
	KORTESTW K1, K2
	JZ       tk1next
	VPXORD   Z0, Z0, Z0
	VPXORD   Z1, Z1, Z1
	LEAQ     (SI)(DX*1), AX
	MOVQ     R14, BX
	BLOCKROWS

tk1trow:
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	ROW1
	ADDQ      R9, AX
	ADDQ      R10, BX
	DECQ      CX
	JNZ       tk1trow
	LEAQ      (DI)(DX*1), AX
	TADD1

tk1next:
	ADDQ R12, DI
	ADDQ $4, R14
	JMP  tk1

tnext:
	MOVQ R9, AX
	SHLQ $5, AX
	ADDQ AX, SI
	MOVQ R10, AX
	SHLQ $5, AX
	ADDQ AX, R13
	SUBQ $32, R8
	JGT  tblock
	VZEROUPPER
	RET

// func decomposeAsm(out, res, m, p, qa, qo *float32, rows, cols, ld, r, pairs, k1, k2 int, scale float32)
//
// Row by row, pair of vectors by pair: the pair's sums over k of
// p[i,k]·qa[k,·] and p[i,k]·qo[k,·] (Z0, Z1 and Z2, Z3), then out =
// scale·the first, res = m − the second. m's pair is loaded before res's
// is stored, so res may be m.
//
// Registers: DI, R13, SI the rows of out, res, m; R14 the row of p; R8
// rows left; R9 a row of m in bytes; R10 a row of qt in bytes; DX the
// pair's offset in the rows; R12 pairs left; AX, BX, R11 the running qa,
// qo and p; CX ks left; Z31 scale.
TEXT ·decomposeAsm(SB), NOSPLIT, $0-108
	MOVQ         out+0(FP), DI
	MOVQ         res+8(FP), R13
	MOVQ         m+16(FP), SI
	MOVQ         p+24(FP), R14
	MOVQ         rows+48(FP), R8
	MOVQ         cols+56(FP), R9
	SHLQ         $2, R9
	MOVQ         ld+64(FP), R10
	SHLQ         $2, R10
	MOVQ         k1+88(FP), AX
	KMOVW        AX, K1
	MOVQ         k2+96(FP), AX
	KMOVW        AX, K2
	VBROADCASTSS scale+104(FP), Z31

drow:
	XORQ  DX, DX
	MOVQ  pairs+80(FP), R12
	TESTQ R12, R12
	JZ    dtail

dpair:
	MOVQ      qa+32(FP), AX
	ADDQ      DX, AX
	MOVQ      qo+40(FP), BX
	ADDQ      DX, BX
	MOVQ      R14, R11
	MOVQ      r+72(FP), CX
	DECQ      CX
	DSTART
	JZ        dpairk

dpairstep:
	DSTEP
	DECQ      CX
	JNZ       dpairstep

dpairk:
	VMULPS  Z31, Z0, Z0
	VMULPS  Z31, Z1, Z1
	VMOVUPS Z0, (DI)(DX*1)
	VMOVUPS Z1, 64(DI)(DX*1)
	VMOVUPS (SI)(DX*1), Z4
	VMOVUPS 64(SI)(DX*1), Z5
	VSUBPS  Z2, Z4, Z4
	VSUBPS  Z3, Z5, Z5
	VMOVUPS Z4, (R13)(DX*1)
	VMOVUPS Z5, 64(R13)(DX*1)
	ADDQ    $128, DX
	DECQ    R12
	JNZ     dpair

dtail:
	KORTESTW K1, K2
	JZ       dnext
	MOVQ      qa+32(FP), AX
	ADDQ      DX, AX
	MOVQ      qo+40(FP), BX
	ADDQ      DX, BX
	MOVQ      R14, R11
	MOVQ      r+72(FP), CX
	DECQ      CX
	DSTART
	JZ       dtailk

dtailstep:
	DSTEP
	DECQ CX
	JNZ  dtailstep

dtailk:
	VMULPS    Z31, Z0, Z0
	VMULPS    Z31, Z1, Z1
	VMOVUPS   Z0, K1, (DI)(DX*1)
	VMOVUPS   Z1, K2, 64(DI)(DX*1)
	VMOVUPS.Z (SI)(DX*1), K1, Z4
	VMOVUPS.Z 64(SI)(DX*1), K2, Z5
	VSUBPS    Z2, Z4, Z4
	VSUBPS    Z3, Z5, Z5
	VMOVUPS   Z4, K1, (R13)(DX*1)
	VMOVUPS   Z5, K2, 64(R13)(DX*1)

dnext:
	ADDQ R9, DI
	ADDQ R9, R13
	ADDQ R9, SI
	MOVQ r+72(FP), AX
	LEAQ (R14)(AX*4), R14
	DECQ R8
	JNZ  drow
	VZEROUPPER
	RET

// func sumAsm(x *float32, n int) float32
//
// The sum of n floats, n a positive multiple of 64, in four accumulators:
// the benchmarks' yardstick of one read of a matrix.
TEXT ·sumAsm(SB), NOSPLIT, $0-20
	MOVQ   x+0(FP), SI
	MOVQ   n+8(FP), CX
	SHRQ   $6, CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3

sloop:
	VADDPS (SI), Z0, Z0
	VADDPS 64(SI), Z1, Z1
	VADDPS 128(SI), Z2, Z2
	VADDPS 192(SI), Z3, Z3
	ADDQ   $256, SI
	DECQ   CX
	JNZ    sloop
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	FOLD32(Z0, Y0, X0, Z2, Y8, X8)
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET
