package compress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/zstd"
)

// Lossless selects the optional entropy stage applied to a payload body after
// the codec has written it. It pays where the link is slow: quantized codes of
// heavy-tailed gradients cluster near the zero point and huff0 shortens them;
// delta-coded top-k indices are small numbers that zstd packs well. A body the
// stage cannot shorten is stored as is (the header flag says which).
type Lossless uint8

// The lossless stages. The values are stored in the payload header flags.
const (
	LosslessNone  Lossless = 0
	LosslessZstd  Lossless = 1 // klauspost/compress zstd, fastest level
	LosslessHuff0 Lossless = 2 // huff0 4X streams over 128 KiB blocks
)

var losslessByName = map[string]Lossless{"none": LosslessNone, "zstd": LosslessZstd, "huff0": LosslessHuff0}

// String returns the stage's spec name.
func (l Lossless) String() string {
	for name, v := range losslessByName {
		if v == l {
			return name
		}
	}
	return fmt.Sprintf("lossless(%d)", uint8(l))
}

// squeeze runs the stage over body in place. It returns the stored length and
// true when the result is shorter, or false with body unchanged.
func (l Lossless) squeeze(body []byte, impl codec) (int, bool) {
	t, _ := impl.(entropyTransform)
	if t != nil {
		t.forward(body)
	}
	var packed []byte
	switch l {
	case LosslessZstd:
		packed = zstdEncoder().EncodeAll(body, nil)
	case LosslessHuff0:
		packed = huff0Pack(body)
	}
	if packed == nil || len(packed) >= len(body) {
		if t != nil {
			t.inverse(body)
		}
		return 0, false
	}
	return copy(body, packed), true
}

// expand undoes the stage: it returns the raw body of exactly raw bytes, never
// allocating more than raw bytes for the output whatever stored claims.
func (l Lossless) expand(stored []byte, raw int, impl codec) ([]byte, error) {
	var out []byte
	var err error
	switch l {
	case LosslessZstd:
		out, err = zstdDecode(stored, raw)
	case LosslessHuff0:
		out, err = huff0Unpack(stored, raw)
	}
	if err != nil {
		return nil, &CorruptInputError{Offset: HeaderLen, Reason: fmt.Sprintf("%s stage: %v", l, err)}
	}
	if t, ok := impl.(entropyTransform); ok {
		t.inverse(out)
	}
	return out, nil
}

var (
	zstdEncOnce sync.Once
	zstdEnc     *zstd.Encoder
)

// The window of a frame our encoder writes for a body of raw bytes is
// 1<<bits.Len(raw), clamped to [1 KiB, 4 MiB] (4 MiB is SpeedFastest's
// window). Decoders are pooled by that window log and refuse larger windows,
// so a forged frame header cannot make a small body allocate a large history.
const (
	zstdMinWindowLog = 10
	zstdMaxWindowLog = 22
)

var zstdDecs [zstdMaxWindowLog + 1]sync.Pool // indexed by window log

func zstdWindowLog(raw int) int {
	return min(max(bits.Len(uint(raw)), zstdMinWindowLog), zstdMaxWindowLog)
}

func zstdDecoder(log int) *zstd.Decoder {
	if d, ok := zstdDecs[log].Get().(*zstd.Decoder); ok {
		return d
	}
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(1<<log))
	if err != nil {
		panic("compress: zstd decoder with static options: " + err.Error())
	}
	return d
}

func zstdEncoder() *zstd.Encoder {
	zstdEncOnce.Do(func() {
		var err error
		zstdEnc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err != nil {
			panic("compress: zstd encoder with static options: " + err.Error())
		}
	})
	return zstdEnc
}

