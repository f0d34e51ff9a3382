package compress_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// chunkRef is chunked top-k by the definition on chunkTopK (topk_chunk.go),
// brute force: a sort per chunk, the quantization written out, the body
// laid out section by section, bit by bit.
type chunkRef struct {
	ratio   float64
	chunk   int
	bits    int // 0: float32 values
	nearest bool
	seed    uint64
}

// encode returns the body and the decoding chunked top-k must write for x
// under key, or the index of the *NonFiniteError it must return.
func (r chunkRef) encode(x []float32, key compress.Key) (body []byte, dec []float32, bad int) {
	w := bits.Len(uint(r.chunk - 1))
	vb := 32
	if r.bits != 0 {
		vb = r.bits
	}
	var hdr, idx, vals []byte
	putBits := func(buf []byte, off int, v uint64, width int) {
		for b := range width {
			if v>>b&1 == 1 {
				buf[(off+b)/8] |= 1 << ((off + b) % 8)
			}
		}
	}
	dec = make([]float32, len(x))
	mag := func(v float32) uint32 { return math.Float32bits(v) & 0x7fffffff }
	for i, v := range x {
		if mag(v) >= 0x7f800000 {
			return nil, nil, i
		}
	}
	stream := compress.NewRandomStream(r.seed, key, compress.DomainRound)
	for base := 0; base < len(x); base += r.chunk {
		c := x[base:min(base+r.chunk, len(x))]
		k := min(max(int(math.Round(r.ratio*float64(len(c)))), 1), len(c))
		order := make([]int, len(c))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { // by key descending, stable: ties keep index order
			ka, kb := mag(c[a]), mag(c[b])
			switch {
			case ka > kb:
				return -1
			case ka < kb:
				return 1
			}
			return 0
		})
		kept := slices.Clone(order[:k])
		slices.Sort(kept)
		lo, hi := math.Float32frombits(mag(c[order[k-1]])), math.Float32frombits(mag(c[order[0]]))
		ib, vbuf := make([]byte, (k*w+7)/8), make([]byte, (k*vb+7)/8)
		var scale, inv float32
		levels := 1<<max(r.bits-1, 0) - 1
		if r.bits != 0 {
			d := float64(hi) - float64(lo)
			scale = float32(d / float64(levels))
			if scale != 0 {
				inv = float32(math.Min(float64(levels)/d, math.MaxFloat32))
			}
			if top := lo + float32(float32(levels)*scale); math.IsInf(float64(top), 0) || math.IsNaN(float64(top)) {
				for i, v := range c {
					if mag(v) == mag(hi) {
						return nil, nil, base + i
					}
				}
			}
			hdr = binaryAppend(hdr, math.Float32bits(lo), math.Float32bits(scale))
		}
		for o, i := range kept {
			putBits(ib, o*w, uint64(i), w)
			v := c[i]
			if r.bits == 0 {
				putBits(vbuf, o*32, uint64(math.Float32bits(v)), 32)
				dec[base+i] = v
				continue
			}
			a := math.Float32frombits(mag(v))
			rr := float32(0.5)
			if !r.nearest {
				rr = stream.Uniform(uint32(base + i))
			}
			t := float32(float32(a-lo) * inv)
			m := min(int(float32(t+rr)), levels)
			neg := math.Signbit(float64(v))
			code := uint64(m)
			if neg {
				code |= 1 << (r.bits - 1)
			}
			putBits(vbuf, o*r.bits, code, r.bits)
			d := lo + float32(float32(m)*scale)
			if neg {
				d = -d
			}
			dec[base+i] = d
		}
		idx, vals = append(idx, ib...), append(vals, vbuf...)
	}
	return slices.Concat(hdr, idx, vals), dec, -1
}

func binaryAppend(b []byte, words ...uint32) []byte {
	for _, w := range words {
		b = append(b, byte(w), byte(w>>8), byte(w>>16), byte(w>>24))
	}
	return b
}

func (r chunkRef) spec() string {
	s := fmt.Sprintf("topk:%v:chunk=%d", r.ratio, r.chunk)
	if r.bits != 0 {
		s += fmt.Sprintf(":bits=%d", r.bits)
		if r.nearest {
			s += ":round=nearest"
		}
		if r.seed != 0 {
			s += fmt.Sprintf(":seed=%d", r.seed)
		}
	}
	return s
}

