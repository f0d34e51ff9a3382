//go:build !purego

#include "textflag.h"

// The AVX2 kernels (avx2_amd64.go): the AVX-512 ones' arithmetic on four
// YMM registers of 8 lanes where those use two ZMM of 16, so that lane l
// of the four still holds the partial sum of the columns j with j%32 = l.
// A row's columns go 32 (a quad of registers) at a time; the last cols%32
// through VMASKMOVPS loads of m with the masks at mask (four registers'
// worth of int32, −1 for the columns left), which never touch memory past
// a row. Q's rows are padded with zeros, so the masked-out lanes add +0
// to sums that are never −0: no change, as if they were not added.

// FOLD4 sets the low lane of X0 to the reference fold of the 32 partial
// sums in Y0..Y3 (lanes 0..7, 8..15, 16..23, 24..31): lane l gets lane
// l+16, then l+8, l+4, l+2, l+1 (for a0..a3 = Y0..Y3, x0, x1 = X0, X1).
#define FOLD4(a0, a1, a2, a3, x0, x1) \
	VADDPS       a2, a0, a0; \
	VADDPS       a3, a1, a1; \
	VADDPS       a1, a0, a0; \
	VEXTRACTF128 $1, a0, x1; \
	VADDPS       x1, x0, x0; \
	VPERMILPS    $0x4e, x0, x1; \
	VADDPS       x1, x0, x0; \
	VPERMILPS    $0xb1, x0, x1; \
	VADDPS       x1, x0, x0

// MLOAD4 loads the quad of m at (SI)(DX*1) into Y8..Y11.
#define MLOAD4 \
	VMOVUPS (SI)(DX*1), Y8; \
	VMOVUPS 32(SI)(DX*1), Y9; \
	VMOVUPS 64(SI)(DX*1), Y10; \
	VMOVUPS 96(SI)(DX*1), Y11

// MLOAD4MASKED is MLOAD4 through the tail's masks at (BX).
#define MLOAD4MASKED \
	VMOVDQU    (BX), Y12; \
	VMASKMOVPS (SI)(DX*1), Y12, Y8; \
	VMOVDQU    32(BX), Y13; \
	VMASKMOVPS 32(SI)(DX*1), Y13, Y9; \
	VMOVDQU    64(BX), Y14; \
	VMASKMOVPS 64(SI)(DX*1), Y14, Y10; \
	VMOVDQU    96(BX), Y15; \
	VMASKMOVPS 96(SI)(DX*1), Y15, Y11

// QMAC4 adds to a0..a3 the products of Y8..Y11 with the quad of qt at
// (b).
#define QMAC4(b, a0, a1, a2, a3) \
	VMULPS (b), Y8, Y12; \
	VADDPS Y12, a0, a0; \
	VMULPS 32(b), Y9, Y13; \
	VADDPS Y13, a1, a1; \
	VMULPS 64(b), Y10, Y14; \
	VADDPS Y14, a2, a2; \
	VMULPS 96(b), Y11, Y15; \
	VADDPS Y15, a3, a3

#define ZERO8Y \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7

// func mulQAVX2Asm(p, m, qt *float32, rows, cols, ld, r, qb int, mask *[32]int32)
//
// Row by row, ks two at a time while two are left, then one: the row
// streamed once per group against the group's rows of qt (accumulators
// Y0..Y3 and Y4..Y7), folded by FOLD4 into p. qb is the bytes of a row in
// whole quads (128·(cols/32)); mask is nil when cols%32 is 0.
//
// Registers: SI the row of m, DI its p[i,k], R8 rows left, R9 a row of m
// in bytes, R10 a row of qt in bytes, R14 qt's row k, R12 ks left, DX the
// quad's offset, AX its address in qt, BX mask.
TEXT ·mulQAVX2Asm(SB), NOSPLIT, $0-72
	MOVQ p+0(FP), DI
	MOVQ m+8(FP), SI
	MOVQ rows+24(FP), R8
	MOVQ cols+32(FP), R9
	SHLQ $2, R9
	MOVQ ld+40(FP), R10
	SHLQ $2, R10
	MOVQ mask+64(FP), BX

