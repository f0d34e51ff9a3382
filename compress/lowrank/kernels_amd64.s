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

// The kernels' loops over the columns of a row, pair of vectors (32
// columns) by pair, share one shape: DX is the pair's offset in bytes,
// and K1, K2 the opmasks of the pair's two vectors, all ones (K3) for the
// whole pairs below the argument pb, then the tail's (K4, K5, from
// tailMasks) for one more pair unless both are zero. Loads of m are
// zero-masked, so none reaches past a row; Q's rows (and MulTP's sums)
// are padded. MulQ and Decompose prefetch m 1 KiB ahead of their loads
// (PREFETCHT0, which never faults past the end): with two rows in flight
// the hardware's prefetchers fall behind (1024×1024 in L3, r = 4,
// measured on the AVX-512 EPYC: MulQ 57 → 47 µs, Decompose 107 → 103;
// MulTP, 8 or 32 rows in flight, gained nothing and lost with it).

// QSTEP adds to the accumulators ae, ao (row A's pair) and be, bo (row
// B's) the products of the rows' vectors Z16, Z17 and Z18, Z19 with the
// pair of qt at qe, qo (one k), lanes in K1, K2; t0..t3 are scratch.
#define QSTEP(qe, qo, ae, ao, be, bo, t0, t1, t2, t3) \
	VMOVUPS qe, Z28; \
	VMOVUPS qo, Z29; \
	VMULPS  Z28, Z16, t0; \
	VADDPS  t0, ae, K1, ae; \
	VMULPS  Z29, Z17, t1; \
	VADDPS  t1, ao, K2, ao; \
	VMULPS  Z28, Z18, t2; \
	VADDPS  t2, be, K1, be; \
	VMULPS  Z29, Z19, t3; \
	VADDPS  t3, bo, K2, bo

// QLOAD loads the pair at offset DX of rows A (SI) and B (BX) of m into
// Z16, Z17 and Z18, Z19.
#define QLOAD \
	VMOVUPS.Z (SI)(DX*1), K1, Z16; \
	VMOVUPS.Z 64(SI)(DX*1), K2, Z17; \
	VMOVUPS.Z (BX)(DX*1), K1, Z18; \
	VMOVUPS.Z 64(BX)(DX*1), K2, Z19

#define ZERO4(a, b, c, d) \
	VPXORD a, a, a; \
	VPXORD b, b, b; \
	VPXORD c, c, c; \
	VPXORD d, d, d

// MASKS sets K3 to all ones and K4, K5 to the tail's masks k1 and k2 (at
// the given argument offsets).
#define MASKS(k1, k2) \
	MOVL  $0xffff, AX; \
	KMOVW AX, K3; \
	MOVQ  k1, AX; \
	KMOVW AX, K4; \
	MOVQ  k2, AX; \
	KMOVW AX, K5

// func mulQAsm(p, m, qt *float32, n, mstride, pstride, ld, r, pb, k1, k2 int)
//
// n pairs of rows, rows A and B of a pair mstride bytes apart in m and
// pstride bytes in p (0 and 0: one row, done twice): each pair's ks in
// groups of 4 while 4 are left, then 2, then 1, each group streaming the
// two rows once (from cache after the first group) against its rows of
// qt, with two accumulators per row and k (Z0..Z15: A's k in Z0, Z1, B's
// in Z2, Z3, the next k 4 registers on), folded by FOLD32 into p.
//
// Registers: SI and BX rows A and B of m, DI row A of p, CX its running
// p[i,k], R9 mstride, R13 pstride, R8 pairs of rows left, R10 a row of qt
// in bytes, R11 3·R10, R14 qt's row k, R12 ks left, DX the pair's offset,
// AX its address in qt.
TEXT ·mulQAsm(SB), NOSPLIT, $0-88
	MOVQ p+0(FP), DI
	MOVQ m+8(FP), SI
	MOVQ n+24(FP), R8
	MOVQ mstride+32(FP), R9
	MOVQ pstride+40(FP), R13
	MOVQ ld+48(FP), R10
	SHLQ $2, R10
	LEAQ (R10)(R10*2), R11
	MASKS(k1+72(FP), k2+80(FP))

qrow:
	LEAQ (SI)(R9*1), BX
	MOVQ DI, CX
	MOVQ qt+16(FP), R14
	MOVQ r+56(FP), R12

qk4:
	CMPQ  R12, $4
	JLT   qk2
	ZERO4(Z0, Z1, Z2, Z3)
	ZERO4(Z4, Z5, Z6, Z7)
	ZERO4(Z8, Z9, Z10, Z11)
	ZERO4(Z12, Z13, Z14, Z15)
	KMOVW K3, K1
	KMOVW K3, K2
	XORQ  DX, DX

qk4loop:
	CMPQ     DX, pb+64(FP)
	JLT      qk4body
	JGT      qk4fold
	KMOVW    K4, K1
	KMOVW    K5, K2
	KORTESTW K1, K2
	JZ       qk4fold

