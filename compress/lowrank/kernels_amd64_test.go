//go:build !purego

package lowrank

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// transposeQ is transposeAVX512's reference: qt (r×ld) = scale·qᵀ (q:
// cols×r), each row zero-padded from cols to ld.
func transposeQ(qt []float32, ld int, q []float32, cols, r int, scale float32) {
	for k := range r {
		row, col := qt[k*ld:(k+1)*ld], q[k:]
		for j := range cols {
			row[j] = scale * col[j*r]
		}
		clear(row[cols:])
	}
}

// TestTranspose compares the gathers that transpose Q for the assembly
// kernels (transposeAVX512, and untransposeQ's for r dividing 16) with
// element-by-element loops, on columns around the vector width and every
// r up to 17.
func TestTranspose(t *testing.T) {
	if kernelSet != "avx512" {
		t.Skip("the CPU or the OS lacks AVX-512F")
	}
	rng := rand.New(rand.NewPCG(21, 22))
	for _, cols := range []int{1, 7, 15, 16, 17, 31, 32, 33, 100, 1000} {
		for r := 1; r <= 17; r++ {
			name := fmt.Sprintf("cols=%d r=%d", cols, r)
			q := normal(rng, cols*r)
			ld := padCols(cols)
			for _, scale := range []float32{1, 0.3} {
				want, got := make([]float32, r*ld), normal(rng, r*ld) // garbage to overwrite
				transposeQ(want, ld, q, cols, r, scale)
				transposeAVX512(got, ld, q, cols, r, scale)
				sameBits(t, fmt.Sprintf("%s scale=%v: transpose", name, scale), got, want)
			}
			back, intact := guarded(cols * r)
			untransposeQ(back, transposed(q, ld, cols, r), ld, cols, r)
			if !intact() {
				t.Fatalf("%s: untransposeQ wrote outside q", name)
			}
			sameBits(t, name+": untranspose", back, q)
		}
	}
}

// transposed returns q transposed into r rows of ld floats.
func transposed(q []float32, ld, cols, r int) []float32 {
	qt := make([]float32, r*ld)
	transposeQ(qt, ld, q, cols, r, 1)
	return qt
}

// TestF64Kernels compares Orthogonalize's float64 loops and its
// conversions of P with their generic twins on lengths around the two
// registers of 8 a step.
func TestF64Kernels(t *testing.T) {
	if kernelSet != "avx512" {
		t.Skip("the CPU or the OS lacks AVX-512F")
	}
	rng := rand.New(rand.NewPCG(23, 24))
	f64 := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = rng.NormFloat64()
		}
		return x
	}
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 100, 1000} {
		a, b, z := f64(n), f64(n), f64(n)
		aa1, ab1 := dot2AVX512(a, b)
		aa2, ab2 := dot2Generic(a, b)
		if aa1 != aa2 || ab1 != ab2 {
			t.Fatalf("n=%d: dot2 (%v %v), generic (%v %v)", n, aa1, ab1, aa2, ab2)
		}
		for _, self := range []bool{false, true} {
			y1, y2 := append([]float64(nil), a...), append([]float64(nil), a...)
			z1, z2 := z, z
			if self {
				z1, z2 = y1, y2
			}
			s1 := axpyDotAVX512(y1, -0.7, b, z1)
			s2 := axpyDotGeneric(y2, -0.7, b, z2)
			if s1 != s2 {
				t.Fatalf("n=%d self=%v: axpyDot %v, generic %v", n, self, s1, s2)
			}
			for i := range y1 {
				if y1[i] != y2[i] {
					t.Fatalf("n=%d self=%v: axpyDot's y[%d] %v, generic %v", n, self, i, y1[i], y2[i])
				}
			}
		}
		y1, y2 := append([]float64(nil), a...), append([]float64(nil), a...)
		scaleF64AVX512(y1, 1/3.0)
		scaleF64Generic(y2, 1/3.0)
		for i := range y1 {
			if y1[i] != y2[i] {
				t.Fatalf("n=%d: scale's y[%d] %v, generic %v", n, i, y1[i], y2[i])
			}
		}
	}
	for _, rows := range []int{1, 5, 15, 16, 17, 33, 100} {
		for r := 1; r <= 17; r++ {
			p := normal(rng, rows*r)
			w1, w2 := make([]float64, rows*r), make([]float64, rows*r)
			if !loadPAVX512(w1, p, rows, r) || !loadPGeneric(w2, p, rows, r) {
				t.Fatalf("rows=%d r=%d: loadP found a non-finite value in normal ones", rows, r)
			}
			for i := range w1 {
				if w1[i] != w2[i] {
					t.Fatalf("rows=%d r=%d: loadP's w[%d] %v, generic %v", rows, r, i, w1[i], w2[i])
				}
			}
			p1, intact := guarded(rows * r)
			p2 := make([]float32, rows*r)
			storePAVX512(p1, w1, rows, r)
			storePGeneric(p2, w2, rows, r)
			if !intact() {
				t.Fatalf("rows=%d r=%d: storeP wrote outside p", rows, r)
			}
			sameBits(t, fmt.Sprintf("rows=%d r=%d: storeP", rows, r), p1, p2)
			sameBits(t, fmt.Sprintf("rows=%d r=%d: storeP of loadP", rows, r), p1, p)
		}
	}
}
