package compress

import (
	"encoding/binary"
	"fmt"
	"math"
)

func init() {
	for id, bits := range map[Codec]uint{CodecInt8: 8, CodecInt4: 4, CodecInt2: 2} {
		registerCodec(id, codecDef{
			uses:  fieldBucket | fieldNearest | fieldSeed,
			parse: parseQuant,
			build: func(s Spec) codec {
				return &quantCodec{codec: id, bits: bits, bucket: s.BucketLen(), nearest: s.Nearest, rngSeed: s.Seed}
			},
		})
	}
}

// quantCodec is bucketed min-max quantization to bits = 8, 4 or 2 bits per
// element, spec int8|int4|int2[:bucket=B][:round=stochastic|nearest][:seed=S]
// (defaults 512, stochastic, 0). Header: parameter A = B, parameter B = 0
// (stochastic) or 1 (nearest), seed = S.
//
// The definition below is the reference every backend (the CUDA kernels
// included) matches bit for bit. Every float32 operation is one IEEE
// operation rounded to nearest even, never fused with another (in CUDA:
// __fsub_rn, __fmul_rn, __fadd_rn, or --fmad=false); float64 operations
// likewise. L = 2^bits − 1.
//
// Encoding. The n elements split into nb = ceil(n/B) buckets of B
// consecutive elements, the last one possibly shorter. Per bucket:
//
//	lo, hi = least and greatest element, plus +0 (which turns −0 into +0;
//	         −0 and +0 compare equal); a NaN or ±Inf is a *NonFiniteError
//	         for the lowest such index
//	d      = float64(hi) − float64(lo)
//	scale  = float32(d / L)                               (float64 division)
//	inv    = 0 if scale == 0, else float32(min(L / d, MaxFloat32))   (float64)
//	top    = lo + float32(float32(L) · scale)             (largest decoded value)
//
// A bucket with d > MaxFloat32 or a non-finite top cannot be encoded: it is
// a *NonFiniteError at the bucket's first maximum. Element x at global index
// i (0 ≤ i < n) of a bucket gets
//
//	t    = float32(float32(x − lo) · inv)                 0 ≤ t ≤ L·(1+2^-22)
//	r    = NewRandomStream(S, key, DomainRound).Uniform(i)      stochastic
//	       (uniform(i) of rng.go: 24 bits of the 32-bit lane stream)
//	       0.5                                            nearest
//	code = min(trunc(float32(t + r)), L)                  t + r ≥ 0: trunc is floor
//
// so that code is ⌊t⌋ + 1 with probability t − ⌊t⌋ (stochastic, to the 2^-24
// resolution of r) or t rounded half up (nearest), clamped to [0, L].
//
// Decoding. D(code) = lo + float32(float32(code) · scale); DecompressAdd
// computes dst[i] = dst[i] + D(code) in float32.
//
// Error. With s = (hi − lo)/L and M = max(|lo|, |hi|), every element obeys
// |x − D(code)| ≤ s·(1 + 2^-14) (stochastic) or s·(1/2 + 2^-14) (nearest)
// + 2^-20·M + 2^-120: the last two terms are float32 rounding slack (a few
// ulps of M; subnormal underflow). Stochastic rounding is unbiased up to the
// same slack: E[D(code)] = x.
//
// Body. First nb bucket headers of 8 bytes: lo and scale as little-endian
// float32 bits. Then the codes packed LSB-first over the whole input: code i
// at bit offset i·bits (int4: a byte's low nibble is the even element). The
// unused high bits of the last byte are zero. Length 8·nb + ceil(n·bits/8).
// check rejects a non-finite lo, a scale that is negative (−0 included) or
// not finite, a non-finite top, and nonzero padding bits.
//
// Parallel runs split the input at multiples of 8·B elements, which are
// bucket and byte boundaries, so they write the same bytes as a serial run.
// The inner loops (minMaxKernel, quantKernel, which draws the random
// numbers itself, and dequantKernel) have AVX2 twins on amd64
// (simd_amd64.go), the first two AVX-512 ones (avx512_amd64.go), and all
// three NEON ones on arm64 (simd_arm64.go), that compute the same bits.
type quantCodec struct {
	codec   Codec
	bits    uint // 8, 4 or 2
	bucket  int  // B
	nearest bool // round to nearest instead of stochastically
	rngSeed uint64
}

