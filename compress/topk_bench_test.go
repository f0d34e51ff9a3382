package compress

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// BenchmarkSortBaseline is what top-k by sorting costs: copy |x| and sort
// it with slices.Sort, on one goroutine. BenchmarkCodec/topk* in the same
// run give the ratios.
func BenchmarkSortBaseline(b *testing.B) {
	forSizes(b, func(b *testing.B, n int) {
		src := benchGradient(n)
		mag := make([]float32, n)
		b.SetBytes(int64(4 * n))
		timePaired(b, n, func() error {
			for i, x := range src {
				mag[i] = float32(math.Abs(float64(x)))
			}
			slices.Sort(mag)
			return nil
		})
	})
}

// topkRecall returns, for a sampled top-k spec, the fraction of the exact
// top-k index set that payload carries; ok is false for other specs.
func topkRecall(b *testing.B, spec string, src []float32, payload []byte) (recall float64, ok bool) {
	exactSpec, sampled := strings.CutSuffix(spec, ":sampled")
	if !sampled {
		return 0, false
	}
	exact, err := mustParse(b, exactSpec).Compress(nil, src, Key{Bucket: 3, Step: 7})
	if err != nil {
		b.Fatal(err)
	}
	got, _ := sparseTopKBody(payloadBody(payload))
	want, _ := sparseTopKBody(payloadBody(exact))
	return sparseRecall(got, want), true
}

// BenchmarkTopKInputs times exact and sampled top-k on 16M elements of each
// kind of sparseData (ties, zeros and magnitudes growing with the index
// besides a gradient-like one), one goroutine: the inputs on which the
// first level's bound skips little.
func BenchmarkTopKInputs(b *testing.B) {
	if testing.Short() {
		b.Skip("64 MiB inputs skipped under -short")
	}
	const n = 1 << 24
	for _, kind := range []string{"laplace", "ties", "equal", "zeros", "ramp"} {
		src := sparseData(kind, n, 1)
		for _, spec := range []string{"topk:0.01", "topk:0.1", "topk:0.01:sampled"} {
			c := mustParse(b, spec, WithWorkers(1))
			b.Run(kind+"/"+spec, func(b *testing.B) {
				b.SetBytes(4 * n)
				var p []byte
				for range b.N {
					var err error
					if p, err = c.Compress(p[:0], src, Key{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
