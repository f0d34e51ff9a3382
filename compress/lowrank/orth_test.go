package lowrank

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// orthTol bounds |P̂ᵀP̂ − I| for Orthogonalize's output: each element of
// P̂ is the float64 result rounded to float32 (relative error u), so an
// entry of P̂ᵀP̂ of unit columns moves by at most about 2u from the
// float64 one, whose own loss of orthogonality (float64 MGS, condition
// numbers up to 1/Eps) is below 1e-9; the float64 products of the check
// add nothing to speak of.
const orthTol = 4*u + 1e-9

// checkOrthonormal fails t unless each column of p is zero (exactly the
// columns in zero) or of unit norm, and the non-zero ones are orthogonal,
// within orthTol; and unless p has no NaN or Inf.
func checkOrthonormal(t *testing.T, what string, p []float32, rows, r int) (zero []bool) {
	t.Helper()
	for x, v := range p {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s: element %d is %v", what, x, v)
		}
	}
	zero = make([]bool, r)
	for a := range r {
		zero[a] = true
		for i := range rows {
			if p[i*r+a] != 0 {
				zero[a] = false
			}
		}
	}
	for a := range r {
		for b := a; b < r; b++ {
			if zero[a] || zero[b] {
				continue
			}
			var d float64
			for i := range rows {
				d += float64(p[i*r+a]) * float64(p[i*r+b])
			}
			want := 0.0
			if a == b {
				want = 1
			}
			if math.Abs(d-want) > orthTol {
				t.Fatalf("%s: (PᵀP)[%d,%d] = %.10g, want %v ± %.2g", what, a, b, d, want, orthTol)
			}
		}
	}
	return zero
}

// checkSpan fails t unless every column of p0 is in the span of p's
// columns up to tol of its norm: P0 − P̂·(P̂ᵀ·P0).
func checkSpan(t *testing.T, what string, p, p0 []float32, rows, r int, tol float64) {
	t.Helper()
	for c := range r {
		coef := make([]float64, r)
		var n0 float64
		for i := range rows {
			n0 += float64(p0[i*r+c]) * float64(p0[i*r+c])
			for k := range r {
				coef[k] += float64(p[i*r+k]) * float64(p0[i*r+c])
			}
		}
		var e float64
		for i := range rows {
			v := float64(p0[i*r+c])
			for k := range r {
				v -= coef[k] * float64(p[i*r+k])
			}
			e += v * v
		}
		if math.Sqrt(e) > tol*math.Sqrt(n0) {
			t.Fatalf("%s: column %d is %.3g of its norm outside the span of the result", what, c, math.Sqrt(e/n0))
		}
	}
}

func TestOrthogonalize(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, s := range []shape{{1, 0, 1}, {2, 0, 2}, {5, 0, 3}, {17, 0, 9}, {33, 0, 5}, {1000, 0, 8}, {1024, 0, 32}, {40, 0, 40}} {
		rows, r := s.rows, s.r
		name := fmt.Sprintf("%dx%d", rows, r)
		p := normal(rng, rows*r)
		p0 := slices.Clone(p)
		if z := Orthogonalize(p, rows, r); z != 0 {
			t.Fatalf("%s: %d columns zeroed, want 0", name, z)
		}
		checkOrthonormal(t, name, p, rows, r)
		checkSpan(t, name, p, p0, rows, r, 1e-5)
		again := slices.Clone(p0)
		Orthogonalize(again, rows, r)
		sameBits(t, name+": two runs", p, again)
	}
}

