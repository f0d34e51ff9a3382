package lowrank

import (
	"fmt"
	"math"
)

// Eps is Orthogonalize's rank-deficiency threshold: a column whose norm,
// after the projections onto the columns before it, is at most Eps times
// its norm before them is taken as dependent on them and zeroed. 1e-6 is
// about 17 units in the last place of float32 (2⁻²⁴ ≈ 6e-8): a part of a
// column that small is of the order of the rounding of float32 inputs (an
// exactly repeated column leaves about 1e-16 in Orthogonalize's float64
// arithmetic), so its direction is noise that normalizing would blow up
// into a unit vector; anything larger is kept. An all-zero column (norm 0
// before and after) is always zeroed.
const Eps = 1e-6

// Orthogonalize makes the r columns of p (rows×r, row-major) orthonormal
// in place by modified Gram-Schmidt, the second step of a PowerSGD round
// (after the all-reduce of P). It works on a float64 copy of p, column by
// column in order: column c's norm n₀ is taken, then for each earlier
// column k that was not zeroed, in order, its projection onto k is
// subtracted (the dot product of the updated column with column k, then
// the update), then its norm n; if n ≤ Eps·n₀ (a zero column, a repeated
// one, one in the span of those before: rank-deficient P) the column
// becomes all zero and counts in zeroed, else it is multiplied by 1/n.
// Dot products and norms are float64 sums in a fixed order (sixteen
// running sums over the rows by i mod 16, folded in halves) with every
// product rounded before it is added, and the result is rounded to
// float32 at the end: the same input gives the same bits on every run and
// machine, with the AVX-512 loops or the Go ones (which forbid fused
// multiply-adds, so arm64 agrees too).
//
// From finite input it never produces NaN or Inf: a float64 sum of
// squares of float32 values neither overflows nor underflows, and a column
// is scaled only by the reciprocal of a norm above Eps·n₀ > 0. If any
// element of p is NaN or ±Inf, every element becomes +0 and Orthogonalize
// returns r. With rows < r at least r − rows columns are zeroed. Columns
// whose float64 condition is poor but above Eps stay orthonormal to
// float32 rounding (TestOrthogonalizeIllConditioned: a Kahan matrix of
// condition 1e13).
//
// A zeroed column of P gives a zero column of Q = Mᵀ·P̂, and a zero column
// of the warm start Q a zero column of the next P: a caller that keeps Q
// from round to round should refill such columns (e.g. with random
// values) or they stay zero.
//
// It panics if rows < 0, r < 1 or len(p) != rows·r.
func Orthogonalize(p []float32, rows, r int) (zeroed int) {
	const fn = "Orthogonalize"
	if rows < 0 || r < 1 {
		panic(fmt.Sprintf("lowrank.%s: rows = %d, r = %d: want rows ≥ 0 and r ≥ 1", fn, rows, r))
	}
	checkSizes(fn, rows, 0, r)
	checkLen(fn, "p", len(p), "rows·r", rows, r)
	w, h := scratch64(rows * r) // column c is w[c*rows:(c+1)*rows]
	defer pool64.Put(h)
	if !loadPKernel(w, p, rows, r) {
		clear(p)
		return r
	}
	live := make([]int, 0, r) // the columns not zeroed, in order
	for c := range r {
		wc := w[c*rows : (c+1)*rows]
		// n0² and the first projection's dot product in one pass, then
		// each projection fused with the next one's dot product, the last
		// with the norm: the arithmetic of the separate passes, element by
		// element and sum by sum, in fewer reads of wc.
		var n0sq, nsq float64
		if len(live) == 0 {
			n0sq, _ = dot2Kernel(wc, wc)
			nsq = n0sq
		} else {
			var d float64
			n0sq, d = dot2Kernel(wc, w[live[0]*rows:(live[0]+1)*rows])
			for x, k := range live {
				wk := w[k*rows : (k+1)*rows]
				next := wc
				if x+1 < len(live) {
					next = w[live[x+1]*rows : (live[x+1]+1)*rows]
				}
				d = axpyDotKernel(wc, -d, wk, next)
			}
			nsq = d
		}
		n0, n := math.Sqrt(n0sq), math.Sqrt(nsq)
		if !(n > Eps*n0) || math.IsInf(n, 0) {
			clear(wc)
			zeroed++
			continue
		}
		scaleF64Kernel(wc, 1/n)
		live = append(live, c)
	}
	storePKernel(p, w, rows, r)
	return zeroed
}

// The float64 loops of Orthogonalize, with one summation order on every
// platform: sixteen running sums, s[i%16], folded in halves (lane l gets
// lane l+8, then l+4, l+2, l+1), each product rounded before it is added
// (the explicit conversions forbid fused multiply-adds). On amd64 with
// AVX-512 they are assembly loops (two vectors of 8 lanes) that give the
// same bits, as are the copies of P to and from its float64 columns
// (loadPKernel, storePKernel: gathers).
var (
	dot2Kernel     = dot2Generic
	axpyDotKernel  = axpyDotGeneric
	scaleF64Kernel = scaleF64Generic
	loadPKernel    = loadPGeneric
	storePKernel   = storePGeneric
)

// fold16 adds the sixteen running sums in halves.
func fold16(s *[16]float64) float64 {
	for w := 8; w >= 1; w /= 2 {
		for l := range w {
			s[l] += s[l+w]
		}
	}
	return s[0]
}

// dot2Generic returns Σ a[i]² and Σ a[i]·b[i].
func dot2Generic(a, b []float64) (aa, ab float64) {
	b = b[:len(a)]
	var s, t [16]float64
	for i, v := range a {
		s[i%16] += float64(v * v)
		t[i%16] += float64(v * b[i])
	}
	return fold16(&s), fold16(&t)
}

// axpyDotGeneric adds d·x to y and returns Σ z[i]·y[i] of the updated y
// (z may be y).
func axpyDotGeneric(y []float64, d float64, x, z []float64) float64 {
	x, z = x[:len(y)], z[:len(y)]
	var s [16]float64
	for i := range y {
		y[i] += float64(d * x[i])
		s[i%16] += float64(z[i] * y[i])
	}
	return fold16(&s)
}

// loadPGeneric sets w (r columns of rows float64) to the columns of p
// (rows×r) and reports whether every element of p is finite.
func loadPGeneric(w []float64, p []float32, rows, r int) bool {
	for c := range r {
		wc := w[c*rows : (c+1)*rows]
		for i := range wc {
			v := p[i*r+c]
			if !(v >= -math.MaxFloat32 && v <= math.MaxFloat32) {
				return false
			}
			wc[i] = float64(v)
		}
	}
	return true
}

// storePGeneric sets p (rows×r) to w (r columns of rows float64), rounded
// to float32.
func storePGeneric(p []float32, w []float64, rows, r int) {
	for c := range r {
		wc := w[c*rows : (c+1)*rows]
		for i, v := range wc {
			p[i*r+c] = float32(v)
		}
	}
}

// scaleF64Generic multiplies y by c.
func scaleF64Generic(y []float64, c float64) {
	for i := range y {
		y[i] *= c
	}
}
