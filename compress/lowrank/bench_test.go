package lowrank

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// sink keeps the yardstick's sums alive.
var sink float32

// BenchmarkRound times one PowerSGD round on one worker (MulQ,
// Orthogonalize, MulTP, Decompose) and reports it as a multiple of the
// yardstick, the time to read the matrix twice (sumKernel over m, twice,
// an AVX-512 sum where the kernels are assembly) measured in the same
// sub-benchmark just before: round/read2. ns/op and MB/s are the round's,
// the bytes being m's. The round's Q is the previous round's MulTP result
// (a warm start), qAvg; qOwn is another matrix, as on one of several
// workers. res=m writes the residual over m, as the engine's error
// feedback does (m then drifts by a small qOwn each round); res=apart
// writes it to a matrix of its own.
func BenchmarkRound(b *testing.B) {
	for _, s := range []shape{{1024, 1024, 1}, {1024, 1024, 2}, {1024, 1024, 4}, {1024, 1024, 8}, {4096, 1024, 4}} {
		for _, inPlace := range []bool{true, false} {
			name := fmt.Sprintf("%dx%d/r=%d/res=apart", s.rows, s.cols, s.r)
			if inPlace {
				name = fmt.Sprintf("%dx%d/r=%d/res=m", s.rows, s.cols, s.r)
			}
			b.Run(name, func(b *testing.B) {
				rows, cols, r := s.rows, s.cols, s.r
				rng := rand.New(rand.NewPCG(1, 2))
				m, q, qOwn := normal(rng, rows*cols), normal(rng, cols*r), normal(rng, cols*r)
				for i := range qOwn {
					qOwn[i] *= 1e-3
				}
				p := make([]float32, rows*r)
				out, res := make([]float32, rows*cols), m
				if !inPlace {
					res = make([]float32, rows*cols)
				}
				round := func() {
					MulQ(p, m, rows, cols, q, r)
					Orthogonalize(p, rows, r)
					MulTP(q, m, rows, cols, p, r)
					Decompose(out, res, m, rows, cols, p, q, qOwn, r, 1)
				}
				read2 := func() {
					sink += sumKernel(m)
					sink += sumKernel(m)
				}
				round()
				read2()
				start := time.Now()
				for range b.N {
					read2()
				}
				read := time.Since(start)
				b.SetBytes(int64(4 * rows * cols))
				b.ResetTimer()
				for range b.N {
					round()
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed())/float64(read), "round/read2")
				b.ReportMetric(float64(read.Nanoseconds())/1e3/float64(b.N), "read2-µs")
			})
		}
	}
}

// kernelCases are the versions BenchmarkMulQ, BenchmarkMulTP and
// BenchmarkDecompose time: the one in use ("asm" where it is assembly) and
// the generic Go loops.
func kernelCases[F any](inUse, generic F) []struct {
	name string
	f    F
} {
	cs := []struct {
		name string
		f    F
	}{{"generic", generic}}
	if kernelSet != "generic" {
		cs = append([]struct {
			name string
			f    F
		}{{"asm", inUse}}, cs...)
	}
	return cs
}

var benchShapes = []shape{{1024, 1024, 1}, {1024, 1024, 4}, {1024, 1024, 8}}

// BenchmarkMulQ: MB/s of m.
func BenchmarkMulQ(b *testing.B) {
	for _, k := range kernelCases(mulQKernel, mulQGeneric) {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d/r=%d", k.name, s.rows, s.cols, s.r), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				m, q := normal(rng, s.rows*s.cols), normal(rng, s.cols*s.r)
				p := make([]float32, s.rows*s.r)
				b.SetBytes(int64(4 * s.rows * s.cols))
				for b.Loop() {
					k.f(p, m, s.rows, s.cols, q, s.r)
				}
			})
		}
	}
}

// BenchmarkMulTP: MB/s of m.
func BenchmarkMulTP(b *testing.B) {
	for _, k := range kernelCases(mulTPKernel, mulTPGeneric) {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d/r=%d", k.name, s.rows, s.cols, s.r), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				m, p := normal(rng, s.rows*s.cols), normal(rng, s.rows*s.r)
				q := make([]float32, s.cols*s.r)
				b.SetBytes(int64(4 * s.rows * s.cols))
				for b.Loop() {
					k.f(q, m, s.rows, s.cols, p, s.r)
				}
			})
		}
	}
}

// BenchmarkDecompose: MB/s of m (out and res, as many bytes each, are
// written besides).
func BenchmarkDecompose(b *testing.B) {
	for _, k := range kernelCases(decomposeKernel, decomposeGeneric) {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d/r=%d", k.name, s.rows, s.cols, s.r), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				m, p := normal(rng, s.rows*s.cols), normal(rng, s.rows*s.r)
				qa, qo := normal(rng, s.cols*s.r), normal(rng, s.cols*s.r)
				out, res := make([]float32, s.rows*s.cols), make([]float32, s.rows*s.cols)
				b.SetBytes(int64(4 * s.rows * s.cols))
				for b.Loop() {
					k.f(out, res, m, s.rows, s.cols, p, qa, qo, s.r, 1)
				}
			})
		}
	}
}

// BenchmarkOrthogonalize: P of 1024 and 4096 rows.
func BenchmarkOrthogonalize(b *testing.B) {
	for _, s := range []shape{{1024, 0, 4}, {4096, 0, 4}, {4096, 0, 32}} {
		b.Run(fmt.Sprintf("%dx%d", s.rows, s.r), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			p0 := normal(rng, s.rows*s.r)
			p := make([]float32, len(p0))
			for b.Loop() {
				copy(p, p0)
				Orthogonalize(p, s.rows, s.r)
			}
		})
	}
}
