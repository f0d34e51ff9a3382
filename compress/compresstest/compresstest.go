// Package compresstest is the conformance suite every compress.Compressor
// backend must pass: the CPU reference in package compress, the CUDA kernels,
// anything that claims to speak the gradcomp wire format. A backend's tests
// run it in one line:
//
//	func TestConformance(t *testing.T) {
//		compresstest.Run(t, func(spec string) (compress.Compressor, error) {
//			return mybackend.Parse(spec)
//		})
//	}
//
// The suite checks each codec's round-trip bound, the error-feedback
// invariant, byte-identical payloads against the CPU reference (whatever its
// worker count), the handling of NaN and Inf, writes outside the destination,
// DecompressAdd, and the rejection of foreign, truncated and corrupted
// payloads. The bounds are stated with each check; the tolerances are the
// named constants in bounds.go.
package compresstest

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// DefaultSpecs are the specs Run checks: every codec, its non-default
// options, and each lossless stage. Ratios are chosen so that ratio·n is
// never exactly halfway between integers for the lengths the suite uses.
var DefaultSpecs = []string{
	"none", "fp16", "bf16",
	"none:lossless=zstd", "fp16:lossless=huff0", "bf16:lossless=zstd",
	"topk:0.1", "topk:0.01:lossless=zstd", "topk:0.01:lossless=huff0",
	"topk:0.1:sampled", "topk:0.01:sampled",
	"randomk:0.1", "randomk:0.05:seed=7:lossless=zstd",
	"int8", "int8:round=nearest", "int8:bucket=64:lossless=huff0", "int8:lossless=zstd",
	"int4", "int4:bucket=100:round=nearest", "int4:lossless=huff0",
	"int2", "int2:bucket=33:seed=3", "int2:round=nearest",
	"sign", "sign:bucket=100", "sign:lossless=huff0",
	// Chunked top-k (SparseLoCo's): float32 values, and 2, 4 or 8 bits.
	"topk:0.1:chunk=64", "topk:0.01:chunk=1000:lossless=huff0",
	"topk:0.05:chunk=100:bits=2", "topk:0.02:chunk=4096:bits=2:seed=9",
	"topk:0.1:chunk=64:bits=4:round=nearest:lossless=zstd", "topk:0.03:chunk=300:bits=8",
}

// factory builds a backend's compressor for a spec string.
type factory func(spec string) (compress.Compressor, error)

// Run runs every check on every spec in DefaultSpecs as parallel subtests
// named after the spec. A spec whose codec this build of package compress
// does not register yet, or that the backend declines while the CPU reference
// accepts it, is skipped with the reason; a spec the CPU reference rejects is
// a failure of the suite itself.
func Run(t *testing.T, newCompressor func(spec string) (compress.Compressor, error)) {
	for _, spec := range DefaultSpecs {
		t.Run(spec, func(t *testing.T) {
			t.Parallel()
			e := open(t, newCompressor, spec)
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) { c.fn(t, e) })
			}
		})
	}
}

// checks are the suite's checks, in the order they run for each spec.
var checks = []struct {
	name string
	fn   func(t *testing.T, e *env)
}{
	{"RoundTrip", checkRoundTrip},
	{"ErrorFeedback", checkErrorFeedback},
	{"Determinism", checkDeterminism},
	{"KeyDependence", checkKeyDependence},
	{"NonFinite", checkNonFinite},
	{"Guards", checkGuards},
	{"DecompressAdd", checkDecompressAdd},
	{"BadInput", checkBadInput},
}

// env is what every check of one spec works with.
type env struct {
	spec string
	c    compress.Compressor
	new  factory
	info specInfo
}

// specInfo is what the checks need to know about a spec: the codec and its
// parameters, with the defaults the spec grammar documents filled in.
type specInfo struct {
	codec    compress.Codec
	ratio    float64 // topk, randomk
	sampled  bool    // topk:RATIO:sampled
	chunk    int     // topk:RATIO:chunk=C; 0 for the rest
	bits     int     // topk's bits=B; 0 for float32 values and the rest
	bucket   int     // quantization bucket (int8/4/2, sign), top-k's chunk; 512 for the rest
	nearest  bool    // int8/4/2 and top-k's bits with round=nearest
	lossless bool    // a lossless stage is configured
}

