//go:build !purego

#include "go_asm.h"
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
//
// 32 elements per iteration while they last, their minimum and maximum
// taken as a tree so that the running ones wait on one instruction each,
// then 8 at a time.
TEXT ·rangeAVX2(SB), NOSPLIT, $0-33
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	VMOVUPS (SI), Y0          // running minimum
	VMOVAPS Y0, Y1            // running maximum
	VCMPPS  $3, Y0, Y0, Y2    // lanes that saw a NaN (unordered)
	ADDQ    $32, SI
	SUBQ    $8, CX

loop32:
	CMPQ    CX, $32
	JB      loop8
	VMOVUPS (SI), Y3
	VMOVUPS 32(SI), Y4
	VMOVUPS 64(SI), Y5
	VMOVUPS 96(SI), Y6
	VMINPS  Y4, Y3, Y7
	VMAXPS  Y4, Y3, Y8
	VCMPPS  $3, Y4, Y3, Y9 // unordered: either is a NaN
	VMINPS  Y6, Y5, Y10
	VMAXPS  Y6, Y5, Y11
	VCMPPS  $3, Y6, Y5, Y12
	VMINPS  Y10, Y7, Y7
	VMAXPS  Y11, Y8, Y8
	VORPS   Y12, Y9, Y9
	VMINPS  Y7, Y0, Y0
	VMAXPS  Y8, Y1, Y1
	VORPS   Y9, Y2, Y2
	ADDQ    $128, SI
	SUBQ    $32, CX
	JMP     loop32

loop8:
	TESTQ   CX, CX
	JZ      reduce
	VMOVUPS (SI), Y3
	VMINPS  Y3, Y0, Y0
	VMAXPS  Y3, Y1, Y1
	VCMPPS  $3, Y3, Y3, Y4
	VORPS   Y4, Y2, Y2
	ADDQ    $32, SI
	SUBQ    $8, CX
	JMP     loop8

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

// func quantAsm(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool)
//
// Each group of 8 elements becomes 8 codes, one per byte of X3 (QPRE, then
// QRAND or QHALF, then QPOST), then 8, 4 or 2 bytes of out by the width:
// one loop per width and rounding mode, 32 elements a step while they last
// and then 8.
TEXT ·quantAsm(SB), NOSPLIT, $0-81
	MOVQ         out_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	VBROADCASTSS lo+48(FP), Y0
	VBROADCASTSS inv+52(FP), Y1
	MOVL         levels+56(FP), AX
	VMOVD        AX, X2
	VPBROADCASTD X2, Y2
	VMOVDQU      packOrder<>(SB), Y7
	MOVQ         bits+64(FP), AX
	MOVBLZX      nearest+80(FP), DX
	TESTL        DX, DX
	JNZ          nearest
	MOVL         ctr+72(FP), DX
	VMOVD        DX, X10
	VPBROADCASTD X10, Y10
	VPADDD       laneWeyl<>(SB), Y10, Y10 // ctr + k·0x9e3779b9 in lane k
	MOVL         k1+76(FP), DX
	VMOVD        DX, X11
	VPBROADCASTD X11, Y11
	VPBROADCASTD lane32M1<>(SB), Y12
	VPBROADCASTD lane32M2<>(SB), Y13
	VPBROADCASTD laneWeyl8<>(SB), Y14
	VBROADCASTSS twoPow24<>(SB), Y8
	CMPQ         AX, $8
	JEQ          rand8
	CMPQ         AX, $4
	JEQ          rand4
	JMP          rand2

nearest:
	VBROADCASTSS half<>(SB), Y8
	VBROADCASTSS one<>(SB), Y9
	CMPQ         AX, $8
	JEQ          half8
	CMPQ         AX, $4
	JEQ          half4
	JMP          half2

// QPRE sets Y3 to t = (x − lo)·inv of the 8 elements at SI and advances SI.
#define QPRE \
	VMOVUPS (SI), Y3; \
	VSUBPS  Y0, Y3, Y3; \
	VMULPS  Y1, Y3, Y3; \
	ADDQ    $32, SI

