//go:build !purego

package lowrank

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"golang.org/x/sys/cpu"
)

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
				transposeGo(want, ld, q, cols, r, scale)
				transposeAVX512(got, ld, q, cols, r, scale)
				sameBits(t, fmt.Sprintf("%s scale=%v: transpose", name, scale), got, want)
			}
			back, intact := guarded(cols * r)
			untransposeGo(back, transposed(q, ld, cols, r), ld, cols, r)
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
	transposeGo(qt, ld, q, cols, r, 1)
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

// kernelVersion is one amd64 version of the matrix kernels, which the CPU
// runs if has() is true.
type kernelVersion struct {
	name, lacks string
	has         func() bool
	mulQ        func(p, m []float32, rows, cols int, q []float32, r int)
	mulTP       func(q, m []float32, rows, cols int, p []float32, r int)
	decompose   func(out, res, m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32)
}

var kernelVersions = []kernelVersion{
	{"avx2", "the CPU or the OS lacks AVX2 or FMA", func() bool { return cpu.X86.HasAVX2 && cpu.X86.HasFMA },
		mulQAVX2, mulTPAVX2, decomposeAVX2},
	{"avx512", "the CPU or the OS lacks AVX-512F", func() bool { return cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasAVX512F },
		mulQAVX512, mulTPAVX512, decomposeAVX512},
}

func init() {
	moreBenchVersions = func() []benchKernels {
		if kernelSet != "avx512" {
			return nil
		}
		return []benchKernels{{"avx2", mulQAVX2, mulTPAVX2, decomposeAVX2}}
	}
}

// TestKernelVersions compares each amd64 version of MulQ, MulTP and
// Decompose the CPU can run (AVX2 and AVX-512, whichever is in use; the
// other tests check the one in use) with the generic loops, bit for bit,
// on every shape of the other tests, with guards around the outputs, res
// apart and in place, out aligned (non-temporal stores, strips of
// columns) and not.
func TestKernelVersions(t *testing.T) {
	t.Logf("kernels in use: %s", kernelSet)
	for _, k := range kernelVersions {
		t.Run(k.name, func(t *testing.T) {
			if !k.has() {
				t.Skip(k.lacks)
			}
			rng := rand.New(rand.NewPCG(29, 30))
			all := append(shapes(), shape{200, 33, 5}, shape{523, 528, 3}, shape{365, 720, 9})
			for _, s := range all {
				rows, cols, r := s.rows, s.cols, s.r
				name := fmt.Sprintf("%dx%d r=%d", rows, cols, r)
				m, q, p, q2 := normal(rng, rows*cols), normal(rng, cols*r), normal(rng, rows*r), normal(rng, cols*r)

				got, intact := guarded(rows * r)
				k.mulQ(got, m, rows, cols, q, r)
				want := make([]float32, rows*r)
				mulQGeneric(want, m, rows, cols, q, r)
				if !intact() {
					t.Fatalf("%s: MulQ wrote outside p", name)
				}
				sameBits(t, name+": MulQ", got, want)

				got, intact = guarded(cols * r)
				k.mulTP(got, m, rows, cols, p, r)
				want = make([]float32, cols*r)
				mulTPGeneric(want, m, rows, cols, p, r)
				if !intact() {
					t.Fatalf("%s: MulTP wrote outside q", name)
				}
				sameBits(t, name+": MulTP", got, want)

				wantOut, wantRes := make([]float32, rows*cols), make([]float32, rows*cols)
				decomposeGeneric(wantOut, wantRes, m, rows, cols, p, q, q2, r, 0.75)
				for _, shift := range []int{0, 1} {
					buf := make([]float32, rows*cols+16)
					out := buf[shift : shift+rows*cols]
					res, resOK := guarded(rows * cols)
					k.decompose(out, res, m, rows, cols, p, q, q2, r, 0.75)
					if !resOK() {
						t.Fatalf("%s: Decompose wrote outside res", name)
					}
					sameBits(t, fmt.Sprintf("%s shift %d: Decompose out", name, shift), out, wantOut)
					sameBits(t, fmt.Sprintf("%s shift %d: Decompose res", name, shift), res, wantRes)
					inPlace := slices.Clone(m)
					k.decompose(out, inPlace, inPlace, rows, cols, p, q, q2, r, 0.75)
					sameBits(t, fmt.Sprintf("%s shift %d: Decompose out, res = m", name, shift), out, wantOut)
					sameBits(t, fmt.Sprintf("%s shift %d: Decompose res = m", name, shift), inPlace, wantRes)
				}
			}
		})
	}
}
