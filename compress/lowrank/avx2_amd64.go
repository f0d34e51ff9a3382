//go:build !purego

package lowrank

import "unsafe"

// AVX2 versions of MulQ, MulTP and Decompose, used when the CPU has AVX2
// and FMA with the OS saving the YMM state but no AVX-512F (an AVX-512 CPU
// runs the AVX-512 ones; Orthogonalize keeps its Go loops here). They
// compute what the generic loops compute, bit for bit, on four YMM
// registers where the AVX-512 kernels use two ZMM (avx2_amd64.s);
// TestKernelVersions compares them with the generic loops on any CPU that
// has AVX2. One row at a time, ks two at a time: the 16 YMM registers
// hold no more. Q is transposed and untransposed by Go loops
// (transposeGo, untransposeGo).

// avx2Kernels installs the AVX2 kernels (init, kernels_amd64.go).
func avx2Kernels() {
	kernelSet = "avx2"
	mulQKernel = mulQAVX2
	mulTPKernel = mulTPAVX2
	decomposeKernel = decomposeAVX2
	sumKernel = sumAVX2
}

// transposeGo sets qt (r×ld) to the transpose of scale·q (q: cols×r),
// each row zero-padded from cols to ld.
func transposeGo(qt []float32, ld int, q []float32, cols, r int, scale float32) {
	for k := range r {
		row, col := qt[k*ld:(k+1)*ld], q[k:]
		if scale == 1 {
			for j := range cols {
				row[j] = col[j*r]
			}
		} else {
			for j := range cols {
				row[j] = scale * col[j*r]
			}
		}
		clear(row[cols:])
	}
}

// untransposeGo sets q (cols×r) to the transpose of t (r×ld).
func untransposeGo(q, t []float32, ld, cols, r int) {
	for j := range cols {
		qj := q[j*r : (j+1)*r]
		for k := range qj {
			qj[k] = t[k*ld+j]
		}
	}
}

// quadMask returns the masks of the last cols%32 columns for the AVX2
// kernels' VMASKMOVPS (−1 for a column left, 0 past them), or nil when
// cols is a multiple of 32.
func quadMask(cols int) *[32]int32 {
	rem := cols % 32
	if rem == 0 {
		return nil
	}
	var mask [32]int32
	for l := range rem {
		mask[l] = -1
	}
	return &mask
}

// The assembly loops; qb = 128·(cols/32) is the bytes of a row in whole
// quads of registers, mask = quadMask(cols), ld = padCols(cols).

// mulQAVX2Asm sets the rows×r p to m (rows×cols) times q, given
// transposed as qt (r×ld).
//
//go:noescape
func mulQAVX2Asm(p, m, qt *float32, rows, cols, ld, r, qb int, mask *[32]int32)

// mulTPAVX2Asm adds the sums over the n rows at m (their rows of p at p)
// of m[i,·]·p[i,k] to t (r×ld, q transposed).
//
//go:noescape
func mulTPAVX2Asm(t, m, p *float32, n, cols, ld, r, qb int, mask *[32]int32)

// decomposeAVX2Asm is Decompose on rows rows stride bytes apart (in out,
// res and m; p's are r floats apart), with scale·qAvg and qOwn given
// transposed as qa and qo (r×ld); the first ntqb bytes of each row of out
// (0, or qb) are stored non-temporally, which needs them 32-byte aligned.
//
//go:noescape
func decomposeAVX2Asm(out, res, m, p, qa, qo *float32, rows, stride, ld, r, qb int, mask *[32]int32, ntqb int)

// sumAVX2Asm returns the sum of the n floats at x, n a positive multiple
// of 32.
//
//go:noescape
func sumAVX2Asm(x *float32, n int) float32

func mulQAVX2(p, m []float32, rows, cols int, q []float32, r int) {
	if cols == 0 {
		clear(p)
		return
	}
	ld := padCols(cols)
	qt, h := scratch32(r * ld)
	defer pool32.Put(h)
	transposeGo(qt, ld, q, cols, r, 1)
	mulQAVX2Asm(&p[0], &m[0], &qt[0], rows, cols, ld, r, cols/32*128, quadMask(cols))
}

func mulTPAVX2(q, m []float32, rows, cols int, p []float32, r int) {
	if rows == 0 {
		clear(q)
		return
	}
	ld := padCols(cols)
	t, h := scratch32(r * ld)
	defer pool32.Put(h)
	clear(t)
	mask := quadMask(cols)
	for b := 0; b < rows; b += tpBlock {
		n := min(tpBlock, rows-b)
		mulTPAVX2Asm(&t[0], &m[b*cols], &p[b*r], n, cols, ld, r, cols/32*128, mask)
	}
	untransposeGo(q, t, ld, cols, r)
}

func decomposeAVX2(out, res, m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32) {
	qa, qo, ld, width, nt, put := decomposePlan(out, cols, qAvg, qOwn, r, scale, transposeGo)
	defer put()
	for c := 0; c < cols; c += width {
		w := min(width, cols-c)
		qb, ntqb := w/32*128, 0
		if nt {
			ntqb = qb
		}
		decomposeAVX2Asm(&out[c], &res[c], &m[c], &p[0], &qa[c], &qo[c], rows, 4*cols, ld, r, qb, quadMask(w), ntqb)
	}
}

func sumAVX2(x []float32) float32 {
	n := len(x) &^ 31
	s := sumGeneric(x[n:])
	if n > 0 {
		s += sumAVX2Asm(unsafe.SliceData(x), n)
	}
	return s
}
