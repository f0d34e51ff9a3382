package lowrank

import (
	"fmt"
	"sync"
	"unsafe"
)

// kernelSet names the kernels MulQ, MulTP, Decompose and Orthogonalize
// run: "avx512", "avx2" (Orthogonalize's loops then generic) or "generic"
// (the Go loops). The tests log it.
var kernelSet = "generic"

// The kernels in use; init on amd64 installs the assembly ones over the
// generic ones (kernels_amd64.go).
var (
	mulQKernel      = mulQGeneric
	mulTPKernel     = mulTPGeneric
	decomposeKernel = decomposeGeneric
)

// MulQ sets p = m·q (p: rows×r, m: rows×cols, q: cols×r, all row-major):
// the first step of a PowerSGD round. Each element is the reference loop
//
//	var acc [32]float32
//	for j := range cols {
//		acc[j%32] += float32(m[i*cols+j] * q[j*r+k])
//	}
//	for w := 16; w >= 1; w /= 2 {
//		for l := range w {
//			acc[l] += acc[l+w]
//		}
//	}
//	p[i*r+k] = acc[0]
//
// bit for bit: 32 float32 partial sums, each product rounded before it is
// added, folded in halves. Rows are independent, so MulQ on a range of rows
// (m[i0*cols:i1*cols], p[i0*r:i1*r]) gives the same bits as on all of them.
// It panics if rows, cols < 0, r < 1, a length is not the one the sizes
// give, or p overlaps m or q.
func MulQ(p, m []float32, rows, cols int, q []float32, r int) {
	const fn = "MulQ"
	checkSizes(fn, rows, cols, r)
	checkLen(fn, "p", len(p), "rows·r", rows, r)
	checkLen(fn, "m", len(m), "rows·cols", rows, cols)
	checkLen(fn, "q", len(q), "cols·r", cols, r)
	checkApart(fn, "p", p, "m", m)
	checkApart(fn, "p", p, "q", q)
	if rows == 0 {
		return
	}
	mulQKernel(p, m, rows, cols, q, r)
}

// tpBlock is the number of rows whose products MulTP sums on their own
// before it adds them to the total.
const tpBlock = 32

// MulTP sets q = mᵀ·p (q: cols×r, m: rows×cols, p: rows×r, all row-major):
// the second step of a PowerSGD round, after Orthogonalize. It is a
// reduction over the rows, in one fixed order: float32 sums over blocks of
// 32 rows, added in turn to a float32 total. Each element is the
// reference loop
//
//	var t float32
//	for b := 0; b < rows; b += 32 {
//		var s float32
//		for i := b; i < min(b+32, rows); i++ {
//			s += float32(m[i*cols+j] * p[i*r+k])
//		}
//		t += s
//	}
//	q[j*r+k] = t
//
// bit for bit. The blocks bound the rounding error at about
// (32 + rows/32)·2⁻²⁴ of Σᵢ|m[i,j]·p[i,k]| instead of the rows·2⁻²⁴ of a
// single running sum (for 4096 rows, 160 units of float32's last place
// instead of 4096), at no cost in speed: the assembly keeps a block's
// sums in registers and adds them to the total once per block. Float32
// sums keep MulTP at the speed of MulQ (float64 would halve the lanes of
// every multiply and add). It panics if rows, cols < 0, r < 1, a length
// is not the one the sizes give, or q overlaps m or p.
func MulTP(q, m []float32, rows, cols int, p []float32, r int) {
	const fn = "MulTP"
	checkSizes(fn, rows, cols, r)
	checkLen(fn, "q", len(q), "cols·r", cols, r)
	checkLen(fn, "m", len(m), "rows·cols", rows, cols)
	checkLen(fn, "p", len(p), "rows·r", rows, r)
	checkApart(fn, "q", q, "m", m)
	checkApart(fn, "q", q, "p", p)
	if cols == 0 {
		return
	}
	mulTPKernel(q, m, rows, cols, p, r)
}

