package compress

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestQuantRun: quantRunKernel (the AVX2 build's leaner loop over whole
// buckets) writes the bytes quantRunGeneric writes and returns the same
// error, for bucket lengths it takes and leaves, partial last buckets, a
// run that starts past 0, and a NaN, an ±Inf or a range too wide to
// encode in the run's first, a middle or its last bucket.
func TestQuantRun(t *testing.T) {
	if !accelerated(quantRunKernel, quantRunGeneric) {
		t.Skipf("quantRunKernel is quantRunGeneric in this build or on this CPU (kernels: %s): nothing to compare", kernelSet)
	}
	r := rand.New(rand.NewPCG(5, 6))
	faults := map[string]func(x []float32, i, bucket int){
		"none": func([]float32, int, int) {},
		"nan":  func(x []float32, i, _ int) { x[i] = float32(math.NaN()) },
		"inf":  func(x []float32, i, _ int) { x[i] = float32(math.Inf(-1)) },
		"wide": func(x []float32, i, bucket int) { x[i/bucket*bucket], x[i] = -math.MaxFloat32, math.MaxFloat32 },
	}
	failed := 0
	for _, bucket := range []int{8, 24, 512, 3, 100} {
		from := 8 * bucket // the second run of a parallel split
		for _, n := range []int{2 * from, 4*from + 5, from + bucket + bucket/2} {
			for _, nearest := range []bool{false, true} {
				for _, bits := range []uint{8, 4, 2} {
					q := &quantCodec{bits: bits, bucket: bucket, nearest: nearest}
					keys := lanes32(r.Uint64())
					for fname, fault := range faults {
						for _, at := range []int{from + 1, (from + n) / 2, n - 1} {
							x := make([]float32, n)
							for i := range x {
								x[i] = float32(r.NormFloat64())
							}
							fault(x, at, bucket)
							name := fmt.Sprintf("bucket=%d n=%d nearest=%v bits=%d %s at %d", bucket, n, nearest, bits, fname, at)
							var out [2][]byte
							var errs [2]error
							for k, run := range []func(*quantCodec, []byte, []byte, []float32, int, int, laneKeys) error{quantRunKernel, quantRunGeneric} {
								nb := numBuckets(n, bucket)
								out[k] = make([]byte, q.bodyLen(n))
								errs[k] = run(q, out[k][:8*nb], out[k][8*nb:], x, from, n, keys)
							}
							if fmt.Sprint(errs[0]) != fmt.Sprint(errs[1]) {
								t.Fatalf("%s: error %v, generic %v", name, errs[0], errs[1])
							}
							if errs[0] != nil {
								failed++
							} else if !bytes.Equal(out[0], out[1]) {
								t.Fatalf("%s: bodies differ at byte %d", name, firstDiff(out[0], out[1]))
							}
						}
					}
				}
			}
		}
	}
	if failed == 0 {
		t.Fatal("no run failed: the faults did not reach the runs")
	}
}