qk4body:
	QLOAD
	PREFETCHT0 1024(SI)(DX*1)
	PREFETCHT0 1088(SI)(DX*1)
	PREFETCHT0 1024(BX)(DX*1)
	PREFETCHT0 1088(BX)(DX*1)
	LEAQ (R14)(DX*1), AX
	QSTEP((AX), 64(AX), Z0, Z1, Z2, Z3, Z20, Z21, Z22, Z23)
	QSTEP((AX)(R10*1), 64(AX)(R10*1), Z4, Z5, Z6, Z7, Z24, Z25, Z26, Z27)
	QSTEP((AX)(R10*2), 64(AX)(R10*2), Z8, Z9, Z10, Z11, Z20, Z21, Z22, Z23)
	QSTEP((AX)(R11*1), 64(AX)(R11*1), Z12, Z13, Z14, Z15, Z24, Z25, Z26, Z27)
	ADDQ $128, DX
	JMP  qk4loop

qk4fold:
	FOLD32(Z0, Y0, X0, Z1, Y1, X1)
	FOLD32(Z4, Y4, X4, Z5, Y5, X5)
	FOLD32(Z8, Y8, X8, Z9, Y9, X9)
	FOLD32(Z12, Y12, X12, Z13, Y13, X13)
	FOLD32(Z2, Y2, X2, Z3, Y3, X3)
	FOLD32(Z6, Y6, X6, Z7, Y7, X7)
	FOLD32(Z10, Y10, X10, Z11, Y11, X11)
	FOLD32(Z14, Y14, X14, Z15, Y15, X15)
	VMOVSS X0, (CX)
	VMOVSS X4, 4(CX)
	VMOVSS X8, 8(CX)
	VMOVSS X12, 12(CX)
	VMOVSS X2, (CX)(R13*1)
	VMOVSS X6, 4(CX)(R13*1)
	VMOVSS X10, 8(CX)(R13*1)
	VMOVSS X14, 12(CX)(R13*1)
	ADDQ   $16, CX
	LEAQ   (R14)(R10*4), R14
	SUBQ   $4, R12
	JMP    qk4

qk2:
	CMPQ  R12, $2
	JLT   qk1
	ZERO4(Z0, Z1, Z2, Z3)
	ZERO4(Z4, Z5, Z6, Z7)
	KMOVW K3, K1
	KMOVW K3, K2
	XORQ  DX, DX

qk2loop:
	CMPQ     DX, pb+64(FP)
	JLT      qk2body
	JGT      qk2fold
	KMOVW    K4, K1
	KMOVW    K5, K2
	KORTESTW K1, K2
	JZ       qk2fold

qk2body:
	QLOAD
	PREFETCHT0 1024(SI)(DX*1)
	PREFETCHT0 1088(SI)(DX*1)
	PREFETCHT0 1024(BX)(DX*1)
	PREFETCHT0 1088(BX)(DX*1)
	LEAQ       (R14)(DX*1), AX
	QSTEP((AX), 64(AX), Z0, Z1, Z2, Z3, Z20, Z21, Z22, Z23)
	QSTEP((AX)(R10*1), 64(AX)(R10*1), Z4, Z5, Z6, Z7, Z24, Z25, Z26, Z27)
	ADDQ       $128, DX
	JMP        qk2loop

qk2fold:
	FOLD32(Z0, Y0, X0, Z1, Y1, X1)
	FOLD32(Z4, Y4, X4, Z5, Y5, X5)
	FOLD32(Z2, Y2, X2, Z3, Y3, X3)
	FOLD32(Z6, Y6, X6, Z7, Y7, X7)
	VMOVSS X0, (CX)
	VMOVSS X4, 4(CX)
	VMOVSS X2, (CX)(R13*1)
	VMOVSS X6, 4(CX)(R13*1)
	ADDQ   $8, CX
	LEAQ   (R14)(R10*2), R14
	SUBQ   $2, R12

qk1:
	TESTQ R12, R12
	JZ    qnext
	ZERO4(Z0, Z1, Z2, Z3)
	KMOVW K3, K1
	KMOVW K3, K2
	XORQ  DX, DX

qk1loop:
	CMPQ     DX, pb+64(FP)
	JLT      qk1body
	JGT      qk1fold
	KMOVW    K4, K1
	KMOVW    K5, K2
	KORTESTW K1, K2
	JZ       qk1fold

qk1body:
	QLOAD
	LEAQ (R14)(DX*1), AX
	QSTEP((AX), 64(AX), Z0, Z1, Z2, Z3, Z20, Z21, Z22, Z23)
	ADDQ $128, DX
	JMP  qk1loop

qk1fold:
	FOLD32(Z0, Y0, X0, Z1, Y1, X1)
	FOLD32(Z2, Y2, X2, Z3, Y3, X3)
	VMOVSS X0, (CX)
	VMOVSS X2, (CX)(R13*1)
	ADDQ   $4, CX
	ADDQ   R10, R14
	DECQ   R12
	JMP    qk1

qnext:
	LEAQ (SI)(R9*2), SI
	LEAQ (DI)(R13*2), DI
	DECQ R8
	JNZ  qrow
	VZEROUPPER
	RET

