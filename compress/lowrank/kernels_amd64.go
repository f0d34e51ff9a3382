//go:build !purego

package lowrank

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// AVX-512 versions of MulQ, MulTP, Decompose and Orthogonalize's loops,
// used when the CPU has AVX-512F and the OS saves the opmask and ZMM state
// (else the AVX2 ones of avx2_amd64.go where the CPU has AVX2 and FMA;
// build with -tags purego to keep the Go loops). Each computes exactly
// what its generic twin computes, bit for bit: the same products and sums
// in the same order (VMULPS then VADDPS, never a fused multiply-add), lane
// l of a ZMM accumulator holding the reference loop's partial sum l (MulQ:
// the columns j with j%32 = l, or l+16 for the second register of a
// pair). TestKernelVersions (every version the CPU runs), TestMulQ,
// TestMulTP, TestDecompose, TestOrthogonalizeKernels, TestF64Kernels and
// FuzzKernels (the versions in use) compare them with the generic loops.
//
// The matrix kernels read Q transposed, r rows of ld = padCols(cols)
// floats, zero-padded, 64-byte aligned, in a pooled buffer
// (transposeAVX512; MulTP's sums too, untransposed by untransposeQ): a
// row of m then meets each column of Q as contiguous vectors. Whole pairs
// of 16-lane vectors (32 columns) go through the main loops, the last
// cols%32 columns through the same arithmetic with the opmasks K1 and K2
// (tailMasks), whose zero-masked loads never touch memory past a row of
// m. MulQ and Decompose take two rows at a time (sharing Q's loads), an
// odd last row as a pair of itself.
func init() {
	// golang.org/x/sys/cpu reports AVX2 and AVX-512F only where the OS
	// saves the YMM (and opmask and ZMM) state.
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		return
	}
	if !cpu.X86.HasAVX512F {
		avx2Kernels()
		return
	}
	kernelSet = "avx512"
	mulQKernel = mulQAVX512
	mulTPKernel = mulTPAVX512
	decomposeKernel = decomposeAVX512
	sumKernel = sumAVX512
	dot2Kernel = dot2AVX512
	axpyDotKernel = axpyDotAVX512
	scaleF64Kernel = scaleF64AVX512
	loadPKernel = loadPAVX512
	storePKernel = storePAVX512
}

// padCols returns the row length of the kernels' transposed Q: cols
// rounded up to a multiple of 32 (a whole last pair of vectors), plus 16
// so that a row is an odd number of 64-byte lines: the rows of a group of
// ks then fall in different sets of the L1 cache (rows 4 KiB apart all
// fall in one, and MulQ's 8 and Decompose's 16 rows at r = 8 would evict
// each other from its 12 ways).
func padCols(cols int) int { return (cols+31)&^31 + 16 }

// transposeAsm sets the first ⌈cols/16⌉·16 floats of each row k of qt
// (r rows, ld floats apart) to column k of q (cols×r), times scale if
// mul is 1, zero past cols; idx holds 0, r, 2r, ..., 15r.
//
//go:noescape
func transposeAsm(qt, q *float32, idx *[16]int32, cols, r, ld, k1, mul int, scale float32)

// transposeAVX512 is transposeQ by gathers.
func transposeAVX512(qt []float32, ld int, q []float32, cols, r int, scale float32) {
	var idx [16]int32
	for l := range idx {
		idx[l] = int32(l * r)
	}
	mul := 0
	if scale != 1 {
		mul = 1
	}
	transposeAsm(&qt[0], &q[0], &idx, cols, r, ld, 1<<(cols%16)-1, mul, scale)
	for k := range r {
		clear(qt[k*ld+(cols+15)&^15 : (k+1)*ld])
	}
}

// untransposeAsm sets q (cols×r, r dividing 16) to the transpose of t (r
// rows, ld floats apart): chunks = cols·r/16 whole vectors, then the k1
// lanes of one more; idx[l] = (l%r)·ld + l/r, step = 64/r.
//
//go:noescape
func untransposeAsm(q, t *float32, idx *[16]int32, chunks, step, k1 int)