// parseQuant reads the quantizers' options: bucket, round and seed.
func parseQuant(a *specArgs, s *Spec) (err error) {
	if s.Bucket, err = bucketOption(a); err != nil {
		return err
	}
	round, err := a.enumOption("round", "stochastic", "nearest")
	if err != nil {
		return err
	}
	s.Nearest = round == "nearest"
	s.Seed, err = a.uintOption("seed")
	return err
}

func (q *quantCodec) id() Codec    { return q.codec }
func (q *quantCodec) seed() uint64 { return q.rngSeed }

func (q *quantCodec) params(int) (a, b uint32) {
	if q.nearest {
		return uint32(q.bucket), 1
	}
	return uint32(q.bucket), 0
}

// levels returns L, the largest code.
func (q *quantCodec) levels() int32 { return 1<<q.bits - 1 }

func (q *quantCodec) bodyLen(n int) int {
	return 8*numBuckets(n, q.bucket) + packedLen(n, q.bits)
}

func (q *quantCodec) encode(body []byte, src []float32, key Key, run runner) error {
	return q.encodeFeedback(body, nil, nil, src, key, nil, run, nil)
}

// encodeFeedback implements feedbackCodec.
func (q *quantCodec) encodeFeedback(body []byte, e, g, src []float32, key Key, res []float32, run runner, bs *bodySum) error {
	n := len(src)
	nb := numBuckets(n, q.bucket)
	l := bucketBody{hdr: body[:8*nb], codes: body[8*nb:], bucket: q.bucket, hdrSize: 8, bits: q.bits}
	keys := lanes32(NewRandomStream(q.rngSeed, key, DomainRound).base)
	return l.encode(n, run, bs, func(from, to int) error {
		return q.encodeRange(l.hdr, l.codes, e, g, src, res, from, to, keys)
	})
}

// encodeRange encodes the buckets of src[from:to], first setting each to
// e + g unless e is nil, and sets their residual in res unless res is nil;
// from is a multiple of 8·B, so the range starts on a bucket and a byte
// boundary.
func (q *quantCodec) encodeRange(hdr, codes []byte, e, g, src, res []float32, from, to int, keys laneKeys) error {
	if e == nil && res == nil {
		return quantRunKernel(q, hdr, codes, src, from, to, keys)
	}
	return q.encodeBuckets(hdr, codes, e, g, src, res, from, to, keys)
}

// encodeBuckets is encodeRange, bucket by bucket.
func (q *quantCodec) encodeBuckets(hdr, codes []byte, e, g, src, res []float32, from, to int, keys laneKeys) error {
	for s := from; s < to; s += q.bucket {
		x := src[s:min(s+q.bucket, to)]
		if e != nil {
			addKernel(x, e[s:s+len(x)], g[s:s+len(x)])
		}
		lo, scale, err := q.encodeBucket(hdr, codes, x, s, keys)
		if err != nil {
			return err
		}
		if res != nil {
			r := res[s : s+len(x)]
			dequantBucket(r, codes, s, lo, scale, q.bits, false)
			subtractFrom(r, x, serial)
		}
	}
	return nil
}

// quantRunKernel is encodeRange without e and res. The AVX2 build replaces
// it by a leaner loop over whole buckets (simd_amd64.go).
var quantRunKernel = quantRunGeneric

func quantRunGeneric(q *quantCodec, hdr, codes []byte, src []float32, from, to int, keys laneKeys) error {
	return q.encodeBuckets(hdr, codes, nil, nil, src, nil, from, to, keys)
}

