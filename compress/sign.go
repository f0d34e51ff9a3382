package compress

import (
	"encoding/binary"
	"fmt"
	"math"
)

func init() {
	registerCodec(CodecSign, codecDef{
		uses: fieldBucket,
		parse: func(a *specArgs, s *Spec) (err error) {
			s.Bucket, err = bucketOption(a)
			return err
		},
		build: func(s Spec) codec { return &signCodec{bucket: s.BucketLen()} },
	})
}

// signCodec sends one sign bit per element and one scale per bucket, spec
// sign[:bucket=B] (default 512). Header: parameter A = B, parameter B = 0,
// seed = 0.
//
// Encoding. The n elements split into nb = ceil(n/B) buckets of B
// consecutive elements, the last one possibly shorter. Element x at global
// index i gets bit 1 iff x < 0 (so −0 and +0 give 0). A bucket of m elements
// gets scale = mean |x|, summed in float64 in this exact order:
//
//	acc[k]  = sum of float64(|x_i|) over the bucket's i with i mod 8 == k,
//	          added one at a time in increasing i, from 0      (k = 0..7)
//	sum     = ((acc[0]+acc[1]) + (acc[2]+acc[3])) + ((acc[4]+acc[5]) + (acc[6]+acc[7]))
//	scale   = float32(sum / float64(m))
//
// A NaN or ±Inf is a *NonFiniteError for the lowest such index. The float64
// sum cannot overflow, and any other summation order in float64 (a CUDA tree
// reduction, say) has a relative error below m·2^-53 ≤ 2^-29, so its scale
// is within 1 ulp of this one: backends compare the scale within 1 ulp and
// the sign bits exactly.
//
// Decoding. D = −scale for bit 1, +scale for bit 0 (the sign bit of scale
// set or not); DecompressAdd computes dst[i] = dst[i] + D in float32.
//
// Body. First nb scales as little-endian float32 bits, then bit i of the
// input at bit i%8 of byte i/8; the unused high bits of the last byte are
// zero. Length 4·nb + ceil(n/8). check rejects a scale that is negative (−0
// included) or not finite, and nonzero padding bits.
type signCodec struct{ bucket int }

func (c *signCodec) id() Codec                { return CodecSign }
func (c *signCodec) seed() uint64             { return 0 }
func (c *signCodec) params(int) (a, b uint32) { return uint32(c.bucket), 0 }
func (c *signCodec) bodyLen(n int) int        { return 4*numBuckets(n, c.bucket) + packedLen(n, 1) }
func (c *signCodec) scalesLen(n int) int      { return 4 * numBuckets(n, c.bucket) }

func (c *signCodec) encode(body []byte, src []float32, key Key, run runner) error {
	return c.encodeFeedback(body, nil, nil, src, key, nil, run, nil)
}

// encodeFeedback implements feedbackCodec.
func (c *signCodec) encodeFeedback(body []byte, e, g, src []float32, _ Key, res []float32, run runner, bs *bodySum) error {
	n := len(src)
	nh := c.scalesLen(n)
	l := bucketBody{hdr: body[:nh], codes: body[nh:], bucket: c.bucket, hdrSize: 4, bits: 1}
	return l.encode(n, run, bs, func(from, to int) error {
		var acc [8]float64 // one per range: signKernel's argument escapes
		for s := from; s < to; s += c.bucket {
			x := src[s:min(s+c.bucket, to)]
			if e != nil {
				addKernel(x, e[s:s+len(x)], g[s:s+len(x)])
			}
			scale, err := signBucket(l.codes, x, s, &acc)
			if err != nil {
				return err
			}
			binary.LittleEndian.PutUint32(l.hdr[4*(s/c.bucket):], math.Float32bits(scale))
			if res != nil {
				r := res[s : s+len(x)]
				unsign(r, l.codes, s, math.Float32bits(scale), false)
				subtractFrom(r, x, serial)
			}
		}
		return nil
	})
}

// signBucket writes the sign bits of the bucket x, whose first element has
// index s, and returns its scale (see signCodec); acc is its scratch space.
func signBucket(bits []byte, x []float32, s int, acc *[8]float64) (float32, error) {
	*acc = [8]float64{}
	head, end := groupSpan(s, len(x))
	for k, v := range x[:head] {
		u := math.Float32bits(v)
		acc[(s+k)%8] += absBits(u)
		putCode(bits, s+k, 1, signBit(u))
	}
	signKernel(bits[(s+head)/8:], x[head:end], acc)
	for k := end; k < len(x); k++ {
		u := math.Float32bits(x[k])
		acc[(s+k)%8] += absBits(u)
		putCode(bits, s+k, 1, signBit(u))
	}
	sum := ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
	if math.IsNaN(sum) || math.IsInf(sum, 0) {
		return 0, nonFinite(x, s)
	}
	return float32(sum / float64(len(x))), nil
}

