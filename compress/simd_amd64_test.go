//go:build !purego

package compress

import "testing"

// quantKernelVersions are the amd64 versions of the quantizer's kernels
// (TestKernelsQuant).
var quantKernelVersions = []kernelVersion{
	{"avx2", "the CPU or the OS lacks AVX2 or FMA", cpuFeatures, minMaxAVX2, quantAVX2},
	{"avx512", "the CPU or the OS lacks AVX-512F", func() bool { return cpuFeatures() && avx512Features() }, minMaxAVX512, quantAVX512},
}

// BenchmarkQuantAVX512 times the quantizers' encode with the AVX-512
// kernels and with the AVX2 ones in turn, on the same inputs and one
// goroutine, each call paired with a memcpy of the same bytes ("xmemcpy",
// timePaired): the side-by-side figure of what AVX-512 buys on the CPU it
// runs on. It skips where the CPU or the OS lacks AVX-512F.
func BenchmarkQuantAVX512(b *testing.B) {
	if !useAVX512 {
		b.Skip("the CPU or the OS lacks AVX-512F: no AVX-512 kernels to compare")
	}
	defer func() { minMaxKernel, quantKernel, useAVX512 = minMaxAVX512, quantAVX512, true }()
	sets := []struct {
		name  string
		apply func()
	}{
		{"avx512", func() { minMaxKernel, quantKernel, useAVX512 = minMaxAVX512, quantAVX512, true }},
		{"avx2", func() { minMaxKernel, quantKernel, useAVX512 = minMaxAVX2, quantAVX2, false }},
	}
	key := Key{Bucket: 3, Step: 7}
	for _, spec := range []string{"int8", "int4", "int2", "int8:round=nearest"} {
		b.Run(spec, func(b *testing.B) {
			forSizes(b, func(b *testing.B, n int) {
				src := benchGradient(n)
				c := mustParse(b, spec, WithWorkers(1))
				for _, set := range sets {
					b.Run(set.name, func(b *testing.B) {
						set.apply()
						payload, err := c.Compress(nil, src, key)
						if err != nil {
							b.Fatal(err)
						}
						timePaired(b, n, func() error {
							_, err := c.Compress(payload[:0], src, key)
							return err
						})
						b.SetBytes(int64(4 * n))
					})
				}
			})
		})
	}
}
