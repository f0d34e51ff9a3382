package compresstest

import (
	"math"
	"math/rand/v2"
)

// An input is a named generator of test gradients: the same (n, seed) always
// gives the same values.
type input struct {
	name string
	gen  func(n int, seed uint64) []float32
}

// inputs are the gradients the round-trip checks feed every codec. None holds
// a zero, so a decoded nonzero marks an element a sparse codec kept.
var inputs = []input{
	{"wide", wide},
	{"ties", ties},
	{"constant", constant},
}

// wide returns values of random sign whose magnitudes are spread
// log-uniformly over [2^-30, 2^9): binary16 subnormals and underflow included,
// nothing fp16 cannot hold.
func wide(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	x := make([]float32, n)
	for i := range x {
		v := float32(math.Ldexp(1+r.Float64(), r.IntN(39)-30))
		if r.IntN(2) == 0 {
			v = -v
		}
		x[i] = v
	}
	return x
}

// ties returns values from {±0.5, ±1, ±1.5}: most magnitudes tie, which is
// what exposes the tie-breaking of top-k.
func ties(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	x := make([]float32, n)
	for i := range x {
		v := float32(1+r.IntN(3)) / 2
		if r.IntN(2) == 0 {
			v = -v
		}
		x[i] = v
	}
	return x
}

// constant returns n copies of 0.75: a quantization bucket whose minimum
// equals its maximum, and a top-k where every element ties.
func constant(n int, _ uint64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = 0.75
	}
	return x
}
