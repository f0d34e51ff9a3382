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

func (d denseCodec) encode(body []byte, src []float32, _ Key, run runner) error {
	var fe firstError
	run(len(src), 1024, func(lo, hi int) {
		fe.set(lo, d.encodeRange(body, src, lo, hi))
	})
	return fe.err
}

func (d denseCodec) encodeRange(body []byte, src []float32, lo, hi int) error {
	if i := firstAtLeast(src[lo:hi], nonFiniteKey); i >= 0 {
		return &NonFiniteError{Index: lo + i, Value: src[lo+i]}
	}
	switch d.codec {
	case CodecNone:
		putFloat32s(body[4*lo:4*hi], src[lo:hi])
	case CodecFP16:
		out := body[2*lo : 2*hi]
		for i, x := range src[lo:hi] {
			h := FP16FromFloat32(x)
			if h&0x7c00 == 0x7c00 {
				return &NonFiniteError{Index: lo + i, Value: x}
			}
			binary.LittleEndian.PutUint16(out[2*i:], h)
		}
	case CodecBF16:
		out := body[2*lo : 2*hi]
		for i, x := range src[lo:hi] {
			h := BF16FromFloat32(x)
			if h&0x7f80 == 0x7f80 {
				return &NonFiniteError{Index: lo + i, Value: x}
			}
			binary.LittleEndian.PutUint16(out[2*i:], h)
		}
	}
	return nil
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
		for i, h := range uint16s(body) {
			if h&mask == mask {
				return &CorruptInputError{Offset: int64(2 * i), Reason: "non-finite " + d.codec.String() + " value"}
			}
		}
	}
	return nil
}

func (d denseCodec) decode(dst []float32, body []byte, _ *header, add bool, run runner) {
	run(len(dst), 1024, func(lo, hi int) {
		out := dst[lo:hi]
		switch {
		case d.codec == CodecNone && !add:
			getFloat32s(out, body[4*lo:4*hi])
		case d.codec == CodecNone:
			addFloat32s(out, body[4*lo:4*hi])
		case d.codec == CodecFP16:
			tab := fp16Table()
			in := uint16s(body[2*lo : 2*hi])[:len(out)]
			if !add {
				for i, h := range in {
					out[i] = tab[h]
				}
				return
			}
			for i, h := range in {
				out[i] += tab[h]
			}
		default: // CodecBF16
			in := uint16s(body[2*lo : 2*hi])[:len(out)]
			if !add {
				for i, h := range in {
					out[i] = Float32FromBF16(h)
				}
				return
			}
			for i, h := range in {
				out[i] += Float32FromBF16(h)
			}
		}
	})
}

// FP16FromFloat32 rounds x to the nearest IEEE binary16 value, ties to even,
// and returns its bits. Values of magnitude ≥ 65520 become ±Inf and NaN
// becomes a quiet NaN, as IEEE 754 conversion does.
func FP16FromFloat32(x float32) uint16 {
	const (
		f16max      = (127 + 16) << 23                   // 2^16: at or above, Inf or NaN
		denormMagic = ((127 - 15) + (23 - 10) + 1) << 23 // aligns subnormal mantissas
	)
	u := math.Float32bits(x)
	sign := uint16(u>>16) & 0x8000
	u &^= 0x80000000
	switch {
	case u >= f16max:
		if u > 0x7f800000 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case u < 113<<23: // subnormal or zero in binary16
		f := math.Float32frombits(u) + math.Float32frombits(denormMagic)
		return sign | uint16(math.Float32bits(f)-denormMagic)
	default:
		odd := (u >> 13) & 1
		u = u - (127-15)<<23 + 0xfff + odd
		return sign | uint16(u>>13)
	}
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
