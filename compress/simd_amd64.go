//go:build !purego

package compress

import "hash/crc32"

// AVX2 versions of the codecs' inner loops, used when the CPU and the OS
// support AVX2 and FMA (build with -tags purego to keep the generic Go
// loops); an AVX-512 CPU runs them too, but for the quantizer's, which have
// AVX-512 versions (avx512_amd64.go). Each computes exactly what its
// generic twin computes, bit for bit: the same IEEE single-precision
// operations lane by lane, rounded to nearest even, and the same integer
// arithmetic. The fused multiply-adds of quantAsm, t + u·2^-24 and
// x·1 − lo, have exact products, so each rounds once as the generic
// addition or subtraction does.
// TestKernels runs every pair on the same inputs.
func init() {
	if !cpuFeatures() {
		return
	}
	kernelSet = "avx2"
	minMaxKernel = minMaxAVX2
	quantKernel = quantAVX2
	quantRunKernel = quantRunAVX2
	dequantKernel = dequantAVX2
	signKernel = signAVX2
	unsignKernel = unsignAVX2
	addKernel = addAVX2
	subKernel = subAVX2
	histTopKernel = histTopAVX2
	collectKernel = collectAsm
	histAtLeastKernel = histAtLeastAVX2
	if clmulFeatures() {
		kernelSet = "avx2+vpclmulqdq"
		crcUpdate = crcUpdateAVX2
		checksum = checksumAVX2
	}
	if avx512Features() {
		kernelSet += "+avx512"
		minMaxKernel = minMaxAVX512
		quantKernel = quantAVX512
		useAVX512 = true
	}
}

// useAVX512 reports whether init installed the AVX-512 kernels, which
// quantRunAVX2 then calls instead of the AVX2 ones.
var useAVX512 bool

// cpuFeatures reports whether the CPU has AVX2 and FMA, with the OS saving
// the YMM state.
func cpuFeatures() bool {
	if maxID, _, _, _ := cpuid(0, 0); maxID < 7 {
		return false
	}
	const fma, osxsave, avx = 1 << 12, 1 << 27, 1 << 28
	if _, _, ecx, _ := cpuid(1, 0); ecx&fma == 0 || ecx&osxsave == 0 || ecx&avx == 0 {
		return false
	}
	xcr0, _ := xgetbv()
	_, ebx, _, _ := cpuid(7, 0)
	const avx2Bit = 1 << 5
	return xcr0&0x06 == 0x06 && ebx&avx2Bit != 0 // XMM and YMM state
}

// clmulFeatures reports whether the CPU also has VPCLMULQDQ (carry-less
// multiplies of YMM registers) and SSE4.2 (the CRC32 instruction).
func clmulFeatures() bool {
	const sse42, vpclmulqdq = 1 << 20, 1 << 10
	_, _, ecx1, _ := cpuid(1, 0)
	_, _, ecx7, _ := cpuid(7, 0)
	return ecx1&sse42 != 0 && ecx7&vpclmulqdq != 0
}

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

// rangeAVX2 returns the least and greatest element of x as VMINPS and
// VMAXPS find them, and whether x holds a NaN. len(x) is a positive
// multiple of 8.
//
//go:noescape
func rangeAVX2(x []float32) (lo, hi float32, nan bool)

func minMaxAVX2(x []float32) (lo, hi float32, finite bool) {
	m := len(x) &^ 7
	if m == 0 {
		return minMaxGeneric(x)
	}
	lo, hi, nan := rangeAVX2(x[:m])
	return foldRange(x[m:], lo, hi, nan)
}

// quantAsm is quantGeneric for len(x) a positive multiple of 8.
//
//go:noescape
func quantAsm(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool)

func quantAVX2(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool) {
	if holds(out, len(x)*int(bits)/8) { // the length quantAsm trusts
		quantAsm(out, x, lo, inv, levels, bits, ctr, k1, nearest)
	}
}