// chunkInputs are the gradients of the differential test: spread
// magnitudes, heavy ties, zeros of both signs, and magnitudes near the top
// of float32 (whose range a chunk may be unable to quantize).
func chunkInputs(n int, seed uint64) map[string][]float32 {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	in := map[string][]float32{}
	for _, kind := range []string{"wide", "ties", "zeros", "huge"} {
		x := make([]float32, n)
		for i := range x {
			switch kind {
			case "wide":
				x[i] = float32(math.Ldexp(1+r.Float64(), r.IntN(60)-40))
			case "ties":
				x[i] = float32(1+r.IntN(3)) / 4
			case "zeros":
				if r.IntN(3) > 0 {
					x[i] = float32(r.NormFloat64())
				}
			case "huge":
				x[i] = math.MaxFloat32 / float32(1+r.IntN(3)) / float32(1+r.IntN(1<<r.IntN(20)))
			}
			if r.IntN(2) == 0 {
				x[i] = -x[i]
			}
		}
		in[kind] = x
	}
	return in
}

// chunkLengths returns lengths clustered around the chunk boundaries of C,
// ±1, and a few at random.
func chunkLengths(c int, r *rand.Rand) []int {
	ns := []int{0, 1, 2}
	for m := 1; m <= 3; m++ {
		ns = append(ns, m*c-1, m*c, m*c+1)
	}
	for range 3 {
		ns = append(ns, r.IntN(4*c+1))
	}
	slices.Sort(ns)
	return slices.Compact(ns)
}