// TROW4 adds to the accumulators Z0..Z7 (two per k) the products of the
// row's pair Z8, Z9 with p[i,k..k+3] at (BX).
#define TROW4 \
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

// TROW2 is TROW4 for two ks: p[i,k], p[i,k+1] at (BX), accumulators
// Z0..Z3.
#define TROW2 \
	VBROADCASTSS (BX), Z10; \
	VBROADCASTSS 4(BX), Z11; \
	VMULPS       Z10, Z8, Z14; \
	VADDPS       Z14, Z0, Z0; \
	VMULPS       Z10, Z9, Z15; \
	VADDPS       Z15, Z1, Z1; \
	VMULPS       Z11, Z8, Z16; \
	VADDPS       Z16, Z2, Z2; \
	VMULPS       Z11, Z9, Z17; \
	VADDPS       Z17, Z3, Z3

// TROW1 is TROW4 for one k: p[i,k] at (BX), accumulators Z0, Z1.
#define TROW1 \
	VBROADCASTSS (BX), Z10; \
	VMULPS       Z10, Z8, Z14; \
	VADDPS       Z14, Z0, Z0; \
	VMULPS       Z10, Z9, Z15; \
	VADDPS       Z15, Z1, Z1

// func mulTPAsm(s, t, m, p *float32, n, cols, ld, r, pb, k1, k2, mode int)
//
// Adds n rows of mᵀ·p to the sums s (r×ld, q transposed): k by k in
// groups of 4 while 4 are left, then 2, then 1, pair of vectors by pair,
// the pair's columns of the n rows times p[i,k] summed row by row in the
// accumulators Z0..Z7 (two per k), which start from s's, or from zero if
// mode&1 (the block's first group), and end in s, or added to t (r×ld) if
// mode&2 (its last). The n rows are read once per group of ks, from cache
// after the first.
//
// Registers: SI the first row of m, R13 its row of p, R14 p[0,k], DI s's
// row k, R8 t's, R9 a row of m in bytes, R10 a row of p (4r), R12 a row
// of s and t, DX the pair's offset, AX and BX the running m and p, CX
// rows left, R11 the pair's address in s or t.
TEXT ·mulTPAsm(SB), NOSPLIT, $0-96
	MOVQ s+0(FP), DI
	MOVQ t+8(FP), R8
	MOVQ m+16(FP), SI
	MOVQ p+24(FP), R13
	MOVQ R13, R14
	MOVQ cols+40(FP), R9
	SHLQ $2, R9
	MOVQ ld+48(FP), R12
	SHLQ $2, R12
	MOVQ r+56(FP), R10
	SHLQ $2, R10
	MASKS(k1+72(FP), k2+80(FP))

tk4:
	MOVQ  R14, AX
	SUBQ  R13, AX
	ADDQ  $16, AX
	CMPQ  AX, R10
	JGT   tk2
	KMOVW K3, K1
	KMOVW K3, K2
	XORQ  DX, DX

tk4loop:
	CMPQ     DX, pb+64(FP)
	JLT      tk4body
	JGT      tk4next
	KMOVW    K4, K1
	KMOVW    K5, K2
	KORTESTW K1, K2
	JZ       tk4next

tk4body:
	LEAQ    (DI)(DX*1), R11
	TESTQ   $1, mode+88(FP)
	JNZ     tk4zero
	VMOVUPS (R11), Z0
	VMOVUPS 64(R11), Z1
	VMOVUPS (R11)(R12*1), Z2
	VMOVUPS 64(R11)(R12*1), Z3
	VMOVUPS (R11)(R12*2), Z4
	VMOVUPS 64(R11)(R12*2), Z5
	LEAQ    (R11)(R12*2), AX
	VMOVUPS (AX)(R12*1), Z6
	VMOVUPS 64(AX)(R12*1), Z7
	JMP     tk4rows

tk4zero:
	ZERO4(Z0, Z1, Z2, Z3)
	ZERO4(Z4, Z5, Z6, Z7)

tk4rows:
	LEAQ (SI)(DX*1), AX
	MOVQ R14, BX
	MOVQ n+32(FP), CX

tk4row:
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	TROW4
	ADDQ      R9, AX
	ADDQ      R10, BX
	DECQ      CX
	JNZ       tk4row
	TESTQ     $2, mode+88(FP)
	JZ        tk4store
	LEAQ      (R8)(DX*1), R11
	VADDPS    (R11), Z0, Z0
	VADDPS    64(R11), Z1, Z1
	VADDPS    (R11)(R12*1), Z2, Z2
	VADDPS    64(R11)(R12*1), Z3, Z3
	VADDPS    (R11)(R12*2), Z4, Z4
	VADDPS    64(R11)(R12*2), Z5, Z5
	LEAQ      (R11)(R12*2), AX
	VADDPS    (AX)(R12*1), Z6, Z6
	VADDPS    64(AX)(R12*1), Z7, Z7

tk4store:
	VMOVUPS Z0, (R11)
	VMOVUPS Z1, 64(R11)
	VMOVUPS Z2, (R11)(R12*1)
	VMOVUPS Z3, 64(R11)(R12*1)
	VMOVUPS Z4, (R11)(R12*2)
	VMOVUPS Z5, 64(R11)(R12*2)
	LEAQ    (R11)(R12*2), AX
	VMOVUPS Z6, (AX)(R12*1)
	VMOVUPS Z7, 64(AX)(R12*1)
	ADDQ    $128, DX
	JMP     tk4loop

