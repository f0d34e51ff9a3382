package compress

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// The wire format, version 1. All integers are little-endian.
//
//	offset size field
//	0      4    magic "GCMP"
//	4      1    version (1)
//	5      1    codec (Codec)
//	6      1    source dtype (1 = float32)
//	7      1    flags: bits 0-1 lossless stage (Lossless), bits 2-7 zero
//	8      8    element count n (≤ MaxElements)
//	16     4    parameter A: k (topk, randomk) or bucket size (int8/4/2, sign)
//	20     4    parameter B: codec-specific (quantization: rounding mode;
//	            topk: 0, or with chunk=C its chunk and value layout, see
//	            chunkTopK: C in bits 0-16, bits=B in 24-27, nearest bit 28)
//	24     8    seed
//	32     8    Key.Bucket
//	40     8    Key.Step
//	48     8    body length in bytes, as stored (after the lossless stage)
//	56     -    body
//	end-4  4    CRC32C (Castagnoli) of every byte before it
//
// The body layout of each codec is documented on its type. Without a lossless
// stage its length is a function of n and the parameters alone, which is what
// lets collectives use fixed-size buffers. A layout a codec gained later has
// parameters an earlier decoder refuses (a *PayloadMismatchError): chunked
// top-k's parameter B is nonzero, and version 1 top-k decoders want 0.
const (
	wireMagic   = "GCMP"
	wireVersion = 1
	dtypeF32    = 1
)

