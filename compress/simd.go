//go:build (amd64 || arm64) && !purego

package compress

import "math"

// holds reports whether n > 0, having checked that b holds n bytes (else
// it panics as an index out of range does): the assembly loops trust their
// lengths, and take no empty input.
func holds(b []byte, n int) bool {
	if n == 0 {
		return false
	}
	_ = b[n-1]
	return true
}

// foldRange returns minMaxGeneric's results for a slice whose first
// elements a range kernel found lo, hi and nan in (see rangeAVX2 and
// rangeNEON) and whose other elements are rest.
func foldRange(rest []float32, lo, hi float32, nan bool) (float32, float32, bool) {
	for _, v := range rest {
		lo, hi = min(lo, v), max(hi, v) // a NaN sticks
	}
	return lo, hi, !nan && lo >= -math.MaxFloat32 && hi <= math.MaxFloat32
}