yqrow:
	MOVQ qt+16(FP), R14
	MOVQ r+48(FP), R12

yqk2:
	CMPQ R12, $2
	JLT  yqk1
	ZERO8Y
	XORQ DX, DX

yqk2loop:
	CMPQ DX, qb+56(FP)
	JEQ  yqk2tail
	MLOAD4
	LEAQ (R14)(DX*1), AX
	QMAC4(AX, Y0, Y1, Y2, Y3)
	ADDQ R10, AX
	QMAC4(AX, Y4, Y5, Y6, Y7)
	ADDQ $128, DX
	JMP  yqk2loop

yqk2tail:
	TESTQ BX, BX
	JZ    yqk2fold
	MLOAD4MASKED
	LEAQ  (R14)(DX*1), AX
	QMAC4(AX, Y0, Y1, Y2, Y3)
	ADDQ  R10, AX
	QMAC4(AX, Y4, Y5, Y6, Y7)

yqk2fold:
	FOLD4(Y0, Y1, Y2, Y3, X0, X1)
	FOLD4(Y4, Y5, Y6, Y7, X4, X5)
	VMOVSS X0, (DI)
	VMOVSS X4, 4(DI)
	ADDQ   $8, DI
	LEAQ   (R14)(R10*2), R14
	SUBQ   $2, R12
	JMP    yqk2

yqk1:
	TESTQ  R12, R12
	JZ     yqnext
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ   DX, DX

yqk1loop:
	CMPQ DX, qb+56(FP)
	JEQ  yqk1tail
	MLOAD4
	LEAQ (R14)(DX*1), AX
	QMAC4(AX, Y0, Y1, Y2, Y3)
	ADDQ $128, DX
	JMP  yqk1loop

yqk1tail:
	TESTQ BX, BX
	JZ    yqk1fold
	MLOAD4MASKED
	LEAQ  (R14)(DX*1), AX
	QMAC4(AX, Y0, Y1, Y2, Y3)

yqk1fold:
	FOLD4(Y0, Y1, Y2, Y3, X0, X1)
	VMOVSS X0, (DI)
	ADDQ   $4, DI
	DECQ   R12

yqnext:
	ADDQ R9, SI
	DECQ R8
	JNZ  yqrow
	VZEROUPPER
	RET

// TMAC adds to a0..a3 the products of Y8..Y11 with the broadcast b.
#define TMAC(b, a0, a1, a2, a3) \
	VMULPS b, Y8, Y14; \
	VADDPS Y14, a0, a0; \
	VMULPS b, Y9, Y15; \
	VADDPS Y15, a1, a1; \
	VMULPS b, Y10, Y14; \
	VADDPS Y14, a2, a2; \
	VMULPS b, Y11, Y15; \
	VADDPS Y15, a3, a3

// TADDY adds a0..a3 to the quad of t at (AX) and stores them there.
#define TADDY(a0, a1, a2, a3) \
	VADDPS  (AX), a0, a0; \
	VMOVUPS a0, (AX); \
	VADDPS  32(AX), a1, a1; \
	VMOVUPS a1, 32(AX); \
	VADDPS  64(AX), a2, a2; \
	VMOVUPS a2, 64(AX); \
	VADDPS  96(AX), a3, a3; \
	VMOVUPS a3, 96(AX)

