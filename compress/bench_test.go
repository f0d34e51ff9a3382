package compress

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// The codec benchmarks compare against a copy of the same bytes: the speed
// targets are ratios to it, since the machine is shared and noisy.
// BenchmarkMemcpy times the copy alone; BenchmarkCodec times one copy (timer
// stopped) before every operation and reports the paired ratio copy time /
// operation time as "xmemcpy":
//
//	go test ./compress -run '^$' -bench 'Codec|Memcpy|Sort' -benchtime 3x

// benchSizes are the element counts benchmarked; the 64Mi one (256 MiB of
// fp32) is skipped under -short.
var benchSizes = []struct {
	name string
	n    int
}{{"1M", 1 << 20}, {"64M", 1 << 26}}

var (
	gradMu    sync.Mutex
	gradCache = map[int][]float32{}
)

// benchGradient returns n elements of a heavy-tailed synthetic gradient:
// Student-t with 3 degrees of freedom scaled by 1e-3, fixed seed, cached.
func benchGradient(n int) []float32 {
	gradMu.Lock()
	defer gradMu.Unlock()
	if g, ok := gradCache[n]; ok {
		return g
	}
	r := rand.New(rand.NewPCG(42, uint64(n)))
	g := make([]float32, n)
	for i := range g {
		chi2 := 0.0
		for range 3 {
			z := r.NormFloat64()
			chi2 += z * z
		}
		g[i] = float32(1e-3 * r.NormFloat64() / math.Sqrt(chi2/3))
	}
	gradCache[n] = g
	return g
}

// forSizes runs body as one sub-benchmark per size.
func forSizes(b *testing.B, body func(b *testing.B, n int)) {
	for _, sz := range benchSizes {
		b.Run("n="+sz.name, func(b *testing.B) {
			if testing.Short() && sz.n > 1<<20 {
				b.Skip("256 MiB input skipped under -short")
			}
			body(b, sz.n)
		})
	}
}

// copyBuffers returns two buffers of 4·n bytes, cached, pages faulted in.
// The source is written before it is read: a never-written source maps
// the kernel's zero page, which a copy reads from cache (seen: 29–35 GB/s
// for 256 MiB against 10 GB/s from written memory on the same machine).
func copyBuffers(n int) (dst, src []byte) {
	gradMu.Lock()
	defer gradMu.Unlock()
	if b, ok := copyCache[n]; ok {
		return b[0], b[1]
	}
	dst, src = make([]byte, 4*n), make([]byte, 4*n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	copyCache[n] = [2][]byte{dst, src}
	return dst, src
}

var copyCache = map[int][2][]byte{}

func BenchmarkMemcpy(b *testing.B) {
	forSizes(b, func(b *testing.B, n int) {
		dst, src := copyBuffers(n)
		b.SetBytes(int64(4 * n))
		for range b.N {
			copy(dst, src)
		}
	})
}

// timePaired runs op b.N times, each after an untimed copy of 4·n bytes,
// and reports the ratio of the copy time to the op time as "xmemcpy". It
// resets the timer, which drops metrics reported before it.
func timePaired(b *testing.B, n int, op func() error) {
	dst, src := copyBuffers(n)
	var copyTime time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		t0 := time.Now()
		copy(dst, src)
		copyTime += time.Since(t0)
		b.StartTimer()
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(copyTime.Seconds()/b.Elapsed().Seconds(), "xmemcpy")
}

// benchSpecs are the compressors BenchmarkCodec measures.
var benchSpecs = []string{
	"none", "fp16", "bf16",
	"topk:0.01", "topk:0.01:sampled", "randomk:0.01",
	"int8", "int4", "int2", "int8:round=nearest", "sign",
	"topk:0.01:lossless=zstd", "int4:lossless=huff0",
	"topk:0.02:chunk=4096", "topk:0.02:chunk=4096:bits=2", // SparseLoCo's
}

// BenchmarkCodec measures every spec of benchSpecs (sub-benchmark names are
// the specs, so -bench 'Codec/int8' selects one).
func BenchmarkCodec(b *testing.B) {
	for _, spec := range benchSpecs {
		b.Run(spec, func(b *testing.B) { benchCodec(b, spec) })
	}
}

// benchCodec times Compress and DecompressAdd of spec on 1 and 2 workers and
// reports the compression ratio, the relative L2 error ‖x − D(C(x))‖/‖x‖ and,
// for sampled top-k, the recall of the exact top-k set.
func benchCodec(b *testing.B, spec string) {
	b.Logf("inner loops: %s", kernelSet) // shown with -v
	forSizes(b, func(b *testing.B, n int) {
		src := benchGradient(n)
		key := Key{Bucket: 3, Step: 7}
		payload, err := mustParse(b, spec).Compress(nil, src, key)
		if err != nil {
			b.Fatal(err)
		}
		dec := make([]float32, n)
		if err := mustParse(b, spec).Decompress(dec, payload); err != nil {
			b.Fatal(err)
		}
		ratio := float64(4*n) / float64(len(payload))
		relErr := relL2(src, dec)
		recall, hasRecall := topkRecall(b, spec, src, payload)
		report := func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			b.ReportMetric(ratio, "ratio")
			b.ReportMetric(relErr, "relL2")
			if hasRecall {
				b.ReportMetric(recall, "recall")
			}
		}
		for _, workers := range []int{1, 2} {
			c := mustParse(b, spec, WithWorkers(workers))
			b.Run(fmt.Sprintf("w=%d/Encode", workers), func(b *testing.B) {
				timePaired(b, n, func() error {
					_, err := c.Compress(payload[:0], src, key)
					return err
				})
				report(b)
			})
			b.Run(fmt.Sprintf("w=%d/DecompressAdd", workers), func(b *testing.B) {
				timePaired(b, n, func() error { return c.DecompressAdd(dec, payload) })
				report(b)
			})
		}
	})
}

