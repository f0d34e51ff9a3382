package overlap

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
	"github.com/gradcomp/gradcomp/kernels"
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

// TestSparseFeedbackParts: parts over top-k or random-k are a
// compress.SparseFeedbackCompressor for error-feedback memory (the route
// the engine's sparse strategies take): CompressSelectFeedback's payload,
// indices and sum equal CompressSelect's of e + g, and slices of another
// length are refused with dst and sel unchanged.
func TestSparseFeedbackParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	e, g := make([]float32, 1001), make([]float32, 1001)
	for i := range g {
		e[i], g[i] = float32(rng.NormFloat64())/4, float32(rng.NormFloat64())
	}
	s := make([]float32, len(g))
	for i := range s {
		s[i] = e[i] + g[i]
	}
	key := compress.Key{Bucket: 2, Step: 5}
	for _, spec := range []string{"topk:0.05", "topk:0.05:sampled", "randomk:0.05"} {
		for _, count := range []int{1, 3} {
			p := &parts{inner: compresstest.MustParse(t, spec), count: count, stage: 1, ranks: count}
			sp, ok := p.forMemory().(compress.SparseFeedbackCompressor)
			if !ok {
				t.Fatalf("%s in %d parts: forMemory is %T, not a compress.SparseFeedbackCompressor", spec, count, p.forMemory())
			}
			sum := make([]float32, len(g))
			got, sel, err := sp.CompressSelectFeedback([]byte("x"), e, g, sum, key, []uint32{7})
			if err != nil {
				t.Fatalf("%s in %d parts: CompressSelectFeedback: %v", spec, count, err)
			}
			want, wantSel, err := sp.CompressSelect([]byte("x"), s, key, []uint32{7})
			if err != nil {
				t.Fatalf("%s in %d parts: CompressSelect: %v", spec, count, err)
			}
			if !bytes.Equal(got, want) || !slices.Equal(sel, wantSel) {
				t.Errorf("%s in %d parts: CompressSelectFeedback's payload or indices differ from CompressSelect's of e + g", spec, count)
			}
			if i := sameFloats(sum, s); i >= 0 {
				t.Errorf("%s in %d parts: sum[%d] = %v, want %v", spec, count, i, sum[i], s[i])
			}
			if out, sel, err := sp.CompressSelectFeedback([]byte("x"), e, g, sum[:10], key, []uint32{7}); err == nil || string(out) != "x" || len(sel) != 1 {
				t.Errorf("%s in %d parts: a short sum: %q, %v, %v; want a *SizeError, dst and sel unchanged", spec, count, out, sel, err)
			}
		}
	}
}

// TestFeedbackParts: parts over a compress.FeedbackCompressor are one for
// error-feedback memory: CompressFeedback's payload, sum and residual
// equal CompressResidual's of e + g; a sparse codec's parts are not one,
// and slices of another length are refused with dst unchanged.
func TestFeedbackParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	e, g := make([]float32, 1001), make([]float32, 1001)
	for i := range g {
		e[i], g[i] = float32(rng.NormFloat64())/4, float32(rng.NormFloat64())
	}
	key := compress.Key{Bucket: 3, Step: 7}
	for _, spec := range []string{"int8", "int4:bucket=64", "int2:round=nearest", "sign:bucket=32"} {
		for _, count := range []int{1, 3} {
			p := &parts{inner: compresstest.MustParse(t, spec), count: count, stage: 1, ranks: count}
			fp, ok := p.forMemory().(compress.FeedbackCompressor)
			if !ok {
				t.Fatalf("%s in %d parts: forMemory is %T, not a compress.FeedbackCompressor", spec, count, p.forMemory())
			}
			sum, res := make([]float32, len(g)), make([]float32, len(g))
			got, err := fp.CompressFeedback([]byte("x"), e, g, sum, key, res)
			if err != nil {
				t.Fatalf("%s in %d parts: CompressFeedback: %v", spec, count, err)
			}
			s := make([]float32, len(g))
			for i := range s {
				s[i] = e[i] + g[i]
			}
			wantRes := make([]float32, len(g))
			want, err := p.CompressResidual([]byte("x"), s, key, wantRes)
			if err != nil {
				t.Fatalf("%s in %d parts: CompressResidual: %v", spec, count, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s in %d parts: CompressFeedback's payload differs from CompressResidual's of e + g", spec, count)
			}
			if i := sameFloats(sum, s); i >= 0 {
				t.Errorf("%s in %d parts: sum[%d] = %v, want %v", spec, count, i, sum[i], s[i])
			}
			if i := sameFloats(res, wantRes); i >= 0 {
				t.Errorf("%s in %d parts: residual[%d] = %v, want %v", spec, count, i, res[i], wantRes[i])
			}
			if out, err := fp.CompressFeedback([]byte("x"), e[:10], g, sum, key, res); err == nil || string(out) != "x" {
				t.Errorf("%s in %d parts: a short e: %q, %v; want a *SizeError and dst unchanged", spec, count, out, err)
			}
		}
	}
	sparse := &parts{inner: compresstest.MustParse(t, "topk:0.1"), count: 2, stage: 1, ranks: 2}
	if _, ok := sparse.forMemory().(compress.FeedbackCompressor); ok {
		t.Errorf("topk:0.1 in 2 parts: forMemory is a compress.FeedbackCompressor")
	}
}

