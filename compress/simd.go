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

// addSplit adds the whole groups of 8 elements with the assembly loop asm
// (addGeneric for len(dst) a positive multiple of 8) and the rest with
// addGeneric.
func addSplit(dst, a, b []float32, asm func(dst, a, b []float32)) {
	m := len(dst) &^ 7
	if m > 0 {
		_, _ = a[m-1], b[m-1] // the lengths the assembly trusts
		asm(dst[:m], a, b)
	}
	addGeneric(dst[m:], a[m:], b[m:])
}

// subSplit subtracts the whole groups of 8 elements with the assembly loop
// asm (subGeneric for len(res) a positive multiple of 8) and the rest with
// subGeneric.
func subSplit(res, src []float32, asm func(res, src []float32)) {
	m := len(res) &^ 7
	if m > 0 {
		_ = src[m-1] // the length the assembly trusts
		asm(res[:m], src)
	}
	subGeneric(res[m:], src[m:len(res)])
}

// halfSplit converts the whole groups of 8 elements with the assembly loop
// asm (fp16 or bf16) and the rest with its generic twin.
func halfSplit(out []byte, x []float32, asm, generic func([]byte, []float32) bool) bool {
	m := len(x) &^ 7
	ok := true
	if holds(out, 2*m) { // the length the assembly trusts
		ok = asm(out, x[:m])
	}
	return generic(out[2*m:], x[m:]) && ok
}

// halfDecodeSplit decodes the whole groups of 8 elements with the assembly
// loop asm and the rest with its generic twin.
func halfDecodeSplit(out []float32, in []byte, add bool, asm, generic func([]float32, []byte, bool)) {
	m := len(out) &^ 7
	if holds(in, 2*m) { // the length the assembly trusts
		asm(out[:m], in, add)
	}
	generic(out[m:], in[2*m:], add)
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