// TestOrthogonalizeRankDeficient: zero, repeated, scaled and dependent
// columns are zeroed, counted, and never make a NaN; the others stay
// orthonormal and span the input.
func TestOrthogonalizeRankDeficient(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	const rows, r = 50, 6
	cases := []struct {
		name string
		set  func(col func(c int) []float32)
		want []bool // the columns zeroed
	}{
		{"zero column", func(col func(int) []float32) { clear(col(2)) }, []bool{false, false, true, false, false, false}},
		{"first column zero", func(col func(int) []float32) { clear(col(0)) }, []bool{true, false, false, false, false, false}},
		{"repeated column", func(col func(int) []float32) { copy(col(4), col(1)) }, []bool{false, false, false, false, true, false}},
		{"scaled column", func(col func(int) []float32) {
			for i, v := range col(0) {
				col(3)[i] = -3 * v
			}
		}, []bool{false, false, false, true, false, false}},
		{"sum of two", func(col func(int) []float32) {
			for i := range col(5) {
				col(5)[i] = col(0)[i] + col(2)[i] // exact in float32 for these halves
			}
		}, []bool{false, false, false, false, false, true}},
		{"all zero", func(col func(int) []float32) {
			for c := range r {
				clear(col(c))
			}
		}, []bool{true, true, true, true, true, true}},
		{"all the same", func(col func(int) []float32) {
			for c := 1; c < r; c++ {
				copy(col(c), col(0))
			}
		}, []bool{false, true, true, true, true, true}},
		{"tiny values", func(col func(int) []float32) {
			for c := range r {
				for i := range col(c) {
					col(c)[i] *= 1e-38
				}
			}
		}, []bool{false, false, false, false, false, false}},
		{"huge values", func(col func(int) []float32) {
			for c := range r {
				for i := range col(c) {
					col(c)[i] *= 1e37
				}
			}
		}, []bool{false, false, false, false, false, false}},
	}
	for _, c := range cases {
		// Columns as separate slices, then interleaved into P.
		cols := make([][]float32, r)
		for k := range cols {
			cols[k] = make([]float32, rows)
			for i := range cols[k] {
				cols[k][i] = float32(math.Round(rng.NormFloat64()*64)) / 128 // halves of small integers: exact sums
			}
		}
		c.set(func(k int) []float32 { return cols[k] })
		p := make([]float32, rows*r)
		for i := range rows {
			for k := range r {
				p[i*r+k] = cols[k][i]
			}
		}
		p0 := slices.Clone(p)
		z := Orthogonalize(p, rows, r)
		zero := checkOrthonormal(t, c.name, p, rows, r)
		if !slices.Equal(zero, c.want) {
			t.Fatalf("%s: zero columns %v, want %v", c.name, zero, c.want)
		}
		if n := count(zero); z != n {
			t.Fatalf("%s: returned %d, %d columns are zero", c.name, z, n)
		}
		checkSpan(t, c.name, p, p0, rows, r, 1e-5)
	}
}

func count(b []bool) (n int) {
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}

// TestOrthogonalizeFewRows: with rows < r, at most rows columns survive.
func TestOrthogonalizeFewRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, s := range []shape{{1, 0, 4}, {3, 0, 5}, {7, 0, 9}} {
		p := normal(rng, s.rows*s.r)
		z := Orthogonalize(p, s.rows, s.r)
		if z < s.r-s.rows {
			t.Fatalf("%dx%d: %d columns zeroed, want at least %d", s.rows, s.r, z, s.r-s.rows)
		}
		checkOrthonormal(t, fmt.Sprintf("%dx%d", s.rows, s.r), p, s.rows, s.r)
	}
}

// TestOrthogonalizeNonFinite: a NaN or ±Inf anywhere zeroes all of P.
func TestOrthogonalizeNonFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		for _, at := range []int{0, 7, 29} {
			p := normal(rng, 10*3)
			p[at] = v
			if z := Orthogonalize(p, 10, 3); z != 3 {
				t.Fatalf("%v at %d: returned %d, want 3", v, at, z)
			}
			for x, w := range p {
				if w != 0 || math.Signbit(float64(w)) {
					t.Fatalf("%v at %d: element %d = %v, want +0", v, at, x, w)
				}
			}
		}
	}
}

// FuzzOrthogonalize: from any finite input, no NaN or Inf, and the
// result orthonormal but for zeroed columns.
func FuzzOrthogonalize(f *testing.F) {
	f.Add(uint8(3), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add(uint8(2), []byte{0, 0, 0x80, 0x3f, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0, 0x40})
	f.Add(uint8(1), []byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, rb uint8, data []byte) {
		r := int(rb%8) + 1
		n := len(data) / 4
		rows := n / r
		if rows == 0 || rows > 256 {
			return
		}
		p := make([]float32, rows*r)
		for x := range p {
			b := data[4*x:]
			v := math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				v = 1
			}
			p[x] = v
		}
		z := Orthogonalize(p, rows, r)
		zero := checkOrthonormal(t, "fuzz", p, rows, r)
		if z != count(zero) {
			t.Fatalf("returned %d, %d columns are zero", z, count(zero))
		}
	})
}

