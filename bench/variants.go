package bench

import (
	"github.com/gradcomp/gradcomp/compress"
)

// losslessBase returns, for a compressor with a lossless stage, the spec
// of the same compressor without it and the stage's name; ok is false for
// one without.
func losslessBase(c compress.Compressor) (base compress.Spec, stage string, ok bool) {
	s := c.Spec()
	if s.Lossless == compress.LosslessNone {
		return s, "", false
	}
	stage = s.Lossless.String()
	s.Lossless = compress.LosslessNone
	return s, stage, true
}

// exactTopK returns, for a sampled top-k compressor, the spec of exact top-k
// with the same ratio and options; ok is false for any other compressor.
func exactTopK(c compress.Compressor) (exact compress.Spec, ok bool) {
	s := c.Spec()
	if s.Codec != compress.CodecTopK || !s.Sampled {
		return s, false
	}
	s.Sampled = false
	return s, true
}
