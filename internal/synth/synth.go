// Package synth draws synthetic gradients: the laws bench measures codecs
// on, netbench exchanges and tests feed the engine and the kernels. Values
// are a function of (law, length, seed) alone, on every machine and with
// any GOMAXPROCS.
package synth

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
)

// Scale is the typical magnitude of a synthetic gradient element (the Laplace
// mean |x|). It keeps nearly every value in fp16's normal range, as real
// gradients of a loss-scaled or fp32 model are.
const Scale = 1e-3

// genBlock is the number of elements drawn from one random stream. Each block
// has its own stream keyed by (seed, block index), so Generate's output does
// not depend on how many goroutines fill it.
const genBlock = 1 << 16

// Distribution is a law synthetic gradients are drawn from. The zero value is
// not usable; take one from Distributions or ByName, or make one with New.
type Distribution struct {
	name  string
	about string
	// fill draws len(dst) ≤ genBlock values from r, one block's worth.
	fill func(dst []float32, r *rand.Rand)
}

// New returns a distribution called name, described by about, whose fill
// sets dst (at most 65536 values, one block) from r.
func New(name, about string, fill func(dst []float32, r *rand.Rand)) Distribution {
	return Distribution{name: name, about: about, fill: fill}
}

// Valid reports whether d can draw values (the zero Distribution cannot).
func (d Distribution) Valid() bool { return d.fill != nil }

// Name returns the name ByName accepts.
func (d Distribution) Name() string { return d.name }

// String returns the name and a one-line description.
func (d Distribution) String() string { return d.name + ": " + d.about }

// Distributions lists the built-in distributions. "mixture" is the default of
// the gradcomp CLI: it looks most like a bucket of real layer gradients.
func Distributions() []Distribution {
	return []Distribution{
		{"mixture", "Laplace whose scale varies ×10^±1 per 64Ki block (layers), plus 0.1% outliers at 30–300× the block scale", fillMixture},
		{"laplace", "Laplace, mean |x| = Scale (excess kurtosis 3)", fillLaplace},
		{"student-t", "Student-t with ν = 3 times Scale (infinite kurtosis)", fillStudentT},
		{"normal", "Gaussian, σ = Scale: the light-tailed baseline", fillNormal},
	}
}

// ByName returns the built-in distribution called name, or an error naming
// it and the valid names.
func ByName(name string) (Distribution, error) {
	var names []string
	for _, d := range Distributions() {
		if d.name == name {
			return d, nil
		}
		names = append(names, d.name)
	}
	return Distribution{}, fmt.Errorf("unknown distribution %q (want one of %s)", name, strings.Join(names, ", "))
}

// Generate returns n values drawn from d. The result is a function of (d, n,
// seed) alone: the same arguments give the same values on every machine and
// with any GOMAXPROCS, and a longer gradient starts with a shorter one's values.
func Generate(d Distribution, n int, seed uint64) []float32 {
	x := make([]float32, n)
	blocks := (n + genBlock - 1) / genBlock
	workers := min(runtime.GOMAXPROCS(0), blocks)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := w; b < blocks; b += workers {
				r := rand.New(rand.NewPCG(seed, uint64(b)))
				d.fill(x[b*genBlock:min((b+1)*genBlock, n)], r)
			}
		}()
	}
	wg.Wait()
	return x
}

// laplace draws from the Laplace law with mean |x| = b.
func laplace(r *rand.Rand, b float64) float64 {
	v := r.ExpFloat64() * b
	if r.Uint32()&1 == 0 {
		return -v
	}
	return v
}

func fillLaplace(dst []float32, r *rand.Rand) {
	for i := range dst {
		dst[i] = float32(laplace(r, Scale))
	}
}

func fillNormal(dst []float32, r *rand.Rand) {
	for i := range dst {
		dst[i] = float32(r.NormFloat64() * Scale)
	}
}

// fillStudentT draws Z / sqrt(V/3) with Z standard normal and V a χ² with 3
// degrees of freedom (the sum of three squared standard normals).
func fillStudentT(dst []float32, r *rand.Rand) {
	for i := range dst {
		z := r.NormFloat64()
		a, b, c := r.NormFloat64(), r.NormFloat64(), r.NormFloat64()
		dst[i] = float32(Scale * z / math.Sqrt((a*a+b*b+c*c)/3))
	}
}

// The mixture's outliers: the fraction of elements and their magnitude range
// in multiples of the block scale.
const (
	outlierRate = 1e-3
	outlierLo   = 30
	outlierHi   = 300
)

func fillMixture(dst []float32, r *rand.Rand) {
	s := Scale * math.Pow(10, 2*r.Float64()-1)
	for i := range dst {
		if r.Float64() < outlierRate {
			m := s * (outlierLo + (outlierHi-outlierLo)*r.Float64())
			if r.Uint32()&1 == 0 {
				m = -m
			}
			dst[i] = float32(m)
			continue
		}
		dst[i] = float32(laplace(r, s))
	}
}

// unitLaplace is the Laplace law with mean |x| = 1.
var unitLaplace = New("laplace-1", "Laplace, mean |x| = 1", func(dst []float32, r *rand.Rand) {
	for i := range dst {
		dst[i] = float32(laplace(r, 1))
	}
})

// UnitLaplace returns n values of the Laplace law with mean |x| = 1, the
// device tests' input.
func UnitLaplace(n int, seed uint64) []float32 { return Generate(unitLaplace, n, seed) }
