//go:build !purego

#include "textflag.h"

// func fp16Asm(out []byte, x []float32) bool
// Y7 collects h&0x7c00 + 0x0400 of every result: bit 15 of a word is set
// where a result's exponent is all ones (Inf or NaN).
TEXT ·fp16Asm(SB), NOSPLIT, $0-49
	MOVQ         out_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	MOVL         $0x7c007c00, AX
	VMOVD        AX, X5
	VPBROADCASTD X5, X5           // exponent mask, per word
	MOVL         $0x04000400, AX
	VMOVD        AX, X6
	VPBROADCASTD X6, X6           // its lowest bit, per word
	VPXOR        X7, X7, X7

h16loop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, X1          // round to nearest even
	VMOVDQU   X1, (DI)
	VPAND     X5, X1, X1
	VPADDW    X6, X1, X1
	VPOR      X1, X7, X7
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JNZ       h16loop
	VPMOVMSKB X7, AX
	TESTL     $0xaaaa, AX         // bit 15 of any word
	SETEQ     ret+48(FP)
	VZEROUPPER
	RET

// func bf16Asm(out []byte, x []float32) bool
// BF16FromFloat32 of a finite u is (u + 0x7fff + (u>>16)&1) >> 16; a NaN or
// Inf input (whose sum may wrap) and a finite one that rounds to Inf set Y7.
// The constants go to X registers by VMOVD, not MOVD: MOVD is a legacy SSE
// instruction, and one after the VEX write of a YMM register made this loop
// 3.9 times slower on the AVX2 EPYC (292 against 76 ns per 512 elements).
TEXT ·bf16Asm(SB), NOSPLIT, $0-49
	MOVQ         out_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	MOVL         $0x7f800000, AX
	VMOVD        AX, X8
	VPBROADCASTD X8, Y8           // exponent mask
	MOVL         $1, AX
	VMOVD        AX, X9
	VPBROADCASTD X9, Y9
	MOVL         $0x7fff, AX
	VMOVD        AX, X10
	VPBROADCASTD X10, Y10
	VPXOR        Y7, Y7, Y7

b16loop:
	VMOVDQU      (SI), Y0
	VPAND        Y8, Y0, Y1
	VPCMPEQD     Y8, Y1, Y1       // input not finite
	VPSRLD       $16, Y0, Y2
	VPAND        Y9, Y2, Y2
	VPADDD       Y10, Y0, Y3
	VPADDD       Y2, Y3, Y3       // rounded
	VPAND        Y8, Y3, Y4
	VPCMPEQD     Y8, Y4, Y4       // result Inf
	VPOR         Y1, Y4, Y4
	VPOR         Y4, Y7, Y7
	VPSRLD       $16, Y3, Y3
	VEXTRACTI128 $1, Y3, X4
	VPACKUSDW    X4, X3, X3       // elements 0-3, then 4-7
	VMOVDQU      X3, (DI)
	ADDQ         $32, SI
	ADDQ         $16, DI
	SUBQ         $8, CX
	JNZ          b16loop
	VPTEST       Y7, Y7
	SETEQ        ret+48(FP)
	VZEROUPPER
	RET

// func fp16DecodeAsm(out []float32, in []byte, add bool)
TEXT ·fp16DecodeAsm(SB), NOSPLIT, $0-49
	MOVQ    out_base+0(FP), DI
	MOVQ    out_len+8(FP), CX
	MOVQ    in_base+24(FP), SI
	CMPB    add+48(FP), $0
	JNE     h16add

h16set:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       h16set
	VZEROUPPER
	RET

h16add:
	VCVTPH2PS (SI), Y0
	VADDPS    (DI), Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       h16add
	VZEROUPPER
	RET

// func bf16DecodeAsm(out []float32, in []byte, add bool)
TEXT ·bf16DecodeAsm(SB), NOSPLIT, $0-49
	MOVQ    out_base+0(FP), DI
	MOVQ    out_len+8(FP), CX
	MOVQ    in_base+24(FP), SI
	CMPB    add+48(FP), $0
	JNE     b16add

b16set:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       b16set
	VZEROUPPER
	RET

b16add:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VADDPS    (DI), Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       b16add
	VZEROUPPER
	RET