// encodeBucket writes the header and the codes of the bucket x, whose
// first element has index s, and returns its lo and scale.
func (q *quantCodec) encodeBucket(hdr, codes []byte, x []float32, s int, keys laneKeys) (lo, scale float32, err error) {
	lo, hi, err := bucketRange(x, s)
	if err != nil {
		return 0, 0, err
	}
	scale, inv, ok := q.scales(lo, hi)
	if !ok {
		return 0, 0, firstMaximum(x, s, hi)
	}
	putScales(hdr[8*(s/q.bucket):], lo, scale)
	q.quantize(codes, x, s, lo, inv, keys)
	return lo, scale, nil
}

// scales returns the scale and inv of a bucket whose least and greatest
// elements are lo and hi, and whether it can be encoded: its range fits a
// float32 and its largest decoded value is finite (see quantCodec).
func (q *quantCodec) scales(lo, hi float32) (scale, inv float32, ok bool) {
	d := float64(hi) - float64(lo)
	scale = float32(d / float64(q.levels()))
	top := lo + float32(float32(q.levels())*scale)
	if d > math.MaxFloat32 || math.Float32bits(top)&expMask == expMask {
		return 0, 0, false
	}
	if scale != 0 {
		inv = float32(min(float64(q.levels())/d, math.MaxFloat32))
	}
	return scale, inv, true
}

// putScales writes a bucket header: lo and scale.
func putScales(h []byte, lo, scale float32) {
	binary.LittleEndian.PutUint32(h, math.Float32bits(lo))
	binary.LittleEndian.PutUint32(h[4:], math.Float32bits(scale))
}

// kernelSet names the inner loops in use: "generic", or the instruction
// sets of the accelerated ones (see simd_amd64.go).
var kernelSet = "generic"

// quantize writes the codes of the bucket x, whose first element has index
// s, with the bucket's lo and inv and the keys of the DomainRound stream.
func (q *quantCodec) quantize(codes []byte, x []float32, s int, lo, inv float32, keys laneKeys) {
	levels, bits := q.levels(), q.bits
	head, end := groupSpan(s, len(x))
	for k := range head {
		putCode(codes, s+k, bits, quantCode(x[k], lo, inv, q.uniformBits(keys, s+k), levels))
	}
	quantKernel(codes[(s+head)*int(bits)/8:], x[head:end], lo, inv, levels, bits, keys.counter(uint32(s+head)), keys.k1, q.nearest)
	for k := end; k < len(x); k++ {
		putCode(codes, s+k, bits, quantCode(x[k], lo, inv, q.uniformBits(keys, s+k), levels))
	}
}

// uniformBits returns u = r·2^24 for element i: draw32(i) >> 8, or 2^23
// (r = 0.5) under nearest rounding.
func (q *quantCodec) uniformBits(keys laneKeys, i int) uint32 {
	if q.nearest {
		return 1 << 23
	}
	return keys.draw(uint32(i)) >> 8
}

// quantKernel writes the codes quantCode(x[i], lo, inv, u_i, levels) of
// len(x) elements, a multiple of 8, packed at bits per code (see packCodes)
// to the start of out, where u_i = 2^23 if nearest, else
// hash32(ctr + i·0x9e3779b9, k1) >> 8: with ctr = laneKeys.counter(j) for
// the global index j of x[0], that is the uniform bits of draw32(j + i)
// (rng.go).
var quantKernel = quantGeneric

// quantBlock is how many elements quantGeneric quantizes at a time: their
// codes, a byte each, stay in L1 until packCodes packs them.
const quantBlock = 512

