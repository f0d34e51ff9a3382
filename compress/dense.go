package compress

import (
	"encoding/binary"
	"math"
	"sync"
)

func init() {
	for _, id := range []Codec{CodecNone, CodecFP16, CodecBF16} {
		registerCodec(id, codecDef{build: func(Spec) codec { return denseCodec{id} }})
	}
}

// denseCodec keeps every element: fp32 as is (body: n little-endian float32),
// or rounded to nearest even in IEEE binary16 or bfloat16 (body: n
// little-endian uint16). A value the half format cannot hold (|x| ≥ 65520 for
// fp16, beyond bf16's largest finite) is a *NonFiniteError, never an Inf on
// the wire. Decoding rejects Inf and NaN in the body.
type denseCodec struct{ codec Codec }

func (d denseCodec) id() Codec                { return d.codec }
func (d denseCodec) params(int) (a, b uint32) { return 0, 0 }
func (d denseCodec) seed() uint64             { return 0 }

func (d denseCodec) width() int {
	if d.codec == CodecNone {
		return 4
	}
	return 2
}

func (d denseCodec) bodyLen(n int) int { return n * d.width() }

func (d denseCodec) encode(body []byte, src []float32, key Key, run runner) error {
	return d.encodeFeedback(body, nil, nil, src, key, nil, run, nil)
}

// encodeFeedback implements feedbackCodec: chunk by chunk, the sum e + g,
// its conversion, the checksum of the converted bytes and the residual,
// each while the chunk is in cache. The body is one region of codes of
// 8·width bits, which bucketBody's chunking serves with a bucket of one
// element and no headers.
func (d denseCodec) encodeFeedback(body []byte, e, g, src []float32, _ Key, res []float32, run runner, bs *bodySum) error {
	w := d.width()
	l := bucketBody{codes: body, bucket: 1, bits: uint(8 * w)}
	return l.encode(len(src), run, bs, func(from, to int) error {
		x := src[from:to]
		if e != nil {
			addKernel(x, e[from:to], g[from:to])
		}
		out := body[w*from : w*to]
		if err := d.encodeChunk(out, x); err != nil {
			err.Index += from
			return err
		}
		if res != nil {
			r := res[from:to]
			d.decodeChunk(r, out, false)
			subKernel(r, x)
		}
		return nil
	})
}

// encodeChunk writes the body bytes of x to out, or returns the
// *NonFiniteError of the first element that is not finite or that the
// half format cannot hold, its Index relative to x.
func (d denseCodec) encodeChunk(out []byte, x []float32) *NonFiniteError {
	ok := true
	switch d.codec {
	case CodecNone:
		if ok = firstAtLeast(x, nonFiniteKey) < 0; ok {
			putFloat32s(out, x)
		}
	case CodecFP16:
		ok = fp16Kernel(out, x)
	default: // CodecBF16
		ok = bf16Kernel(out, x)
	}
	if ok {
		return nil
	}
	i := 0
	for i < len(x)-1 && d.finite(x[i]) {
		i++
	}
	return &NonFiniteError{Index: i, Value: x[i]}
}

// finite reports whether x is finite in the body's format.
func (d denseCodec) finite(x float32) bool {
	switch d.codec {
	case CodecNone:
		return math.Float32bits(x)&expMask != expMask
	case CodecFP16:
		return FP16FromFloat32(x)&0x7c00 != 0x7c00
	default:
		return BF16FromFloat32(x)&0x7f80 != 0x7f80
	}
}

// fp16Kernel writes FP16FromFloat32 of every x[i] to out[2i:] (little
// endian) and reports whether all of them are finite; bf16Kernel does the
// same with BF16FromFloat32.
var fp16Kernel, bf16Kernel = fp16Generic, bf16Generic