tk4next:
	LEAQ (DI)(R12*4), DI
	LEAQ (R8)(R12*4), R8
	ADDQ $16, R14
	JMP  tk4

tk2:
	MOVQ  R14, AX
	SUBQ  R13, AX
	ADDQ  $8, AX
	CMPQ  AX, R10
	JGT   tk1
	KMOVW K3, K1
	KMOVW K3, K2
	XORQ  DX, DX

tk2loop:
	CMPQ     DX, pb+64(FP)
	JLT      tk2body
	JGT      tk2next
	KMOVW    K4, K1
	KMOVW    K5, K2
	KORTESTW K1, K2
	JZ       tk2next

tk2body:
	LEAQ    (DI)(DX*1), R11
	TESTQ   $1, mode+88(FP)
	JNZ     tk2zero
	VMOVUPS (R11), Z0
	VMOVUPS 64(R11), Z1
	VMOVUPS (R11)(R12*1), Z2
	VMOVUPS 64(R11)(R12*1), Z3
	JMP     tk2rows

tk2zero:
	ZERO4(Z0, Z1, Z2, Z3)

tk2rows:
	LEAQ (SI)(DX*1), AX
	MOVQ R14, BX
	MOVQ n+32(FP), CX

tk2row:
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	TROW2
	ADDQ      R9, AX
	ADDQ      R10, BX
	DECQ      CX
	JNZ       tk2row
	TESTQ     $2, mode+88(FP)
	JZ        tk2store
	LEAQ      (R8)(DX*1), R11
	VADDPS    (R11), Z0, Z0
	VADDPS    64(R11), Z1, Z1
	VADDPS    (R11)(R12*1), Z2, Z2
	VADDPS    64(R11)(R12*1), Z3, Z3

tk2store:
	VMOVUPS Z0, (R11)
	VMOVUPS Z1, 64(R11)
	VMOVUPS Z2, (R11)(R12*1)
	VMOVUPS Z3, 64(R11)(R12*1)
	ADDQ    $128, DX
	JMP     tk2loop

tk2next:
	LEAQ (DI)(R12*2), DI
	LEAQ (R8)(R12*2), R8
	ADDQ $8, R14

tk1:
	MOVQ  R14, AX
	SUBQ  R13, AX
	CMPQ  AX, R10
	JGE   tdone
	KMOVW K3, K1
	KMOVW K3, K2
	XORQ  DX, DX

tk1loop:
	CMPQ     DX, pb+64(FP)
	JLT      tk1body
	JGT      tk1next
	KMOVW    K4, K1
	KMOVW    K5, K2
	KORTESTW K1, K2
	JZ       tk1next

tk1body:
	LEAQ    (DI)(DX*1), R11
	TESTQ   $1, mode+88(FP)
	JNZ     tk1zero
	VMOVUPS (R11), Z0
	VMOVUPS 64(R11), Z1
	JMP     tk1rows

tk1zero:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1

tk1rows:
	LEAQ (SI)(DX*1), AX
	MOVQ R14, BX
	MOVQ n+32(FP), CX

tk1row:
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	TROW1
	ADDQ      R9, AX
	ADDQ      R10, BX
	DECQ      CX
	JNZ       tk1row
	TESTQ     $2, mode+88(FP)
	JZ        tk1store
	LEAQ      (R8)(DX*1), R11
	VADDPS    (R11), Z0, Z0
	VADDPS    64(R11), Z1, Z1

tk1store:
	VMOVUPS Z0, (R11)
	VMOVUPS Z1, 64(R11)
	ADDQ    $128, DX
	JMP     tk1loop

tk1next:
	ADDQ R12, DI
	ADDQ R12, R8
	ADDQ $4, R14
	JMP  tk1

tdone:
	VZEROUPPER
	RET

// func decomposeAsm(out, res, m, p, qa, qo *float32, n, stride, pstride, ld, r, pb, k1, k2, ntpb int)
//
// n pairs of rows, rows A and B of a pair stride bytes apart in out, res
// and m and pstride bytes in p (0 and 0: one row, done twice, which
// writes the same values twice): pair of vectors by pair, the sums over k
// of p[i,k]·qa[k,·] (A's in Z0, Z1, B's in Z4, Z5) and of p[i,k]·qo[k,·]
// (Z2, Z3 and Z6, Z7), then out = the first, res = m − the second (qa
// holds scale·qAvg).
// Both rows' m is loaded before either row's res is stored, so res may be
// m. The whole pairs below offset ntpb of out are stored non-temporally
// (VMOVNTPS, 64-byte aligned), the rest through the cache; SFENCE orders
// the non-temporal stores before the return.
//
// Registers: DI, R13, SI row A of out, res, m; R14 row A of p; R9 stride;
// R8 pairs of rows left; R10 a row of qt in bytes; DX the pair's offset;
// AX, BX the running qa and qo; R11, R12 the running p[A,k], p[B,k]; CX
// ks left.
TEXT ·decomposeAsm(SB), NOSPLIT, $0-120
	MOVQ         out+0(FP), DI
	MOVQ         res+8(FP), R13
	MOVQ         m+16(FP), SI
	MOVQ         p+24(FP), R14
	MOVQ         n+48(FP), R8
	MOVQ         stride+56(FP), R9
	MOVQ         ld+72(FP), R10
	SHLQ         $2, R10
	MASKS(k1+96(FP), k2+104(FP))

