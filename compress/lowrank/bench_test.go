package lowrank

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// sink keeps the yardstick's sums alive.
var sink float32

// BenchmarkRound times one PowerSGD round on one worker (MulQ,
// Orthogonalize, MulTP, Decompose) against the yardstick of reading the
// matrix twice (sumKernel over m, twice: an AVX-512 sum where the kernels
// are assembly), the two timed in turn in every iteration so that both
// meet the same machine. It reports round/read2, the ratio of their
// median times (medians, not means: a burst of another process's work
// moves them least), read2-µs, the yardstick's median, and as ns/op and
// MB/s the round's mean time and m's bytes over it. The round's Q is the
// previous round's MulTP result (a warm start) and its qAvg; qOwn is
// another matrix, as on one of several workers. res=m writes the residual
// over m, as error feedback does in place (m then drifts by a small qOwn
// each round); res=apart writes it to a matrix of its own.
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
				rounds, reads := make([]time.Duration, b.N), make([]time.Duration, b.N)
				var total time.Duration
				b.ResetTimer()
				for i := range b.N {
					t0 := time.Now()
					round()
					t1 := time.Now()
					read2()
					t2 := time.Now()
					rounds[i], reads[i] = t1.Sub(t0), t2.Sub(t1)
					total += rounds[i]
				}
				b.StopTimer()
				mid := func(x []time.Duration) float64 {
					slices.Sort(x)
					return float64(x[len(x)/2])
				}
				mean := float64(total) / float64(b.N)
				b.ReportMetric(mean, "ns/op")
				b.ReportMetric(float64(4*rows*cols)/mean*1e3, "MB/s")
				b.ReportMetric(mid(reads)/1e3, "read2-µs")
				b.ReportMetric(mid(rounds)/mid(reads), "round/read2")
			})
		}
	}
}

// benchKernels is one version of the matrix kernels that BenchmarkMulQ,
// BenchmarkMulTP and BenchmarkDecompose time.
type benchKernels struct {
	name      string
	mulQ      func(p, m []float32, rows, cols int, q []float32, r int)
	mulTP     func(q, m []float32, rows, cols int, p []float32, r int)
	decompose func(out, res, m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32)
}

// benchVersions returns the kernels in use ("avx512", "avx2": assembly),
// the generic Go loops, and moreBenchVersions (on amd64 with AVX-512, the
// AVX2 kernels: kernels_amd64_test.go).
func benchVersions() []benchKernels {
	v := []benchKernels{{"generic", mulQGeneric, mulTPGeneric, decomposeGeneric}}
	if kernelSet != "generic" {
		v = append([]benchKernels{{kernelSet, mulQKernel, mulTPKernel, decomposeKernel}}, v...)
	}
	return append(v, moreBenchVersions()...)
}

// moreBenchVersions returns the kernel versions besides the one in use
// and the generic one that the benchmarks time.
var moreBenchVersions = func() []benchKernels { return nil }

var benchShapes = []shape{{1024, 1024, 1}, {1024, 1024, 4}, {1024, 1024, 8}}

// BenchmarkMulQ: MB/s of m.
func BenchmarkMulQ(b *testing.B) {
	for _, k := range benchVersions() {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d/r=%d", k.name, s.rows, s.cols, s.r), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				m, q := normal(rng, s.rows*s.cols), normal(rng, s.cols*s.r)
				p := make([]float32, s.rows*s.r)
				b.SetBytes(int64(4 * s.rows * s.cols))
				for b.Loop() {
					k.mulQ(p, m, s.rows, s.cols, q, s.r)
				}
			})
		}
	}
}

// BenchmarkMulTP: MB/s of m.
func BenchmarkMulTP(b *testing.B) {
	for _, k := range benchVersions() {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d/r=%d", k.name, s.rows, s.cols, s.r), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				m, p := normal(rng, s.rows*s.cols), normal(rng, s.rows*s.r)
				q := make([]float32, s.cols*s.r)
				b.SetBytes(int64(4 * s.rows * s.cols))
				for b.Loop() {
					k.mulTP(q, m, s.rows, s.cols, p, s.r)
				}
			})
		}
	}
}

// BenchmarkDecompose: MB/s of m (out and res, as many bytes each, are
// written besides).
func BenchmarkDecompose(b *testing.B) {
	for _, k := range benchVersions() {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d/r=%d", k.name, s.rows, s.cols, s.r), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				m, p := normal(rng, s.rows*s.cols), normal(rng, s.rows*s.r)
				qa, qo := normal(rng, s.cols*s.r), normal(rng, s.cols*s.r)
				out, res := make([]float32, s.rows*s.cols), make([]float32, s.rows*s.cols)
				b.SetBytes(int64(4 * s.rows * s.cols))
				for b.Loop() {
					k.decompose(out, res, m, s.rows, s.cols, p, qa, qo, s.r, 1)
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