// quantGeneric computes a code per byte (int8 straight into out) and packs
// the bytes afterwards: one quantizing loop serves every width, and a byte
// store per code costs less than shifting it into a word (int8 ~15% faster).
// Nearest rounding has a loop of its own: a shared one that chose between
// r = 1/2 and the draw per element, or read r from a buffer, measured 20%
// slower for stochastic rounding.
func quantGeneric(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool) {
	var block [quantBlock]byte
	for len(x) > 0 {
		n := min(len(x), quantBlock)
		codes := block[:n]
		if bits == 8 {
			codes = out[:n]
		}
		if nearest {
			quantHalf(codes, x[:n], lo, inv)
		} else if quantDrawn(codes, x[:n], lo, inv, ctr, k1) > int64(levels) {
			clampDrawn(codes, x[:n], lo, inv, levels, ctr, k1)
		}
		out = packCodes(out, codes, bits)
		x = x[n:]
		ctr += uint32(n) * lane32Weyl
	}
}

// quantDrawn sets codes[i] to the low byte of rawCode(x[i], lo, inv, r_i),
// with r_i the uniform of counter c + i·0x9e3779b9 (uniform32), for len(x)
// a multiple of 8. It returns the OR of the unclamped codes, which exceeds L
// exactly when one of them is L + 1 = 2^bits: then the caller redoes the
// block with the clamp (clampDrawn). Testing once per block instead of
// clamping each code saves an instruction per element; a code reaches L + 1
// only where t ≥ L (x at or next to hi) and r is within half an ulp of L
// of 1 (2^-17 for int8, 2^-23 for int2).
//
// The 8 elements of a group are written out so that the compiler keeps them
// in registers without bounds checks, and their hashes, independent of each
// other, overlap in the CPU.
func quantDrawn(codes []byte, x []float32, lo, inv float32, c, k1 uint32) (or int64) {
	w := uint32(lane32Weyl) // a variable: constant multiples of it would overflow
	for i := 0; i+8 <= len(x); i += 8 {
		g, o := (*[8]float32)(x[i:i+8]), (*[8]byte)(codes[i:i+8])
		v0 := rawCode(g[0], lo, inv, uniform32(c, k1))
		o[0] = byte(v0)
		v1 := rawCode(g[1], lo, inv, uniform32(c+w, k1))
		o[1] = byte(v1)
		v2 := rawCode(g[2], lo, inv, uniform32(c+2*w, k1))
		o[2] = byte(v2)
		v3 := rawCode(g[3], lo, inv, uniform32(c+3*w, k1))
		o[3] = byte(v3)
		v4 := rawCode(g[4], lo, inv, uniform32(c+4*w, k1))
		o[4] = byte(v4)
		v5 := rawCode(g[5], lo, inv, uniform32(c+5*w, k1))
		o[5] = byte(v5)
		v6 := rawCode(g[6], lo, inv, uniform32(c+6*w, k1))
		o[6] = byte(v6)
		v7 := rawCode(g[7], lo, inv, uniform32(c+7*w, k1))
		o[7] = byte(v7)
		or |= v0 | v1 | v2 | v3 | v4 | v5 | v6 | v7
		c += 8 * w
	}
	return or
}

// clampDrawn sets codes to quantDrawn's codes clamped to L, for the rare
// block where one came out as L + 1.
func clampDrawn(codes []byte, x []float32, lo, inv float32, levels int32, c, k1 uint32) {
	for i, v := range x {
		codes[i] = byte(quantCode(v, lo, inv, hash32(c, k1)>>8, levels))
		c += lane32Weyl
	}
}

// quantHalf sets codes[i] to the code of x[i] rounded to nearest (r = 1/2),
// for len(x) a multiple of 8. It needs no clamp: t ≤ L·(1+2^-22) (see
// quantCodec) keeps float32(t + 1/2) below L + 1.
func quantHalf(codes []byte, x []float32, lo, inv float32) {
	for i := 0; i+8 <= len(x); i += 8 {
		g, o := (*[8]float32)(x[i:i+8]), (*[8]byte)(codes[i:i+8])
		o[0] = byte(rawCode(g[0], lo, inv, 0.5))
		o[1] = byte(rawCode(g[1], lo, inv, 0.5))
		o[2] = byte(rawCode(g[2], lo, inv, 0.5))
		o[3] = byte(rawCode(g[3], lo, inv, 0.5))
		o[4] = byte(rawCode(g[4], lo, inv, 0.5))
		o[5] = byte(rawCode(g[5], lo, inv, 0.5))
		o[6] = byte(rawCode(g[6], lo, inv, 0.5))
		o[7] = byte(rawCode(g[7], lo, inv, 0.5))
	}
}

