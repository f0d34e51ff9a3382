//go:build !purego

#include "textflag.h"

// HINC2(R, T, A, B) counts the two top digits in the 32-bit halves of R:
// the low one in the histogram at A, the high one in the one at B (T is
// scratch).
#define HINC2(R, T, A, B) \
	MOVL R, T; \
	SHRQ $32, R; \
	INCL A(T*4); \
	INCL B(R*4)

// func histTopAsm(h *[histBins]uint32, vals []float32)
//
// Element i of each group of 8 counts into one of four histograms by i mod
// 4: h itself and three on the stack, cleared first and added into h at the
// end. A run of equal digits thus waits on a store every fourth element
// only (all-zero input: one bin). The digits are computed 8 at a time and
// moved to general registers two per quadword.
TEXT ·histTopAsm(SB), $24576-32
	MOVQ   h+0(FP), DI
	MOVQ   vals_base+8(FP), SI
	MOVQ   vals_len+16(FP), CX
	MOVQ   SP, R13             // three histograms of histBins uint32
	VPXOR  Y0, Y0, Y0
	MOVQ   R13, AX
	MOVQ   $768, BX            // 24 KiB / 32 bytes

clear:
	VMOVDQU Y0, (AX)
	ADDQ    $32, AX
	DECQ    BX
	JNZ     clear
	SHRQ    $3, CX

loop:
	VMOVDQU      (SI), Y0
	VPSLLD       $1, Y0, Y0     // drop the sign
	VPSRLD       $21, Y0, Y0    // key>>20
	VMOVQ        X0, AX
	VPEXTRQ      $1, X0, BX
	VEXTRACTI128 $1, Y0, X1
	VMOVQ        X1, DX
	VPEXTRQ      $1, X1, R8
	HINC2(AX, R9, (DI), (R13))
	HINC2(BX, R10, 8192(R13), 16384(R13))
	HINC2(DX, R11, (DI), (R13))
	HINC2(R8, R12, 8192(R13), 16384(R13))
	ADDQ         $32, SI
	DECQ         CX
	JNZ          loop

	MOVQ $256, BX // histBins / 8

fold:
	VMOVDQU (DI), Y0
	VPADDD  (R13), Y0, Y0
	VPADDD  8192(R13), Y0, Y0
	VPADDD  16384(R13), Y0, Y0
	VMOVDQU Y0, (DI)
	ADDQ    $32, DI
	ADDQ    $32, R13
	DECQ    BX
	JNZ     fold
	VZEROUPPER
	RET

// ABOVE32 sets Y0–Y3 to the masks key > t − 1 of the 32 elements at SI
// (Y14 = 0x7fffffff, Y15 = t − 1 in every lane) and ZF when none is set:
// a signed compare, since keys are below 2^31 and t = 0 gives −1, below
// every key.
#define ABOVE32 \
	VPAND    (SI), Y14, Y0; \
	VPAND    32(SI), Y14, Y1; \
	VPAND    64(SI), Y14, Y2; \
	VPAND    96(SI), Y14, Y3; \
	VPCMPGTD Y15, Y0, Y0; \
	VPCMPGTD Y15, Y1, Y1; \
	VPCMPGTD Y15, Y2, Y2; \
	VPCMPGTD Y15, Y3, Y3; \
	VPOR     Y1, Y0, Y4; \
	VPOR     Y3, Y2, Y5; \
	VPOR     Y5, Y4, Y4; \
	VPTEST   Y4, Y4

// MASK32 gathers ABOVE32's masks into the bits of AX, element i in bit i
// (BX is scratch).
#define MASK32 \
	VMOVMSKPS Y0, AX; \
	VMOVMSKPS Y1, BX; \
	SHLL      $8, BX; \
	ORL       BX, AX; \
	VMOVMSKPS Y2, BX; \
	SHLL      $16, BX; \
	ORL       BX, AX; \
	VMOVMSKPS Y3, BX; \
	SHLL      $24, BX; \
	ORL       BX, AX

// KEYS32 is ABOVE32 of the 32 elements in Y0–Y3 (which it replaces by
// the masks) rather than in memory.
#define KEYS32 \
	VPAND    Y0, Y14, Y0; \
	VPAND    Y1, Y14, Y1; \
	VPAND    Y2, Y14, Y2; \
	VPAND    Y3, Y14, Y3; \
	VPCMPGTD Y15, Y0, Y0; \
	VPCMPGTD Y15, Y1, Y1; \
	VPCMPGTD Y15, Y2, Y2; \
	VPCMPGTD Y15, Y3, Y3; \
	VPOR     Y1, Y0, Y4; \
	VPOR     Y3, Y2, Y5; \
	VPOR     Y5, Y4, Y4; \
	VPTEST   Y4, Y4

// COLLECT32 writes the hits of the step at SI whose masks ABOVE32 or
// KEYS32 left in Y0–Y3, in index order by their mask bits: for each, its
// input index (R9 + bit) to (DI) and its value to (DX), advancing both,
// one more count in the histogram at R12 for its top digit and one slot
// less of room in R8 (AX, BX, R10 and R11 are scratch). It then jumps to
// next.
#define COLLECT32 \
	MASK32; \
