//go:build !purego

#include "go_asm.h"
#include "textflag.h"

// The vector instructions Go's arm64 assembler has no mnemonics for, as
// their A64 encodings: 4 lanes of float32 or uint32 (the "4S" arrangement),
// register numbers d, n, m. `go tool objdump` names each of them.
#define FADD4(m, n, d) WORD $(0x4E20D400 | (m)<<16 | (n)<<5 | (d)) // FADD Vd.4S, Vn.4S, Vm.4S
#define FSUB4(m, n, d) WORD $(0x4EA0D400 | (m)<<16 | (n)<<5 | (d)) // FSUB Vd.4S, Vn.4S, Vm.4S
#define FMUL4(m, n, d) WORD $(0x6E20DC00 | (m)<<16 | (n)<<5 | (d)) // FMUL Vd.4S, Vn.4S, Vm.4S
#define FMIN4(m, n, d) WORD $(0x4EA0F400 | (m)<<16 | (n)<<5 | (d)) // FMIN Vd.4S, Vn.4S, Vm.4S
#define FMAX4(m, n, d) WORD $(0x4E20F400 | (m)<<16 | (n)<<5 | (d)) // FMAX Vd.4S, Vn.4S, Vm.4S
#define MUL4(m, n, d) WORD $(0x4EA09C00 | (m)<<16 | (n)<<5 | (d))  // MUL Vd.4S, Vn.4S, Vm.4S
#define UCVTF4(n, d) WORD $(0x6E21D800 | (n)<<5 | (d))             // UCVTF Vd.4S, Vn.4S
#define FCVTZU4(n, d) WORD $(0x6EA1B800 | (n)<<5 | (d))            // FCVTZU Vd.4S, Vn.4S
#define FMINV4(n, d) WORD $(0x6EB0F800 | (n)<<5 | (d))             // FMINV Sd, Vn.4S
#define FMAXV4(n, d) WORD $(0x6E30F800 | (n)<<5 | (d))             // FMAXV Sd, Vn.4S
#define FABS4(n, d) WORD $(0x4EA0F800 | (n)<<5 | (d))              // FABS Vd.4S, Vn.4S
#define CMHI4(m, n, d) WORD $(0x6EA03400 | (m)<<16 | (n)<<5 | (d)) // CMHI Vd.4S, Vn.4S, Vm.4S
#define FCVTL2S(n, d) WORD $(0x0E617800 | (n)<<5 | (d))            // FCVTL Vd.2D, Vn.2S
#define FCVTL4S(n, d) WORD $(0x4E617800 | (n)<<5 | (d))            // FCVTL2 Vd.2D, Vn.4S
#define FADD2D(m, n, d) WORD $(0x4E60D400 | (m)<<16 | (n)<<5 | (d)) // FADD Vd.2D, Vn.2D, Vm.2D
#define FCVTN4H(n, d) WORD $(0x0E216800 | (n)<<5 | (d))            // FCVTN Vd.4H, Vn.4S
#define FCVTN8H(n, d) WORD $(0x4E216800 | (n)<<5 | (d))            // FCVTN2 Vd.8H, Vn.4S
#define FCVTL4H(n, d) WORD $(0x0E217800 | (n)<<5 | (d))            // FCVTL Vd.4S, Vn.4H
#define FCVTL8H(n, d) WORD $(0x4E217800 | (n)<<5 | (d))            // FCVTL2 Vd.4S, Vn.8H