drow:
	KMOVW K3, K1
	KMOVW K3, K2
	XORQ  DX, DX

dloop:
	CMPQ     DX, pb+88(FP)
	JLT      dbody
	JGT      dnext
	KMOVW    K4, K1
	KMOVW    K5, K2
	KORTESTW K1, K2
	JZ       dnext

dbody:
	MOVQ         qa+32(FP), AX
	ADDQ         DX, AX
	MOVQ         qo+40(FP), BX
	ADDQ         DX, BX
	MOVQ         R14, R11
	MOVQ         pstride+64(FP), R12
	ADDQ         R14, R12
	MOVQ         r+80(FP), CX
	VBROADCASTSS (R11), Z16
	VBROADCASTSS (R12), Z17
	VMOVUPS      (AX), Z18
	VMOVUPS      64(AX), Z19
	VMOVUPS      (BX), Z20
	VMOVUPS      64(BX), Z21
	VMULPS       Z18, Z16, Z0
	VMULPS       Z19, Z16, Z1
	VMULPS       Z20, Z16, Z2
	VMULPS       Z21, Z16, Z3
	VMULPS       Z18, Z17, Z4
	VMULPS       Z19, Z17, Z5
	VMULPS       Z20, Z17, Z6
	VMULPS       Z21, Z17, Z7
	DECQ         CX
	JZ           dend

dstep:
	ADDQ         R10, AX
	ADDQ         R10, BX
	ADDQ         $4, R11
	ADDQ         $4, R12
	VBROADCASTSS (R11), Z16
	VBROADCASTSS (R12), Z17
	VMOVUPS      (AX), Z18
	VMOVUPS      64(AX), Z19
	VMOVUPS      (BX), Z20
	VMOVUPS      64(BX), Z21
	VMULPS       Z18, Z16, Z22
	VADDPS       Z22, Z0, Z0
	VMULPS       Z19, Z16, Z23
	VADDPS       Z23, Z1, Z1
	VMULPS       Z20, Z16, Z24
	VADDPS       Z24, Z2, Z2
	VMULPS       Z21, Z16, Z25
	VADDPS       Z25, Z3, Z3
	VMULPS       Z18, Z17, Z26
	VADDPS       Z26, Z4, Z4
	VMULPS       Z19, Z17, Z27
	VADDPS       Z27, Z5, Z5
	VMULPS       Z20, Z17, Z28
	VADDPS       Z28, Z6, Z6
	VMULPS       Z21, Z17, Z29
	VADDPS       Z29, Z7, Z7
	DECQ         CX
	JNZ          dstep

dend:
	LEAQ      (SI)(DX*1), AX
	PREFETCHT0 1024(AX)
	PREFETCHT0 1088(AX)
	PREFETCHT0 1024(AX)(R9*1)
	PREFETCHT0 1088(AX)(R9*1)
	VMOVUPS.Z (AX), K1, Z8
	VMOVUPS.Z 64(AX), K2, Z9
	VMOVUPS.Z (AX)(R9*1), K1, Z10
	VMOVUPS.Z 64(AX)(R9*1), K2, Z11
	LEAQ      (DI)(DX*1), AX
	CMPQ      DX, ntpb+112(FP)
	JGE       dcached
	VMOVNTPS  Z0, (AX)
	VMOVNTPS  Z1, 64(AX)
	VMOVNTPS  Z4, (AX)(R9*1)
	VMOVNTPS  Z5, 64(AX)(R9*1)
	JMP       dres

dcached:
	VMOVUPS Z0, K1, (AX)
	VMOVUPS Z1, K2, 64(AX)
	VMOVUPS Z4, K1, (AX)(R9*1)
	VMOVUPS Z5, K2, 64(AX)(R9*1)

dres:
	VSUBPS  Z2, Z8, Z8
	VSUBPS  Z3, Z9, Z9
	VSUBPS  Z6, Z10, Z10
	VSUBPS  Z7, Z11, Z11
	LEAQ    (R13)(DX*1), AX
	VMOVUPS Z8, K1, (AX)
	VMOVUPS Z9, K2, 64(AX)
	VMOVUPS Z10, K1, (AX)(R9*1)
	VMOVUPS Z11, K2, 64(AX)(R9*1)
	ADDQ    $128, DX
	JMP     dloop

dnext:
	LEAQ (DI)(R9*2), DI
	LEAQ (R13)(R9*2), R13
	LEAQ (SI)(R9*2), SI
	MOVQ pstride+64(FP), AX
	LEAQ (R14)(AX*2), R14
	DECQ R8
	JNZ  drow
	SFENCE
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
	FOLD32(Z0, Y0, X0, Z2, Y2, X2)
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET


