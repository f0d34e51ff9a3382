//go:build !purego

package lowrank

import "unsafe"

// AVX-512 versions of MulQ, MulTP and Decompose, used when the CPU has
// AVX-512F and the OS saves the opmask and ZMM state (build with -tags
// purego to keep the Go loops). Each computes exactly what its generic
// twin computes, bit for bit: the same float32 products and sums in the
// same order (VMULPS then VADDPS, never a fused multiply-add), lane l of a
// ZMM accumulator holding the reference loop's partial sum of the columns
// j with j%32 = l (or l+16 for the second of a pair). TestKernels runs
// each pair on the same inputs.
//
// The kernels read Q transposed, r rows of ld = cols rounded up to 32
// floats, zero-padded, 64-byte aligned (transposeQ, into a pooled
// buffer): a row of m then meets each column of Q as a contiguous vector.
// Whole pairs of 16-lane vectors (32 columns) go through the main loops,
// the last cols%32 columns through the same arithmetic with the opmasks
// K1 and K2 (tailMasks), whose zero-masked loads never touch memory past
// a row of m.
func init() {
	if !cpuFeatures() || !avx512Features() {
		return
	}
	kernelSet = "avx512"
	mulQKernel = mulQAVX512
	mulTPKernel = mulTPAVX512
	decomposeKernel = decomposeAVX512
	sumKernel = sumAVX512
}

// cpuFeatures reports whether the CPU has AVX2 and FMA, with the OS saving
// the YMM state (as compress's cpuFeatures).
func cpuFeatures() bool {
	if maxID, _, _, _ := cpuid(0, 0); maxID < 7 {
		return false
	}
	const fma, osxsave, avx = 1 << 12, 1 << 27, 1 << 28
	if _, _, ecx, _ := cpuid(1, 0); ecx&fma == 0 || ecx&osxsave == 0 || ecx&avx == 0 {
		return false
	}
	xcr0, _ := xgetbv()
	_, ebx, _, _ := cpuid(7, 0)
	const avx2Bit = 1 << 5
	return xcr0&0x06 == 0x06 && ebx&avx2Bit != 0 // XMM and YMM state
}

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

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

// padCols returns cols rounded up to a multiple of 32: the row length of
// the kernels' transposed Q.
func padCols(cols int) int { return (cols + 31) &^ 31 }

// transposeQ sets qt (r×ld) to the transpose of q (cols×r), each row
// zero-padded from cols to ld.
func transposeQ(qt []float32, ld int, q []float32, cols, r int) {
	for j := range cols {
		for k, v := range q[j*r : (j+1)*r] {
			qt[k*ld+j] = v
		}
	}
	for k := range r {
		clear(qt[k*ld+cols : (k+1)*ld])
	}
}

// tailMasks returns the opmasks of the last cols%32 columns: the lanes of
// the first and of the second vector of the last pair (both 0 when cols
// is a multiple of 32).
func tailMasks(cols int) (k1, k2 int) {
	switch rem := cols % 32; {
	case rem == 0:
		return 0, 0
	case rem <= 16:
		return 1<<rem - 1, 0
	default:
		return 0xffff, 1<<(rem-16) - 1
	}
}

// mulQAsm sets p (rows×r) = m (rows×cols) · q, q given transposed as qt
// (r×ld). pairs is cols/32, the pairs of vectors of a row the main loops
// read; k1 and k2 are tailMasks(cols).
//
//go:noescape
func mulQAsm(p, m, qt *float32, rows, cols, ld, r, pairs, k1, k2 int)

// mulTPAsm adds mᵀ·p to t (r×ld, q transposed), in MulTP's blocks of 32
// rows.
//
//go:noescape
func mulTPAsm(t, m, p *float32, rows, cols, ld, r, pairs, k1, k2 int)

// decomposeAsm is Decompose with qAvg and qOwn given transposed as qa and
// qo (r×ld).
//
//go:noescape
func decomposeAsm(out, res, m, p, qa, qo *float32, rows, cols, ld, r, pairs, k1, k2 int, scale float32)

func mulQAVX512(p, m []float32, rows, cols int, q []float32, r int) {
	if cols == 0 {
		clear(p)
		return
	}
	ld := padCols(cols)
	qt, h := scratch32(r * ld)
	defer pool32.Put(h)
	transposeQ(qt, ld, q, cols, r)
	k1, k2 := tailMasks(cols)
	mulQAsm(unsafe.SliceData(p), unsafe.SliceData(m), unsafe.SliceData(qt), rows, cols, ld, r, cols/32, k1, k2)
}

func mulTPAVX512(q, m []float32, rows, cols int, p []float32, r int) {
	if rows == 0 {
		clear(q)
		return
	}
	ld := padCols(cols)
	t, h := scratch32(r * ld)
	defer pool32.Put(h)
	clear(t)
	k1, k2 := tailMasks(cols)
	mulTPAsm(unsafe.SliceData(t), unsafe.SliceData(m), unsafe.SliceData(p), rows, cols, ld, r, cols/32, k1, k2)
	for j := range cols {
		qj := q[j*r : (j+1)*r]
		for k := range qj {
			qj[k] = t[k*ld+j]
		}
	}
}

func decomposeAVX512(out, res, m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32) {
	ld := padCols(cols)
	qt, h := scratch32(2 * r * ld)
	defer pool32.Put(h)
	qa, qo := qt[:r*ld], qt[r*ld:]
	transposeQ(qa, ld, qAvg, cols, r)
	transposeQ(qo, ld, qOwn, cols, r)
	k1, k2 := tailMasks(cols)
	decomposeAsm(unsafe.SliceData(out), unsafe.SliceData(res), unsafe.SliceData(m), unsafe.SliceData(p),
		unsafe.SliceData(qa), unsafe.SliceData(qo), rows, cols, ld, r, cols/32, k1, k2, scale)
}

// sumAsm returns the sum of the n floats at x, n a positive multiple of 64.
//
//go:noescape
func sumAsm(x *float32, n int) float32

// sumAVX512 is sumGeneric (the benchmarks' read of a matrix) by sumAsm on
// whole groups of 64 floats.
func sumAVX512(x []float32) float32 {
	n := len(x) &^ 63
	s := sumGeneric(x[n:])
	if n > 0 {
		s += sumAsm(unsafe.SliceData(x), n)
	}
	return s
}