// func mulTPAVX2Asm(t, m, p *float32, n, cols, ld, r, qb int, mask *[32]int32)
//
// Adds the sums over the n rows (a block) of m[i,·]·p[i,k] to t (r×ld, q
// transposed): ks two at a time while two are left, then one, quad of
// columns by quad, the sums from zero in Y0..Y3 (and Y4..Y7), row by row,
// then added to t.
//
// Registers: SI the first row of m, R13 its row of p, R14 p[0,k], DI t's
// row k, R9 a row of m in bytes, R10 a row of p (4r), R12 a row of t, DX
// the quad's offset, AX and CX the running m and p, R8 rows left, BX mask.
TEXT ·mulTPAVX2Asm(SB), NOSPLIT, $0-72
	MOVQ t+0(FP), DI
	MOVQ m+8(FP), SI
	MOVQ p+16(FP), R13
	MOVQ R13, R14
	MOVQ cols+32(FP), R9
	SHLQ $2, R9
	MOVQ ld+40(FP), R12
	SHLQ $2, R12
	MOVQ r+48(FP), R10
	SHLQ $2, R10
	MOVQ mask+64(FP), BX

ytk2:
	MOVQ R14, AX
	SUBQ R13, AX
	ADDQ $8, AX
	CMPQ AX, R10
	JGT  ytk1
	XORQ DX, DX

ytk2quad:
	CMPQ DX, qb+56(FP)
	JLT  ytk2go
	JGT  ytk2next
	TESTQ BX, BX
	JZ   ytk2next

ytk2go:
	ZERO8Y
	LEAQ (SI)(DX*1), AX
	MOVQ R14, CX
	MOVQ n+24(FP), R8

ytk2row:
	CMPQ         DX, qb+56(FP)
	JEQ          ytk2masked
	VMOVUPS      (AX), Y8
	VMOVUPS      32(AX), Y9
	VMOVUPS      64(AX), Y10
	VMOVUPS      96(AX), Y11
	JMP          ytk2mac

ytk2masked:
	VMOVDQU    (BX), Y12
	VMASKMOVPS (AX), Y12, Y8
	VMOVDQU    32(BX), Y13
	VMASKMOVPS 32(AX), Y13, Y9
	VMOVDQU    64(BX), Y14
	VMASKMOVPS 64(AX), Y14, Y10
	VMOVDQU    96(BX), Y15
	VMASKMOVPS 96(AX), Y15, Y11

ytk2mac:
	VBROADCASTSS (CX), Y12
	VBROADCASTSS 4(CX), Y13
	TMAC(Y12, Y0, Y1, Y2, Y3)
	TMAC(Y13, Y4, Y5, Y6, Y7)
	ADDQ         R9, AX
	ADDQ         R10, CX
	DECQ         R8
	JNZ          ytk2row
	LEAQ         (DI)(DX*1), AX
	TADDY(Y0, Y1, Y2, Y3)
	ADDQ         R12, AX
	TADDY(Y4, Y5, Y6, Y7)
	ADDQ         $128, DX
	JMP          ytk2quad

ytk2next:
	LEAQ (DI)(R12*2), DI
	ADDQ $8, R14
	JMP  ytk2

ytk1:
	MOVQ R14, AX
	SUBQ R13, AX
	CMPQ AX, R10
	JGE  ytdone
	XORQ DX, DX

ytk1quad:
	CMPQ  DX, qb+56(FP)
	JLT   ytk1go
	JGT   ytdone
	TESTQ BX, BX
	JZ    ytdone

ytk1go:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	LEAQ   (SI)(DX*1), AX
	MOVQ   R14, CX
	MOVQ   n+24(FP), R8

ytk1row:
	CMPQ    DX, qb+56(FP)
	JEQ     ytk1masked
	VMOVUPS (AX), Y8
	VMOVUPS 32(AX), Y9
	VMOVUPS 64(AX), Y10
	VMOVUPS 96(AX), Y11
	JMP     ytk1mac

ytk1masked:
	VMOVDQU    (BX), Y12
	VMASKMOVPS (AX), Y12, Y8
	VMOVDQU    32(BX), Y13
	VMASKMOVPS 32(AX), Y13, Y9
	VMOVDQU    64(BX), Y14
	VMASKMOVPS 64(AX), Y14, Y10
	VMOVDQU    96(BX), Y15
	VMASKMOVPS 96(AX), Y15, Y11