// func transposeAsm(qt, q *float32, idx *[16]int32, cols, r, ld, k1, mul int, scale float32)
//
// Row k of qt (ld floats apart), for k = 0..r−1: column k of q (cols×r),
// times scale if mul is 1, 16 elements a gather (indices idx: 0, r, ...,
// 15r) for the whole vectors, then the k1 lanes of one more, the others
// zero.
TEXT ·transposeAsm(SB), NOSPLIT, $0-68
	MOVQ         qt+0(FP), DI
	MOVQ         q+8(FP), R8
	MOVQ         idx+16(FP), AX
	VMOVDQU32    (AX), Z1
	MOVQ         ld+40(FP), R10
	SHLQ         $2, R10
	MOVQ         r+32(FP), R11
	MOVQ         R11, R9
	SHLQ         $6, R9
	MOVL         $0xffff, AX
	KMOVW        AX, K3
	MOVQ         k1+48(FP), AX
	KMOVW        AX, K4
	VBROADCASTSS scale+64(FP), Z2

trow:
	MOVQ DI, BX
	MOVQ R8, SI
	MOVQ cols+24(FP), CX
	SHRQ $4, CX
	JZ   trtail

trloop:
	KMOVW      K3, K1
	VPXORD     Z0, Z0, Z0
	VGATHERDPS (SI)(Z1*4), K1, Z0
	CMPQ       mul+56(FP), $0
	JEQ        trstore
	VMULPS     Z2, Z0, Z0

trstore:
	VMOVUPS Z0, (BX)
	ADDQ    $64, BX
	ADDQ    R9, SI
	DECQ    CX
	JNZ     trloop

trtail:
	KORTESTW   K4, K4
	JZ         trnext
	KMOVW      K4, K1
	VPXORD     Z0, Z0, Z0
	VGATHERDPS (SI)(Z1*4), K1, Z0
	CMPQ       mul+56(FP), $0
	JEQ        trtstore
	VMULPS     Z2, Z0, Z0

trtstore:
	VMOVUPS Z0, (BX)

trnext:
	ADDQ R10, DI
	ADDQ $4, R8
	DECQ R11
	JNZ  trow
	VZEROUPPER
	RET

// func untransposeAsm(q, t *float32, idx *[16]int32, chunks, step, k1 int)
//
// q (cols×r, r dividing 16) from its transpose t (r rows, ld floats
// apart): 16 elements of q a gather from t at the indices idx ((l%r)·ld +
// l/r for lane l), whose base moves step bytes (64/r) from one vector of q
// to the next; chunks whole vectors, then the k1 lanes of one more.
TEXT ·untransposeAsm(SB), NOSPLIT, $0-48
	MOVQ      q+0(FP), DI
	MOVQ      t+8(FP), SI
	MOVQ      idx+16(FP), AX
	VMOVDQU32 (AX), Z1
	MOVQ      chunks+24(FP), CX
	MOVQ      step+32(FP), R9
	MOVL      $0xffff, AX
	KMOVW     AX, K3
	TESTQ     CX, CX
	JZ        untail

unloop:
	KMOVW      K3, K1
	VGATHERDPS (SI)(Z1*4), K1, Z0
	VMOVUPS    Z0, (DI)
	ADDQ       $64, DI
	ADDQ       R9, SI
	DECQ       CX
	JNZ        unloop

untail:
	MOVQ       k1+40(FP), AX
	KMOVW      AX, K4
	KORTESTW   K4, K4
	JZ         undone
	KMOVW      K4, K1
	VGATHERDPS (SI)(Z1*4), K1, Z0
	VMOVUPS    Z0, K4, (DI)

undone:
	VZEROUPPER
	RET

// FOLD16D sets the low lane of X(a) to the fold of the sixteen float64
// partial sums in Z(a) (lanes 0..7) and Z(b) (lanes 8..15): lane l gets
// lane l+8, then l+4, l+2, l+1.
#define FOLD16D(za, ya, xa, zb, ty, tx) \
	VADDPD        zb, za, za; \
	VEXTRACTF64X4 $1, za, ty; \
	VADDPD        ty, ya, ya; \
	VEXTRACTF128  $1, ya, tx; \
	VADDPD        tx, xa, xa; \
	VPERMILPD     $1, xa, tx; \
	VADDSD        tx, xa, xa

// The float64 loops of Orthogonalize walk their vectors 16 elements (two
// ZMM registers) a step: n/16 whole steps with the masks K1, K2 all ones,
// then one with the tail's masks k1, k2 (lanes 0..7 of each register)
// unless both are zero. Loads are zero-masked, stores and the running sums'
// additions merge-masked.

// func dot2Asm(a, b *float64, n, k1, k2 int) (aa, ab float64)
TEXT ·dot2Asm(SB), NOSPLIT, $0-56
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   n+16(FP), CX
	SHRQ   $4, CX
	MOVL   $0xffff, AX
	KMOVW  AX, K1
	KMOVW  AX, K2
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	VPXORQ Z2, Z2, Z2
	VPXORQ Z3, Z3, Z3

