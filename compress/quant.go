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
// (simd_amd64.go) that compute the same bits.
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
// len(x) elements, a multiple of 8, packed at bits per code (see storeGroup)
// to the start of out, where u_i = 2^23 if nearest, else
// hash32(ctr + i·0x9e3779b9, k1) >> 8: with ctr = laneKeys.counter(j) for
// the global index j of x[0], that is the uniform bits of draw32(j + i)
// (rng.go).
var quantKernel = quantGeneric

func quantGeneric(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool) {
	u := [8]uint32{1 << 23, 1 << 23, 1 << 23, 1 << 23, 1 << 23, 1 << 23, 1 << 23, 1 << 23}
	for i := 0; i+8 <= len(x); i += 8 {
		g := (*[8]float32)(x[i : i+8])
		if !nearest {
			w := uint32(lane32Weyl)
			c := ctr + uint32(i)*w
			u = [8]uint32{hash32(c, k1) >> 8, hash32(c+w, k1) >> 8, hash32(c+2*w, k1) >> 8, hash32(c+3*w, k1) >> 8,
				hash32(c+4*w, k1) >> 8, hash32(c+5*w, k1) >> 8, hash32(c+6*w, k1) >> 8, hash32(c+7*w, k1) >> 8}
		}
		w := quantCode(g[0], lo, inv, u[0], levels) |
			quantCode(g[1], lo, inv, u[1], levels)<<8 |
			quantCode(g[2], lo, inv, u[2], levels)<<16 |
			quantCode(g[3], lo, inv, u[3], levels)<<24 |
			quantCode(g[4], lo, inv, u[4], levels)<<32 |
			quantCode(g[5], lo, inv, u[5], levels)<<40 |
			quantCode(g[6], lo, inv, u[6], levels)<<48 |
			quantCode(g[7], lo, inv, u[7], levels)<<56
		out = storeGroup(out, bits, w)
	}
}

// quantCode returns min(trunc(float32(t + r)), L) with
// t = float32(float32(x − lo) · inv) and r = u·2^-24 (exact); the
// conversions forbid fusion.
func quantCode(x, lo, inv float32, u uint32, levels int32) uint64 {
	t := float32(float32(x-lo) * inv)
	return uint64(min(int32(t+float32(u)*0x1p-24), levels))
}

// storeGroup stores the codes of 8 elements, given one per byte of w (first
// element lowest), packed to bits bits each at the start of out, and returns
// the rest of out.
func storeGroup(out []byte, bits uint, w uint64) []byte {
	switch bits {
	case 8:
		binary.LittleEndian.PutUint64(out, w)
	case 4:
		w = (w | w>>4) & 0x00ff00ff00ff00ff
		w = (w | w>>8) & 0x0000ffff0000ffff
		binary.LittleEndian.PutUint32(out, uint32(w|w>>16))
	case 2:
		w = (w | w>>6) & 0x000f000f000f000f
		w = (w | w>>12) & 0x000000ff000000ff
		binary.LittleEndian.PutUint16(out, uint16(w|w>>24))
	}
	return out[bits:]
}

// loadGroup returns the packed codes (bits 8, 4 or 2 each) of the 8
// elements from index i, which is a multiple of 8.
func loadGroup(codes []byte, i int, bits uint) uint64 {
	switch bits {
	case 8:
		return binary.LittleEndian.Uint64(codes[i:])
	case 4:
		return uint64(binary.LittleEndian.Uint32(codes[i/2:]))
	default: // 2
		return uint64(binary.LittleEndian.Uint16(codes[i/4:]))
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

func minMaxGeneric(x []float32) (lo, hi float32, finite bool) {
	lo, hi = float32(math.Inf(1)), float32(math.Inf(-1))
	for y := x; ; {
		i := outside(y, lo, hi)
		if i == len(y) {
			break
		}
		lo, hi = min(lo, y[i]), max(hi, y[i]) // a NaN sticks
		y = y[i+1:]
	}
	return lo, hi, lo >= -math.MaxFloat32 && hi <= math.MaxFloat32
}

// outside returns the index of the first element of x not in [lo, hi] (a
// NaN is not), or len(x). The range widens rarely, so this loop does the
// work of minMaxGeneric.
func outside(x []float32, lo, hi float32) int {
	for i, v := range x {
		if !(v >= lo && v <= hi) {
			return i
		}
	}
	return len(x)
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
	nb := numBuckets(len(dst), q.bucket)
	hdr, codes := body[:8*nb], body[8*nb:]
	run(len(dst), 8*q.bucket, func(from, to int) {
		for s := from; s < to; s += q.bucket {
			h := hdr[8*(s/q.bucket):]
			lo := math.Float32frombits(binary.LittleEndian.Uint32(h))
			scale := math.Float32frombits(binary.LittleEndian.Uint32(h[4:]))
			dequantBucket(dst[s:min(s+q.bucket, to)], codes, s, lo, scale, q.bits, add)
		}
	})
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
	mask := uint8(1<<bits - 1)
	for i := 0; i+8 <= len(out); i += 8 {
		w := loadGroup(codes, i, bits)
		o := (*[8]float32)(out[i : i+8])
		for k := range o {
			setOrAdd(&o[k], dequant(uint8(w)&mask, lo, scale), add)
			w >>= bits
		}
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