// QRAND adds r = u·2^-24 to Y3, u the top 24 bits of draw32 of the
// counters x = i·0x9e3779b9 + k0 in Y10 (rng.go's hash32), and advances the
// counters by 8·0x9e3779b9.
// The product u·2^-24 is exact, so the fused add rounds as an add does.
// QRANDR(R) is QRAND into register R.
#define QRANDR(R) \
	VPSRLD      $16, Y10, Y9; \
	VPXOR       Y10, Y9, Y9; \
	VPMULLD     Y12, Y9, Y9; \
	VPSRLD      $15, Y9, Y15; \
	VPXOR       Y15, Y9, Y9; \
	VPXOR       Y11, Y9, Y9; \
	VPMULLD     Y13, Y9, Y9; \
	VPSRLD      $16, Y9, Y15; \
	VPXOR       Y15, Y9, Y9; \
	VPSRLD      $8, Y9, Y9; \
	VCVTDQ2PS   Y9, Y9; \
	VFMADD231PS Y8, Y9, R; \
	VPADDD      Y14, Y10, Y10

#define QRAND QRANDR(Y3)

// QHALF adds r = 0.5 to Y3.
#define QHALF \
	VADDPS Y8, Y3, Y3

// QPOST truncates Y3, clamps to L and narrows the 8 codes to the low 8
// bytes of X3.
#define QPOST \
	VCVTTPS2DQ   Y3, Y3; \
	VPMINSD      Y2, Y3, Y3; \
	VEXTRACTI128 $1, Y3, X4; \
	VPACKUSDW    X4, X3, X3; \
	VPACKUSWB    X3, X3, X3

// ST8, ST4 and ST2 store the codes in X3 at 8, 4 or 2 bits each.
#define ST8 \
	VMOVQ X3, (DI); \
	ADDQ  $8, DI; \
	SUBQ  $8, CX

#define ST4 \
	VPMADDUBSW packNibbles<>(SB), X3, X3; \
	VPACKUSWB  X3, X3, X3; \
	VMOVD      X3, (DI); \
	ADDQ       $4, DI; \
	SUBQ       $8, CX

#define ST2 \
	VPMADDUBSW packCrumbs<>(SB), X3, X3; \
	VPMADDWD   packCrumbPairs<>(SB), X3, X3; \
	VPACKUSDW  X3, X3, X3; \
	VPACKUSWB  X3, X3, X3; \
	VMOVD      X3, AX; \
	MOVW       AX, (DI); \
	ADDQ       $2, DI; \
	SUBQ       $8, CX

// The 32-element steps: Y3, Y4, Y5, Y6 hold x of 8 elements each (QLOAD4),
// then t (QSUB4 or QSUBF4, then QMUL4), then r is added to each (QRANDR or
// QHALF4), then QCVT4 truncates them, QMIN4 clamps them to L and QPACK4
// narrows them to 32 bytes of Y3 in element order (VPERMD by Y7 = dwords
// 0, 4, 1, 5, 2, 6, 3, 7 undoes the packs' lane interleave), which ST32x8,
// ST32x4 and ST32x2 store at 8, 4 and 2 bits each. At 8 bits the packs'
// unsigned saturation clamps to L = 255, so QMIN4 is left out.
//
// QLOAD4 prefetches 8 KiB ahead: memory serves the buckets to come while
// this one is quantized from L1, which at 512-element buckets overlapped
// memory and compute better than a prefetch in the range pass, and
// quantRunAVX2, which takes the next bucket's range before it quantizes
// this one, does best with 8 KiB rather than 4 (measured on the AVX2
// EPYC).
#define QLOAD4 \
	VMOVUPS    (SI), Y3; \
	VMOVUPS    32(SI), Y4; \
	VMOVUPS    64(SI), Y5; \
	VMOVUPS    96(SI), Y6; \
	PREFETCHT0 8192(SI); \
	PREFETCHT0 8256(SI); \
	ADDQ       $128, SI