// untransposeQ sets q (cols×r) to the transpose of t (r×ld): by gathers
// when r divides 16 (the lanes of a vector of q then follow one pattern
// of rows and columns of t) and the gathers' int32 indices hold, else
// element by element.
func untransposeQ(q, t []float32, ld, cols, r int) {
	if 16%r != 0 || (r-1)*ld >= 1<<31-16 {
		untransposeGo(q, t, ld, cols, r)
		return
	}
	var idx [16]int32
	for l := range idx {
		idx[l] = int32(l%r*ld + l/r)
	}
	n := cols * r
	untransposeAsm(&q[0], &t[0], &idx, n/16, 64/r, 1<<(n%16)-1)
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

// The assembly loops. Each takes pb = 128·(cols/32), the bytes of a row
// in whole pairs of vectors, k1 and k2 = tailMasks(cols), and ld =
// padCols(cols); strides are in bytes.

// mulQAsm sets n pairs of rows of p (row A at p, row B pstride bytes
// further) to the rows of m (row A at m, B mstride bytes further) times
// q, given transposed as qt (r×ld). With mstride = pstride = 0 it does
// one row (twice). Pairs follow each other: the next row A is 2·mstride
// and 2·pstride bytes on.
//
//go:noescape
func mulQAsm(p, m, qt *float32, n, mstride, pstride, ld, r, pb, k1, k2 int)

// mulTPAsm adds the n rows of m at m (of cols floats each, their rows of
// p at p) times p to the sums s (r×ld, q transposed): starting from zero
// instead of s if mode&1, and adding the result to t (r×ld) instead of
// storing it in s if mode&2.
//
//go:noescape
func mulTPAsm(s, t, m, p *float32, n, cols, ld, r, pb, k1, k2, mode int)

// decomposeAsm is Decompose on n pairs of rows (rows A and B stride bytes
// apart in out, res and m, pstride bytes in p; 0 and 0: one row, twice),
// with scale·qAvg and qOwn given transposed as qa and qo (r×ld). The first ntpb
// bytes of each row of out (0, or pb) are written with non-temporal
// stores, which need them 64-byte aligned.
//
//go:noescape
func decomposeAsm(out, res, m, p, qa, qo *float32, n, stride, pstride, ld, r, pb, k1, k2, ntpb int)

// mulQAVX512 is mulQGeneric: pairs of rows by mulQAsm, then an odd last
// row by mulQAsm with strides 0.
func mulQAVX512(p, m []float32, rows, cols int, q []float32, r int) {
	if cols == 0 {
		clear(p)
		return
	}
	ld := padCols(cols)
	qt, h := scratch32(r * ld)
	defer pool32.Put(h)
	transposeAVX512(qt, ld, q, cols, r, 1)
	k1, k2 := tailMasks(cols)
	pb := cols / 32 * 128
	if n := rows / 2; n > 0 {
		mulQAsm(&p[0], &m[0], &qt[0], n, 4*cols, 4*r, ld, r, pb, k1, k2)
	}
	if rows%2 == 1 {
		i := rows - 1
		mulQAsm(&p[i*r], &m[i*cols], &qt[0], 1, 0, 0, ld, r, pb, k1, k2)
	}
}

// tpGroup returns the number of rows mulTPAsm adds at a time for rank r.
// A group of a whole block keeps its sums in registers from its first row
// to its last, but each pair of vectors of columns is then one chain of
// 32 dependent additions per k: with 4 ks at a time there are 8 chains to
// interleave, with one k (r < 4) only 2, and groups of 8 rows, whose sums
// go through s between groups, let the next pair's chains start sooner
// (1024×1024 in L3, measured on the AVX-512 EPYC: r = 4, 52 µs with
// groups of 32, 57 with 16, 62 with 8; r = 1, 47, 42 and 42 µs).
func tpGroup(r int) int {
	if r < 4 {
		return 8
	}
	return tpBlock
}

// mulTPAVX512 is mulTPGeneric: each block of tpBlock rows in groups of
// tpGroup rows by mulTPAsm, the block's sums in s between groups, then
// added to t.
func mulTPAVX512(q, m []float32, rows, cols int, p []float32, r int) {
	if rows == 0 {
		clear(q)
		return
	}
	ld := padCols(cols)
	buf, h := scratch32(2 * r * ld)
	defer pool32.Put(h)
	s, t := buf[:r*ld], buf[r*ld:]
	clear(t)
	k1, k2 := tailMasks(cols)
	pb := cols / 32 * 128
	group := tpGroup(r)
	for b := 0; b < rows; b += tpBlock {
		e := min(b+tpBlock, rows)
		for g := b; g < e; g += group {
			n := min(group, e-g)
			mode := 0
			if g == b {
				mode |= 1
			}
			if g+n == e {
				mode |= 2
			}
			mulTPAsm(&s[0], &t[0], &m[g*cols], &p[g*r], n, cols, ld, r, pb, k1, k2, mode)
		}
	}
	untransposeQ(q, t, ld, cols, r)
}

// ntMin is the length of out (1 MiB) from which Decompose writes it with
// non-temporal stores, if its rows are 64-byte aligned (out is, and cols
// is a multiple of 16): they skip the read for ownership of each line
// that ordinary stores make, a third of Decompose's traffic when res is m
// (1024×1024, r = 4, in L3: 98 µs instead of 126, measured on the AVX-512
// EPYC), and leave out in memory, not in the caches, where a matrix that
// large would not stay long anyway. res, which is usually m itself and so
// already in the cache, is written through it (non-temporal stores of
// both make Decompose slower: 209 µs, the two streams then wait on
// memory's write bandwidth).
const ntMin = 1 << 18

// When qa and qo together (2·r·ld floats) take more than decomposeWhole
// bytes, decomposeAVX512 works on strips of columns, all rows of a strip
// before the next, each strip's qa and qo decomposeStrip bytes (a width
// that is a multiple of 32, at least 64), so that they stay in the 48 KiB
// L1 with the rows streaming through it: at r = 8 and 1024 columns
// (66 KiB of qa and qo) Decompose took 230 µs instead of 317 (1024×1024
// in L3, measured on the AVX-512 EPYC); at r = 4 (33 KiB) strips of
// 16 KiB made it slower, 120 µs instead of 111.
const (
	decomposeWhole = 40 << 10
	decomposeStrip = 16 << 10
)

// decomposePlan is what the assembly Decomposes share: Q's transposes qa
// (scaled) and qo, whether out takes non-temporal stores (nt), and the
// width of the strips of columns they go through; put returns the
// transposes' buffer to the pool.
func decomposePlan(out []float32, cols int, qAvg, qOwn []float32, r int, scale float32,
	transpose func(qt []float32, ld int, q []float32, cols, r int, scale float32)) (qa, qo []float32, ld, width int, nt bool, put func()) {
	ld = padCols(cols)
	qt, h := scratch32(2 * r * ld)
	qa, qo = qt[:r*ld], qt[r*ld:]
	transpose(qa, ld, qAvg, cols, r, scale)
	transpose(qo, ld, qOwn, cols, r, 1)
	nt = len(out) >= ntMin && cols%16 == 0 && uintptr(unsafe.Pointer(&out[0]))%64 == 0
	width = cols
	if 8*r*ld > decomposeWhole {
		width = max(64, decomposeStrip/(8*r)&^31)
	}
	return qa, qo, ld, width, nt, func() { pool32.Put(h) }
}

// decomposeAVX512 is decomposeGeneric: strip by strip of columns, pairs
// of rows by decomposeAsm, then an odd last row by decomposeAsm with
// strides 0.
func decomposeAVX512(out, res, m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32) {
	qa, qo, ld, width, nt, put := decomposePlan(out, cols, qAvg, qOwn, r, scale, transposeAVX512)
	defer put()
	for c := 0; c < cols; c += width {
		w := min(width, cols-c)
		k1, k2 := tailMasks(w)
		pb := w / 32 * 128
		ntpb := 0
		if nt {
			ntpb = pb
		}
		if n := rows / 2; n > 0 {
			decomposeAsm(&out[c], &res[c], &m[c], &p[0], &qa[c], &qo[c], n, 4*cols, 4*r, ld, r, pb, k1, k2, ntpb)
		}
		if rows%2 == 1 {
			i := rows - 1
			decomposeAsm(&out[i*cols+c], &res[i*cols+c], &m[i*cols+c], &p[i*r], &qa[c], &qo[c], 1, 0, 0, ld, r, pb, k1, k2, ntpb)
		}
	}
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

// f64Masks returns the opmasks of the last len%16 elements of a float64
// loop: the lanes of its two registers of 8.
func f64Masks(n int) (k1, k2 int) {
	switch rem := n % 16; {
	case rem == 0:
		return 0, 0
	case rem <= 8:
		return 1<<rem - 1, 0
	default:
		return 0xff, 1<<(rem-8) - 1
	}
}

// dot2Asm, axpyDotAsm and scaleF64Asm are dot2Generic, axpyDotGeneric and
// scaleF64Generic on n elements, with k1, k2 = f64Masks(n).
//
//go:noescape
func dot2Asm(a, b *float64, n, k1, k2 int) (aa, ab float64)

//go:noescape
func axpyDotAsm(y, x, z *float64, n, k1, k2 int, d float64) float64

//go:noescape
func scaleF64Asm(y *float64, n, k1, k2 int, c float64)

func dot2AVX512(a, b []float64) (aa, ab float64) {
	if len(a) == 0 {
		return 0, 0
	}
	_ = b[len(a)-1] // the length dot2Asm trusts
	k1, k2 := f64Masks(len(a))
	return dot2Asm(&a[0], &b[0], len(a), k1, k2)
}

func axpyDotAVX512(y []float64, d float64, x, z []float64) float64 {
	if len(y) == 0 {
		return 0
	}
	_, _ = x[len(y)-1], z[len(y)-1] // the lengths axpyDotAsm trusts
	k1, k2 := f64Masks(len(y))
	return axpyDotAsm(&y[0], &x[0], &z[0], len(y), k1, k2, d)
}

func scaleF64AVX512(y []float64, c float64) {
	if len(y) == 0 {
		return
	}
	k1, k2 := f64Masks(len(y))
	scaleF64Asm(&y[0], len(y), k1, k2, c)
}

// loadPAsm sets w (r columns of rows float64) to the columns of p
// (rows×r) and reports whether p holds a NaN or ±Inf; idx holds 0, r,
// ..., 15r and k1 the lanes of the last rows%16 rows.
//
//go:noescape
func loadPAsm(w *float64, p *float32, idx *[16]int32, rows, r, k1 int) (bad bool)

// storePAsm sets p (rows×r, r dividing 16) to w (r columns of rows
// float64) rounded to float32: chunks = rows·r/16 whole vectors, then the
// k1 lanes of one more; idx[l] = (l%r)·rows + l/r, step = 8·16/r.
//
//go:noescape
func storePAsm(p *float32, w *float64, idx *[16]int32, chunks, step, k1 int)

func loadPAVX512(w []float64, p []float32, rows, r int) bool {
	if rows == 0 {
		return true
	}
	_ = w[rows*r-1] // the length loadPAsm trusts
	var idx [16]int32
	for l := range idx {
		idx[l] = int32(l * r)
	}
	return !loadPAsm(&w[0], &p[0], &idx, rows, r, 1<<(rows%16)-1)
}

func storePAVX512(p []float32, w []float64, rows, r int) {
	if rows == 0 {
		return
	}
	if 16%r != 0 || rows > 1<<26 {
		storePGeneric(p, w, rows, r)
		return
	}
	_ = w[rows*r-1] // the length storePAsm trusts
	var idx [16]int32
	for l := range idx {
		idx[l] = int32(l%r*rows + l/r)
	}
	n := rows * r
	storePAsm(&p[0], &w[0], &idx, n/16, 8*16/r, 1<<(n%16)-1)
}
