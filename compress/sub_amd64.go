//go:build !purego

package compress

func init() {
	if cpuFeatures() {
		subKernel = subAVX2
	}
}

// subAsm is subGeneric for len(res) a positive multiple of 8.
//
//go:noescape
func subAsm(res, src []float32)

func subAVX2(res, src []float32) {
	m := len(res) &^ 7
	if m > 0 {
		_ = src[m-1] // the length subAsm trusts
		subAsm(res[:m], src)
	}
	subGeneric(res[m:], src[m:len(res)])
}