ytk1mac:
	VBROADCASTSS (CX), Y12
	TMAC(Y12, Y0, Y1, Y2, Y3)
	ADDQ         R9, AX
	ADDQ         R10, CX
	DECQ         R8
	JNZ          ytk1row
	LEAQ         (DI)(DX*1), AX
	TADDY(Y0, Y1, Y2, Y3)
	ADDQ         $128, DX
	JMP          ytk1quad

ytdone:
	VZEROUPPER
	RET

// DMAC adds to a0..a3 the products of the quad at (b) with the
// broadcast Y8.
#define DMAC(b, a0, a1, a2, a3) \
	VMULPS (b), Y8, Y12; \
	VADDPS Y12, a0, a0; \
	VMULPS 32(b), Y8, Y13; \
	VADDPS Y13, a1, a1; \
	VMULPS 64(b), Y8, Y14; \
	VADDPS Y14, a2, a2; \
	VMULPS 96(b), Y8, Y15; \
	VADDPS Y15, a3, a3

// DMUL sets a0..a3 to the products of the quad at (b) with Y8.
#define DMUL(b, a0, a1, a2, a3) \
	VMULPS (b), Y8, a0; \
	VMULPS 32(b), Y8, a1; \
	VMULPS 64(b), Y8, a2; \
	VMULPS 96(b), Y8, a3

// func decomposeAVX2Asm(out, res, m, p, qa, qo *float32, rows, stride, ld, r, qb int, mask *[32]int32, ntqb int)
//
// Row by row, quad of columns by quad: the sums over k of p[i,k]·qa[k,·]
// (Y0..Y3) and p[i,k]·qo[k,·] (Y4..Y7), then out = the first (qa holds
// scale·qAvg), res = m − the second; m's quad is loaded before res's is
// stored, so res may be m. The whole quads below offset ntqb of out are
// stored non-temporally (32-byte aligned), the rest through the cache; the
// tail's through the masks.
//
// Registers: DI, R13, SI the rows of out, res, m; R14 the row of p; R8
// rows left; R9 stride; R10 a row of qt in bytes; DX the quad's offset;
// AX, R11 the running qa and qo; CX ks left; R12 the running p[i,k]; BX
// mask.
TEXT ·decomposeAVX2Asm(SB), NOSPLIT, $0-104
	MOVQ out+0(FP), DI
	MOVQ res+8(FP), R13
	MOVQ m+16(FP), SI
	MOVQ p+24(FP), R14
	MOVQ rows+48(FP), R8
	MOVQ stride+56(FP), R9
	MOVQ ld+64(FP), R10
	SHLQ $2, R10
	MOVQ mask+88(FP), BX

ydrow:
	XORQ DX, DX

ydquad:
	CMPQ  DX, qb+80(FP)
	JLT   ydgo
	JGT   ydnext
	TESTQ BX, BX
	JZ    ydnext

ydgo:
	MOVQ         qa+32(FP), AX
	ADDQ         DX, AX
	MOVQ         qo+40(FP), R11
	ADDQ         DX, R11
	MOVQ         R14, R12
	MOVQ         r+72(FP), CX
	VBROADCASTSS (R12), Y8
	DMUL(AX, Y0, Y1, Y2, Y3)
	DMUL(R11, Y4, Y5, Y6, Y7)
	DECQ         CX
	JZ           ydend

ydstep:
	ADDQ         R10, AX
	ADDQ         R10, R11
	ADDQ         $4, R12
	VBROADCASTSS (R12), Y8
	DMAC(AX, Y0, Y1, Y2, Y3)
	DMAC(R11, Y4, Y5, Y6, Y7)
	DECQ         CX
	JNZ          ydstep