d2loop:
	TESTQ    CX, CX
	JNZ      d2body
	MOVQ     k1+24(FP), AX
	KMOVW    AX, K1
	MOVQ     k2+32(FP), AX
	KMOVW    AX, K2
	KORTESTW K1, K2
	JZ       d2fold
	MOVQ     $1, CX            // one more step, the tail

d2body:
	VMOVUPD.Z (SI), K1, Z4
	VMOVUPD.Z 64(SI), K2, Z5
	VMOVUPD.Z (DI), K1, Z6
	VMOVUPD.Z 64(DI), K2, Z7
	VMULPD    Z4, Z4, Z8
	VADDPD    Z8, Z0, K1, Z0
	VMULPD    Z5, Z5, Z9
	VADDPD    Z9, Z1, K2, Z1
	VMULPD    Z6, Z4, Z10
	VADDPD    Z10, Z2, K1, Z2
	VMULPD    Z7, Z5, Z11
	VADDPD    Z11, Z3, K2, Z3
	ADDQ      $128, SI
	ADDQ      $128, DI
	DECQ      CX
	JNZ       d2body
	KMOVW     K1, AX
	CMPL      AX, $0xffff
	JEQ       d2loop

d2fold:
	FOLD16D(Z0, Y0, X0, Z1, Y1, X1)
	FOLD16D(Z2, Y2, X2, Z3, Y3, X3)
	VMOVSD X0, aa+40(FP)
	VMOVSD X2, ab+48(FP)
	VZEROUPPER
	RET

// func axpyDotAsm(y, x, z *float64, n, k1, k2 int, d float64) float64
TEXT ·axpyDotAsm(SB), NOSPLIT, $0-64
	MOVQ         y+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         z+16(FP), DX
	MOVQ         n+24(FP), CX
	SHRQ         $4, CX
	VBROADCASTSD d+48(FP), Z15
	MOVL         $0xffff, AX
	KMOVW        AX, K1
	KMOVW        AX, K2
	VPXORQ       Z0, Z0, Z0
	VPXORQ       Z1, Z1, Z1

axloop:
	TESTQ    CX, CX
	JNZ      axbody
	MOVQ     k1+32(FP), AX
	KMOVW    AX, K1
	MOVQ     k2+40(FP), AX
	KMOVW    AX, K2
	KORTESTW K1, K2
	JZ       axfold
	MOVQ     $1, CX

axbody:
	VMOVUPD.Z (SI), K1, Z4
	VMOVUPD.Z 64(SI), K2, Z5
	VMULPD    Z4, Z15, Z4
	VMULPD    Z5, Z15, Z5
	VMOVUPD.Z (DI), K1, Z6
	VMOVUPD.Z 64(DI), K2, Z7
	VADDPD    Z4, Z6, Z6
	VADDPD    Z5, Z7, Z7
	VMOVUPD   Z6, K1, (DI)
	VMOVUPD   Z7, K2, 64(DI)
	VMOVUPD.Z (DX), K1, Z8
	VMOVUPD.Z 64(DX), K2, Z9
	VMULPD    Z8, Z6, Z8
	VADDPD    Z8, Z0, K1, Z0
	VMULPD    Z9, Z7, Z9
	VADDPD    Z9, Z1, K2, Z1
	ADDQ      $128, DI
	ADDQ      $128, SI
	ADDQ      $128, DX
	DECQ      CX
	JNZ       axbody
	KMOVW     K1, AX
	CMPL      AX, $0xffff
	JEQ       axloop

axfold:
	FOLD16D(Z0, Y0, X0, Z1, Y1, X1)
	VMOVSD X0, ret+56(FP)
	VZEROUPPER
	RET

// func scaleF64Asm(y *float64, n, k1, k2 int, c float64)
TEXT ·scaleF64Asm(SB), NOSPLIT, $0-40
	MOVQ         y+0(FP), DI
	MOVQ         n+8(FP), CX
	SHRQ         $4, CX
	VBROADCASTSD c+32(FP), Z15
	MOVL         $0xffff, AX
	KMOVW        AX, K1
	KMOVW        AX, K2

scloop:
	TESTQ    CX, CX
	JNZ      scbody
	MOVQ     k1+16(FP), AX
	KMOVW    AX, K1
	MOVQ     k2+24(FP), AX
	KMOVW    AX, K2
	KORTESTW K1, K2
	JZ       scdone
	MOVQ     $1, CX

scbody:
	VMOVUPD.Z (DI), K1, Z4
	VMOVUPD.Z 64(DI), K2, Z5
	VMULPD    Z15, Z4, Z4
	VMULPD    Z15, Z5, Z5
	VMOVUPD   Z4, K1, (DI)
	VMOVUPD   Z5, K2, 64(DI)
	ADDQ      $128, DI
	DECQ      CX
	JNZ       scbody
	KMOVW     K1, AX
	CMPL      AX, $0xffff
	JEQ       scloop

scdone:
	VZEROUPPER
	RET

