//go:build !purego

package compress

// AVX2 and F16C versions of the dense codecs' conversions (dense.go), used
// when the CPU has both (cpuFeatures, simd_amd64.go, and F16C). Each
// computes exactly what its generic twin computes: VCVTPS2PH with rounding
// control 0 rounds to nearest even as FP16FromFloat32 does, subnormals
// included (Go leaves MXCSR's DAZ and FTZ clear), and VCVTPH2PS is exact.
// TestDenseKernels runs every pair on the same inputs.
func init() {
	if !cpuFeatures() || !f16cFeature() {
		return
	}
	fp16Kernel, bf16Kernel = fp16AVX2, bf16AVX2
	fp16DecodeKernel, bf16DecodeKernel = fp16DecodeAVX2, bf16DecodeAVX2
}

// f16cFeature reports whether the CPU has F16C (VCVTPS2PH, VCVTPH2PS).
func f16cFeature() bool {
	const f16c = 1 << 29
	_, _, ecx, _ := cpuid(1, 0)
	return ecx&f16c != 0
}

// fp16Asm and bf16Asm are fp16Generic and bf16Generic for len(x) a positive
// multiple of 8.
//
//go:noescape
func fp16Asm(out []byte, x []float32) bool

//go:noescape
func bf16Asm(out []byte, x []float32) bool

// fp16DecodeAsm and bf16DecodeAsm are fp16DecodeGeneric and
// bf16DecodeGeneric for len(out) a positive multiple of 8.
//
//go:noescape
func fp16DecodeAsm(out []float32, in []byte, add bool)

//go:noescape
func bf16DecodeAsm(out []float32, in []byte, add bool)

func fp16AVX2(out []byte, x []float32) bool {
	return halfSplit(out, x, fp16Asm, fp16Generic)
}

func bf16AVX2(out []byte, x []float32) bool {
	return halfSplit(out, x, bf16Asm, bf16Generic)
}

func fp16DecodeAVX2(out []float32, in []byte, add bool) {
	halfDecodeSplit(out, in, add, fp16DecodeAsm, fp16DecodeGeneric)
}

func bf16DecodeAVX2(out []float32, in []byte, add bool) {
	halfDecodeSplit(out, in, add, bf16DecodeAsm, bf16DecodeGeneric)
}