// quantCode returns min(trunc(float32(t + r)), L) with
// t = float32(float32(x − lo) · inv) and r = u·2^-24 (exact).
func quantCode(x, lo, inv float32, u uint32, levels int32) uint64 {
	return uint64(min(rawCode(x, lo, inv, float32(u)*0x1p-24), int64(levels)))
}

// rawCode returns trunc(float32(t + r)) with t = float32(float32(x − lo) ·
// inv): the code before the clamp to L. The conversions forbid fusion, and
// the truncating conversion is the floor, t + r being non-negative.
func rawCode(x, lo, inv, r float32) int64 {
	t := float32(float32(x-lo) * inv)
	return int64(t + r)
}

// packCodes packs codes, one per byte and each below 2^bits, to bits bits
// each at the start of out (LSB first, see quantCodec) and returns the rest
// of out; len(codes) is a multiple of 8. Whole words at a time where it can.
func packCodes(out, codes []byte, bits uint) []byte {
	switch bits {
	case 4:
		for ; len(codes) >= 16 && len(out) >= 8; codes, out = codes[16:], out[8:] {
			binary.LittleEndian.PutUint64(out, nibbles(codes)|nibbles(codes[8:])<<32)
		}
		if len(codes) > 0 {
			binary.LittleEndian.PutUint32(out, uint32(nibbles(codes)))
			out = out[4:]
		}
		return out
	case 2:
		for ; len(codes) >= 32 && len(out) >= 8; codes, out = codes[32:], out[8:] {
			binary.LittleEndian.PutUint64(out, crumbs(codes)|crumbs(codes[8:])<<16|crumbs(codes[16:])<<32|crumbs(codes[24:])<<48)
		}
		for ; len(codes) > 0; codes, out = codes[8:], out[2:] {
			binary.LittleEndian.PutUint16(out, uint16(crumbs(codes)))
		}
		return out
	}
	return out[len(codes):]
}

// nibbles returns the first 8 codes, each below 16, packed 4 bits each:
// pairs of codes into bytes, pairs of bytes into 16 bits, then into 32.
func nibbles(codes []byte) uint64 {
	w := binary.LittleEndian.Uint64(codes)
	w = (w | w>>4) & 0x00ff00ff00ff00ff
	w = (w | w>>8) & 0x0000ffff0000ffff
	return (w | w>>16) & 0xffffffff
}

// crumbs returns the first 8 codes, each below 4, packed 2 bits each.
func crumbs(codes []byte) uint64 {
	w := binary.LittleEndian.Uint64(codes)
	w = (w | w>>6) & 0x000f000f000f000f
	w = (w | w>>12) & 0x000000ff000000ff
	return (w | w>>24) & 0xffff
}

// loadGroup returns the packed codes (bits 8, 4, 2 or 1 each) of the 8
// elements from index i, which is a multiple of 8.
func loadGroup(codes []byte, i int, bits uint) uint64 {
	switch bits {
	case 8:
		return binary.LittleEndian.Uint64(codes[i:])
	case 4:
		return uint64(binary.LittleEndian.Uint32(codes[i/2:]))
	case 2:
		return uint64(binary.LittleEndian.Uint16(codes[i/4:]))
	default: // 1
		return uint64(codes[i/8])
	}
}

// bucketRange returns the least and greatest elements of x (non-empty), as
// +0 if zero, or the *NonFiniteError for its first NaN or ±Inf; x starts at
// index s of the input.
func bucketRange(x []float32, s int) (lo, hi float32, err error) {
	lo, hi, finite := minMaxKernel(x)
	if !finite {
		return 0, 0, nonFinite(x, s)
	}
	return lo + 0, hi + 0, nil // −0 + +0 is +0
}

