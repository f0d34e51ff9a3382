package compress

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSubKernel: subKernel (AVX2 where the CPU has it) equals subGeneric
// bit for bit on every length around the vector width, with signed zeros,
// infinities and NaN among the inputs, and writes nothing past res.
func TestSubKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.NaN()), math.MaxFloat32, math.SmallestNonzeroFloat32}
	for n := range 70 {
		src, res := make([]float32, n+3), make([]float32, n+1)
		for i := range src {
			src[i] = float32(r.NormFloat64())
			if r.IntN(6) == 0 {
				src[i] = special[r.IntN(len(special))]
			}
		}
		for i := range res {
			res[i] = float32(r.NormFloat64())
			if r.IntN(6) == 0 {
				res[i] = special[r.IntN(len(special))]
			}
		}
		res[n] = 7 // a sentinel past the residual
		want := append([]float32(nil), res...)
		subGeneric(want[:n], src)
		subKernel(res[:n], src)
		for i := range res {
			if math.Float32bits(res[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d: element %d = %v, want %v (%s)", n, i, res[i], want[i], kernelSet)
			}
		}
	}
}
