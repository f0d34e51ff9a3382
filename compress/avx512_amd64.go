//go:build !purego

package compress

// AVX-512 versions of the quantizer's inner loops: the range of a bucket,
// and its codes with the random stream of stochastic rounding, on 16 lanes
// of a ZMM register instead of 8 of a YMM one. init (simd_amd64.go)
// installs them over the AVX2 kernels when avx512Features holds; the other
// kernels stay AVX2. Like those they compute exactly what their generic
// twins do, bit for bit: TestKernels compares the kernels in use,
// TestKernelsQuant quantAVX2 and quantAVX512 each.

// avx512Features reports whether the CPU has AVX-512F, with the OS saving
// the opmask and ZMM state besides the XMM and YMM state. It assumes
// cpuFeatures holds (CPUID leaf 7 and XGETBV are there).
func avx512Features() bool {
	const avx512f = 1 << 16
	const zmmState = 1<<1 | 1<<2 | 1<<5 | 1<<6 | 1<<7 // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
	_, ebx, _, _ := cpuid(7, 0)
	xcr0, _ := xgetbv()
	return ebx&avx512f != 0 && xcr0&zmmState == zmmState
}

// rangeAVX512 is rangeAVX2 for len(x) a positive multiple of 16.
//
//go:noescape
func rangeAVX512(x []float32) (lo, hi float32, nan bool)

// minMaxAVX512 is minMaxGeneric: the whole groups of 16 elements by
// rangeAVX512, the rest by foldRange.
func minMaxAVX512(x []float32) (lo, hi float32, finite bool) {
	m := len(x) &^ 15
	if m == 0 {
		return minMaxAVX2(x)
	}
	lo, hi, nan := rangeAVX512(x[:m])
	return foldRange(x[m:], lo, hi, nan)
}

// quantAsm512 is quantGeneric for len(x) a positive multiple of 16.
//
//go:noescape
func quantAsm512(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool)

// quantAVX512 is quantGeneric: the whole groups of 16 elements by
// quantAsm512, a last group of 8 by quantAVX2.
func quantAVX512(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool) {
	m := len(x) &^ 15
	if holds(out, m*int(bits)/8) { // the length quantAsm512 trusts
		quantAsm512(out, x[:m], lo, inv, levels, bits, ctr, k1, nearest)
	}
	quantAVX2(out[m*int(bits)/8:], x[m:], lo, inv, levels, bits, ctr+uint32(m)*lane32Weyl, k1, nearest)
}