// minMaxKernel returns whether every element of x is finite and, if so, the
// least and greatest (−0 and +0 in either order).
var minMaxKernel = minMaxGeneric

// minMaxGeneric works on the bit patterns, which integer compares and
// conditional moves order without a branch per element: hi has the greatest
// bits as int32 (non-negative floats order as their bits, every negative one
// is below them), and lo the greatest as uint32 (negative floats order by
// magnitude there, above every non-negative one). That takes both signs; a
// bucket of one sign gets its other end, the least magnitude, from a second
// pass. x is non-empty.
func minMaxGeneric(x []float32) (lo, hi float32, finite bool) {
	b := float32Bits(x)
	ms, mu := int32(math.MinInt32), uint32(0)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		g := (*[8]uint32)(b[i : i+8])
		// Pairs first: a compare serves the signed and the unsigned max.
		ms = max(ms, max(max(int32(g[0]), int32(g[1])), max(int32(g[2]), int32(g[3]))),
			max(max(int32(g[4]), int32(g[5])), max(int32(g[6]), int32(g[7]))))
		mu = max(mu, max(max(g[0], g[1]), max(g[2], g[3])), max(max(g[4], g[5]), max(g[6], g[7])))
	}
	for _, u := range b[i:] {
		ms, mu = max(ms, int32(u)), max(mu, u)
	}
	hb, lb := uint32(ms), mu
	if ms < 0 || mu < 1<<31 {
		least := uint32(math.MaxUint32)
		for _, u := range b {
			least = min(least, u)
		}
		if ms < 0 {
			hb = least
		} else {
			lb = least
		}
	}
	// +Inf and NaN have int32 bits above every finite float's, −Inf and −NaN
	// uint32 bits above every finite one's.
	return math.Float32frombits(lb), math.Float32frombits(hb), ms < expMask && mu < 1<<31|expMask
}

// firstMaximum returns the *NonFiniteError for a bucket x (starting at index
// s) whose range hi − lo is too wide to encode, at its first element hi.
func firstMaximum(x []float32, s int, hi float32) error {
	i := 0
	for i < len(x)-1 && x[i] != hi { // hi is an element of x
		i++
	}
	return &NonFiniteError{Index: s + i, Value: x[i]}
}

func (q *quantCodec) check(body []byte, h *header) error {
	n := int(h.n)
	nb := numBuckets(n, q.bucket)
	levels := float32(q.levels())
	for j := range nb {
		lb := binary.LittleEndian.Uint32(body[8*j:])
		sb := binary.LittleEndian.Uint32(body[8*j+4:])
		lo, scale := math.Float32frombits(lb), math.Float32frombits(sb)
		switch top := lo + float32(levels*scale); {
		case lb&expMask == expMask:
			return &CorruptInputError{Offset: int64(8 * j), Reason: fmt.Sprintf("bucket %d minimum %v is not finite", j, lo)}
		case sb >= expMask: // sign bit set, Inf or NaN
			return &CorruptInputError{Offset: int64(8*j + 4), Reason: fmt.Sprintf("bucket %d scale %v is not a finite non-negative number", j, scale)}
		case math.Float32bits(top)&expMask == expMask:
			return &CorruptInputError{Offset: int64(8*j + 4), Reason: fmt.Sprintf("bucket %d largest value %v + %d·%v overflows float32", j, lo, q.levels(), scale)}
		}
	}
	return checkPadding(body[8*nb:], n*int(q.bits), 8*nb)
}

func (q *quantCodec) decode(dst []float32, body []byte, _ *header, add bool, run runner) {
	decodeRanges(q, dst, body, add, run)
}

// decodeGrain implements rangeDecoder: 8 buckets start on a code byte.
func (q *quantCodec) decodeGrain() int { return 8 * q.bucket }

