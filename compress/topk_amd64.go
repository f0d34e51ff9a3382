//go:build !purego

package compress

// The AVX2 top-k kernel that error feedback's fused sum adds (the others
// are set up with the codecs' in simd_amd64.go), under the same CPU check.
func init() {
	if cpuFeatures() {
		addCollectKernel = addCollectAVX2
	}
}

// addCollectAsm is addCollectGeneric.
//
//go:noescape
func addCollectAsm(h *[histBins]uint32, pos []uint32, vals []float32, x, e, g []float32, base, t uint32) (read, wrote int)

func addCollectAVX2(h *[histBins]uint32, pos []uint32, vals []float32, x, e, g []float32, base, t uint32) (read, wrote int) {
	if len(x) > 0 {
		_, _ = e[len(x)-1], g[len(x)-1] // the lengths addCollectAsm trusts
	}
	return addCollectAsm(h, pos, vals, x, e, g, base, t)
}