// TestChunkTopKReference compares chunked top-k, serially and with 3
// workers splitting even small inputs, with chunkRef: the body byte for
// byte, the decoding, DecompressAdd and CompressResidual bit for bit, and
// the index of a *NonFiniteError.
func TestChunkTopKReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var refs []chunkRef
	for _, c := range []int{64, 100, 4096} {
		for _, ratio := range []float64{0.03, 0.3, 1} {
			refs = append(refs, chunkRef{ratio: ratio, chunk: c})
			for _, b := range []int{2, 4, 8} {
				refs = append(refs, chunkRef{ratio: ratio, chunk: c, bits: b, seed: uint64(b)}, chunkRef{ratio: ratio, chunk: c, bits: b, nearest: true})
			}
		}
	}
	refs = append(refs, chunkRef{ratio: 0.0001, chunk: 65536, bits: 2}, chunkRef{ratio: 0.02, chunk: 65536})
	for _, ref := range refs {
		spec := ref.spec()
		cs := []compress.Compressor{
			compresstest.MustParse(t, spec, compress.WithWorkers(1)),
			compresstest.MustParse(t, spec, compress.WithWorkers(3), compress.WithMinParallel(1)),
		}
		lengths := chunkLengths(ref.chunk, rng)
		if ref.chunk == 65536 {
			lengths = []int{65535, 65537}
		}
		for _, n := range lengths {
			for kind, x := range chunkInputs(n, uint64(n)) {
				key := compress.Key{Bucket: uint64(n), Step: 3}
				body, dec, bad := ref.encode(x, key)
				for w, c := range cs {
					what := fmt.Sprintf("%s n=%d %s workers=%d", spec, n, kind, 1+2*w)
					p, err := c.Compress(nil, x, key)
					if bad >= 0 {
						var nf *compress.NonFiniteError
						if !errors.As(err, &nf) || nf.Index != bad {
							t.Fatalf("%s: got %v, want a *NonFiniteError at %d", what, err, bad)
						}
						continue
					}
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if got := p[compress.HeaderLen : len(p)-compress.TrailerLen]; !bytes.Equal(got, body) {
						t.Fatalf("%s: body differs from the reference at byte %d (%d and %d bytes)", what, firstDiffByte(got, body), len(got), len(body))
					}
					got := make([]float32, n)
					if err := c.Decompress(got, p); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					if !sameBits(got, dec) {
						t.Fatalf("%s: decoding differs from the reference", what)
					}
					acc := slices.Clone(x)
					if err := c.DecompressAdd(acc, p); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					res := make([]float32, n)
					if _, err := compress.CompressResidual(c, nil, x, key, res); err != nil {
						t.Fatalf("%s: CompressResidual: %v", what, err)
					}
					for i := range x {
						if add, want := acc[i], x[i]+dec[i]; dec[i] != 0 && math.Float32bits(add) != math.Float32bits(want) {
							t.Fatalf("%s: DecompressAdd[%d] = %v, want %v", what, i, add, want)
						}
						if want := x[i] - dec[i]; math.Float32bits(res[i]) != math.Float32bits(want) {
							t.Fatalf("%s: residual[%d] = %v, want %v", what, i, res[i], want)
						}
					}
				}
			}
		}
	}
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func firstDiffByte(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestChunkTopKFeedback runs ErrorFeedback over chunked top-k for a few
// steps and checks the residual against chunkRef: e_new = s − D(C(s)), the
// quantization error of the kept values included, and that the
// compressors take the fused paths (sparse in place without bits, one
// pass of e + g, codes and residual with bits).
func TestChunkTopKFeedback(t *testing.T) {
	for _, ref := range []chunkRef{{ratio: 0.05, chunk: 256}, {ratio: 0.05, chunk: 256, bits: 2, seed: 4}, {ratio: 0.1, chunk: 64, bits: 8, nearest: true}} {
		for _, workers := range []int{1, 2} {
			c := compresstest.MustParse(t, ref.spec(), compress.WithWorkers(workers), compress.WithMinParallel(1))
			if _, sparse := c.(compress.SparseFeedbackCompressor); sparse != (ref.bits == 0) {
				t.Errorf("%s: SparseFeedbackCompressor is %v", ref.spec(), sparse)
			}
			if _, fused := c.(compress.FeedbackCompressor); fused != (ref.bits != 0) {
				t.Errorf("%s: FeedbackCompressor is %v", ref.spec(), fused)
			}
			f := compress.NewErrorFeedback(c)
			const n = 1000
			e := make([]float32, n)
			for step := range uint64(5) {
				g := chunkInputs(n, step)["wide"]
				key := compress.Key{Bucket: 2, Step: step}
				s := make([]float32, n)
				for i := range s {
					s[i] = e[i] + g[i]
				}
				_, dec, _ := ref.encode(s, key)
				if _, err := f.Compress(nil, g, key); err != nil {
					t.Fatal(err)
				}
				for i := range e {
					e[i] = s[i] - dec[i]
				}
				if got := f.Residual(2); !sameBits(got, e) {
					t.Fatalf("%s step %d: residual differs from s − D(C(s))", ref.spec(), step)
				}
			}
		}
	}
}

// TestChunkTopKSize reports the payload of the SparseLoCo setting: 2^20
// elements, ratio 0.02, chunks of 4096, 2-bit values.
func TestChunkTopKSize(t *testing.T) {
	const n = 1 << 20
	c := compresstest.MustParse(t, "topk:0.02:chunk=4096:bits=2")
	// 256 chunks of 82 kept: 8 bytes of lo and scale, 82 indices of 12
	// bits (123 bytes) and 82 codes of 2 bits (21 bytes, 4 bits padding).
	wantBody := 256 * (8 + 123 + 21)
	if got := c.MaxEncodedLen(n); got != compress.HeaderLen+wantBody+compress.TrailerLen {
		t.Fatalf("MaxEncodedLen(%d) = %d, want %d", n, got, compress.HeaderLen+wantBody+compress.TrailerLen)
	}
	p, err := c.Compress(nil, chunkInputs(n, 1)["wide"], compress.Key{})
	if err != nil || len(p) != c.MaxEncodedLen(n) {
		t.Fatalf("Compress: %d bytes, %v", len(p), err)
	}
	h, _, err := compress.ParseHeader(p)
	if err != nil || h.ParamA != 256*82 || h.ParamB != 4096|2<<24 {
		t.Errorf("header %+v, %v: want k = %d and parameter B = %#x", h, err, 256*82, 4096|2<<24)
	}
	t.Logf("%d elements: %d bytes, %.1f times less than fp32 (%d bytes); plain topk:0.02 %d bytes",
		n, len(p), float64(4*n)/float64(len(p)), 4*n, compresstest.MustParse(t, "topk:0.02").MaxEncodedLen(n))
}

// TestChunkTopKCorrupt forges chunked top-k bodies, checksum fixed, and
// checks that decoding fails with a *CorruptInputError at the forged byte
// and leaves dst as it was; and that a payload of another layout is a
// *PayloadMismatchError naming parameter B.
func TestChunkTopKCorrupt(t *testing.T) {
	const hl = compress.HeaderLen
	// n = 74: chunks of 64 (6 kept) and 10 (1 kept); w = 6 bits.
	// bits=2 body: headers 0-15, indices 16-20 and 21, codes 22-23 and 24.
	quant := compresstest.MustParse(t, "topk:0.1:chunk=64:bits=2")
	// no bits: indices 0-4 and 5, values 6-29 and 30-33.
	plain := compresstest.MustParse(t, "topk:0.1:chunk=64")
	x := chunkInputs(74, 9)["wide"]
	f32 := func(v float32) []byte { return binaryAppend(nil, math.Float32bits(v)) }
	cases := []struct {
		name  string
		c     compress.Compressor
		at    int    // body offset of the forged bytes
		bytes []byte // what is written there
		or    byte   // or ORed into the byte at at
		want  int    // body offset the error names
	}{
		{"negative lo", quant, 3, nil, 0x80, 0},
		{"NaN lo", quant, 8, f32(float32(math.NaN())), 0, 8},
		{"Inf scale", quant, 4, f32(float32(math.Inf(1))), 0, 4},
		{"negative scale", quant, 12, f32(-1), 0, 12},
		{"top overflows", quant, 0, append(f32(math.MaxFloat32), f32(math.MaxFloat32)...), 0, 4},
		{"indices not ascending", quant, 16, []byte{0, 0, 0, 0, 0}, 0, 16},
		{"index past a partial chunk", quant, 21, []byte{10}, 0, 21},
		{"index padding", quant, 21, nil, 0x80, 21},
		{"code padding", quant, 24, nil, 0x80, 24},
		{"plain: index past a partial chunk", plain, 5, []byte{63}, 0, 5},
		{"plain: NaN value", plain, 30, f32(float32(math.NaN())), 0, 30},
		{"plain: Inf value", plain, 10, f32(float32(math.Inf(-1))), 0, 10},
		{"plain: index padding", plain, 4, nil, 0x40, 4},
	}
	for _, tc := range cases {
		p, err := tc.c.Compress(nil, x, compress.Key{Step: 1})
		if err != nil {
			t.Fatal(err)
		}
		copy(p[hl+tc.at:], tc.bytes)
		p[hl+tc.at] |= tc.or
		compresstest.Reseal(p)
		for _, add := range []bool{false, true} {
			dst := slices.Clone(x)
			if add {
				err = tc.c.DecompressAdd(dst, p)
			} else {
				err = tc.c.Decompress(dst, p)
			}
			var ce *compress.CorruptInputError
			switch {
			case !errors.As(err, &ce):
				t.Errorf("%s: got %v, want a *CorruptInputError", tc.name, err)
			case ce.Offset != int64(hl+tc.want):
				t.Errorf("%s: %v names offset %d, want %d", tc.name, err, ce.Offset, hl+tc.want)
			}
			if !sameBits(dst, x) {
				t.Errorf("%s: dst changed although decoding failed", tc.name)
			}
		}
	}

	// A payload of plain top-k, chunks of 100, or another value width, for
	// the same k: parameter B tells them apart.
	p, err := quant.Compress(nil, x[:64], compress.Key{})
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{"topk:0.1", "topk:0.1:chunk=100:bits=2", "topk:0.1:chunk=64:bits=4", "topk:0.1:chunk=64:bits=2:round=nearest", "topk:0.1:chunk=64"} {
		var me *compress.PayloadMismatchError
		if err := compresstest.MustParse(t, other).Decompress(make([]float32, 64), p); !errors.As(err, &me) || me.Field != "parameter B (rounding mode, or top-k's chunk layout)" {
			t.Errorf("%s decoding a topk:0.1:chunk=64:bits=2 payload: %v, want a *PayloadMismatchError of parameter B", other, err)
		}
	}
	var me *compress.PayloadMismatchError
	if err := compresstest.MustParse(t, "topk:0.1:chunk=64:bits=2:seed=1").Decompress(make([]float32, 64), p); !errors.As(err, &me) || me.Field != "seed" {
		t.Errorf("another seed: %v, want a *PayloadMismatchError of the seed", err)
	}
}

// TestChunkTopKAverage checks DecompressAverage of chunked payloads, which
// decodes chunk by chunk, against DecompressAdd and Average.
func TestChunkTopKAverage(t *testing.T) {
	for _, spec := range []string{"topk:0.05:chunk=64", "topk:0.05:chunk=100:bits=4"} {
		c := compresstest.MustParse(t, spec, compress.WithWorkers(2), compress.WithMinParallel(1))
		const n = 70001
		var payloads [][]byte
		want := make([]float32, n)
		for q := range 3 {
			p, err := c.Compress(nil, chunkInputs(n, uint64(q))["wide"], compress.Key{Step: uint64(q)})
			if err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, p)
			decode := c.DecompressAdd
			if q == 0 {
				decode = c.Decompress
			}
			if err := decode(want, p); err != nil {
				t.Fatal(err)
			}
		}
		compress.Average(want, 3)
		got := make([]float32, n)
		if _, err := compress.DecompressAverage(c, got, payloads); err != nil || !sameBits(got, want) {
			t.Errorf("%s: DecompressAverage differs from DecompressAdd and Average (%v)", spec, err)
		}
	}
}
