package overlap

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// TestSparsePartsSelect: parts over a sparse compressor are one for
// error-feedback memory, reporting the bucket's indices (each part's
// offset added): the input with +0 at them is the residual
// CompressResidual computes, and the payload is the same; a dense codec's
// parts are not sparse.
func TestSparsePartsSelect(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]float32, 1001)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
	}
	key := compress.Key{Bucket: 2, Step: 5}
	for _, spec := range []string{"topk:0.05", "randomk:0.05", "topk:0.05:lossless=zstd"} {
		for _, count := range []int{1, 3} {
			p := &parts{inner: compresstest.MustParse(t, spec), count: count, stage: 1, ranks: count}
			sp, ok := p.forMemory().(compress.SparseCompressor)
			if !ok {
				t.Fatalf("%s in %d parts: forMemory is %T, not a compress.SparseCompressor", spec, count, p.forMemory())
			}
			got, sel, err := sp.CompressSelect(nil, src, key, []uint32{7})
			if err != nil {
				t.Fatalf("%s in %d parts: CompressSelect: %v", spec, count, err)
			}
			res := make([]float32, len(src))
			want, err := p.CompressResidual(nil, src, key, res)
			if err != nil {
				t.Fatalf("%s in %d parts: CompressResidual: %v", spec, count, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s in %d parts: CompressSelect's payload differs from CompressResidual's", spec, count)
			}
			if sel[0] != 7 || len(sel) < 2 {
				t.Fatalf("%s in %d parts: sel %v, want 7 then the kept indices", spec, count, sel[:min(len(sel), 4)])
			}
			kept := append([]float32(nil), src...)
			for _, i := range sel[1:] {
				kept[i] = 0
			}
			for i := range kept {
				if math.Float32bits(kept[i]) != math.Float32bits(res[i]) {
					t.Fatalf("%s in %d parts: element %d: input with +0 at the kept indices %v, residual %v", spec, count, i, kept[i], res[i])
				}
			}
		}
	}
	dense := &parts{inner: compresstest.MustParse(t, "int8"), count: 2, stage: 1, ranks: 2}
	if _, ok := dense.forMemory().(compress.SparseCompressor); ok {
		t.Errorf("int8 in 2 parts: forMemory is a compress.SparseCompressor")
	}
}