// relL2 returns ‖x − y‖/‖x‖ in float64.
func relL2(x, y []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(x[i]) - float64(y[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt(num / den)
}

// BenchmarkFeedback times ErrorFeedback.Compress (Begin and Commit: e + g,
// the payload and the new residual) of the quantizers, sign, top-k and
// random-k, one goroutine, paired with a copy like BenchmarkCodec.
func BenchmarkFeedback(b *testing.B) {
	for _, spec := range []string{"int8", "int4", "int8:round=nearest", "sign", "fp16", "bf16", "topk:0.01", "topk:0.01:sampled", "randomk:0.01",
		"topk:0.02:chunk=4096", "topk:0.02:chunk=4096:bits=2"} {
		b.Run(spec, func(b *testing.B) {
			forSizes(b, func(b *testing.B, n int) {
				g := benchGradient(n)
				f := NewErrorFeedback(mustParse(b, spec, WithWorkers(1)))
				key := Key{Bucket: 3}
				payload, err := f.Compress(nil, g, key)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(4 * n))
				timePaired(b, n, func() error {
					key.Step++
					payload, err = f.Compress(payload[:0], g, key)
					return err
				})
			})
		})
	}
}

// BenchmarkDecompressAverage times DecompressAverage of 4 payloads (the
// rank average of a 4-rank all-gather) into n elements.
func BenchmarkDecompressAverage(b *testing.B) {
	for _, spec := range []string{"int8", "sign", "fp16", "topk:0.01", "topk:0.02:chunk=4096:bits=2"} {
		b.Run(spec, func(b *testing.B) {
			forSizes(b, func(b *testing.B, n int) {
				c := mustParse(b, spec, WithWorkers(1))
				g := benchGradient(n)
				payloads := make([][]byte, 4)
				for q := range payloads {
					var err error
					if payloads[q], err = c.Compress(nil, g, Key{Bucket: 1, Step: uint64(q)}); err != nil {
						b.Fatal(err)
					}
				}
				dst := make([]float32, n)
				b.SetBytes(int64(4 * n))
				timePaired(b, n, func() error {
					_, err := DecompressAverage(c, dst, payloads)
					return err
				})
			})
		})
	}
}

// BenchmarkBucketKernels times the encoding inner loops in use on one
// bucket of 512 elements that stays in L1: encoding's compute without
// memory's share. For the quantizers that is the range and the quantize
// loop (minMaxKernel, quantKernel), for sign its bits and sums
// (signKernel), for fp16 and bf16 the conversion. 64M elements take at
// least 2^17 times its ns/op, which against BenchmarkMemcpy/n=64M of the
// same run bounds the encode's ratio to memcpy from above; with -tags
// purego, the generic loops' bound, and the ratio of the two runs is what
// the accelerated loops gain.
func BenchmarkBucketKernels(b *testing.B) {
	b.Logf("inner loops: %s", kernelSet) // shown with -v
	const n = 512
	x := benchGradient(1 << 20)[:n]
	out := make([]byte, 2*n)
	quant := func(bits uint, nearest bool) func(i int) {
		q := &quantCodec{bits: bits}
		return func(i int) {
			lo, hi, _ := minMaxKernel(x)
			_, inv, _ := q.scales(lo, hi)
			quantKernel(out[:n*bits/8], x, lo, inv, q.levels(), bits, uint32(i)*n*lane32Weyl, 7, nearest)
		}
	}
	var acc [8]float64
	for _, c := range []struct {
		name string
		run  func(i int)
	}{
		{"int8", quant(8, false)}, {"int4", quant(4, false)}, {"int2", quant(2, false)},
		{"int8:round=nearest", quant(8, true)},
		{"sign", func(int) { signKernel(out[:n/8], x, &acc) }},
		{"fp16", func(int) { fp16Kernel(out, x) }},
		{"bf16", func(int) { bf16Kernel(out, x) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for i := range b.N {
				c.run(i)
			}
		})
	}
}
