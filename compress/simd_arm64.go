//go:build !purego

package compress

// NEON (Advanced SIMD, which every arm64 CPU has) versions of the
// quantizers' inner loops (the range of a bucket, its quantization and the
// decoding of its codes), of sign's (its bits and sums, and their
// decoding), of the fp16 and bf16 conversions, and of error feedback's e +
// g and residual subtraction. Each computes exactly
// what its generic twin computes, bit for bit: the same IEEE operations
// lane by lane, rounded to nearest even (Go leaves FPCR's FZ, FZ16 and DN
// clear), and the same integer arithmetic; the fused multiply-add of t +
// u·2^-24 has an exact product, so it rounds once as the generic addition
// does. Build with -tags purego to keep the generic Go loops. TestKernels,
// TestKernelsQuant and TestDenseKernels compare them with the generic
// ones; `make arm64` runs those tests under qemu-user.
func init() {
	kernelSet = "neon"
	minMaxKernel = minMaxNEON
	quantKernel = quantNEON
	dequantKernel = dequantNEON
	signKernel = signNEON
	unsignKernel = unsignNEON
	fp16Kernel, bf16Kernel = fp16NEON, bf16NEON
	fp16DecodeKernel, bf16DecodeKernel = fp16DecodeNEON, bf16DecodeNEON
	addKernel, subKernel = addNEON, subNEON
}

// rangeNEON returns the least and greatest element of x as FMIN and FMAX
// find them: NaN if x holds a NaN. len(x) is a positive multiple of 16.
//
//go:noescape
func rangeNEON(x []float32) (lo, hi float32)

func minMaxNEON(x []float32) (lo, hi float32, finite bool) {
	m := len(x) &^ 15
	if m == 0 {
		return minMaxGeneric(x)
	}
	lo, hi = rangeNEON(x[:m])
	return foldRange(x[m:], lo, hi, false) // a NaN in lo or hi is not finite
}

// quantNEONAsm is quantGeneric for len(x) a positive multiple of 8.
//
//go:noescape
func quantNEONAsm(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool)

func quantNEON(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool) {
	if holds(out, len(x)*int(bits)/8) { // the length quantNEONAsm trusts
		quantNEONAsm(out, x, lo, inv, levels, bits, ctr, k1, nearest)
	}
}

// dequantNEONAsm is dequantGeneric for len(out) a positive multiple of 8.
//
//go:noescape
func dequantNEONAsm(out []float32, codes []byte, lo, scale float32, bits uint, add bool)

func dequantNEON(out []float32, codes []byte, lo, scale float32, bits uint, add bool) {
	if holds(codes, len(out)*int(bits)/8) { // the length dequantNEONAsm trusts
		dequantNEONAsm(out, codes, lo, scale, bits, add)
	}
}

// signNEONAsm is signGeneric.
//
//go:noescape
func signNEONAsm(bits []byte, x []float32, acc *[8]float64)

func signNEON(bits []byte, x []float32, acc *[8]float64) {
	if holds(bits, len(x)/8) { // the length signNEONAsm trusts
		signNEONAsm(bits, x, acc)
	}
}

// unsignNEONAsm is unsignGeneric.
//
//go:noescape
func unsignNEONAsm(out []float32, bits []byte, sb uint32, add bool)

func unsignNEON(out []float32, bits []byte, sb uint32, add bool) {
	if holds(bits, len(out)/8) { // the length unsignNEONAsm trusts
		unsignNEONAsm(out, bits, sb, add)
	}
}

// fp16NEONAsm and bf16NEONAsm are fp16Generic and bf16Generic for len(x) a
// positive multiple of 8.
//
//go:noescape
func fp16NEONAsm(out []byte, x []float32) bool

//go:noescape
func bf16NEONAsm(out []byte, x []float32) bool

// fp16DecodeNEONAsm and bf16DecodeNEONAsm are fp16DecodeGeneric and
// bf16DecodeGeneric for len(out) a positive multiple of 8.
//
//go:noescape
func fp16DecodeNEONAsm(out []float32, in []byte, add bool)

//go:noescape
func bf16DecodeNEONAsm(out []float32, in []byte, add bool)

func fp16NEON(out []byte, x []float32) bool { return halfSplit(out, x, fp16NEONAsm, fp16Generic) }

func bf16NEON(out []byte, x []float32) bool { return halfSplit(out, x, bf16NEONAsm, bf16Generic) }

func fp16DecodeNEON(out []float32, in []byte, add bool) {
	halfDecodeSplit(out, in, add, fp16DecodeNEONAsm, fp16DecodeGeneric)
}

func bf16DecodeNEON(out []float32, in []byte, add bool) {
	halfDecodeSplit(out, in, add, bf16DecodeNEONAsm, bf16DecodeGeneric)
}

// addNEONAsm and subNEONAsm are addGeneric and subGeneric for a length (of
// dst, res) that is a positive multiple of 8.
//
//go:noescape
func addNEONAsm(dst, a, b []float32)

//go:noescape
func subNEONAsm(res, src []float32)

func addNEON(dst, a, b []float32) { addSplit(dst, a, b, addNEONAsm) }

func subNEON(res, src []float32) { subSplit(res, src, subNEONAsm) }
