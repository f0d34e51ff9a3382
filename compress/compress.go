// Package compress holds gradcomp's gradient compressors, their error-feedback
// memory and their wire format. It is the reference semantics: every other
// backend (the CUDA kernels, the plugin) must produce the same payloads.
//
// A compressor is built from a spec string a user can type:
//
//	none                       fp32, as is
//	fp16 | bf16                half precision, round to nearest even
//	topk:RATIO[:sampled]       the k = round(RATIO·n) largest magnitudes
//	topk:RATIO:chunk=C[:bits=B] the same in each chunk of C elements, the
//	                           kept values at B = 2, 4 or 8 bits (SparseLoCo)
//	randomk:RATIO              k indices drawn from (seed, step, bucket)
//	int8 | int4 | int2         per-bucket min-max quantization
//	sign                       1 bit per element, per-bucket scale mean|x|
//	powersgd:R                 rank-R factors of each matrix (PowerSGD): a
//	                           spec only; the engine exchanges it
//
// followed by options NAME=VALUE separated by ':' (see Parse). Every payload
// is self-describing (see the wire format in wire.go) and carries a CRC32C.
package compress

import (
	"fmt"
	"math"
)

// Codec identifies an encoding on the wire. Its numeric value is part of the
// wire format and never changes.
type Codec uint8

// The codecs. The values are stored in every payload header.
const (
	CodecNone    Codec = 1 // fp32 values
	CodecFP16    Codec = 2 // IEEE binary16 values
	CodecBF16    Codec = 3 // bfloat16 values
	CodecTopK    Codec = 4 // ascending uint32 indices, then float32 values; chunked: see chunkTopK
	CodecRandomK Codec = 5 // float32 values at indices derived from the header
	CodecInt8    Codec = 6 // per-bucket (min, scale), then 8-bit codes
	CodecInt4    Codec = 7 // per-bucket (min, scale), then 4-bit codes
	CodecInt2    Codec = 8 // per-bucket (min, scale), then 2-bit codes
	CodecSign    Codec = 9 // per-bucket scale, then 1 sign bit per element
	// CodecPowerSGD is PowerSGD's low-rank exchange (powersgd.go): a spec,
	// never a payload.
	CodecPowerSGD Codec = 10
)

var codecNames = map[Codec]string{
	CodecNone: "none", CodecFP16: "fp16", CodecBF16: "bf16",
	CodecTopK: "topk", CodecRandomK: "randomk",
	CodecInt8: "int8", CodecInt4: "int4", CodecInt2: "int2", CodecSign: "sign",
	CodecPowerSGD: "powersgd",
}

// String returns the codec's spec name, or "codec(N)" for an unknown value.
func (c Codec) String() string {
	if s, ok := codecNames[c]; ok {
		return s
	}
	return fmt.Sprintf("codec(%d)", uint8(c))
}

// MaxElements is the largest number of float32 elements one payload may
// carry. Top-k indices are uint32, so every codec shares this bound.
const MaxElements = 1<<32 - 1

// maxElements is the most elements a payload may carry on this platform:
// MaxElements, or less where an int cannot count that many (32-bit).
const maxElements = min(MaxElements, math.MaxInt)

// Key names one compression call: the gradient bucket it belongs to and the
// training step. Random-k indices and stochastic rounding are functions of
// (seed, Key, element index), so every rank and every backend that compresses
// the same bucket at the same step draws the same random numbers.
type Key struct {
	Bucket uint64 // identifies the gradient bucket (not a quantization bucket)
	Step   uint64 // training step
}

// Compressor encodes float32 gradients into self-describing payloads and
// decodes them back. A Compressor holds no per-call state: it is safe for
// concurrent use by several goroutines.
type Compressor interface {
	// Spec returns the compressor's configuration; New(Spec()) and
	// Parse(Spec().String()) yield compressors that produce identical
	// payloads.
	Spec() Spec

	// Codec returns the codec this compressor writes.
	Codec() Codec

	// MaxEncodedLen returns the largest payload Compress can produce for n
	// elements. Without a lossless stage it is the exact length.
	MaxEncodedLen(n int) int

	// Compress appends the payload for src, compressed under key, to dst and
	// returns the extended slice. On error it returns dst unchanged (bytes
	// between len(dst) and cap(dst) may have been overwritten). A NaN or Inf
	// in src is a *NonFiniteError.
	Compress(dst []byte, src []float32, key Key) ([]byte, error)

	// Decompress validates payload, which must have been written by a
	// compressor with the same spec, and sets dst to its decoded values;
	// len(dst) must equal the payload's element count. On error dst is
	// left untouched.
	Decompress(dst []float32, payload []byte) error

	// DecompressAdd is Decompress that adds the decoded values to dst
	// (dst[i] += D(payload)[i]) instead of overwriting it. On error dst is
	// left untouched.
	DecompressAdd(dst []float32, payload []byte) error
}
