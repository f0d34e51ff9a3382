package lowrank

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"
)

// goldenRound is the FNV-64a hash of the outputs of rounds (MulQ,
// Orthogonalize, MulTP, Decompose) on goldenInputs: the same bits on
// every platform and kernel set. It was checked with the AVX-512 kernels,
// with -tags purego, as an arm64 program under qemu-aarch64-static and as
// a 386 program (GOARCH=arm64 or 386 go test -c ./compress/lowrank, then
// run the binary).
const goldenRound = 0xa090da473eda2af4

// goldenInputs returns m (rows×cols) and q (cols×r) of multiples of 1/256
// between −4 and 4 from a fixed stream of integers: no floating-point
// function in their making.
func goldenInputs(rows, cols, r int) (m, q []float32) {
	rng := rand.New(rand.NewPCG(31, 32))
	v := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(int(rng.Uint32()%2049)-1024) / 256
		}
		return x
	}
	return v(rows * cols), v(cols * r)
}

func TestGoldenRound(t *testing.T) {
	h := fnv.New64a()
	put := func(x []float32) {
		for _, v := range x {
			b := math.Float32bits(v)
			h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
		}
	}
	for _, s := range []shape{{70, 45, 3}, {64, 96, 4}, {33, 17, 9}} {
		m, q := goldenInputs(s.rows, s.cols, s.r)
		p := make([]float32, s.rows*s.r)
		MulQ(p, m, s.rows, s.cols, q, s.r)
		put(p)
		Orthogonalize(p, s.rows, s.r)
		put(p)
		qOwn := make([]float32, s.cols*s.r)
		MulTP(qOwn, m, s.rows, s.cols, p, s.r)
		put(qOwn)
		out, res := make([]float32, s.rows*s.cols), make([]float32, s.rows*s.cols)
		Decompose(out, res, m, s.rows, s.cols, p, q, qOwn, s.r, 0.25)
		put(out)
		put(res)
	}
	if got := h.Sum64(); got != goldenRound {
		t.Errorf("round hash %#x, want %#x (kernels %s)", got, uint64(goldenRound), kernelSet)
	}
}