// signKernel writes the sign bits of x, whose first element has an index
// that is a multiple of 8 and whose length is a multiple of 8, to the start
// of bits, and adds float64(|x[i]|) to acc[i%8] in increasing i.
var signKernel = signGeneric

// signGeneric reads each element twice, as a float for the sum and as bits
// for the sign, which keeps both in their own registers: the float64 of the
// float32 is exact, so math.Abs of it is absBits, and clearing its sign
// there measured faster than clearing the float32's in an integer register.
// The sign bits combine with LEAs (a + 2·b) instead of a shift and an OR
// each.
func signGeneric(bits []byte, x []float32, acc *[8]float64) {
	a0, a1, a2, a3, a4, a5, a6, a7 := acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]
	u := float32Bits(x)
	for i := 0; i+8 <= len(x); i += 8 {
		g, b := (*[8]float32)(x[i:i+8]), (*[8]uint32)(u[i:i+8])
		a0 += math.Abs(float64(g[0]))
		a1 += math.Abs(float64(g[1]))
		a2 += math.Abs(float64(g[2]))
		a3 += math.Abs(float64(g[3]))
		a4 += math.Abs(float64(g[4]))
		a5 += math.Abs(float64(g[5]))
		a6 += math.Abs(float64(g[6]))
		a7 += math.Abs(float64(g[7]))
		lo := signBit(b[0]) + 2*signBit(b[1]) + 4*(signBit(b[2])+2*signBit(b[3]))
		hi := signBit(b[4]) + 2*signBit(b[5]) + 4*(signBit(b[6])+2*signBit(b[7]))
		bits[i/8] = byte(lo + 16*hi)
	}
	*acc = [8]float64{a0, a1, a2, a3, a4, a5, a6, a7}
}

// absBits returns float64(|x|) for the float32 with bits u.
func absBits(u uint32) float64 { return float64(math.Float32frombits(u &^ (1 << 31))) }

// signBit returns 1 if the float32 with bits u is below zero (u > 1<<31:
// negative and not −0), else 0: bit 32 of u + (2^31 − 1). NaN never reaches
// it.
func signBit(u uint32) uint64 { return (uint64(u) + 1<<31 - 1) >> 32 }

func (c *signCodec) check(body []byte, h *header) error {
	n := int(h.n)
	nh := c.scalesLen(n)
	for off := 0; off < nh; off += 4 {
		if sb := binary.LittleEndian.Uint32(body[off:]); sb >= expMask { // sign bit set, Inf or NaN
			return &CorruptInputError{Offset: int64(off), Reason: fmt.Sprintf("bucket %d scale %v is not a finite non-negative number", off/4, math.Float32frombits(sb))}
		}
	}
	return checkPadding(body[nh:], n, nh)
}

func (c *signCodec) decode(dst []float32, body []byte, _ *header, add bool, run runner) {
	decodeRanges(c, dst, body, add, run)
}

// decodeGrain implements rangeDecoder: 8 buckets start on a code byte.
func (c *signCodec) decodeGrain() int { return 8 * c.bucket }

// decodeRange implements rangeDecoder.
func (c *signCodec) decodeRange(dst []float32, body []byte, from, to int, add bool) {
	nh := c.scalesLen(len(dst))
	hdr, bits := body[:nh], body[nh:]
	for s := from; s < to; s += c.bucket {
		sb := binary.LittleEndian.Uint32(hdr[4*(s/c.bucket):])
		unsign(dst[s:min(s+c.bucket, to)], bits, s, sb, add)
	}
}

// unsign sets or adds to out, the bucket starting at index s, ±scale
// (bits sb) by the sign bits.
func unsign(out []float32, bits []byte, s int, sb uint32, add bool) {
	head, end := groupSpan(s, len(out))
	for k := range out[:head] {
		setOrAdd(&out[k], signed(sb, getCode(bits, s+k, 1)), add)
	}
	unsignKernel(out[head:end], bits[(s+head)/8:], sb, add)
	for k := end; k < len(out); k++ {
		setOrAdd(&out[k], signed(sb, getCode(bits, s+k, 1)), add)
	}
}

// signed returns the float32 with bits sb, negated if bit is 1.
func signed(sb uint32, bit uint8) float32 { return math.Float32frombits(sb | uint32(bit)<<31) }

// unsignKernel sets (add false) or adds to (add true) out[i] the value
// signed(sb, bit i of bits), for len(out) a multiple of 8.
var unsignKernel = unsignGeneric

// unsignGeneric decodes through decodeCodes: −0 + float32(±1·scale) is
// ±scale exactly, −0 for a zero scale included.
func unsignGeneric(out []float32, bits []byte, sb uint32, add bool) {
	decodeCodes(out, bits, &signFactors, negZero, math.Float32frombits(sb), 1, add)
}

// signFactors are decodeCodes' factors for sign bits 0 and 1.
var signFactors = [256]float32{1, -1}

// negZero is −0, the float32 identity of addition.
var negZero = float32(math.Copysign(0, -1))