bit: \
	BSFL AX, BX; \
	MOVL (SI)(BX*4), R10; \
	LEAL (R9)(BX*1), R11; \
	MOVL R11, (DI); \
	MOVL R10, (DX); \
	SHLL $1, R10; \
	SHRL $21, R10; \
	INCL (R12)(R10*4); \
	ADDQ $4, DI; \
	ADDQ $4, DX; \
	DECQ R8; \
	LEAL -1(AX), BX; \
	ANDL BX, AX; \
	JNZ  bit; \
	JMP  next

// SETT sets Y14 and Y15 for ABOVE32 from t in AX.
#define SETT \
	DECL         AX; \
	VMOVD        AX, X15; \
	VPBROADCASTD X15, Y15; \
	VPCMPEQD     Y14, Y14, Y14; \
	VPSRLD       $1, Y14, Y14

// func collectAsm(h *[histBins]uint32, pos []uint32, vals []float32, x []float32, base, t uint32) (read, wrote int)
//
// 32 elements per step (ABOVE32); only a step with a hit goes through its
// hits, in index order by their mask bits.
TEXT ·collectAsm(SB), NOSPLIT, $0-104
	MOVQ    h+0(FP), R12
	MOVQ    pos_base+8(FP), DI
	MOVQ    pos_len+16(FP), R8
	MOVQ    vals_base+32(FP), DX
	MOVQ    vals_len+40(FP), AX
	CMPQ    AX, R8
	CMOVQLT AX, R8            // room
	MOVQ    x_base+56(FP), SI
	MOVQ    x_len+64(FP), CX
	MOVL    base+80(FP), R9   // input index of (SI)
	MOVL    t+84(FP), AX
	SETT

loop:
	CMPQ CX, $32
	JB   done
	CMPQ R8, $32
	JB   done
	ABOVE32
	JNZ  hits

next:
	ADDQ $128, SI
	ADDL $32, R9
	SUBQ $32, CX
	JMP  loop

hits:
	COLLECT32

done:
	SUBQ x_base+56(FP), SI
	SHRQ $2, SI
	MOVQ SI, read+88(FP)
	SUBQ pos_base+8(FP), DI
	SHRQ $2, DI
	MOVQ DI, wrote+96(FP)
	VZEROUPPER
	RET

// func addCollectAsm(h *[histBins]uint32, pos []uint32, vals []float32, x, e, g []float32, base, t uint32) (read, wrote int)
//
// collectAsm that first sets each step of x to e + g (VADDPS, rounded
// once as addGeneric's float32 addition) and tests the sums while they
// are in registers: error feedback's sum is written and selected from in
// one pass, the step's loads of e and g overlapping the tests of the last.
TEXT ·addCollectAsm(SB), NOSPLIT, $0-152
	MOVQ    h+0(FP), R12
	MOVQ    pos_base+8(FP), DI
	MOVQ    pos_len+16(FP), R8
	MOVQ    vals_base+32(FP), DX
	MOVQ    vals_len+40(FP), AX
	CMPQ    AX, R8
	CMOVQLT AX, R8            // room
	MOVQ    x_base+56(FP), SI
	MOVQ    x_len+64(FP), CX
	MOVQ    e_base+80(FP), R13
	MOVQ    g_base+104(FP), R14
	MOVL    base+128(FP), R9  // input index of (SI)
	MOVL    t+132(FP), AX
	SETT

loop:
	CMPQ    CX, $32
	JB      done
	CMPQ    R8, $32
	JB      done
	VMOVUPS (R13), Y0
	VMOVUPS 32(R13), Y1
	VMOVUPS 64(R13), Y2
	VMOVUPS 96(R13), Y3
	VADDPS  (R14), Y0, Y0
	VADDPS  32(R14), Y1, Y1
	VADDPS  64(R14), Y2, Y2
	VADDPS  96(R14), Y3, Y3
	VMOVUPS Y0, (SI)
	VMOVUPS Y1, 32(SI)
	VMOVUPS Y2, 64(SI)
	VMOVUPS Y3, 96(SI)
	KEYS32
	JNZ     hits

next:
	ADDQ $128, SI
	ADDQ $128, R13
	ADDQ $128, R14
	ADDL $32, R9
	SUBQ $32, CX
	JMP  loop

hits:
	COLLECT32

done:
	SUBQ x_base+56(FP), SI
	SHRQ $2, SI
	MOVQ SI, read+136(FP)
	SUBQ pos_base+8(FP), DI
	SHRQ $2, DI
	MOVQ DI, wrote+144(FP)
	VZEROUPPER
	RET

// func histAtLeastAsm(h *[histBins]uint32, vals []float32, t uint32) (counted int)
//
// 32 elements per step (ABOVE32); only a step with a hit counts the top
// digits of its hits.
TEXT ·histAtLeastAsm(SB), NOSPLIT, $0-48
	MOVQ h+0(FP), DI
	MOVQ vals_base+8(FP), SI
	MOVQ vals_len+16(FP), CX
	MOVL t+32(FP), AX
	SETT
	XORQ R8, R8

loop:
	ABOVE32
	JNZ hits

next:
	ADDQ $128, SI
	SUBQ $32, CX
	JNZ  loop
	MOVQ R8, counted+40(FP)
	VZEROUPPER
	RET

hits:
	MASK32

bit:
	BSFL AX, BX
	MOVL (SI)(BX*4), R10
	SHLL $1, R10
	SHRL $21, R10
	INCL (DI)(R10*4)
	INCQ R8
	LEAL -1(AX), BX
	ANDL BX, AX
	JNZ  bit
	JMP  next
