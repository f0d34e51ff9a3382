//go:build !purego

package compress

// quantKernelVersions are the arm64 versions of the quantizer's kernels
// (TestKernelsQuant): NEON, which every arm64 CPU has.
var quantKernelVersions = []kernelVersion{
	{"neon", "", func() bool { return true }, minMaxNEON, quantNEON},
}