// orthogonalizeGeneric is Orthogonalize with the generic loops in place
// of the assembly ones.
func orthogonalizeGeneric(p []float32, rows, r int) int {
	d, a, s, l, st := dot2Kernel, axpyDotKernel, scaleF64Kernel, loadPKernel, storePKernel
	defer func() { dot2Kernel, axpyDotKernel, scaleF64Kernel, loadPKernel, storePKernel = d, a, s, l, st }()
	dot2Kernel, axpyDotKernel, scaleF64Kernel, loadPKernel, storePKernel = dot2Generic, axpyDotGeneric, scaleF64Generic, loadPGeneric, storePGeneric
	return Orthogonalize(p, rows, r)
}

// TestOrthogonalizeKernels compares Orthogonalize's kernels in use with
// the generic ones, bit for bit, on rows around the 16 elements of their
// steps, every r up to 17, rank-deficient and non-finite P.
func TestOrthogonalizeKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, rows := range []int{1, 2, 15, 16, 17, 31, 33, 64, 100, 1000} {
		for r := 1; r <= 17; r++ {
			for variant := range 3 {
				p := normal(rng, rows*r)
				switch variant {
				case 1: // column 0 repeated in the last, column 1 zero
					for i := range rows {
						p[i*r+r-1] = p[i*r]
						if r > 2 {
							p[i*r+1] = 0
						}
					}
				case 2:
					p[rng.IntN(len(p))] = float32(math.Inf(-1))
				}
				name := fmt.Sprintf("%dx%d variant %d", rows, r, variant)
				a, b := slices.Clone(p), slices.Clone(p)
				za, zb := Orthogonalize(a, rows, r), orthogonalizeGeneric(b, rows, r)
				if za != zb {
					t.Fatalf("%s: %d columns zeroed, generic %d", name, za, zb)
				}
				sameBits(t, name, a, b)
			}
		}
	}
}

// TestOrthogonalizeIllConditioned: a Kahan matrix (upper triangular, its
// columns ever closer to the span of those before, condition number
// around 1e13 at r = 32) in a random basis stays orthonormal to float32
// rounding: the float64 arithmetic absorbs what modified Gram-Schmidt
// loses to the conditioning.
func TestOrthogonalizeIllConditioned(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 28))
	const rows = 64
	for _, r := range []int{8, 32} {
		s := math.Pow(1e-5, 1/float64(r-1)) // the last column's part outside the others: 1e-5 of it
		c := math.Sqrt(1 - s*s)
		// U: r orthonormal columns of rows (Gram-Schmidt, twice, of Gaussians).
		u := make([][]float64, r)
		for k := range u {
			v := make([]float64, rows)
			for i := range v {
				v[i] = rng.NormFloat64()
			}
			for range 2 {
				for _, w := range u[:k] {
					var d float64
					for i := range v {
						d += v[i] * w[i]
					}
					for i := range v {
						v[i] -= d * w[i]
					}
				}
			}
			var n float64
			for _, x := range v {
				n += x * x
			}
			for i := range v {
				v[i] /= math.Sqrt(n)
			}
			u[k] = v
		}
		// P = U·K, K[k][j] = s^k for j = k, −c·s^k for j > k.
		p := make([]float32, rows*r)
		for i := range rows {
			for j := range r {
				var a float64
				for k := 0; k <= j; k++ {
					kk := math.Pow(s, float64(k))
					if k < j {
						kk *= -c
					}
					a += u[k][i] * kk
				}
				p[i*r+j] = float32(a)
			}
		}
		if z := Orthogonalize(p, rows, r); z != 0 {
			t.Fatalf("r=%d: %d columns zeroed, want 0", r, z)
		}
		checkOrthonormal(t, fmt.Sprintf("Kahan r=%d", r), p, rows, r)
	}
}