ydend:
	CMPQ    DX, qb+80(FP)
	JEQ     ydtail
	VMOVUPS (SI)(DX*1), Y8
	VMOVUPS 32(SI)(DX*1), Y9
	VMOVUPS 64(SI)(DX*1), Y10
	VMOVUPS 96(SI)(DX*1), Y11
	VSUBPS  Y4, Y8, Y8
	VSUBPS  Y5, Y9, Y9
	VSUBPS  Y6, Y10, Y10
	VSUBPS  Y7, Y11, Y11
	VMOVUPS Y8, (R13)(DX*1)
	VMOVUPS Y9, 32(R13)(DX*1)
	VMOVUPS Y10, 64(R13)(DX*1)
	VMOVUPS Y11, 96(R13)(DX*1)
	CMPQ    DX, ntqb+96(FP)
	JGE     ydcached
	VMOVNTPS Y0, (DI)(DX*1)
	VMOVNTPS Y1, 32(DI)(DX*1)
	VMOVNTPS Y2, 64(DI)(DX*1)
	VMOVNTPS Y3, 96(DI)(DX*1)
	ADDQ     $128, DX
	JMP      ydquad

ydcached:
	VMOVUPS Y0, (DI)(DX*1)
	VMOVUPS Y1, 32(DI)(DX*1)
	VMOVUPS Y2, 64(DI)(DX*1)
	VMOVUPS Y3, 96(DI)(DX*1)
	ADDQ    $128, DX
	JMP     ydquad

ydtail:
	VMOVDQU    (BX), Y12
	VMOVDQU    32(BX), Y13
	VMOVDQU    64(BX), Y14
	VMOVDQU    96(BX), Y15
	VMASKMOVPS (SI)(DX*1), Y12, Y8
	VMASKMOVPS 32(SI)(DX*1), Y13, Y9
	VMASKMOVPS 64(SI)(DX*1), Y14, Y10
	VMASKMOVPS 96(SI)(DX*1), Y15, Y11
	VSUBPS     Y4, Y8, Y8
	VSUBPS     Y5, Y9, Y9
	VSUBPS     Y6, Y10, Y10
	VSUBPS     Y7, Y11, Y11
	VMASKMOVPS Y8, Y12, (R13)(DX*1)
	VMASKMOVPS Y9, Y13, 32(R13)(DX*1)
	VMASKMOVPS Y10, Y14, 64(R13)(DX*1)
	VMASKMOVPS Y11, Y15, 96(R13)(DX*1)
	VMASKMOVPS Y0, Y12, (DI)(DX*1)
	VMASKMOVPS Y1, Y13, 32(DI)(DX*1)
	VMASKMOVPS Y2, Y14, 64(DI)(DX*1)
	VMASKMOVPS Y3, Y15, 96(DI)(DX*1)

ydnext:
	ADDQ R9, DI
	ADDQ R9, R13
	ADDQ R9, SI
	MOVQ r+72(FP), AX
	LEAQ (R14)(AX*4), R14
	DECQ R8
	JNZ  ydrow
	SFENCE
	VZEROUPPER
	RET

// func sumAVX2Asm(x *float32, n int) float32
//
// The sum of n floats, n a positive multiple of 32, in four accumulators:
// the benchmarks' yardstick of one read of a matrix.
TEXT ·sumAVX2Asm(SB), NOSPLIT, $0-20
	MOVQ   x+0(FP), SI
	MOVQ   n+8(FP), CX
	SHRQ   $5, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

ysloop:
	VADDPS (SI), Y0, Y0
	VADDPS 32(SI), Y1, Y1
	VADDPS 64(SI), Y2, Y2
	VADDPS 96(SI), Y3, Y3
	ADDQ   $128, SI
	DECQ   CX
	JNZ    ysloop
	FOLD4(Y0, Y1, Y2, Y3, X0, X1)
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET
