package bench

import (
	"strings"

	"github.com/gradcomp/gradcomp/compress"
)

// specParts splits a canonical spec into its ':'-separated parts.
func specParts(spec string) []string { return strings.Split(spec, ":") }

// losslessBase returns, for a spec with a lossless stage, the same spec
// without it and the stage's name; ok is false for a spec without one.
func losslessBase(spec string) (base, stage string, ok bool) {
	var keep []string
	for _, p := range specParts(spec) {
		if v, isStage := strings.CutPrefix(p, "lossless="); isStage {
			stage, ok = v, v != "none"
			continue
		}
		keep = append(keep, p)
	}
	return strings.Join(keep, ":"), stage, ok
}

// exactTopK returns, for a sampled top-k compressor, the spec of exact top-k
// with the same ratio and options; ok is false for any other compressor.
func exactTopK(c compress.Compressor) (exact string, ok bool) {
	if c.Codec() != compress.CodecTopK {
		return "", false
	}
	parts := specParts(c.Spec())
	keep := []string{parts[0]}
	for _, p := range parts[1:] {
		if p == "sampled" {
			ok = true
			continue
		}
		keep = append(keep, p)
	}
	return strings.Join(keep, ":"), ok
}
