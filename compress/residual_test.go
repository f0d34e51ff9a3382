package compress_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// residualInput returns n values of mixed scale and sign with repeated
// magnitudes and signed zeros, so that top-k ties, −0 and +0 all occur.
func residualInput(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	x := make([]float32, n)
	for i := range x {
		switch r.IntN(8) {
		case 0:
			x[i] = float32(math.Copysign(0, float64(r.IntN(2)*2-1)))
		case 1:
			x[i] = float32(r.IntN(3)) - 1
		default:
			x[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(12)-6))
		}
	}
	return x
}

// TestCompressResidual checks, for every spec of the conformance suite, at
// lengths around quantization-bucket and byte boundaries and above the
// parallel threshold, serially and with 2 and 3 workers, that
// CompressResidual appends the bytes Compress appends and sets res to src −
// Decompress(payload) bit for bit, the definition ErrorFeedback relies on.
func TestCompressResidual(t *testing.T) {
	lengths := []int{1, 7, 8, 9, 63, 64, 65, 511, 512, 513, 4097}
	if !testing.Short() {
		lengths = append(lengths, 70001)
	}
	for _, spec := range compresstest.DefaultSpecs {
		for _, workers := range []int{1, 2, 3} {
			c := compresstest.MustParse(t, spec, compress.WithWorkers(workers), compress.WithMinParallel(4096))
			rc, ok := c.(compress.ResidualCompressor)
			if !ok {
				t.Fatalf("%s: Parse's compressor is not a ResidualCompressor", spec)
			}
			for _, n := range lengths {
				what := fmt.Sprintf("%s, %d workers, n=%d", spec, workers, n)
				src := residualInput(n, uint64(workers))
				key := compress.Key{Bucket: 3, Step: uint64(n)}
				want, err := c.Compress([]byte("pre"), src, key)
				if err != nil {
					t.Fatalf("%s: Compress: %v", what, err)
				}
				res := make([]float32, n)
				got, err := rc.CompressResidual([]byte("pre"), src, key, res)
				if err != nil {
					t.Fatalf("%s: CompressResidual: %v", what, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s: CompressResidual's payload differs from Compress's", what)
				}
				d := make([]float32, n)
				if err := c.Decompress(d, want[3:]); err != nil {
					t.Fatalf("%s: Decompress: %v", what, err)
				}
				for i := range src {
					if w := src[i] - d[i]; math.Float32bits(res[i]) != math.Float32bits(w) {
						t.Fatalf("%s: res[%d] = %v, want %v − %v = %v", what, i, res[i], src[i], d[i], w)
					}
				}
			}
		}
	}
}

// opaque hides every method but the Compressor interface's.
type opaque struct{ compress.Compressor }

// TestCompressResidualFallback: the package function gives the same bytes
// and residual for a compressor without the fused method, and checks the
// residual's length either way.
func TestCompressResidualFallback(t *testing.T) {
	for _, spec := range []string{"int4", "topk:0.1", "fp16"} {
		c := compresstest.MustParse(t, spec)
		src := residualInput(1000, 1)
		key := compress.Key{Bucket: 1}
		fused, plain := make([]float32, len(src)), make([]float32, len(src))
		p1, err1 := compress.CompressResidual(c, nil, src, key, fused)
		p2, err2 := compress.CompressResidual(opaque{c}, nil, src, key, plain)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v, %v", spec, err1, err2)
		}
		if !bytes.Equal(p1, p2) {
			t.Fatalf("%s: payloads differ", spec)
		}
		for i := range fused {
			if math.Float32bits(fused[i]) != math.Float32bits(plain[i]) {
				t.Fatalf("%s: res[%d] = %v fused, %v by decoding", spec, i, fused[i], plain[i])
			}
		}
		for _, cc := range []compress.Compressor{c, opaque{c}} {
			dst := []byte("keep")
			out, err := compress.CompressResidual(cc, dst, src, key, make([]float32, len(src)-1))
			var se *compress.SizeError
			if !errors.As(err, &se) || string(out) != "keep" {
				t.Fatalf("%s (%T): short residual: got %q, %v; want dst unchanged and a *SizeError", spec, cc, out, err)
			}
		}
	}
}

// TestFeedbackFused: error feedback over a quantizer, sign, top-k or
// random-k, which fold e + g into their first pass, gives the payloads and
// residuals of the general path (opaque hides the codec), step after step,
// serial and parallel, and a non-finite e + g leaves the residual as it
// was on both.
func TestFeedbackFused(t *testing.T) {
	for _, spec := range []string{"int8", "int4:bucket=13", "int2:round=nearest", "sign:bucket=100", "int8:lossless=huff0",
		"topk:0.05", "topk:0.05:sampled", "randomk:0.05:seed=2", "topk:0.05:lossless=zstd"} {
		for _, workers := range []int{1, 2} {
			c := compresstest.MustParse(t, spec, compress.WithWorkers(workers), compress.WithMinParallel(1))
			fused, plain := compress.NewErrorFeedback(c), compress.NewErrorFeedback(opaque{c})
			for step := range uint64(4) {
				g := residualInput(3001, step+1)
				if step == 2 {
					g[1234] = float32(math.Inf(1))
				}
				key := compress.Key{Bucket: 9, Step: step}
				p1, err1 := fused.Compress(nil, g, key)
				p2, err2 := plain.Compress(nil, g, key)
				if !bytes.Equal(p1, p2) || (err1 == nil) != (err2 == nil) {
					t.Fatalf("%s w=%d step %d: payloads or errors differ (%v, %v)", spec, workers, step, err1, err2)
				}
				if step == 2 && err1 == nil {
					t.Fatalf("%s step 2: no error for an Inf", spec)
				}
				e1, e2 := fused.Residual(9), plain.Residual(9)
				for i := range e1 {
					if math.Float32bits(e1[i]) != math.Float32bits(e2[i]) {
						t.Fatalf("%s w=%d step %d: residual[%d] = %v fused, %v plain", spec, workers, step, i, e1[i], e2[i])
					}
				}
			}
		}
	}
}
