package compress

import "fmt"

// Hooks for other backends (the CUDA kernels in package kernels): they
// compute a codec's raw body themselves and leave the framing, the lossless
// stage, the checksum and the validation of payloads to this package, so
// that their payloads are the CPU reference's byte for byte.

// backendOf returns the implementation behind a Compressor made by Parse.
func backendOf(c Compressor) (*compressor, error) {
	switch impl := c.(type) {
	case *compressor:
		return impl, nil
	case sparseCompressor:
		return impl.compressor, nil
	case feedbackCompressor:
		return impl.compressor, nil
	}
	return nil, fmt.Errorf("compress: %T is not a compressor made by compress.Parse", c)
}

// EncodePayload appends to dst the payload c.Compress would append for n
// elements under key, except that the raw body (the codec's layout, before
// any lossless stage) is written by fill into the slice it is handed, whose
// length is the codec's body length for n. The header, the lossless stage
// and the CRC32C are this package's. c must come from Parse. On error
// (fill's error is returned as is) dst is returned unchanged; bytes between
// len(dst) and cap(dst) may have been overwritten.
func EncodePayload(c Compressor, dst []byte, n int, key Key, fill func(body []byte) error) ([]byte, error) {
	impl, err := backendOf(c)
	if err != nil {
		return dst, err
	}
	return impl.encodeWith(dst, n, key, func(body []byte, _ *bodySum) error { return fill(body) })
}

// DecodePayload validates payload exactly as c.Decompress does for n
// elements (framing, checksum, c's configuration, the lossless stage, the
// codec's checks of the body) and returns its header and its raw body, the
// lossless stage undone: the bytes a decoder reads. The body may alias
// payload. c must come from Parse.
func DecodePayload(c Compressor, payload []byte, n int) (Header, []byte, error) {
	impl, err := backendOf(c)
	if err != nil {
		return Header{}, nil, err
	}
	h, body, err := impl.open(payload, n)
	if err != nil {
		return Header{}, nil, err
	}
	return h.public(), body, nil
}

// StreamBase returns the 64-bit base of NewRandomStream(seed, key, domain): draw
// i is mix64(base + (i+1)·0x9e3779b97f4a7c15) and draw32(i) is keyed by
// uint32(base) and uint32(base >> 32), which is how a backend that draws on
// its own computes the same bits (see rng.go).
func StreamBase(seed uint64, key Key, domain uint64) uint64 {
	return NewRandomStream(seed, key, domain).base
}
