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
// column in order: column c's norm n₀ is taken, then for k = 0..c−1 its
// projection onto the finished column k is subtracted (the dot product of
// the updated column with column k, then the update), then its norm n; if
// n ≤ Eps·n₀ (a zero column, a repeated one, one in the span of those
// before: rank-deficient P) the column becomes all zero and counts in
// zeroed, else it is divided by n. Dot products and norms are float64 sums
// in a fixed order (four running sums over the rows by i mod 4, added as
// (s0+s1)+(s2+s3)) with every product rounded before it is added, so the
// same input gives the same bits on every run and machine. The result is
// rounded to float32 at the end.
//
// From finite input it never produces NaN or Inf: a float64 sum of
// squares of float32 values neither overflows nor underflows, and a column
// is divided only by a norm above Eps·n₀ > 0. If any element of p is NaN
// or ±Inf, every element becomes zero and Orthogonalize returns r. With
// rows < r at least r − rows columns are zeroed.
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
	for _, v := range p {
		if !(v >= -math.MaxFloat32 && v <= math.MaxFloat32) {
			clear(p)
			return r
		}
	}
	w, h := scratch64(rows * r) // column c is w[c*rows:(c+1)*rows]
	defer pool64.Put(h)
	for i := range rows {
		for c, v := range p[i*r : (i+1)*r] {
			w[c*rows+i] = float64(v)
		}
	}
	zero := make([]bool, r)
	for c := range r {
		wc := w[c*rows : (c+1)*rows]
		n0 := math.Sqrt(dot64(wc, wc))
		for k := range c {
			if !zero[k] {
				wk := w[k*rows : (k+1)*rows]
				axpy64(wc, -dot64(wk, wc), wk)
			}
		}
		n := math.Sqrt(dot64(wc, wc))
		if !(n > Eps*n0) || math.IsInf(n, 0) {
			clear(wc)
			zero[c] = true
			zeroed++
			continue
		}
		for i := range wc {
			wc[i] /= n
		}
	}
	for i := range rows {
		pi := p[i*r : (i+1)*r]
		for c := range pi {
			pi[c] = float32(w[c*rows+i])
		}
	}
	return zeroed
}

// dot64 returns Σ a[i]·b[i] as four running sums over i mod 4, added as
// (s0+s1)+(s2+s3), each product rounded before it is added (the explicit
// conversions forbid fused multiply-adds, so every architecture gives the
// same bits).
func dot64(a, b []float64) float64 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += float64(a[i] * b[i])
		s1 += float64(a[i+1] * b[i+1])
		s2 += float64(a[i+2] * b[i+2])
		s3 += float64(a[i+3] * b[i+3])
	}
	for ; i < len(a); i++ {
		switch i % 4 {
		case 0:
			s0 += float64(a[i] * b[i])
		case 1:
			s1 += float64(a[i] * b[i])
		case 2:
			s2 += float64(a[i] * b[i])
		}
	}
	return (s0 + s1) + (s2 + s3)
}

// axpy64 adds d·x to y, each product rounded
// before the addition.
func axpy64(y []float64, d float64, x []float64) {
	x = x[:len(y)]
	for i := range y {
		y[i] += float64(d * x[i])
	}
}