// open builds the compressor for spec or skips the test with the reason.
func open(t *testing.T, newCompressor factory, spec string) *env {
	t.Helper()
	name, _, _ := strings.Cut(spec, ":")
	if !slices.Contains(compress.CodecNames(), name) {
		t.Skipf("codec %q is not registered in this build of package compress", name)
	}
	if _, err := compress.Parse(spec); err != nil {
		t.Fatalf("the CPU reference rejects a spec of the suite: %v", err)
	}
	c, err := newCompressor(spec)
	if err != nil {
		t.Skipf("backend does not support %q: %v", spec, err)
	}
	info, err := describe(spec, c.Codec())
	if err != nil {
		t.Fatal(err)
	}
	return &env{spec: spec, c: c, new: newCompressor, info: info}
}

// describe reads a spec the CPU reference has accepted.
func describe(spec string, codec compress.Codec) (specInfo, error) {
	s, err := compress.ParseSpec(spec)
	if err != nil {
		return specInfo{}, errors.New("compresstest: cannot read spec " + strconv.Quote(spec) + ": " + err.Error())
	}
	info := specInfo{codec: codec, ratio: s.Ratio, sampled: s.Sampled, chunk: s.Chunk, bits: s.Bits, bucket: s.BucketLen(),
		nearest: s.Nearest, lossless: s.Lossless != compress.LosslessNone}
	if s.Chunk != 0 {
		info.bucket = s.Chunk // the lengths cluster around chunk boundaries
	}
	return info, nil
}

// quantBits returns the code width of a min-max quantizing codec, or 0.
func (s specInfo) quantBits() int {
	switch s.codec {
	case compress.CodecInt8:
		return 8
	case compress.CodecInt4:
		return 4
	case compress.CodecInt2:
		return 2
	}
	return 0
}

// stochastic reports whether the decoded values depend on the Key: random-k
// draws its indices from it and stochastic rounding its dither.
func (s specInfo) stochastic() bool {
	return s.codec == compress.CodecRandomK || (s.quantBits() > 0 || s.bits > 0) && !s.nearest
}

// keyFree reports whether the decoded values must not depend on the Key.
// Sampled top-k is neither: its sample may or may not be drawn from the Key.
func (s specInfo) keyFree() bool {
	return !s.stochastic() && !(s.codec == compress.CodecTopK && s.sampled)
}

// lengths returns the element counts the checks use: the edges of one
// quantization bucket, a few odd sizes, and (unless -short) one large enough
// to run the CPU reference in parallel.
func (e *env) lengths(big bool) []int {
	b := e.info.bucket
	ns := []int{0, 1, 2, 7, b - 1, b, b + 1, 2*b + 3, 1000, 4097}
	if big && !testing.Short() {
		ns = append(ns, 1<<20+3)
	}
	slices.Sort(ns)
	return slices.Compact(ns)
}

// mustCompress compresses src onto nil and fails the test on error.
func mustCompress(t *testing.T, c compress.Compressor, src []float32, key compress.Key) []byte {
	t.Helper()
	p, err := c.Compress(nil, src, key)
	if err != nil {
		t.Fatalf("%s: Compress(%d elements, %+v): %v", c.Spec(), len(src), key, err)
	}
	return p
}

// mustDecompress decodes p into a new slice of n elements.
func mustDecompress(t *testing.T, c compress.Compressor, p []byte, n int) []float32 {
	t.Helper()
	d := make([]float32, n)
	if err := c.Decompress(d, p); err != nil {
		t.Fatalf("%s: Decompress(%d elements): %v", c.Spec(), n, err)
	}
	return d
}

// MustParse returns compress.Parse(spec, opts...), or fails tb with the
// spec's error.
func MustParse(tb testing.TB, spec string, opts ...compress.Option) compress.Compressor {
	tb.Helper()
	c, err := compress.Parse(spec, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}