// Decompose writes, in one pass over m, out = p·(scale·qAvg)ᵀ, the
// averaged low-rank approximation, and res = m − p·qOwnᵀ, the
// error-feedback residual (out, res, m: rows×cols; p: rows×r; qAvg,
// qOwn: cols×r; all row-major): the last step of a PowerSGD round. scale
// multiplies qAvg first, as PyTorch's PowerSGD hook divides the summed Q
// by the number of workers before it multiplies: 1 if qAvg is already
// the mean, 1/n if it is the sum over n workers. Each element is the
// reference loop
//
//	a := float32(p[i*r] * float32(scale*qAvg[j*r]))
//	o := float32(p[i*r] * qOwn[j*r])
//	for k := 1; k < r; k++ {
//		a += float32(p[i*r+k] * float32(scale*qAvg[j*r+k]))
//		o += float32(p[i*r+k] * qOwn[j*r+k])
//	}
//	out[i*cols+j] = a
//	res[i*cols+j] = m[i*cols+j] - o
//
// bit for bit. res may be m itself (the residual replaces m in place, the
// usual error feedback); otherwise no output may overlap another output
// or an input, and qAvg may be qOwn. Rows are independent, so Decompose on
// a range of rows gives the same bits as on all of them. On amd64 (AVX2
// or AVX-512) an out of at least 1 MiB whose rows are 64-byte aligned
// (out is, and cols is a multiple of 16) is written with non-temporal
// stores, which bypass the caches: it is then in memory, not in cache,
// when Decompose returns. It
// panics if rows, cols < 0, r < 1, a length is not the one the sizes
// give, or the slices overlap otherwise.
func Decompose(out, res, m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32) {
	const fn = "Decompose"
	checkSizes(fn, rows, cols, r)
	checkLen(fn, "out", len(out), "rows·cols", rows, cols)
	checkLen(fn, "res", len(res), "rows·cols", rows, cols)
	checkLen(fn, "m", len(m), "rows·cols", rows, cols)
	checkLen(fn, "p", len(p), "rows·r", rows, r)
	checkLen(fn, "qAvg", len(qAvg), "cols·r", cols, r)
	checkLen(fn, "qOwn", len(qOwn), "cols·r", cols, r)
	checkApart(fn, "out", out, "res", res)
	checkApart(fn, "out", out, "m", m)
	if len(res) > 0 && unsafe.SliceData(res) != unsafe.SliceData(m) {
		checkApart(fn, "res", res, "m", m)
	}
	for _, o := range []struct {
		name string
		x    []float32
	}{{"out", out}, {"res", res}} {
		checkApart(fn, o.name, o.x, "p", p)
		checkApart(fn, o.name, o.x, "qAvg", qAvg)
		checkApart(fn, o.name, o.x, "qOwn", qOwn)
	}
	if rows == 0 || cols == 0 {
		return
	}
	decomposeKernel(out, res, m, rows, cols, p, qAvg, qOwn, r, scale)
}

// checkSizes panics unless rows, cols ≥ 0 and r ≥ 1, and rows·cols,
// rows·r and cols·r fit an int.
func checkSizes(fn string, rows, cols, r int) {
	if rows < 0 || cols < 0 || r < 1 {
		panic(fmt.Sprintf("lowrank.%s: rows = %d, cols = %d, r = %d: want rows, cols ≥ 0 and r ≥ 1", fn, rows, cols, r))
	}
	for _, d := range [][2]int{{rows, cols}, {rows, r}, {cols, r}} {
		if d[0] != 0 && d[1] > maxInt/d[0] {
			panic(fmt.Sprintf("lowrank.%s: rows = %d, cols = %d, r = %d: %d·%d overflows int", fn, rows, cols, r, d[0], d[1]))
		}
	}
}

const maxInt = int(^uint(0) >> 1)

// checkLen panics unless got == a·b, naming the function, the slice and
// both lengths.
func checkLen(fn, name string, got int, what string, a, b int) {
	if got != a*b {
		panic(fmt.Sprintf("lowrank.%s: len(%s) = %d, want %s = %d·%d = %d", fn, name, got, what, a, b, a*b))
	}
}

// checkApart panics if a and b share memory.
func checkApart(fn, an string, a []float32, bn string, b []float32) {
	if len(a) == 0 || len(b) == 0 {
		return
	}
	pa := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	pb := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if pa < pb+4*uintptr(len(b)) && pb < pa+4*uintptr(len(a)) {
		panic(fmt.Sprintf("lowrank.%s: %s and %s overlap", fn, an, bn))
	}
}

// Scratch buffers: the transposed Q of the assembly kernels, the partial
// sums of the generic ones, Orthogonalize's float64 copy of P.
var pool32, pool64 sync.Pool

// scratch32 returns a buffer of n float32 from pool32 (contents unknown)
// whose start is 64-byte aligned, and the handle to give back with
// pool32.Put.
func scratch32(n int) ([]float32, *[]float32) {
	h, _ := pool32.Get().(*[]float32)
	if h == nil || cap(*h) < n+16 {
		b := make([]float32, n+16)
		h = &b
	}
	b := (*h)[:cap(*h)]
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) & 63 / 4)
	off = (16 - off) & 15
	return b[off : off+n], h
}

// scratch64 returns a buffer of n float64 from pool64 (contents unknown)
// and the handle to give back with pool64.Put.
func scratch64(n int) ([]float64, *[]float64) {
	h, _ := pool64.Get().(*[]float64)
	if h == nil || cap(*h) < n {
		b := make([]float64, n)
		h = &b
	}
	return (*h)[:n], h
}