// func rangeNEON(x []float32) (lo, hi float32)
//
// FMIN and FMAX return a NaN where either operand is one, so lo and hi are
// NaN if x holds one. 16 elements per iteration into 4 running minima and
// maxima, then a tree. len(x) is a positive multiple of 16.
TEXT ·rangeNEON(SB), NOSPLIT, $0-32
	MOVD   x_base+0(FP), R0
	MOVD   x_len+8(FP), R1
	VLD1.P 64(R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	VMOV   V0.B16, V4.B16
	VMOV   V1.B16, V5.B16
	VMOV   V2.B16, V6.B16
	VMOV   V3.B16, V7.B16
	SUBS   $16, R1

loop:
	BEQ    fold
	VLD1.P 64(R0), [V8.S4, V9.S4, V10.S4, V11.S4]
	FMIN4(8, 0, 0)
	FMIN4(9, 1, 1)
	FMIN4(10, 2, 2)
	FMIN4(11, 3, 3)
	FMAX4(8, 4, 4)
	FMAX4(9, 5, 5)
	FMAX4(10, 6, 6)
	FMAX4(11, 7, 7)
	SUBS   $16, R1
	B      loop

fold:
	FMIN4(1, 0, 0)
	FMIN4(3, 2, 2)
	FMIN4(2, 0, 0)
	FMINV4(0, 0)
	FMAX4(5, 4, 4)
	FMAX4(7, 6, 6)
	FMAX4(6, 4, 4)
	FMAXV4(4, 4)
	FMOVS  F0, lo+24(FP)
	FMOVS  F4, hi+28(FP)
	RET

// The quantizer's steps on the 4 lanes of a vector register V (number v):
//
// QT sets V to t = (x − lo)·inv (V20 = lo, V21 = inv), each step rounded
// as the generic loop's float32 conversions round it.
#define QT(v) \
	FSUB4(20, v, v); \
	FMUL4(21, v, v)

// QDRAW adds r = u·2^-24 to V, u the top 24 bits of draw32 of the
// counters x = i·0x9e3779b9 + k0 in V23 (rng.go's hash32, with V24 = k1,
// V25 and V26 its multipliers), and advances the counters by 4·0x9e3779b9
// (V27). D and T are scratch registers, d the number of D. The product
// u·2^-24 (V28) is exact, so the fused add rounds as an add does.
#define QDRAW(V, D, d, T) \
	VUSHR $16, V23.S4, D.S4; \
	VEOR  V23.B16, D.B16, D.B16; \
	MUL4(25, d, d); \
	VUSHR $15, D.S4, T.S4; \
	VEOR  T.B16, D.B16, D.B16; \
	VEOR  V24.B16, D.B16, D.B16; \
	MUL4(26, d, d); \
	VUSHR $16, D.S4, T.S4; \
	VEOR  T.B16, D.B16, D.B16; \
	VUSHR $8, D.S4, D.S4; \
	UCVTF4(d, d); \
	VFMLA V28.S4, D.S4, V.S4; \
	VADD  V27.S4, V23.S4, V23.S4

// QCODE truncates V to its code and clamps it to L (V22): t + r is at
// least 0, and below L + 2.
#define QCODE(V, v) \
	FCVTZU4(v, v); \
	VUMIN V22.S4, V.S4, V.S4

// func quantNEONAsm(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool)
//
// 16 elements per iteration, then a last 8: t of each lane (QT), plus the
// draw (QDRAW) or 1/2 (V29), truncated and clamped (QCODE), narrowed to
// bytes in element order, packed to bits each and stored. len(x) is a
// positive multiple of 8, out holds len(x)·bits/8 bytes.
TEXT ·quantNEONAsm(SB), NOSPLIT, $0-81
	MOVD   out_base+0(FP), R0
	MOVD   x_base+24(FP), R1
	MOVD   x_len+32(FP), R2
	FMOVS  lo+48(FP), F20
	VDUP   V20.S[0], V20.S4
	FMOVS  inv+52(FP), F21
	VDUP   V21.S[0], V21.S4
	MOVWU  levels+56(FP), R3
	VDUP   R3, V22.S4
	MOVD   bits+64(FP), R4
	MOVWU  ctr+72(FP), R3
	VDUP   R3, V23.S4
	MOVD   $laneWeyl4<>(SB), R5
	VLD1   (R5), [V27.S4]
	VADD   V27.S4, V23.S4, V23.S4 // ctr + k·0x9e3779b9 in lane k
	MOVWU  k1+76(FP), R3
	VDUP   R3, V24.S4
	MOVW   $const_lane32M1, R3
	VDUP   R3, V25.S4
	MOVW   $const_lane32M2, R3
	VDUP   R3, V26.S4
	MOVW   $(4*const_lane32Weyl), R3
	VDUP   R3, V27.S4
	MOVW   $0x33800000, R3        // float32 2^-24
	VDUP   R3, V28.S4
	MOVW   $0x3f000000, R3        // float32 1/2
	VDUP   R3, V29.S4
	MOVBU  nearest+80(FP), R7

loop16:
	CMP    $16, R2
	BLT    last8
	VLD1.P 64(R1), [V0.S4, V1.S4, V2.S4, V3.S4]
	QT(0)
	QT(1)
	QT(2)
	QT(3)
	CBNZ   R7, half16
	QDRAW(V0, V4, 4, V8)
	QDRAW(V1, V5, 5, V9)
	QDRAW(V2, V6, 6, V10)
	QDRAW(V3, V7, 7, V11)
	B      code16

half16:
	FADD4(29, 0, 0)
	FADD4(29, 1, 1)
	FADD4(29, 2, 2)
	FADD4(29, 3, 3)

code16:
	QCODE(V0, 0)
	QCODE(V1, 1)
	QCODE(V2, 2)
	QCODE(V3, 3)
	VUZP1  V1.H8, V0.H8, V0.H8     // the low halves of lanes 0-7
	VUZP1  V3.H8, V2.H8, V2.H8
	VUZP1  V2.B16, V0.B16, V0.B16  // their low bytes: codes 0-15
	SUB    $16, R2
	CMP    $8, R4
	BNE    pack16
	VST1.P [V0.B16], 16(R0)
	B      loop16

pack16:
	CMP    $4, R4
	BNE    crumbs16
	VUZP2  V0.B16, V0.B16, V1.B16  // odd codes
	VUZP1  V0.B16, V0.B16, V0.B16  // even codes
	VSLI   $4, V1.B16, V0.B16      // even | odd<<4
	VMOV   V0.D[0], R3
	MOVD.P R3, 8(R0)
	B      loop16

crumbs16:
	// Each lane holds codes c0..c3 in its bytes: adding the lane shifted
	// right by 6, then by 12, gathers c0 | c1<<2 | c2<<4 | c3<<6 in its
	// low byte (the fields never overlap, so adds are ors).
	VUSRA  $6, V0.S4, V0.S4
	VUSRA  $12, V0.S4, V0.S4
	VUZP1  V0.H8, V0.H8, V0.H8
	VUZP1  V0.B16, V0.B16, V0.B16
	VMOV   V0.S[0], R3
	MOVW.P R3, 4(R0)
	B      loop16

last8:
	CBZ    R2, done
	VLD1   (R1), [V0.S4, V1.S4]
	QT(0)
	QT(1)
	CBNZ   R7, half8
	QDRAW(V0, V4, 4, V8)
	QDRAW(V1, V5, 5, V9)
	B      code8

half8:
	FADD4(29, 0, 0)
	FADD4(29, 1, 1)

code8:
	QCODE(V0, 0)
	QCODE(V1, 1)
	VUZP1  V1.H8, V0.H8, V0.H8
	VUZP1  V0.B16, V0.B16, V0.B16  // codes 0-7 in the low 8 bytes
	CMP    $8, R4
	BNE    pack8
	VMOV   V0.D[0], R3
	MOVD   R3, (R0)
	RET

pack8:
	CMP    $4, R4
	BNE    crumbs8
	VUZP2  V0.B16, V0.B16, V1.B16
	VUZP1  V0.B16, V0.B16, V0.B16
	VSLI   $4, V1.B16, V0.B16
	VMOV   V0.S[0], R3
	MOVW   R3, (R0)
	RET

crumbs8:
	VUSRA  $6, V0.S4, V0.S4
	VUSRA  $12, V0.S4, V0.S4
	VUZP1  V0.H8, V0.H8, V0.H8
	VUZP1  V0.B16, V0.B16, V0.B16
	VMOV   V0.H[0], R3
	MOVH   R3, (R0)

done:
	RET

// UNPACK splits each of the low 8 bytes of V0 into two codes, its bits
// under the mask in M (15 or 3) and its bits from s on, and interleaves
// them (low part first) into the 16 bytes of V0: nibbles to bytes, or, a
// second time, crumb pairs to crumbs.
#define UNPACK(M, s) \
	VAND  M.B16, V0.B16, V1.B16; \
	VUSHR $s, V0.B16, V2.B16; \
	VZIP1 V2.B16, V1.B16, V0.B16

// DQ widens the 8 halfword codes of H to lanes, the low 4 into A and the
// high 4 into B (register numbers a and b), and sets each to lo + c·scale
// (V20 = lo, V21 = scale, each step rounded as the generic loop rounds).
#define DQ(H, A, a, B, b) \
	VUXTL  H.H4, A.S4; \
	VUXTL2 H.H8, B.S4; \
	UCVTF4(a, a); \
	UCVTF4(b, b); \
	FMUL4(21, a, a); \
	FMUL4(21, b, b); \
	FADD4(20, a, a); \
	FADD4(20, b, b)

// func dequantNEONAsm(out []float32, codes []byte, lo, scale float32, bits uint, add bool)
//
// 16 elements per iteration, then a last 8: their codes unpacked to bytes
// of V0, widened, decoded (DQ) and stored or added. len(out) is a positive
// multiple of 8, codes holds len(out)·bits/8 bytes.
TEXT ·dequantNEONAsm(SB), NOSPLIT, $0-65
	MOVD   out_base+0(FP), R0
	MOVD   out_len+8(FP), R2
	MOVD   codes_base+24(FP), R1
	FMOVS  lo+48(FP), F20
	VDUP   V20.S[0], V20.S4
	FMOVS  scale+52(FP), F21
	VDUP   V21.S[0], V21.S4
	MOVD   bits+56(FP), R4
	MOVBU  add+64(FP), R7
	VMOVI  $15, V30.B16
	VMOVI  $3, V31.B16

loop16:
	CMP    $16, R2
	BLT    last8
	CMP    $8, R4
	BNE    nibbles16
	VLD1.P 16(R1), [V0.B16]
	B      decode16

nibbles16:
	CMP    $4, R4
	BNE    crumbs16
	MOVD.P 8(R1), R3
	VMOV   R3, V0.D[0]
	UNPACK(V30, 4)
	B      decode16

crumbs16:
	MOVWU.P 4(R1), R3
	VMOV   R3, V0.S[0]
	UNPACK(V30, 4)
	UNPACK(V31, 2)

decode16:
	VUXTL  V0.B8, V1.H8
	VUXTL2 V0.B16, V2.H8
	DQ(V1, V4, 4, V5, 5)
	DQ(V2, V6, 6, V7, 7)
	CBZ    R7, set16
	VLD1   (R0), [V8.S4, V9.S4, V10.S4, V11.S4]
	FADD4(8, 4, 4)
	FADD4(9, 5, 5)
	FADD4(10, 6, 6)
	FADD4(11, 7, 7)

set16:
	VST1.P [V4.S4, V5.S4, V6.S4, V7.S4], 64(R0)
	SUB    $16, R2
	B      loop16

last8:
	CBZ    R2, done
	CMP    $8, R4
	BNE    nibbles8
	MOVD   (R1), R3
	VMOV   R3, V0.D[0]
	B      decode8

nibbles8:
	CMP    $4, R4
	BNE    crumbs8
	MOVWU  (R1), R3
	VMOV   R3, V0.S[0]
	UNPACK(V30, 4)
	B      decode8

crumbs8:
	MOVHU  (R1), R3
	VMOV   R3, V0.H[0]
	UNPACK(V30, 4)
	UNPACK(V31, 2)

decode8:
	VUXTL  V0.B8, V1.H8
	DQ(V1, V4, 4, V5, 5)
	CBZ    R7, set8
	VLD1   (R0), [V8.S4, V9.S4]
	FADD4(8, 4, 4)
	FADD4(9, 5, 5)

set8:
	VST1   [V4.S4, V5.S4], (R0)

done:
	RET

// func signNEONAsm(bits []byte, x []float32, acc *[8]float64)
//
// 8 elements per iteration: the byte of their sign bits (bit k set where
// x[k]'s bits as uint32 exceed 0x80000000: below zero, −0 not), and
// float64(|x[k]|) added to acc[k] (V16-V19, two lanes each), in the
// generic loop's order. len(x) is a multiple of 8.
TEXT ·signNEONAsm(SB), NOSPLIT, $0-56
	MOVD   bits_base+0(FP), R0
	MOVD   x_base+24(FP), R1
	MOVD   x_len+32(FP), R2
	MOVD   acc+48(FP), R3
	VLD1   (R3), [V16.D2, V17.D2, V18.D2, V19.D2]
	MOVW   $0x80000000, R4
	VDUP   R4, V20.S4
	MOVD   $signWeights<>(SB), R5
	VLD1   (R5), [V21.S4, V22.S4]

loop:
	CBZ    R2, done
	VLD1.P 32(R1), [V0.S4, V1.S4]
	CMHI4(20, 0, 2)               // all ones where the bits exceed 0x80000000
	CMHI4(20, 1, 3)
	VAND   V21.B16, V2.B16, V2.B16 // bit k of element k
	VAND   V22.B16, V3.B16, V3.B16
	VORR   V3.B16, V2.B16, V2.B16
	VADDV  V2.S4, V2              // distinct bits: their sum is their or
	VMOV   V2.S[0], R6
	MOVB.P R6, 1(R0)
	FABS4(0, 0)
	FABS4(1, 1)
	FCVTL2S(0, 4)
	FCVTL4S(0, 5)
	FCVTL2S(1, 6)
	FCVTL4S(1, 7)
	FADD2D(4, 16, 16)
	FADD2D(5, 17, 17)
	FADD2D(6, 18, 18)
	FADD2D(7, 19, 19)
	SUB    $8, R2
	B      loop

done:
	VST1   [V16.D2, V17.D2, V18.D2, V19.D2], (R3)
	RET

// func unsignNEONAsm(out []float32, bits []byte, sb uint32, add bool)
//
// 8 elements per iteration: their byte of sign bits in every lane, each
// lane's bit tested (CMTST with its weight), its sign set on the scale's
// bits sb, the value stored or added. len(out) is a multiple of 8.
TEXT ·unsignNEONAsm(SB), NOSPLIT, $0-53
	MOVD    out_base+0(FP), R0
	MOVD    out_len+8(FP), R2
	MOVD    bits_base+24(FP), R1
	MOVWU   sb+48(FP), R3
	VDUP    R3, V20.S4
	MOVBU   add+52(FP), R7
	MOVW    $0x80000000, R4
	VDUP    R4, V23.S4
	MOVD    $signWeights<>(SB), R5
	VLD1    (R5), [V21.S4, V22.S4]

loop:
	CBZ     R2, done
	MOVBU.P 1(R1), R4
	VDUP    R4, V0.S4
	VCMTST  V21.S4, V0.S4, V1.S4  // all ones where the lane's bit is set
	VCMTST  V22.S4, V0.S4, V2.S4
	VAND    V23.B16, V1.B16, V1.B16
	VAND    V23.B16, V2.B16, V2.B16
	VORR    V20.B16, V1.B16, V1.B16 // ±scale
	VORR    V20.B16, V2.B16, V2.B16
	CBZ     R7, set
	VLD1    (R0), [V3.S4, V4.S4]
	FADD4(3, 1, 1)
	FADD4(4, 2, 2)

set:
	VST1.P  [V1.S4, V2.S4], 32(R0)
	SUB     $8, R2
	B       loop

done:
	RET

// The bit of each of 8 elements in its byte, lanes 0-3 and 4-7.
DATA signWeights<>+0(SB)/4, $1
DATA signWeights<>+4(SB)/4, $2
DATA signWeights<>+8(SB)/4, $4
DATA signWeights<>+12(SB)/4, $8
DATA signWeights<>+16(SB)/4, $16
DATA signWeights<>+20(SB)/4, $32
DATA signWeights<>+24(SB)/4, $64
DATA signWeights<>+28(SB)/4, $128
GLOBL signWeights<>(SB), RODATA|NOPTR, $32

// NONZERO sets R6 to 1 if any bit of V21 is set, else 0.
#define NONZERO \
	VMOV V21.D[0], R4; \
	VMOV V21.D[1], R5; \
	ORR  R5, R4, R4; \
	CMP  $0, R4; \
	CSET NE, R6

// func fp16NEONAsm(out []byte, x []float32) bool
//
// 8 elements per iteration: FCVTN rounds to nearest even as
// FP16FromFloat32 does, subnormals included (Go leaves FPCR's FZ and FZ16
// clear), and overflows to ±Inf from 65520 on; a result whose exponent is
// all ones is not finite. len(x) is a multiple of 8.
TEXT ·fp16NEONAsm(SB), NOSPLIT, $0-49
	MOVD   out_base+0(FP), R0
	MOVD   x_base+24(FP), R1
	MOVD   x_len+32(FP), R2
	MOVW   $0x7c00, R3
	VDUP   R3, V20.H8             // binary16's exponent
	VEOR   V21.B16, V21.B16, V21.B16

loop:
	CBZ    R2, done
	VLD1.P 32(R1), [V0.S4, V1.S4]
	FCVTN4H(0, 2)
	FCVTN8H(1, 2)
	VAND   V20.B16, V2.B16, V3.B16
	VCMEQ  V20.H8, V3.H8, V3.H8    // Inf or NaN
	VORR   V3.B16, V21.B16, V21.B16
	VST1.P [V2.B16], 16(R0)
	SUB    $8, R2
	B      loop

done:
	NONZERO
	EOR    $1, R6, R6
	MOVB   R6, ret+48(FP)
	RET

// BF16 sets V to the bfloat16 of each lane in its high half, u + 0x7fff +
// (bit 16 of u) (BF16FromFloat32 for every u but a NaN, which is flagged),
// and marks in V21 each lane whose input or result has an exponent of all
// ones (V20 = 0x7f800000, V22 = 1, V23 = 0x7fff; T, U scratch).
#define BF16(V, T, U) \
	VAND  V20.B16, V.B16, T.B16; \
	VCMEQ V20.S4, T.S4, T.S4; \
	VORR  T.B16, V21.B16, V21.B16; \
	VUSHR $16, V.S4, T.S4; \
	VAND  V22.B16, T.B16, T.B16; \
	VADD  V23.S4, V.S4, V.S4; \
	VADD  T.S4, V.S4, V.S4; \
	VAND  V20.B16, V.B16, U.B16; \
	VCMEQ V20.S4, U.S4, U.S4; \
	VORR  U.B16, V21.B16, V21.B16

// func bf16NEONAsm(out []byte, x []float32) bool
//
// 8 elements per iteration, rounded (BF16) and their high halves taken
// (UZP2). len(x) is a multiple of 8.
TEXT ·bf16NEONAsm(SB), NOSPLIT, $0-49
	MOVD   out_base+0(FP), R0
	MOVD   x_base+24(FP), R1
	MOVD   x_len+32(FP), R2
	MOVW   $0x7f800000, R3
	VDUP   R3, V20.S4
	MOVW   $1, R3
	VDUP   R3, V22.S4
	MOVW   $0x7fff, R3
	VDUP   R3, V23.S4
	VEOR   V21.B16, V21.B16, V21.B16

loop:
	CBZ    R2, done
	VLD1.P 32(R1), [V0.S4, V1.S4]
	BF16(V0, V4, V5)
	BF16(V1, V6, V7)
	VUZP2  V1.H8, V0.H8, V2.H8     // the high halves, elements 0-7
	VST1.P [V2.B16], 16(R0)
	SUB    $8, R2
	B      loop

done:
	NONZERO
	EOR    $1, R6, R6
	MOVB   R6, ret+48(FP)
	RET

// HSTORE stores (R7 = 0) or adds to (R7 ≠ 0) the 8 floats of V1 and V2 at
// R0, and advances R0.
#define HSTORE \
	CBZ     R7, 4(PC); \
	VLD1    (R0), [V3.S4, V4.S4]; \
	FADD4(3, 1, 1); \
	FADD4(4, 2, 2); \
	VST1.P  [V1.S4, V2.S4], 32(R0)

// func fp16DecodeNEONAsm(out []float32, in []byte, add bool)
//
// 8 elements per iteration; FCVTL is exact. len(out) is a multiple of 8.
TEXT ·fp16DecodeNEONAsm(SB), NOSPLIT, $0-49
	MOVD   out_base+0(FP), R0
	MOVD   out_len+8(FP), R2
	MOVD   in_base+24(FP), R1
	MOVBU  add+48(FP), R7

loop:
	CBZ    R2, done
	VLD1.P 16(R1), [V0.B16]
	FCVTL4H(0, 1)
	FCVTL8H(0, 2)
	HSTORE
	SUB    $8, R2
	B      loop

done:
	RET

// func bf16DecodeNEONAsm(out []float32, in []byte, add bool)
//
// 8 elements per iteration, each half put in the high half of a lane (ZIP
// with zeros). len(out) is a multiple of 8.
TEXT ·bf16DecodeNEONAsm(SB), NOSPLIT, $0-49
	MOVD   out_base+0(FP), R0
	MOVD   out_len+8(FP), R2
	MOVD   in_base+24(FP), R1
	MOVBU  add+48(FP), R7
	VEOR   V31.B16, V31.B16, V31.B16

loop:
	CBZ    R2, done
	VLD1.P 16(R1), [V0.B16]
	VZIP1  V0.H8, V31.H8, V1.H8
	VZIP2  V0.H8, V31.H8, V2.H8
	HSTORE
	SUB    $8, R2
	B      loop

done:
	RET

// func addNEONAsm(dst, a, b []float32)
//
// dst = a + b, 8 elements per iteration.
TEXT ·addNEONAsm(SB), NOSPLIT, $0-72
	MOVD   dst_base+0(FP), R0
	MOVD   dst_len+8(FP), R2
	MOVD   a_base+24(FP), R1
	MOVD   b_base+48(FP), R3

loop:
	CBZ    R2, done
	VLD1.P 32(R1), [V0.S4, V1.S4]
	VLD1.P 32(R3), [V2.S4, V3.S4]
	FADD4(2, 0, 0)
	FADD4(3, 1, 1)
	VST1.P [V0.S4, V1.S4], 32(R0)
	SUB    $8, R2
	B      loop

done:
	RET

// func subNEONAsm(res, src []float32)
//
// res = src − res, 8 elements per iteration.
TEXT ·subNEONAsm(SB), NOSPLIT, $0-48
	MOVD   res_base+0(FP), R0
	MOVD   res_len+8(FP), R2
	MOVD   src_base+24(FP), R1

loop:
	CBZ    R2, done
	VLD1   (R0), [V0.S4, V1.S4]
	VLD1.P 32(R1), [V2.S4, V3.S4]
	FSUB4(0, 2, 0)
	FSUB4(1, 3, 1)
	VST1.P [V0.S4, V1.S4], 32(R0)
	SUB    $8, R2
	B      loop

done:
	RET

// 0, 1, 2, 3 times the Weyl step, the counters' offsets in lanes 0-3.
DATA laneWeyl4<>+0(SB)/4, $0
DATA laneWeyl4<>+4(SB)/4, $const_lane32Weyl
DATA laneWeyl4<>+8(SB)/4, $(2*const_lane32Weyl)
DATA laneWeyl4<>+12(SB)/4, $(3*const_lane32Weyl)
GLOBL laneWeyl4<>(SB), RODATA|NOPTR, $16