// zstdDecode streams stored through a pooled decoder into a buffer of exactly
// raw bytes and fails if the stream is shorter or longer.
func zstdDecode(stored []byte, raw int) ([]byte, error) {
	log := zstdWindowLog(raw)
	d := zstdDecoder(log)
	defer zstdDecs[log].Put(d)
	if err := d.Reset(bytes.NewReader(stored)); err != nil {
		return nil, err
	}
	out := make([]byte, raw)
	if _, err := io.ReadFull(d, out); err != nil {
		return nil, fmt.Errorf("decoded stream shorter than %d bytes: %w", raw, err)
	}
	var extra [1]byte
	if n, err := d.Read(extra[:]); n != 0 || !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decoded stream longer than %d bytes", raw)
	}
	return out, nil
}

// The huff0 framing: the raw body is cut into huff0Block-byte blocks (the last
// shorter); each is stored as a mode byte, a uint32 length and its bytes.
const (
	huff0Block = 1 << 17
	huff0Raw   = 0 // bytes as is
	huff0Huff  = 1 // a huff0 table and 4X streams
	huff0RLE   = 2 // one byte, repeated for the whole block
)

var huff0Scratch = sync.Pool{New: func() any { return new(huff0.Scratch) }}

func huff0Pack(body []byte) []byte {
	s := huff0Scratch.Get().(*huff0.Scratch)
	defer huff0Scratch.Put(s)
	out := make([]byte, 0, len(body))
	for len(body) > 0 {
		blk := body[:min(len(body), huff0Block)]
		body = body[len(blk):]
		s.Reuse = huff0.ReusePolicyNone
		packed, _, err := huff0.Compress4X(blk, s)
		mode := byte(huff0Huff)
		switch {
		case errors.Is(err, huff0.ErrUseRLE):
			mode, packed = huff0RLE, blk[:1]
		case err != nil:
			mode, packed = huff0Raw, blk
		}
		if len(out)+5+len(packed) >= cap(out) {
			return nil // no saving: the caller stores the body raw
		}
		out = append(out, mode)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(packed)))
		out = append(out, packed...)
	}
	return out
}

func huff0Unpack(stored []byte, raw int) ([]byte, error) {
	s := huff0Scratch.Get().(*huff0.Scratch)
	defer huff0Scratch.Put(s)
	out := make([]byte, 0, raw)
	for off := 0; off < len(stored); {
		want := min(raw-len(out), huff0Block)
		if want == 0 {
			return nil, fmt.Errorf("%d bytes past the last block at offset %d", len(stored)-off, off)
		}
		if len(stored)-off < 5 {
			return nil, fmt.Errorf("block header truncated at offset %d", off)
		}
		mode, claimed := stored[off], binary.LittleEndian.Uint32(stored[off+1:])
		off += 5
		if int64(claimed) > int64(len(stored)-off) { // in int64: a 32-bit int would wrap
			return nil, fmt.Errorf("block at offset %d claims %d bytes, %d remain", off-5, claimed, len(stored)-off)
		}
		size := int(claimed)
		blk := stored[off : off+size]
		off += size
		switch mode {
		case huff0Raw:
			if size != want {
				return nil, fmt.Errorf("raw block at offset %d has %d bytes, want %d", off-size-5, size, want)
			}
			out = append(out, blk...)
		case huff0RLE:
			if size != 1 {
				return nil, fmt.Errorf("RLE block at offset %d has %d bytes, want 1", off-size-5, size)
			}
			for range want {
				out = append(out, blk[0])
			}
		case huff0Huff:
			s.MaxDecodedSize = want
			s2, rest, err := huff0.ReadTable(blk, s)
			if err != nil {
				return nil, fmt.Errorf("block at offset %d: %v", off-size-5, err)
			}
			dec, err := s2.Decompress4X(rest, want)
			if err != nil || len(dec) != want {
				return nil, fmt.Errorf("block at offset %d does not decode to %d bytes (%v)", off-size-5, want, err)
			}
			out = append(out, dec...)
		default:
			return nil, fmt.Errorf("unknown block mode %d at offset %d", mode, off-size-5)
		}
	}
	if len(out) != raw {
		return nil, fmt.Errorf("blocks decode to %d bytes, want %d", len(out), raw)
	}
	return out, nil
}
