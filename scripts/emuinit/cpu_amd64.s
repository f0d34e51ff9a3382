//go:build linux && amd64

#include "textflag.h"

// func xgetbv() uint64
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	SHLQ $32, DX
	ORQ  DX, AX
	MOVQ AX, ret+0(FP)
	RET

// func zmmAdd(a, b, out *[16]uint32)
TEXT ·zmmAdd(SB), NOSPLIT, $0-24
	MOVQ     a+0(FP), AX
	MOVQ     b+8(FP), BX
	MOVQ     out+16(FP), CX
	VMOVDQU32 (AX), Z0
	VMOVDQU32 (BX), Z1
	KXNORW   K1, K1, K1
	VPADDD   Z0, Z1, K1, Z2
	VMOVDQU32 Z2, (CX)
	VZEROUPPER
	RET