// quantRunAVX2 is quantRunGeneric, leaner on whole buckets whose length is
// a multiple of 8: it calls the range and quantize kernels directly,
// minMaxAVX2 and quantAsm or (useAVX512) minMaxAVX512 and quantAVX512 (the
// generic loop's layers of calls cost about a tenth of int8 nearest
// encoding at 512-element buckets, calls through minMaxKernel and
// quantKernel 2%, measured on the AVX2 EPYC), and it takes the range of
// the next bucket before it quantizes the current one, so that the next
// bucket's loads and the divisions of the current scale overlap the
// quantize pass instead of waiting on each other. A bucket it cannot encode (quantRunGeneric
// returns the error) and a partial last bucket go to quantRunGeneric.
func quantRunAVX2(q *quantCodec, hdr, codes []byte, src []float32, from, to int, keys laneKeys) error {
	b, bits, levels := q.bucket, q.bits, q.levels()
	end := from + (to-from)/b*b
	if b%8 != 0 || end == from {
		return quantRunGeneric(q, hdr, codes, src, from, to, keys)
	}
	h := hdr[8*(from/b):]
	x := src[from : from+b]
	var lo, hi float32
	var finite bool
	if useAVX512 {
		lo, hi, finite = minMaxAVX512(x)
	} else {
		lo, hi, finite = minMaxAVX2(x)
	}
	for s := from; s < end; s += b {
		if !finite {
			return quantRunGeneric(q, hdr, codes, src, s, to, keys)
		}
		lo, hi = lo+0, hi+0 // as bucketRange: −0 + +0 is +0
		scale, inv, ok := q.scales(lo, hi)
		if !ok {
			return quantRunGeneric(q, hdr, codes, src, s, to, keys)
		}
		putScales(h, lo, scale)
		h = h[8:]
		cur, curLo := x, lo
		if s+b < end {
			x = src[s+b : s+2*b]
			if useAVX512 {
				lo, hi, finite = minMaxAVX512(x)
			} else {
				lo, hi, finite = minMaxAVX2(x)
			}
		}
		out := codes[s*int(bits)/8 : (s+b)*int(bits)/8]
		if useAVX512 {
			quantAVX512(out, cur, curLo, inv, levels, bits, keys.counter(uint32(s)), keys.k1, q.nearest)
		} else {
			quantAsm(out, cur, curLo, inv, levels, bits, keys.counter(uint32(s)), keys.k1, q.nearest)
		}
	}
	return quantRunGeneric(q, hdr, codes, src, end, to, keys)
}

// dequantAsm is dequantGeneric for len(out) a positive multiple of 8.
//
//go:noescape
func dequantAsm(out []float32, codes []byte, lo, scale float32, bits uint, add bool)

func dequantAVX2(out []float32, codes []byte, lo, scale float32, bits uint, add bool) {
	if holds(codes, len(out)*int(bits)/8) { // the length dequantAsm trusts
		dequantAsm(out, codes, lo, scale, bits, add)
	}
}

// signAsm is signGeneric for len(x) a positive multiple of 8.
//
//go:noescape
func signAsm(bits []byte, x []float32, acc *[8]float64)

func signAVX2(bits []byte, x []float32, acc *[8]float64) {
	if holds(bits, len(x)/8) { // the length signAsm trusts
		signAsm(bits, x, acc)
	}
}

// unsignAsm is unsignGeneric for len(out) a positive multiple of 8.
//
//go:noescape
func unsignAsm(out []float32, bits []byte, sb uint32, add bool)

func unsignAVX2(out []float32, bits []byte, sb uint32, add bool) {
	if holds(bits, len(out)/8) { // the length unsignAsm trusts
		unsignAsm(out, bits, sb, add)
	}
}

// addAsm is addGeneric for len(dst) a positive multiple of 8.
//
//go:noescape
func addAsm(dst, a, b []float32)

func addAVX2(dst, a, b []float32) { addSplit(dst, a, b, addAsm) }

// subAsm is subGeneric for len(res) a positive multiple of 8.
//
//go:noescape
func subAsm(res, src []float32)

func subAVX2(res, src []float32) { subSplit(res, src, subAsm) }

// histTopAsm is histTopGeneric for len(vals) a positive multiple of 8.
//
//go:noescape
func histTopAsm(h *[histBins]uint32, vals []float32)

func histTopAVX2(h *[histBins]uint32, vals []float32) {
	m := len(vals) &^ 7
	if m > 0 {
		histTopAsm(h, vals[:m])
	}
	histTopGeneric(h, vals[m:])
}

// collectAsm is collectGeneric.
//
//go:noescape
func collectAsm(h *[histBins]uint32, pos []uint32, vals []float32, x []float32, base, t uint32) (read, wrote int)

// histAtLeastAsm is histAtLeastGeneric for len(vals) a positive multiple
// of 32.
//
//go:noescape
func histAtLeastAsm(h *[histBins]uint32, vals []float32, t uint32) (counted int)

