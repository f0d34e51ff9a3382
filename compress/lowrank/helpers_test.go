package lowrank

import (
	"math"
	"math/rand/v2"
	"testing"
)

// u is the unit roundoff of float32: a rounded product or sum is within
// a factor 1 ± u of the exact one.
const u = 0x1p-24

// normal returns n normally distributed float32.
func normal(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// guarded returns a slice of n elements inside a larger one whose other
// elements, guard of them on each side, hold the sentinel NaN bits; check
// reports whether the guards are intact.
func guarded(n int) (x []float32, check func() bool) {
	const guard = 40
	const sentinel = 0x7fc0beef
	buf := make([]float32, n+2*guard)
	for i := range buf {
		buf[i] = math.Float32frombits(sentinel)
	}
	x = buf[guard : guard+n : guard+n]
	return x, func() bool {
		for i, v := range buf {
			if (i < guard || i >= guard+n) && math.Float32bits(v) != sentinel {
				return false
			}
		}
		return true
	}
}

// The float64 references: each element with the sum of the magnitudes
// of its terms, the scale of its rounding error.

func refMulQ(m []float32, rows, cols int, q []float32, r int) (p, mag []float64) {
	p, mag = make([]float64, rows*r), make([]float64, rows*r)
	for i := range rows {
		for k := range r {
			for j := range cols {
				t := float64(m[i*cols+j]) * float64(q[j*r+k])
				p[i*r+k] += t
				mag[i*r+k] += math.Abs(t)
			}
		}
	}
	return p, mag
}

func refMulTP(m []float32, rows, cols int, p []float32, r int) (q, mag []float64) {
	q, mag = make([]float64, cols*r), make([]float64, cols*r)
	for i := range rows {
		for j := range cols {
			for k := range r {
				t := float64(m[i*cols+j]) * float64(p[i*r+k])
				q[j*r+k] += t
				mag[j*r+k] += math.Abs(t)
			}
		}
	}
	return q, mag
}

func refDecompose(m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32) (out, outMag, res, resMag []float64) {
	n := rows * cols
	out, outMag, res, resMag = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range rows {
		for j := range cols {
			x := i*cols + j
			res[x] = float64(m[x])
			for k := range r {
				a := float64(p[i*r+k]) * float64(scale*qAvg[j*r+k])
				o := float64(p[i*r+k]) * float64(qOwn[j*r+k])
				out[x] += a
				outMag[x] += math.Abs(a)
				res[x] -= o
				resMag[x] += math.Abs(o)
			}
		}
	}
	return out, outMag, res, resMag
}

// within fails t unless every got[x] is within tol·mag[x] (plus the
// rounding of a float32 result, u·|want|) of want[x].
func within(t *testing.T, what string, got []float32, want, mag []float64, tol float64) {
	t.Helper()
	for x := range got {
		g := float64(got[x])
		if d := math.Abs(g - want[x]); !(d <= tol*mag[x]+u*math.Abs(want[x])) {
			t.Fatalf("%s: element %d = %v, want %v (error %.3g > %.3g·%.3g)", what, x, g, want[x], d, tol, mag[x])
		}
	}
}

// sameBits fails t unless a and b are equal bit for bit.
func sameBits(t *testing.T, what string, a, b []float32) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: lengths %d and %d", what, len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s: element %d: %v (%#08x) and %v (%#08x)", what, i, a[i], math.Float32bits(a[i]), b[i], math.Float32bits(b[i]))
		}
	}
}

// shape is a test case's sizes.
type shape struct{ rows, cols, r int }

// shapes are the sizes the kernel tests run: the brief's odd ones, columns
// around the vector widths (16, a pair of 32), rows around MulTP's block
// of 32, r around MulQ's and MulTP's groups of 4, and r = min(rows, cols).
func shapes() []shape {
	s := []shape{{1, 1, 1}, {3, 5, 1}, {3, 5, 3}, {17, 33, 1}, {17, 33, 5}, {17, 33, 17}, {1000, 7, 1}, {1000, 7, 4}, {1000, 7, 7}}
	for _, cols := range []int{1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 257} {
		for _, rows := range []int{1, 31, 32, 33, 70} {
			for _, r := range []int{1, 2, 3, 4, 5, 8, 9} {
				if r <= min(rows, cols) {
					s = append(s, shape{rows, cols, r})
				}
			}
		}
	}
	return append(s, shape{5, 40, 16}, shape{40, 1024, 6}, shape{129, 129, 12})
}