#define QSUB4 \
	VSUBPS Y0, Y3, Y3; \
	VSUBPS Y0, Y4, Y4; \
	VSUBPS Y0, Y5, Y5; \
	VSUBPS Y0, Y6, Y6

// QSUBF4 is QSUB4 as x·1 − lo in the multiply-add units (Y9 = 1): the
// product is exact, so it rounds as the subtraction does, and it leaves the
// adders to QHALF4 and the conversions.
#define QSUBF4 \
	VFMSUB132PS Y9, Y0, Y3; \
	VFMSUB132PS Y9, Y0, Y4; \
	VFMSUB132PS Y9, Y0, Y5; \
	VFMSUB132PS Y9, Y0, Y6

#define QMUL4 \
	VMULPS Y1, Y3, Y3; \
	VMULPS Y1, Y4, Y4; \
	VMULPS Y1, Y5, Y5; \
	VMULPS Y1, Y6, Y6

#define QRAND4 \
	QRANDR(Y3); \
	QRANDR(Y4); \
	QRANDR(Y5); \
	QRANDR(Y6)

#define QHALF4 \
	VADDPS Y8, Y3, Y3; \
	VADDPS Y8, Y4, Y4; \
	VADDPS Y8, Y5, Y5; \
	VADDPS Y8, Y6, Y6

#define QCVT4 \
	VCVTTPS2DQ Y3, Y3; \
	VCVTTPS2DQ Y4, Y4; \
	VCVTTPS2DQ Y5, Y5; \
	VCVTTPS2DQ Y6, Y6

#define QMIN4 \
	VPMINSD Y2, Y3, Y3; \
	VPMINSD Y2, Y4, Y4; \
	VPMINSD Y2, Y5, Y5; \
	VPMINSD Y2, Y6, Y6

#define QPACK4 \
	VPACKUSDW Y4, Y3, Y3; \
	VPACKUSDW Y6, Y5, Y5; \
	VPACKUSWB Y5, Y3, Y3; \
	VPERMD    Y3, Y7, Y3

#define ST32x8 \
	VMOVDQU Y3, (DI); \
	ADDQ    $32, DI; \
	SUBQ    $32, CX

// Nibbles: bytes (c0 + 16·c1) in the low 8 bytes of each lane, then
// qwords 0 and 2 to X3.
#define ST32x4 \
	VPBROADCASTQ packNibbles<>(SB), Y4; \
	VPMADDUBSW   Y4, Y3, Y3; \
	VPACKUSWB    Y3, Y3, Y3; \
	VPERMQ       $0x08, Y3, Y3; \
	VMOVDQU      X3, (DI); \
	ADDQ         $16, DI; \
	SUBQ         $32, CX

// Crumbs: one byte per 4 codes, dwords 0-3 of each lane, then dwords 0
// and 4 (Y7's first two) to X3.
#define ST32x2 \
	VPBROADCASTQ packCrumbs<>(SB), Y4; \
	VPMADDUBSW   Y4, Y3, Y3; \
	VPBROADCASTQ packCrumbPairs<>(SB), Y4; \
	VPMADDWD     Y4, Y3, Y3; \
	VPACKUSDW    Y3, Y3, Y3; \
	VPACKUSWB    Y3, Y3, Y3; \
	VPERMD       Y3, Y7, Y3; \
	VMOVQ        X3, (DI); \
	ADDQ         $8, DI; \
	SUBQ         $32, CX

rand8:
	CMPQ CX, $32
	JB   rand8t

rand8x:
	QLOAD4
	QSUB4
	QMUL4
	QRAND4
	QCVT4
	QPACK4
	ST32x8
	CMPQ   CX, $32
	JAE    rand8x