// HeaderLen and TrailerLen are the bytes that frame every payload's body:
// the header before it and the CRC32C after it.
const (
	HeaderLen  = 56
	TrailerLen = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// header is a decoded payload header.
type header struct {
	codec    Codec
	lossless Lossless
	n        uint64
	paramA   uint32
	paramB   uint32
	seed     uint64
	key      Key
	bodyLen  uint64
}

func (h *header) put(b []byte) {
	copy(b, wireMagic)
	b[4] = wireVersion
	b[5] = byte(h.codec)
	b[6] = dtypeF32
	b[7] = byte(h.lossless)
	binary.LittleEndian.PutUint64(b[8:], h.n)
	binary.LittleEndian.PutUint32(b[16:], h.paramA)
	binary.LittleEndian.PutUint32(b[20:], h.paramB)
	binary.LittleEndian.PutUint64(b[24:], h.seed)
	binary.LittleEndian.PutUint64(b[32:], h.key.Bucket)
	binary.LittleEndian.PutUint64(b[40:], h.key.Step)
	binary.LittleEndian.PutUint64(b[48:], h.bodyLen)
}

// parsePayload checks the framing of p (length, magic, version, checksum,
// flags, body length) and returns its header and stored body.
func parsePayload(p []byte) (*header, []byte, error) {
	if len(p) < HeaderLen+TrailerLen {
		return nil, nil, &CorruptInputError{Offset: int64(len(p)), Reason: fmt.Sprintf("payload of %d bytes is shorter than the %d-byte frame", len(p), HeaderLen+TrailerLen)}
	}
	if err := checkMagic(p); err != nil {
		return nil, nil, err
	}
	end := len(p) - TrailerLen
	want := checksum(p[:end])
	if got := binary.LittleEndian.Uint32(p[end:]); got != want {
		return nil, nil, &ChecksumError{Got: got, Want: want}
	}
	h := &header{
		codec:    Codec(p[5]),
		lossless: Lossless(p[7] & 3),
		n:        binary.LittleEndian.Uint64(p[8:]),
		paramA:   binary.LittleEndian.Uint32(p[16:]),
		paramB:   binary.LittleEndian.Uint32(p[20:]),
		seed:     binary.LittleEndian.Uint64(p[24:]),
		key:      Key{Bucket: binary.LittleEndian.Uint64(p[32:]), Step: binary.LittleEndian.Uint64(p[40:])},
		bodyLen:  binary.LittleEndian.Uint64(p[48:]),
	}
	switch {
	case p[6] != dtypeF32:
		return nil, nil, &CorruptInputError{Offset: 6, Reason: fmt.Sprintf("unknown source dtype %d", p[6])}
	case p[7]&^3 != 0 || h.lossless > LosslessHuff0:
		return nil, nil, &CorruptInputError{Offset: 7, Reason: fmt.Sprintf("unknown flags %#02x", p[7])}
	case h.n > maxElements:
		return nil, nil, &CorruptInputError{Offset: 8, Reason: fmt.Sprintf("element count %d exceeds %d", h.n, uint64(maxElements))}
	case h.bodyLen != uint64(end-HeaderLen):
		return nil, nil, &CorruptInputError{Offset: 48, Reason: fmt.Sprintf("body length %d, but the frame holds %d bytes", h.bodyLen, end-HeaderLen)}
	}
	return h, p[HeaderLen:end], nil
}

// codec is one encoding's implementation. The generic compressor does the
// framing, the checksum, the lossless stage and the parameter checks; a codec
// only maps float32 values to a body of known length and back.
type codec interface {
	// id returns the codec written to the header.
	id() Codec
	// params returns header parameters A and B for n elements.
	params(n int) (a, b uint32)
	// seed returns the seed written to the header.
	seed() uint64
	// bodyLen returns the body length for n elements before the lossless stage.
	bodyLen(n int) int
	// encode fills body (len == bodyLen(len(src))) from src. It returns a
	// *NonFiniteError for a NaN or Inf in src. run splits data-parallel loops.
	encode(body []byte, src []float32, key Key, run runner) error
	// check validates a body whose length and header parameters already match
	// bodyLen and params. Offsets in its errors count from the body start.
	check(body []byte, h *header) error
	// decode sets (add == false) or adds to (add == true) dst the values of a
	// body that passed check.
	decode(dst []float32, body []byte, h *header, add bool, run runner)
}

// rangeDecoder is implemented by codecs whose body decodes range by range
// (quantizers, sign, dense): decode is decodeRange over the ranges of
// decodeRanges, and DecompressAverage sums and averages the payloads
// block by block while each block of dst is in cache.
type rangeDecoder interface {
	// decodeGrain returns the multiple of which every range starts.
	decodeGrain() int
	// decodeRange is decode of dst[from:to] only: it sets (or, with add,
	// adds to) those elements of dst, the whole destination, from the
	// validated body of len(dst) elements.
	decodeRange(dst []float32, body []byte, from, to int, add bool)
}

// decodeRanges is decode by a rangeDecoder: its ranges, in parallel by run.
func decodeRanges(r rangeDecoder, dst []float32, body []byte, add bool, run runner) {
	run(len(dst), r.decodeGrain(), func(from, to int) { r.decodeRange(dst, body, from, to, add) })
}

// residualCodec is implemented by codecs that compute the error-feedback
// residual while they encode, from data still in cache, instead of
// decoding the body afterwards.
type residualCodec interface {
	// encodeResidual is encode that also sets res[i] = src[i] − D[i]
	// (one float32 subtraction), D being what decode sets from the body;
	// len(res) == len(src), and res does not overlap src.
	encodeResidual(body []byte, src []float32, key Key, res []float32, run runner) error
}

// feedbackCodec is implemented by the bucketed codecs (quantizers, sign)
// and the dense ones, which fold error feedback's sum into their first
// pass: each bucket (dense: chunk) of e + g is summed into sum right
// before the bucket's range (or scale) is taken or the chunk converted,
// while it is in cache, so that ErrorFeedback.Begin reads e and g
// once and writes sum, the residual and the codes in that same pass,
// instead of a pass that writes sum and a second that reads it back.
type feedbackCodec interface {
	// encodeFeedback is encodeResidual of src = sum, where it first sets
	// sum[i] = e[i] + g[i] (one float32 addition), bucket by bucket. All
	// four slices have the same length; sum overlaps none of them. With e
	// nil it is encodeResidual of sum (res may be nil: encode). With bs
	// non-nil it also checksums the body chunk by chunk into bs while
	// each chunk is in cache.
	encodeFeedback(body []byte, e, g, sum []float32, key Key, res []float32, run runner, bs *bodySum) error
}

// sparseCodec is a codec whose decoded body is its input at the indices
// the body selects and +0 everywhere else (top-k, random-k).
type sparseCodec interface {
	// selected appends to sel the indices the raw body of n elements
	// under key selects.
	selected(sel []uint32, body []byte, n int, key Key) []uint32
	// encodeSum is encode of sum, where it first sets sum[i] = e[i] +
	// g[i] (one float32 addition) in the pass that first reads element i
	// (top-k's first histogram level or sampled collection, random-k's
	// scan for non-finite values), so that error feedback's sum costs no
	// pass of its own. e, g and sum have the same length and sum
	// overlaps neither; with e nil it is encode of sum.
	encodeSum(body []byte, e, g, sum []float32, key Key, run runner) error
}

// sparseCompressor is what Parse returns for a sparseCodec: a compressor
// that is also a SparseCompressor.
type sparseCompressor struct{ *compressor }

// feedbackCompressor is the Compressor Parse returns for a feedbackCodec
// (the quantizers, sign, the dense codecs): a FeedbackCompressor.
type feedbackCompressor struct{ *compressor }

// CompressFeedback implements FeedbackCompressor.
func (c feedbackCompressor) CompressFeedback(dst []byte, e, g, sum []float32, key Key, res []float32) ([]byte, error) {
	if err := feedbackLengths(len(g), e, sum); err != nil {
		return dst, err
	}
	if len(res) != len(g) {
		return dst, &SizeError{What: "residual length", Got: int64(len(res)), Want: int64(len(g))}
	}
	return c.compressFeedback(c.impl.(feedbackCodec), dst, e, g, sum, key, res)
}

// feedbackLengths returns a *SizeError unless the residual memory e and
// the sum have the gradient's length n.
func feedbackLengths(n int, e, sum []float32) error {
	if len(e) != n {
		return &SizeError{What: "residual memory length", Got: int64(len(e)), Want: int64(n)}
	}
	if len(sum) != n {
		return &SizeError{What: "sum length", Got: int64(len(sum)), Want: int64(n)}
	}
	return nil
}

// CompressSelect implements SparseCompressor.
func (c sparseCompressor) CompressSelect(dst []byte, src []float32, key Key, sel []uint32) ([]byte, []uint32, error) {
	return c.compressSelect(dst, nil, nil, src, key, sel)
}

// CompressSelectFeedback implements SparseFeedbackCompressor.
func (c sparseCompressor) CompressSelectFeedback(dst []byte, e, g, sum []float32, key Key, sel []uint32) ([]byte, []uint32, error) {
	if err := feedbackLengths(len(g), e, sum); err != nil {
		return dst, sel, err
	}
	return c.compressSelect(dst, e, g, sum, key, sel)
}

// compressSelect is CompressSelect of sum, which it first sets to e + g
// unless e is nil (sparseCodec.encodeSum).
func (c sparseCompressor) compressSelect(dst []byte, e, g, sum []float32, key Key, sel []uint32) ([]byte, []uint32, error) {
	n := len(sum)
	run := c.runner(n)
	sc := c.impl.(sparseCodec)
	out, err := c.encodeWith(dst, n, key, func(body []byte, _ *bodySum) error {
		if err := sc.encodeSum(body, e, g, sum, key, run); err != nil {
			return err
		}
		sel = sc.selected(sel, body, n, key)
		return nil
	})
	return out, sel, err
}

// subtractFrom sets res[i] = src[i] − res[i].
func subtractFrom(res, src []float32, run runner) {
	run(len(res), decodeBlock, func(lo, hi int) { subKernel(res[lo:hi], src[lo:hi]) })
}

// entropyTransform is implemented by codecs whose body compresses better after
// a reversible rewrite (top-k delta-codes its indices) before the lossless stage.
type entropyTransform interface {
	forward(body []byte)
	inverse(body []byte)
}

// compressor frames a codec's body into the wire format.
type compressor struct {
	spec     Spec
	name     string // spec.String()
	impl     codec
	lossless Lossless
	opts     options
}

func (c *compressor) Spec() Spec     { return c.spec }
func (c *compressor) Codec() Codec   { return c.impl.id() }
func (c *compressor) String() string { return c.name }

func (c *compressor) MaxEncodedLen(n int) int {
	return HeaderLen + c.impl.bodyLen(n) + TrailerLen
}

func (c *compressor) Compress(dst []byte, src []float32, key Key) ([]byte, error) {
	return c.compress(dst, src, key, nil)
}

// CompressResidual implements ResidualCompressor: a codec with a fused
// path (residualCodec) computes res while it encodes; any other decodes
// its raw body into res and subtracts, skipping the framing checks a
// Decompress of the payload would repeat.
func (c *compressor) CompressResidual(dst []byte, src []float32, key Key, res []float32) ([]byte, error) {
	if len(res) != len(src) {
		return dst, &SizeError{What: "residual length", Got: int64(len(res)), Want: int64(len(src))}
	}
	return c.compress(dst, src, key, res)
}

// compress is Compress, and with res != nil CompressResidual.
func (c *compressor) compress(dst []byte, src []float32, key Key, res []float32) ([]byte, error) {
	if fc, ok := c.impl.(feedbackCodec); ok {
		return c.compressFeedback(fc, dst, nil, nil, src, key, res)
	}
	n := len(src)
	run := c.runner(n)
	return c.encodeWith(dst, n, key, func(body []byte, _ *bodySum) error {
		if res == nil {
			return c.impl.encode(body, src, key, run)
		}
		if rc, fused := c.impl.(residualCodec); fused {
			return rc.encodeResidual(body, src, key, res, run)
		}
		if err := c.impl.encode(body, src, key, run); err != nil {
			return err
		}
		h := c.header(n, key)
		c.impl.decode(res, body, &h, false, run)
		subtractFrom(res, src, run)
		return nil
	})
}

// compressFeedback is CompressResidual of sum = e + g through c's codec
// fc, which sets sum too; with e nil it is compress of sum.
func (c *compressor) compressFeedback(fc feedbackCodec, dst []byte, e, g, sum []float32, key Key, res []float32) ([]byte, error) {
	n := len(sum)
	run := c.runner(n)
	return c.encodeWith(dst, n, key, func(body []byte, bs *bodySum) error {
		return fc.encodeFeedback(body, e, g, sum, key, res, run, bs)
	})
}

// header is the header of n elements under key before the lossless stage.
func (c *compressor) header(n int, key Key) header {
	h := header{codec: c.impl.id(), n: uint64(n), seed: c.impl.seed(), key: key, bodyLen: uint64(c.impl.bodyLen(n))}
	h.paramA, h.paramB = c.impl.params(n)
	return h
}

// encodeWith appends the payload of n elements under key to dst, its raw
// body (bodyLen(n) bytes) written by fill: the framing, the lossless stage
// and the checksum of Compress. fill gets a *bodySum where no lossless
// stage follows; it may checksum the body into it as it writes it (every
// chunk or none), which saves the pass over the body that the checksum
// takes otherwise. On error it returns dst unchanged.
func (c *compressor) encodeWith(dst []byte, n int, key Key, fill func(body []byte, bs *bodySum) error) ([]byte, error) {
	if n < 0 || int64(n) > MaxElements {
		return dst, &SizeError{What: "input length", Got: int64(n), Want: MaxElements}
	}
	raw := c.impl.bodyLen(n)
	start := len(dst)
	out := grow(dst, HeaderLen+raw+TrailerLen)
	body := out[start+HeaderLen : start+HeaderLen+raw]
	var bs *bodySum
	if c.lossless == LosslessNone {
		bs = new(bodySum)
	}
	if err := fill(body, bs); err != nil {
		return dst, err
	}
	h := c.header(n, key)
	if c.lossless != LosslessNone {
		if stored, ok := c.lossless.squeeze(body, c.impl); ok {
			h.lossless = c.lossless
			h.bodyLen = uint64(stored)
			out = out[:start+HeaderLen+stored+TrailerLen]
		}
	}
	frame := out[start : len(out)-TrailerLen]
	h.put(frame)
	var sum uint32
	if bs != nil && bs.chunks != nil {
		sum = crcSpan{crc: crcUpdate(0, frame[:HeaderLen])}.then(bs.sum()).crc
	} else {
		sum = crcUpdate(0, frame)
	}
	binary.LittleEndian.PutUint32(out[len(out)-TrailerLen:], sum)
	return out, nil
}

func (c *compressor) Decompress(dst []float32, payload []byte) error {
	return c.decompress(dst, payload, false)
}

func (c *compressor) DecompressAdd(dst []float32, payload []byte) error {
	return c.decompress(dst, payload, true)
}

func (c *compressor) decompress(dst []float32, payload []byte, add bool) error {
	h, body, err := c.open(payload, len(dst))
	if err != nil {
		return err
	}
	c.impl.decode(dst, body, h, add, c.runner(len(dst)))
	return nil
}

// open validates payload for n elements as Decompress does (framing, the
// compressor's configuration, the lossless stage, the codec's body checks)
// and returns its header and raw body.
func (c *compressor) open(payload []byte, n int) (*header, []byte, error) {
	h, body, err := parsePayload(payload)
	if err != nil {
		return nil, nil, err
	}
	if h.codec != c.impl.id() {
		return nil, nil, &PayloadMismatchError{Field: "codec", Got: h.codec.String(), Want: c.impl.id().String()}
	}
	if h.n != uint64(n) {
		return nil, nil, &SizeError{What: "destination length", Got: int64(n), Want: int64(h.n)}
	}
	a, b := c.impl.params(n)
	switch {
	case h.paramA != a:
		return nil, nil, &PayloadMismatchError{Field: "parameter A (k or bucket size)", Got: fmt.Sprint(h.paramA), Want: fmt.Sprint(a)}
	case h.paramB != b:
		return nil, nil, &PayloadMismatchError{Field: "parameter B (rounding mode, or top-k's chunk layout)", Got: fmt.Sprint(h.paramB), Want: fmt.Sprint(b)}
	case h.seed != c.impl.seed():
		return nil, nil, &PayloadMismatchError{Field: "seed", Got: fmt.Sprint(h.seed), Want: fmt.Sprint(c.impl.seed())}
	}
	raw := c.impl.bodyLen(n)
	if h.lossless != LosslessNone {
		body, err = h.lossless.expand(body, raw, c.impl)
		if err != nil {
			return nil, nil, err
		}
	} else if len(body) != raw {
		return nil, nil, &CorruptInputError{Offset: 48, Reason: fmt.Sprintf("body of %d bytes, %s needs %d for %d elements", len(body), h.codec, raw, n)}
	}
	if err := c.impl.check(body, h); err != nil {
		if ce, ok := err.(*CorruptInputError); ok {
			if h.lossless == LosslessNone {
				ce.Offset += HeaderLen
			} else {
				ce.Reason = "in the body after the " + h.lossless.String() + " stage: " + ce.Reason
			}
		}
		return nil, nil, err
	}
	return h, body, nil
}

// grow returns b extended by n bytes, reallocating only when cap is short.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), len(b)+n)
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

// Header is the header of a payload, as ParseHeader reads it (see the wire
// format above).
type Header struct {
	Codec    Codec
	Lossless Lossless // the lossless stage the body went through
	Elements int      // element count n
	ParamA   uint32   // k (topk, randomk) or the quantization bucket size (int8/4/2, sign)
	ParamB   uint32   // codec-specific: the rounding mode of int8/4/2, top-k's chunk layout
	Seed     uint64
	Key      Key
}

// ParseHeader checks the framing of payload (length, magic, version,
// checksum, flags, body length) and returns its header and its stored body:
// the bytes after the lossless stage, if any, aliasing payload. It does not
// check the body against a codec; Decompress does. Other backends use it to
// read a payload's fields without decoding it, e.g. the k values of a
// random-k body and the seed that, with RandomKIndices, places them.
func ParseHeader(payload []byte) (Header, []byte, error) {
	h, body, err := parsePayload(payload)
	if err != nil {
		return Header{}, nil, err
	}
	return h.public(), body, nil
}

// public returns the exported form of h.
func (h *header) public() Header {
	return Header{
		Codec: h.codec, Lossless: h.lossless, Elements: int(h.n),
		ParamA: h.paramA, ParamB: h.paramB, Seed: h.seed, Key: h.key,
	}
}

// checkMagic checks the magic and version at the start of p, which holds at
// least 5 bytes.
func checkMagic(p []byte) error {
	if string(p[:4]) != wireMagic {
		return &CorruptInputError{Offset: 0, Reason: fmt.Sprintf("bad magic %q, want %q", p[:4], wireMagic)}
	}
	if p[4] != wireVersion {
		return &VersionError{What: "payload", Got: p[4], Want: wireVersion}
	}
	return nil
}

// PayloadLen returns the total length in bytes (header, body and checksum)
// of the payload whose header starts prefix, which must hold at least the
// 56-byte header; bytes past it are not read. It checks only the magic, the
// version and that the length is representable, so that payloads can travel
// in padded, fixed-size slots: pass slot[:PayloadLen(slot)] to Decompress,
// which validates the rest. A short prefix or bad magic is a
// *CorruptInputError, another version a *VersionError.
func PayloadLen(prefix []byte) (int, error) {
	if len(prefix) < HeaderLen {
		return 0, &CorruptInputError{Offset: int64(len(prefix)), Reason: fmt.Sprintf("%d bytes are shorter than the %d-byte payload header", len(prefix), HeaderLen)}
	}
	if err := checkMagic(prefix); err != nil {
		return 0, err
	}
	body := binary.LittleEndian.Uint64(prefix[48:])
	if body > math.MaxInt-HeaderLen-TrailerLen {
		return 0, &CorruptInputError{Offset: 48, Reason: fmt.Sprintf("body length %d is not representable", body)}
	}
	return HeaderLen + int(body) + TrailerLen, nil
}