// TestSlotHead checks the slot head both backends send: each status and
// ρ round-trips through put and readStatus, an ok head is the device's
// reset status block (all ones), a failure sits in the device's word for
// its kind, and a head that reports a value of the wrong kind, or a ρ that
// cannot be one, is refused.
func TestSlotHead(t *testing.T) {
	for _, guard := range []bool{false, true} {
		for _, s := range []status{
			{},
			{rho: 0.25},
			{rho: math.Inf(1)},
			{code: statusNonFinite, index: 7, value: float32(math.NaN())},
			{code: statusNonFinite, index: 1 << 31, value: float32(math.Inf(-1))},
			{code: statusUnrepresentable, index: 3, value: 70000},
		} {
			if !guard {
				s.rho = 0
			}
			b := make([]byte, slotHead(guard))
			s.put(b, guard)
			got, err := readStatus(b, guard)
			same := got.code == s.code && got.index == s.index && math.Float32bits(got.value) == math.Float32bits(s.value) && got.rho == s.rho
			if err != nil || !same {
				t.Errorf("guard %v: %+v read back as %+v, %v", guard, s, got, err)
			}
			var dev [kernels.StatusLen]byte
			for i := range dev {
				dev[i] = 0xff
			}
			if s.code != statusOK {
				binary.LittleEndian.PutUint64(dev[8*(2-int(s.code)):], uint64(s.index)<<32|uint64(math.Float32bits(s.value)))
			}
			if !bytes.Equal(b[:kernels.StatusLen], dev[:]) {
				t.Errorf("%+v: head %x, the device's status block is %x", s, b[:kernels.StatusLen], dev)
			}
		}
	}
	bad := func(what string, guard bool, edit func(b []byte)) {
		b := make([]byte, slotHead(guard))
		status{}.put(b, guard)
		edit(b)
		if _, err := readStatus(b, guard); err == nil {
			t.Errorf("%s: readStatus accepted %x", what, b)
		}
	}
	bad("finite value as NaN/Inf", false, func(b []byte) { binary.LittleEndian.PutUint64(b, 5<<32|uint64(math.Float32bits(1))) })
	bad("NaN as unrepresentable", false, func(b []byte) { binary.LittleEndian.PutUint64(b[8:], 5<<32|0x7fc00000) })
	bad("negative ρ", true, func(b []byte) { binary.LittleEndian.PutUint64(b[16:], math.Float64bits(-1)) })
	bad("NaN ρ", true, func(b []byte) { binary.LittleEndian.PutUint64(b[16:], math.Float64bits(math.NaN())) })
	bad("guard tail", true, func(b []byte) { b[31] = 1 })
	bad("ρ on a failed slot", true, func(b []byte) {
		status{code: statusNonFinite, value: float32(math.NaN()), rho: 1}.put(b, true)
	})
}