rand8t:
	TESTQ CX, CX
	JZ    done
	QPRE
	QRAND
	QPOST
	ST8
	JMP   rand8t

rand4:
	CMPQ CX, $32
	JB   rand4t

rand4x:
	QLOAD4
	QSUB4
	QMUL4
	QRAND4
	QCVT4
	QMIN4
	QPACK4
	ST32x4
	CMPQ   CX, $32
	JAE    rand4x

rand4t:
	TESTQ CX, CX
	JZ    done
	QPRE
	QRAND
	QPOST
	ST4
	JMP   rand4t

rand2:
	CMPQ CX, $32
	JB   rand2t

rand2x:
	QLOAD4
	QSUB4
	QMUL4
	QRAND4
	QCVT4
	QMIN4
	QPACK4
	ST32x2
	CMPQ   CX, $32
	JAE    rand2x

rand2t:
	TESTQ CX, CX
	JZ    done
	QPRE
	QRAND
	QPOST
	ST2
	JMP   rand2t

half8:
	CMPQ CX, $32
	JB   half8t

half8x:
	QLOAD4
	QSUBF4
	QMUL4
	QHALF4
	QCVT4
	QPACK4
	ST32x8
	CMPQ   CX, $32
	JAE    half8x

half8t:
	TESTQ CX, CX
	JZ    done
	QPRE
	QHALF
	QPOST
	ST8
	JMP   half8t

half4:
	CMPQ CX, $32
	JB   half4t

half4x:
	QLOAD4
	QSUBF4
	QMUL4
	QHALF4
	QCVT4
	QMIN4
	QPACK4
	ST32x4
	CMPQ   CX, $32
	JAE    half4x

half4t:
	TESTQ CX, CX
	JZ    done
	QPRE
	QHALF
	QPOST
	ST4
	JMP   half4t

half2:
	CMPQ CX, $32
	JB   half2t

half2x:
	QLOAD4
	QSUBF4
	QMUL4
	QHALF4
	QCVT4
	QMIN4
	QPACK4
	ST32x2
	CMPQ   CX, $32
	JAE    half2x

half2t:
	TESTQ CX, CX
	JZ    done
	QPRE
	QHALF
	QPOST
	ST2
	JMP   half2t

done:
	VZEROUPPER
	RET

// packOrder is the VPERMD index that puts the dwords of a lane-wise pack
// of four vectors back in element order.
DATA packOrder<>+0(SB)/4, $0
DATA packOrder<>+4(SB)/4, $4
DATA packOrder<>+8(SB)/4, $1
DATA packOrder<>+12(SB)/4, $5
DATA packOrder<>+16(SB)/4, $2
DATA packOrder<>+20(SB)/4, $6
DATA packOrder<>+24(SB)/4, $3
DATA packOrder<>+28(SB)/4, $7
GLOBL packOrder<>(SB), RODATA|NOPTR, $32

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
DATA half<>+0(SB)/4, $0x3f000000 // float32 0.5
GLOBL half<>(SB), RODATA|NOPTR, $4
DATA one<>+0(SB)/4, $0x3f800000 // float32 1
GLOBL one<>(SB), RODATA|NOPTR, $4

// The constants of draw32 (rng.go): the counter offsets k·0x9e3779b9 of
// lanes k = 0..7, the step 8·0x9e3779b9, the two multipliers.
DATA laneWeyl<>+0(SB)/4, $0x00000000
DATA laneWeyl<>+4(SB)/4, $0x9e3779b9
DATA laneWeyl<>+8(SB)/4, $0x3c6ef372
DATA laneWeyl<>+12(SB)/4, $0xdaa66d2b
DATA laneWeyl<>+16(SB)/4, $0x78dde6e4
DATA laneWeyl<>+20(SB)/4, $0x1715609d
DATA laneWeyl<>+24(SB)/4, $0xb54cda56
DATA laneWeyl<>+28(SB)/4, $0x5384540f
GLOBL laneWeyl<>(SB), RODATA|NOPTR, $32
DATA laneWeyl8<>+0(SB)/4, $0xf1bbcdc8
GLOBL laneWeyl8<>(SB), RODATA|NOPTR, $4
DATA lane32M1<>+0(SB)/4, $0x7feb352d
GLOBL lane32M1<>(SB), RODATA|NOPTR, $4
DATA lane32M2<>+0(SB)/4, $0x846ca68b
GLOBL lane32M2<>(SB), RODATA|NOPTR, $4

