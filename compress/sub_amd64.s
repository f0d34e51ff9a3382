//go:build !purego

#include "textflag.h"

// func subAsm(res, src []float32)
TEXT ·subAsm(SB), NOSPLIT, $0-48
	MOVQ res_base+0(FP), DI
	MOVQ res_len+8(FP), CX
	MOVQ src_base+24(FP), SI

sloop:
	VMOVUPS (SI), Y0
	VSUBPS  (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JNZ     sloop
	VZEROUPPER
	RET