func histAtLeastAVX2(h *[histBins]uint32, vals []float32, t uint32) (counted int) {
	m := len(vals) &^ 31
	if m > 0 {
		counted = histAtLeastAsm(h, vals[:m], t)
	}
	return counted + histAtLeastGeneric(h, vals[m:], t)
}

// clmulKeys are the multipliers of crcFoldAsm: for the fold distances D =
// 1024, 768, 512, 256 and 128 bits, x^(D+32) and x^(D−32) modulo the
// Castagnoli polynomial, each pair twice (once per 128-bit lane), as 33-bit
// bit-reflected values (crc.go's form shifted left by one). A 128-bit
// block is its first qword times x^64 plus its second, and the carry-less
// product of a qword and a key, read as a block, is their product times
// x^32: so the two products with x^(D+32) and x^(D−32) sum to the block
// times x^D.
var clmulKeys = func() (k [5][4]uint64) {
	for i, d := range []int{1024, 768, 512, 256, 128} {
		hi, lo := uint64(xPow(d+32))<<1, uint64(xPow(d-32))<<1
		k[i] = [4]uint64{hi, lo, hi, lo}
	}
	return k
}()

// crcFoldAsm is crc32.Update(crc, castagnoli, p) for len(p) a positive
// multiple of 128.
//
//go:noescape
func crcFoldAsm(crc uint32, p []byte) uint32

// checksumAVX2 is checksumGeneric without its reads ahead. A payload of
// checksumSplit bytes or more is checksummed as two halves at once
// (crcFold2Asm, which prefetches), combined: two streams from memory keep
// more lines in flight than one. A 64 MiB payload not in cache is
// checksummed about 2.2× as fast as by checksumGeneric (measured on the
// AVX2 EPYC: 1.7× by one prefetching stream, then 1.3×).
func checksumAVX2(p []byte) uint32 {
	if len(p) < checksumSplit {
		return crcUpdateAVX2(0, p)
	}
	h := len(p) / 2 &^ 127
	ca, cb := crcFold2Asm(p[:h], p[h:2*h])
	return crcUpdateAVX2(crcCombine(ca, cb, h), p[2*h:])
}

// checksumSplit is the payload length from which checksumAVX2 reads two
// streams. Shorter payloads are likely in cache, where one stream is as
// fast and crcCombine's fraction of a microsecond would show.
const checksumSplit = 1 << 20

// crcFold2Asm returns crc32.Checksum of a and of b, for len(a) == len(b) a
// positive multiple of 128.
//
//go:noescape
func crcFold2Asm(a, b []byte) (ca, cb uint32)

// crcUpdateAVX2 is crcUpdateGeneric: whole blocks by crcHybridAsm, then
// 128-byte steps by crcFoldAsm (faster than hash/crc32 on a few hundred
// bytes), the rest by hash/crc32.
func crcUpdateAVX2(crc uint32, p []byte) uint32 {
	if m := len(p) / crcBlock * crcBlock; m > 0 {
		crc = crcHybridAsm(crc, p[:m])
		p = p[m:]
	}
	if m := len(p) &^ 127; m > 0 {
		crc = crcFoldAsm(crc, p[:m])
		p = p[m:]
	}
	return crc32.Update(crc, castagnoli, p)
}

// crcHybridAsm is crc32.Update(crc, castagnoli, p) for len(p) a positive
// multiple of crcBlock: the fold and the CRC32 instruction at once, on
// parts of each block, about 1.6× the speed of either alone in L1 (the
// encoders' checksum of what they just wrote; measured on the AVX2 EPYC).
//
//go:noescape
func crcHybridAsm(crc uint32, p []byte) uint32

// crcSteps is the steps of crcHybridAsm per block of crcBlock bytes: 128
// folded and 3·40 by the CRC32 instruction each.
const (
	crcSteps = 32
	crcBlock = 248 * crcSteps
)

// crcRunKeys are the shifts crcHybridAsm moves the states of a block's
// first three runs by, to its end: past 120, 80 and 40 bytes a step, as
// x^(8n−33) (see CRCSHIFT).
var crcRunKeys = [3]uint64{
	uint64(xPow(8*120*crcSteps - 33)),
	uint64(xPow(8*80*crcSteps - 33)),
	uint64(xPow(8*40*crcSteps - 33)),
}