// func loadPAsm(w *float64, p *float32, idx *[16]int32, rows, r, k1 int) (bad bool)
//
// Column c of w (rows float64, columns rows apart), for c = 0..r−1: column
// c of p (rows×r, float32), 16 elements a gather (indices idx: 0, r, ...,
// 15r) for the whole vectors of 16, then the k1 lanes of one more, widened
// to float64. bad reports whether an element was NaN or ±Inf: its bits
// without the sign above those of MaxFloat32 (0x7f7fffff), as unsigned
// integers, in K6.
TEXT ·loadPAsm(SB), NOSPLIT, $0-49
	MOVQ         w+0(FP), DI
	MOVQ         p+8(FP), R8
	MOVQ         idx+16(FP), AX
	VMOVDQU32    (AX), Z1
	MOVQ         rows+24(FP), R10
	SHLQ         $3, R10
	MOVQ         r+32(FP), R11
	MOVQ         R11, R9
	SHLQ         $6, R9
	MOVL         $0xffff, AX
	KMOVW        AX, K3
	MOVQ         k1+40(FP), AX
	KMOVW        AX, K4
	KSHIFTRW     $8, K4, K5
	KXORW        K6, K6, K6
	MOVL         $0x7fffffff, AX
	VPBROADCASTD AX, Z6
	MOVL         $0x7f7fffff, AX
	VPBROADCASTD AX, Z7

lprow:
	MOVQ DI, BX
	MOVQ R8, SI
	MOVQ rows+24(FP), CX
	SHRQ $4, CX
	JZ   lptail

lploop:
	KMOVW         K3, K1
	VGATHERDPS    (SI)(Z1*4), K1, Z0
	VPANDD        Z6, Z0, Z4
	VPCMPUD       $6, Z7, Z4, K2
	KORW          K2, K6, K6
	VCVTPS2PD     Y0, Z2
	VEXTRACTF64X4 $1, Z0, Y3
	VCVTPS2PD     Y3, Z3
	VMOVUPD       Z2, (BX)
	VMOVUPD       Z3, 64(BX)
	ADDQ          $128, BX
	ADDQ          R9, SI
	DECQ          CX
	JNZ           lploop

lptail:
	KORTESTW      K4, K4
	JZ            lpnext
	KMOVW         K4, K1
	VPXORD        Z0, Z0, Z0
	VGATHERDPS    (SI)(Z1*4), K1, Z0
	VPANDD        Z6, Z0, Z4
	VPCMPUD       $6, Z7, Z4, K2
	KORW          K2, K6, K6
	VCVTPS2PD     Y0, Z2
	VEXTRACTF64X4 $1, Z0, Y3
	VCVTPS2PD     Y3, Z3
	VMOVUPD       Z2, K4, (BX)
	VMOVUPD       Z3, K5, 64(BX)

lpnext:
	ADDQ     R10, DI
	ADDQ     $4, R8
	DECQ     R11
	JNZ      lprow
	KORTESTW K6, K6
	SETNE    bad+48(FP)
	VZEROUPPER
	RET

// func storePAsm(p *float32, w *float64, idx *[16]int32, chunks, step, k1 int)
//
// p (rows×r, r dividing 16) from w (r columns of rows float64), narrowed
// to float32: 16 elements of p two gathers of 8 from w at the indices idx
// ((l%r)·rows + l/r for lane l), whose base moves step bytes (8·16/r) from
// one vector of p to the next; chunks whole vectors, then the k1 lanes of
// one more.
TEXT ·storePAsm(SB), NOSPLIT, $0-48
	MOVQ          p+0(FP), DI
	MOVQ          w+8(FP), SI
	MOVQ          idx+16(FP), AX
	VMOVDQU32     (AX), Z1
	VEXTRACTI64X4 $1, Z1, Y2
	MOVQ          chunks+24(FP), CX
	MOVQ          step+32(FP), R9
	MOVL          $0xffff, AX
	KMOVW         AX, K3
	TESTQ         CX, CX
	JZ            sptail

sploop:
	KMOVW         K3, K1
	KMOVW         K3, K2
	VGATHERDPD    (SI)(Y1*8), K1, Z3
	VGATHERDPD    (SI)(Y2*8), K2, Z4
	VCVTPD2PS     Z3, Y3
	VCVTPD2PS     Z4, Y4
	VINSERTF64X4  $1, Y4, Z3, Z3
	VMOVUPS       Z3, (DI)
	ADDQ          $64, DI
	ADDQ          R9, SI
	DECQ          CX
	JNZ           sploop

sptail:
	MOVQ         k1+40(FP), AX
	KMOVW        AX, K4
	KORTESTW     K4, K4
	JZ           spdone
	KMOVW        K4, K1
	KSHIFTRW     $8, K4, K2
	VPXORD       Z3, Z3, Z3
	VPXORD       Z4, Z4, Z4
	VGATHERDPD   (SI)(Y1*8), K1, Z3
	VGATHERDPD   (SI)(Y2*8), K2, Z4
	VCVTPD2PS    Z3, Y3
	VCVTPD2PS    Z4, Y4
	VINSERTF64X4 $1, Y4, Z3, Z3
	VMOVUPS      Z3, K4, (DI)

spdone:
	VZEROUPPER
	RET
