//go:build !purego

package compress

// quantKernelVersions are the amd64 versions of the quantizer's kernels
// (TestKernelsQuant).
var quantKernelVersions = []kernelVersion{
	{"avx2", "the CPU or the OS lacks AVX2 or FMA", cpuFeatures, minMaxAVX2, quantAVX2},
	{"avx512", "the CPU or the OS lacks AVX-512F", func() bool { return cpuFeatures() && avx512Features() }, minMaxAVX512, quantAVX512},
}