// DEQSTORE turns the 8 codes in the dwords of Y3 into lo + c·scale (Y0,
// Y1), adds the 8 floats at DI if R9 (add) is set, stores them at DI and
// advances DI. It prefetches out 2 KiB ahead: the hardware prefetcher
// alone keeps too few of dst's lines in flight beside the codes' stream
// (DecompressAdd at 64M: int8 and int2 3–15% faster, measured on the AVX2
// EPYC); unsignAsm does the same.
#define DEQSTORE \
	VCVTDQ2PS  Y3, Y3; \
	VMULPS     Y1, Y3, Y3; \
	VADDPS     Y0, Y3, Y3; \
	TESTQ      R9, R9; \
	JZ         2(PC); \
	VADDPS     (DI), Y3, Y3; \
	PREFETCHT0 2048(DI); \
	VMOVUPS    Y3, (DI); \
	ADDQ       $32, DI

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

// func addAsm(dst, a, b []float32)
TEXT ·addAsm(SB), NOSPLIT, $0-72
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ a_base+24(FP), SI
	MOVQ b_base+48(FP), DX

aloop:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	SUBQ    $8, CX
	JNZ     aloop
	VZEROUPPER
	RET

// func subAsm(res, src []float32)
TEXT ·subAsm(SB), NOSPLIT, $0-48
	MOVQ res_base+0(FP), DI
	MOVQ res_len+8(FP), CX
	MOVQ src_base+24(FP), SI

