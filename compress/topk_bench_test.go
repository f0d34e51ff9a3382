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
