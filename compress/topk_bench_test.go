package compress

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
)

// The sparse-codec benchmarks run on one goroutine (WithWorkers(1)) over a
// heavy-tailed synthetic gradient (sparseData "laplace") at ratio 0.01, so
// that exact top-k, sampled top-k and the full-sort baseline compare side
// by side in one run:
//
//	go test ./compress -run '^$' -bench 'TopK|RandomK|Sort' -benchtime 3x
//
// 64M elements (256 MiB of input) are skipped under -short.
var sparseBenchSizes = []struct {
	name string
	n    int
}{{"1M", 1 << 20}, {"64M", 64 << 20}}

const sparseBenchRatio = 0.01

var (
	sparseBenchMu   sync.Mutex
	sparseBenchData = map[int][]float32{}
)

// sparseBenchInput returns the shared benchmark gradient of n elements,
// generated once per process.
func sparseBenchInput(b *testing.B, n int) []float32 {
	b.Helper()
	if n > 1<<20 && testing.Short() {
		b.Skip("64M-element inputs are skipped under -short")
	}
	sparseBenchMu.Lock()
	defer sparseBenchMu.Unlock()
	src, ok := sparseBenchData[n]
	if !ok {
		src = sparseData("laplace", n, 1)
		sparseBenchData[n] = src
	}
	return src
}

// sparseBenchCompress compresses src once with spec on one goroutine.
func sparseBenchCompress(b *testing.B, spec string, src []float32) (Compressor, []byte) {
	b.Helper()
	c := sparseParse(b, spec, WithWorkers(1))
	p, err := c.Compress(nil, src, Key{Bucket: 1, Step: 1})
	if err != nil {
		b.Fatal(err)
	}
	return c, p
}

// BenchmarkTopKEncode measures Compress for exact and sampled top-k, on one
// goroutine (the targets) and on two (how the passes scale). It reports the
// compression ratio (input bytes / payload bytes) and the recall: the
// fraction of the exact top-k set the payload carries.
func BenchmarkTopKEncode(b *testing.B) {
	for _, size := range sparseBenchSizes {
		for _, workers := range []int{1, 2} {
			for _, mode := range []string{"exact", "sampled"} {
				b.Run(fmt.Sprintf("n=%s/%s/workers=%d", size.name, mode, workers), func(b *testing.B) {
					src := sparseBenchInput(b, size.n)
					spec := fmt.Sprintf("topk:%g", sparseBenchRatio)
					_, exact := sparseBenchCompress(b, spec, src)
					if mode == "sampled" {
						spec += ":sampled"
					}
					c := sparseParse(b, spec, WithWorkers(workers))
					p, err := c.Compress(nil, src, Key{Bucket: 1, Step: 1})
					if err != nil {
						b.Fatal(err)
					}
					got, _ := sparseTopKBody(sparseBody(b, p))
					want, _ := sparseTopKBody(sparseBody(b, exact))
					b.SetBytes(int64(4 * size.n))
					b.ResetTimer()
					for range b.N {
						if p, err = c.Compress(p[:0], src, Key{Bucket: 1, Step: 1}); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(4*size.n)/float64(len(p)), "ratio")
					b.ReportMetric(sparseRecall(got, want), "recall")
				})
			}
		}
	}
}

// BenchmarkSortBaseline is what top-k by sorting costs: copy |x| and sort
// it with slices.Sort, on one goroutine.
func BenchmarkSortBaseline(b *testing.B) {
	for _, size := range sparseBenchSizes {
		b.Run("n="+size.name, func(b *testing.B) {
			src := sparseBenchInput(b, size.n)
			mag := make([]float32, len(src))
			b.SetBytes(int64(4 * size.n))
			b.ResetTimer()
			for range b.N {
				for i, x := range src {
					mag[i] = float32(math.Abs(float64(x)))
				}
				slices.Sort(mag)
			}
		})
	}
}

// BenchmarkRandomKEncode measures random-k Compress, which also scans the
// whole input for non-finite values.
func BenchmarkRandomKEncode(b *testing.B) {
	for _, size := range sparseBenchSizes {
		b.Run("n="+size.name, func(b *testing.B) {
			src := sparseBenchInput(b, size.n)
			c, p := sparseBenchCompress(b, fmt.Sprintf("randomk:%g", sparseBenchRatio), src)
			b.SetBytes(int64(4 * size.n))
			b.ResetTimer()
			for range b.N {
				var err error
				if p, err = c.Compress(p[:0], src, Key{Bucket: 1, Step: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(4*size.n)/float64(len(p)), "ratio")
		})
	}
}

// BenchmarkTopKDecompressAdd and BenchmarkRandomKDecompressAdd measure
// DecompressAdd, the scatter-add of a received payload.
func BenchmarkTopKDecompressAdd(b *testing.B) {
	sparseBenchDecompressAdd(b, fmt.Sprintf("topk:%g", sparseBenchRatio))
}

func BenchmarkRandomKDecompressAdd(b *testing.B) {
	sparseBenchDecompressAdd(b, fmt.Sprintf("randomk:%g", sparseBenchRatio))
}

func sparseBenchDecompressAdd(b *testing.B, spec string) {
	for _, size := range sparseBenchSizes {
		b.Run("n="+size.name, func(b *testing.B) {
			src := sparseBenchInput(b, size.n)
			c, p := sparseBenchCompress(b, spec, src)
			dst := make([]float32, size.n)
			b.SetBytes(int64(4 * size.n))
			b.ResetTimer()
			for range b.N {
				if err := c.DecompressAdd(dst, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
