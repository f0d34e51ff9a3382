//go:build (amd64 || arm64) && !purego

package compress

import "math"

// foldRange returns minMaxGeneric's results for a slice whose first
// elements a range kernel found lo, hi and nan in (see rangeAVX2 and
// rangeNEON) and whose other elements are rest.
func foldRange(rest []float32, lo, hi float32, nan bool) (float32, float32, bool) {
	for _, v := range rest {
		lo, hi = min(lo, v), max(hi, v) // a NaN sticks
	}
	return lo, hi, !nan && lo >= -math.MaxFloat32 && hi <= math.MaxFloat32
}
