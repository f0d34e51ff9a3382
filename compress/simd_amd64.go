//go:build !purego

package compress

import "math"

// AVX2 versions of the codecs' inner loops, used when the CPU and the OS
// support AVX2, and an AVX-512 version of the random draws (build with
// -tags purego to keep the generic Go loops). Each computes exactly what its
// generic twin computes, bit for bit: the same IEEE single-precision
// operations lane by lane, rounded to nearest even, never fused, and the
// same integer arithmetic. TestKernels runs every pair on the same inputs.
func init() {
	avx2, avx512 := cpuFeatures()
	if !avx2 {
		return
	}
	kernelSet = "avx2"
	minMaxKernel = minMaxAVX2
	quantKernel = quantAVX2
	dequantKernel = dequantAVX2
	signKernel = signAVX2
	unsignKernel = unsignAVX2
	if avx512 {
		kernelSet = "avx2+avx512"
		drawKernel = drawAVX512
	}
}

// cpuFeatures reports whether the CPU has AVX2, and AVX-512 F and DQ, with
// the OS saving the YMM (and ZMM and opmask) state.
func cpuFeatures() (avx2, avx512 bool) {
	if maxID, _, _, _ := cpuid(0, 0); maxID < 7 {
		return false, false
	}
	const osxsave, avx = 1 << 27, 1 << 28
	if _, _, ecx, _ := cpuid(1, 0); ecx&osxsave == 0 || ecx&avx == 0 {
		return false, false
	}
	xcr0, _ := xgetbv()
	_, ebx, _, _ := cpuid(7, 0)
	const avx2Bit, avx512F, avx512DQ = 1 << 5, 1 << 16, 1 << 17
	avx2 = xcr0&0x06 == 0x06 && ebx&avx2Bit != 0                                // XMM, YMM state
	avx512 = avx2 && xcr0&0xe6 == 0xe6 && ebx&avx512F != 0 && ebx&avx512DQ != 0 // and opmask, ZMM state
	return avx2, avx512
}

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

// rangeAVX2 returns the least and greatest element of x as VMINPS and
// VMAXPS find them, and whether x holds a NaN. len(x) is a positive
// multiple of 8.
//
//go:noescape
func rangeAVX2(x []float32) (lo, hi float32, nan bool)

func minMaxAVX2(x []float32) (lo, hi float32, finite bool) {
	m := len(x) &^ 7
	if m == 0 {
		return minMaxGeneric(x)
	}
	lo, hi, nan := rangeAVX2(x[:m])
	for _, v := range x[m:] {
		lo, hi = min(lo, v), max(hi, v) // a NaN sticks
	}
	return lo, hi, !nan && lo >= -math.MaxFloat32 && hi <= math.MaxFloat32
}

// quantAsm is quantGeneric for len(x) a positive multiple of 8.
//
//go:noescape
func quantAsm(out []byte, x []float32, u []uint32, lo, inv float32, levels int32, bits uint)

func quantAVX2(out []byte, x []float32, u []uint32, lo, inv float32, levels int32, bits uint) {
	if len(x) == 0 {
		return
	}
	_, _ = out[len(x)*int(bits)/8-1], u[len(x)-1] // the lengths quantAsm trusts
	quantAsm(out, x, u, lo, inv, levels, bits)
}

// dequantAsm is dequantGeneric for len(out) a positive multiple of 8.
//
//go:noescape
func dequantAsm(out []float32, codes []byte, lo, scale float32, bits uint, add bool)

func dequantAVX2(out []float32, codes []byte, lo, scale float32, bits uint, add bool) {
	if len(out) == 0 {
		return
	}
	_ = codes[len(out)*int(bits)/8-1] // the length dequantAsm trusts
	dequantAsm(out, codes, lo, scale, bits, add)
}

// signAsm is signGeneric for len(x) a positive multiple of 8.
//
//go:noescape
func signAsm(bits []byte, x []float32, acc *[8]float64)

func signAVX2(bits []byte, x []float32, acc *[8]float64) {
	if len(x) == 0 {
		return
	}
	_ = bits[len(x)/8-1] // the length signAsm trusts
	signAsm(bits, x, acc)
}

// unsignAsm is unsignGeneric for len(out) a positive multiple of 8.
//
//go:noescape
func unsignAsm(out []float32, bits []byte, sb uint32, add bool)

func unsignAVX2(out []float32, bits []byte, sb uint32, add bool) {
	if len(out) == 0 {
		return
	}
	_ = bits[len(out)/8-1] // the length unsignAsm trusts
	unsignAsm(out, bits, sb, add)
}

// drawAsm512 is drawBits for len(u) a positive multiple of 8.
//
//go:noescape
func drawAsm512(u []uint32, ctr uint64)

func drawAVX512(u []uint32, ctr uint64) uint64 {
	m := len(u) &^ 7
	if m > 0 {
		drawAsm512(u[:m], ctr)
		ctr += uint64(m) * golden
	}
	return drawBits(u[m:], ctr)
}