subloop:
	VMOVUPS (SI), Y0
	VSUBPS  (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JNZ     subloop
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
	PREFETCHT0   2048(DI)
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

// FOLD(K, A, B, T) sets A to B ⊕ A·x^D, congruent modulo the polynomial,
// lane by lane, where K holds x^(D+32) and x^(D−32) (see clmulKeys): the
// first qword of a lane (the higher powers, bit-reflected) times the first
// key, the second times the second. T is scratch.
#define FOLD(K, A, B, T) \
	VPCLMULQDQ $0x00, K, A, T; \
	VPCLMULQDQ $0x11, K, A, A; \
	VPXOR      B, T, T; \
	VPXOR      T, A, A

// CRCREDUCE sets AX to the CRC32C state (not yet inverted) after the
// message that the accumulators A0..A3 hold folded, as the last 128 bytes
// (A2, A3 are also XA2, XA3): the four fold onto the last 32 bytes and its
// two lanes onto one 128-bit R, which is congruent to the message (the
// initial state xored into its first 4 bytes) modulo the polynomial, and
// the CRC32 instruction finishes: its state, from 0, after R as 16 bytes
// is the one after the message. It clobbers BX and DX.
#define CRCREDUCE(A0, A1, A2, A3, XA2, XA3) \
	VMOVDQU      ·clmulKeys+32(SB), Y4; \
	FOLD(Y4, A0, A3, Y5); \
	VMOVDQU      ·clmulKeys+64(SB), Y4; \
	FOLD(Y4, A1, A0, Y5); \
	VMOVDQU      ·clmulKeys+96(SB), Y4; \
	FOLD(Y4, A2, A1, Y5); \
	VEXTRACTI128 $1, A2, XA3; \
	VMOVDQU      ·clmulKeys+128(SB), X4; \
	FOLD(X4, XA2, XA3, X5); \
	VMOVQ        XA2, BX; \
	VPEXTRQ      $1, XA2, DX; \
	XORL         AX, AX; \
	CRC32Q       BX, AX; \
	CRC32Q       DX, AX

// func crcFoldAsm(crc uint32, p []byte) uint32
//
// crc32.Update(crc, castagnoli, p) for len(p) a positive multiple of 128.
// Four YMM accumulators take 128 bytes per iteration (8 independent
// carry-less multiplies), each folded 1024 bits forward onto the next
// 128 bytes; CRCREDUCE finishes.
TEXT ·crcFoldAsm(SB), NOSPLIT, $0-36
	MOVL    crc+0(FP), AX
	NOTL    AX
	MOVQ    p_base+8(FP), SI
	MOVQ    p_len+16(FP), CX
	VMOVD   AX, X0
	VPXOR   (SI), Y0, Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVDQU ·clmulKeys+0(SB), Y4
	ADDQ    $128, SI
	SUBQ    $128, CX
	JZ      reduce

fold:
	FOLD(Y4, Y0, (SI), Y5)
	FOLD(Y4, Y1, 32(SI), Y6)
	FOLD(Y4, Y2, 64(SI), Y7)
	FOLD(Y4, Y3, 96(SI), Y8)
	ADDQ $128, SI
	SUBQ $128, CX
	JNZ  fold

reduce:
	CRCREDUCE(Y0, Y1, Y2, Y3, X2, X3)
	NOTL AX
	MOVL AX, ret+32(FP)
	VZEROUPPER
	RET

// func crcFold2Asm(a, b []byte) (ca, cb uint32)
//
// crc32.Checksum of a and of b, len(a) == len(b) a positive multiple of
// 128: crcFoldAsm's loop on both at once, accumulators Y0-Y3 for a and
// Y8-Y11 for b, prefetching 2 KiB ahead in both, for a payload not in
// cache (a decoder's first pass).
TEXT ·crcFold2Asm(SB), NOSPLIT, $0-56
	MOVQ    a_base+0(FP), SI
	MOVQ    a_len+8(FP), CX
	MOVQ    b_base+24(FP), DI
	MOVL    $0xffffffff, AX // the initial CRC 0, inverted
	VMOVD   AX, X0
	VMOVDQU Y0, Y8
	VPXOR   (SI), Y0, Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPXOR   (DI), Y8, Y8
	VMOVDQU 32(DI), Y9
	VMOVDQU 64(DI), Y10
	VMOVDQU 96(DI), Y11
	VMOVDQU ·clmulKeys+0(SB), Y4
	ADDQ    $128, SI
	ADDQ    $128, DI
	SUBQ    $128, CX
	JZ      reduce2

fold2:
	PREFETCHT0 2048(SI)
	PREFETCHT0 2112(SI)
	PREFETCHT0 2048(DI)
	PREFETCHT0 2112(DI)
	FOLD(Y4, Y0, (SI), Y5)
	FOLD(Y4, Y1, 32(SI), Y6)
	FOLD(Y4, Y2, 64(SI), Y7)
	FOLD(Y4, Y3, 96(SI), Y12)
	FOLD(Y4, Y8, (DI), Y13)
	FOLD(Y4, Y9, 32(DI), Y14)
	FOLD(Y4, Y10, 64(DI), Y15)
	FOLD(Y4, Y11, 96(DI), Y5)
	ADDQ       $128, SI
	ADDQ       $128, DI
	SUBQ       $128, CX
	JNZ        fold2

reduce2:
	CRCREDUCE(Y0, Y1, Y2, Y3, X2, X3)
	NOTL AX
	MOVL AX, ca+48(FP)
	CRCREDUCE(Y8, Y9, Y10, Y11, X10, X11)
	NOTL AX
	MOVL AX, cb+52(FP)
	VZEROUPPER
	RET

// CRCSHIFT sets DST to the CRC32C state SRC advanced past n zero bytes,
// SRC·x^(8n) modulo the polynomial, where KEY holds x^(8n−33): the
// carry-less product of two 32-bit reflected values, read as 64 bits,
// is their product times x, and the CRC32 instruction from 0 multiplies
// 64 bits by x^32. It clobbers BX, X12 and X13.
#define CRCSHIFT(SRC, KEY, DST) \
	VMOVD      SRC, X12; \
	VMOVQ      KEY, X13; \
	VPCLMULQDQ $0x00, X13, X12, X12; \
	VMOVQ      X12, BX; \
	XORL       DST, DST; \
	CRC32Q     BX, DST

// func crcHybridAsm(crc uint32, p []byte) uint32
//
// crc32.Update(crc, castagnoli, p) for len(p) a positive multiple of
// crcBlock = 248·crcSteps bytes, crcSteps > 1. Each block is checksummed as four runs
// at once: its first 128·crcSteps bytes by crcFoldAsm's carry-less fold
// (vector units), and the three runs of 40·crcSteps bytes after them by
// the CRC32 instruction (an integer unit, three chains to cover its
// latency), 128 + 3·40 bytes a step; CRCSHIFT then moves each run's state
// to the end of the block (the keys are in crcRunKeys).
TEXT ·crcHybridAsm(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	NOTL AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), R13

block:
	VMOVD   AX, X0
	VPXOR   (SI), Y0, Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVDQU ·clmulKeys+0(SB), Y4
	LEAQ    (128*const_crcSteps)(SI), DI  // the three integer runs
	LEAQ    (40*const_crcSteps)(DI), R8
	LEAQ    (40*const_crcSteps)(R8), R9
	XORL    R10, R10
	XORL    R11, R11
	XORL    R12, R12
	MOVQ    $(const_crcSteps-1), CX
	CRC32Q  (DI), R10
	CRC32Q  8(DI), R10
	CRC32Q  16(DI), R10
	CRC32Q  24(DI), R10
	CRC32Q  32(DI), R10
	CRC32Q  (R8), R11
	CRC32Q  8(R8), R11
	CRC32Q  16(R8), R11
	CRC32Q  24(R8), R11
	CRC32Q  32(R8), R11
	CRC32Q  (R9), R12
	CRC32Q  8(R9), R12
	CRC32Q  16(R9), R12
	CRC32Q  24(R9), R12
	CRC32Q  32(R9), R12

step:
	ADDQ   $128, SI
	ADDQ   $40, DI
	ADDQ   $40, R8
	ADDQ   $40, R9
	FOLD(Y4, Y0, (SI), Y5)
	CRC32Q (DI), R10
	CRC32Q (R8), R11
	CRC32Q (R9), R12
	FOLD(Y4, Y1, 32(SI), Y6)
	CRC32Q 8(DI), R10
	CRC32Q 8(R8), R11
	CRC32Q 8(R9), R12
	FOLD(Y4, Y2, 64(SI), Y7)
	CRC32Q 16(DI), R10
	CRC32Q 16(R8), R11
	CRC32Q 16(R9), R12
	FOLD(Y4, Y3, 96(SI), Y8)
	CRC32Q 24(DI), R10
	CRC32Q 24(R8), R11
	CRC32Q 24(R9), R12
	CRC32Q 32(DI), R10
	CRC32Q 32(R8), R11
	CRC32Q 32(R9), R12
	DECQ   CX
	JNZ    step

	CRCREDUCE(Y0, Y1, Y2, Y3, X2, X3)
	CRCSHIFT(AX, ·crcRunKeys+0(SB), AX)  // past the three integer runs
	CRCSHIFT(R10, ·crcRunKeys+8(SB), R10) // past the second and third
	XORL     R10, AX
	CRCSHIFT(R11, ·crcRunKeys+16(SB), R11) // past the third
	XORL     R11, AX
	XORL     R12, AX
	LEAQ     40(R9), SI
	SUBQ     $const_crcBlock, R13
	JNZ      block

	NOTL AX
	MOVL AX, ret+32(FP)
	VZEROUPPER
	RET