// fp16Generic and bf16Generic flag a result whose exponent is all ones
// without a branch: adding the exponent's lowest bit to it carries into
// bit 15 exactly then. Both conversions inline.
func fp16Generic(out []byte, x []float32) bool {
	out = out[:2*len(x)]
	var bad uint16
	for i, v := range x {
		h := FP16FromFloat32(v)
		bad |= h&0x7c00 + 0x0400
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
	return bad&0x8000 == 0
}

func bf16Generic(out []byte, x []float32) bool {
	out = out[:2*len(x)]
	var bad uint16
	for i, v := range x {
		h := BF16FromFloat32(v)
		bad |= h&0x7f80 + 0x0080
		binary.LittleEndian.PutUint16(out[2*i:], h)
	}
	return bad&0x8000 == 0
}

func (d denseCodec) check(body []byte, _ *header) error {
	switch d.codec {
	case CodecNone:
		if vals, ok := float32View(body); ok {
			if i := firstAtLeast(vals, nonFiniteKey); i >= 0 {
				return &CorruptInputError{Offset: int64(4 * i), Reason: "non-finite fp32 value"}
			}
			return nil
		}
		for i := 0; i+4 <= len(body); i += 4 {
			if binary.LittleEndian.Uint32(body[i:])&nonFiniteKey == nonFiniteKey {
				return &CorruptInputError{Offset: int64(i), Reason: "non-finite fp32 value"}
			}
		}
	case CodecFP16, CodecBF16:
		mask := uint16(0x7c00)
		if d.codec == CodecBF16 {
			mask = 0x7f80
		}
		if i := firstHalfNonFinite(body, mask); i >= 0 {
			return &CorruptInputError{Offset: int64(2 * i), Reason: "non-finite " + d.codec.String() + " value"}
		}
	}
	return nil
}

// firstHalfNonFinite returns the index of the first 16-bit little-endian
// value of b whose exponent bits (mask) are all ones, or -1. Four values
// a word: each value's exponent plus its lowest bit carries into the
// value's bit 15 exactly when the exponent is all ones, and never into the
// next value.
func firstHalfNonFinite(b []byte, mask uint16) int {
	const each = 0x0001000100010001 // a value's bit 0, in each value
	m, low := uint64(mask)*each, uint64(mask&-mask)*each
	i := 0
	for ; i+8 <= len(b); i += 8 {
		if (binary.LittleEndian.Uint64(b[i:])&m+low)&0x8000800080008000 != 0 {
			break
		}
	}
	for ; i+2 <= len(b); i += 2 {
		if binary.LittleEndian.Uint16(b[i:])&mask == mask {
			return i / 2
		}
	}
	return -1
}

func (d denseCodec) decode(dst []float32, body []byte, _ *header, add bool, run runner) {
	decodeRanges(d, dst, body, add, run)
}

// decodeGrain implements rangeDecoder.
func (d denseCodec) decodeGrain() int { return 1024 }

// decodeRange implements rangeDecoder.
func (d denseCodec) decodeRange(dst []float32, body []byte, from, to int, add bool) {
	w := d.width()
	d.decodeChunk(dst[from:to], body[w*from:w*to], add)
}

// decodeChunk sets (or, with add, adds to) out the values of the body
// bytes in, len(out) elements.
func (d denseCodec) decodeChunk(out []float32, in []byte, add bool) {
	switch {
	case d.codec == CodecNone && !add:
		getFloat32s(out, in)
	case d.codec == CodecNone:
		addFloat32s(out, in)
	case d.codec == CodecFP16:
		fp16DecodeKernel(out, in, add)
	default: // CodecBF16
		bf16DecodeKernel(out, in, add)
	}
}

// fp16DecodeKernel sets (or, with add, adds to) out[i] the float32 of the
// binary16 value at in[2i:], little endian; bf16DecodeKernel does the same
// for bfloat16.
var fp16DecodeKernel, bf16DecodeKernel = fp16DecodeGeneric, bf16DecodeGeneric

func fp16DecodeGeneric(out []float32, in []byte, add bool) {
	tab := fp16Table()
	hs := uint16s(in)[:len(out)]
	if !add {
		for i, h := range hs {
			out[i] = tab[h]
		}
		return
	}
	for i, h := range hs {
		out[i] += tab[h]
	}
}

func bf16DecodeGeneric(out []float32, in []byte, add bool) {
	hs := uint16s(in)[:len(out)]
	if !add {
		for i, h := range hs {
			out[i] = Float32FromBF16(h)
		}
		return
	}
	for i, h := range hs {
		out[i] += Float32FromBF16(h)
	}
}

// FP16FromFloat32 rounds x to the nearest IEEE binary16 value, ties to even,
// and returns its bits. Values of magnitude ≥ 65520 become ±Inf and NaN
// becomes a quiet NaN, as IEEE 754 conversion does. It computes the normal
// and the subnormal result and selects one, without a branch that
// gradients, whose magnitudes straddle binary16's smallest normal (2^-14),
// would mispredict; it inlines into the generic encode loop.
func FP16FromFloat32(x float32) uint16 {
	const (
		// 0.5 = 2^((127-15)+(23-10)+1-127): added to a binary16 subnormal
		// (or zero), it aligns the mantissa so that the FPU's rounding of
		// the sum is binary16's.
		denormMagic = 0.5
		denormBits  = 126 << 23 // denormMagic's bits
	)
	u := math.Float32bits(x)
	a := u &^ 0x80000000
	// Normal: rebias the exponent, round the 13 dropped bits to nearest
	// even (a carry may reach the exponent, up to Inf).
	h := (a - ((127-15)<<23 - 0xfff) + (a>>13)&1) >> 13
	// Subnormal or zero in binary16: the FPU rounds the sum.
	if sub := math.Float32bits(math.Float32frombits(a)+denormMagic) - denormBits; a < 113<<23 {
		h = sub
	}
	h = min(h, 0x7c00) // Inf from 65520 on
	if a > 0x7f800000 {
		h = 0x7e00 // a quiet NaN
	}
	return uint16(u>>16&0x8000 | h)
}

// Float32FromFP16 returns the float32 equal to the IEEE binary16 value h.
func Float32FromFP16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch exp {
	case 0: // zero or subnormal: man · 2^-24, exact in float32
		f := float32(man) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(f) | sign)
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	default:
		return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
	}
}

var (
	fp16TabOnce sync.Once
	fp16Tab     *[1 << 16]float32
)

// fp16Table returns every binary16 value's float32, indexed by its bits.
func fp16Table() *[1 << 16]float32 {
	fp16TabOnce.Do(func() {
		fp16Tab = new([1 << 16]float32)
		for i := range fp16Tab {
			fp16Tab[i] = Float32FromFP16(uint16(i))
		}
	})
	return fp16Tab
}

// BF16FromFloat32 rounds x to the nearest bfloat16, ties to even, and returns
// its bits. Values beyond bfloat16's largest finite become ±Inf; NaN stays a
// quiet NaN.
func BF16FromFloat32(x float32) uint16 {
	u := math.Float32bits(x)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// Float32FromBF16 returns the float32 equal to the bfloat16 value h.
func Float32FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