// decodeRange implements rangeDecoder.
func (q *quantCodec) decodeRange(dst []float32, body []byte, from, to int, add bool) {
	nb := numBuckets(len(dst), q.bucket)
	hdr, codes := body[:8*nb], body[8*nb:]
	for s := from; s < to; s += q.bucket {
		h := hdr[8*(s/q.bucket):]
		lo := math.Float32frombits(binary.LittleEndian.Uint32(h))
		scale := math.Float32frombits(binary.LittleEndian.Uint32(h[4:]))
		dequantBucket(dst[s:min(s+q.bucket, to)], codes, s, lo, scale, q.bits, add)
	}
}

// dequantBucket sets (or adds to) out the decoded values of the bucket
// whose first element has index s, from codes packed at bits per code.
func dequantBucket(out []float32, codes []byte, s int, lo, scale float32, bits uint, add bool) {
	head, end := groupSpan(s, len(out))
	for k := range head {
		setOrAdd(&out[k], dequant(getCode(codes, s+k, bits), lo, scale), add)
	}
	dequantKernel(out[head:end], codes[(s+head)*int(bits)/8:], lo, scale, bits, add)
	for k := end; k < len(out); k++ {
		setOrAdd(&out[k], dequant(getCode(codes, s+k, bits), lo, scale), add)
	}
}

// dequant returns D(c) = lo + float32(float32(c)·scale).
func dequant(c uint8, lo, scale float32) float32 { return lo + float32(float32(c)*scale) }

// dequantKernel sets (add false) or adds to (add true) out[i] the value
// dequant(c, lo, scale) of code c of element i, for len(out) a multiple of
// 8, from the codes packed at bits per code at the start of codes.
var dequantKernel = dequantGeneric

func dequantGeneric(out []float32, codes []byte, lo, scale float32, bits uint, add bool) {
	decodeCodes(out, codes, &codeValues, lo, scale, bits, add)
}

// codeValues holds float32(c) for every code c: decodeCodes loads it
// instead of converting c.
var codeValues = func() (v [256]float32) {
	for c := range v {
		v[c] = float32(c)
	}
	return v
}()

// decodeCodes sets (add false) or adds to (add true) out[i] the value
// lo + float32(f[c]·scale) of the code c of element i, for len(out) a
// multiple of 8, from codes packed at bits (8, 4, 2 or 1) per code at the
// start of codes: the quantizers' D(c) with f = codeValues, sign's ±scale
// with f = {1, −1} and lo = −0 (see unsignGeneric). A byte indexes the
// 256 entries of f without a bounds check.
func decodeCodes(out []float32, codes []byte, f *[256]float32, lo, scale float32, bits uint, add bool) {
	mask, s := uint64(1)<<bits-1, bits&63
	for i := 0; i+8 <= len(out); i += 8 {
		w := loadGroup(codes, i, bits)
		o := (*[8]float32)(out[i : i+8])
		setOrAdd(&o[0], lo+float32(f[uint8(w&mask)]*scale), add)
		w >>= s
		setOrAdd(&o[1], lo+float32(f[uint8(w&mask)]*scale), add)
		w >>= s
		setOrAdd(&o[2], lo+float32(f[uint8(w&mask)]*scale), add)
		w >>= s
		setOrAdd(&o[3], lo+float32(f[uint8(w&mask)]*scale), add)
		w >>= s
		setOrAdd(&o[4], lo+float32(f[uint8(w&mask)]*scale), add)
		w >>= s
		setOrAdd(&o[5], lo+float32(f[uint8(w&mask)]*scale), add)
		w >>= s
		setOrAdd(&o[6], lo+float32(f[uint8(w&mask)]*scale), add)
		w >>= s
		setOrAdd(&o[7], lo+float32(f[uint8(w&mask)]*scale), add)
	}
}

// setOrAdd stores v to *p, or adds it when add is set.
func setOrAdd(p *float32, v float32, add bool) {
	if add {
		*p += v
	} else {
		*p = v
	}
}
