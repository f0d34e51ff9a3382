package compress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// sparseData returns n float32 values of a named kind: "laplace" (a
// heavy-tailed gradient), "ties" (seven quantized levels), "equal" (one
// magnitude, both signs), "zeros" (±0 with a few non-zeros) or "ramp"
// (magnitude growing with the index, so the largest sit at the end).
func sparseData(kind string, n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	x := make([]float32, n)
	for i := range x {
		switch kind {
		case "laplace":
			x[i] = float32(r.ExpFloat64() * 1e-3)
		case "ties":
			x[i] = float32(r.IntN(7)) * 0.5
		case "equal":
			x[i] = 0.25
		case "zeros":
			if r.IntN(1000) == 0 {
				x[i] = float32(r.NormFloat64())
			}
		case "ramp":
			x[i] = float32(i) * 1e-6
		default:
			panic("unknown data kind " + kind)
		}
		if r.IntN(2) == 0 {
			x[i] = -x[i]
		}
	}
	return x
}

// sparseRanking is the reference order: every index of src sorted by
// (−|x|, index), the order a stable sort by decreasing magnitude gives.
func sparseRanking(src []float32) []uint32 {
	keys := make([]uint64, len(src))
	for i, x := range src {
		mag := math.Float32bits(float32(math.Abs(float64(x))))
		keys[i] = uint64(^mag)<<32 | uint64(i)
	}
	slices.Sort(keys)
	order := make([]uint32, len(src))
	for i, k := range keys {
		order[i] = uint32(k)
	}
	return order
}

// sparseTopOf returns the first k indices of a ranking, ascending.
func sparseTopOf(ranking []uint32, k int) []uint32 {
	in := make([]bool, len(ranking))
	for _, i := range ranking[:k] {
		in[i] = true
	}
	top := make([]uint32, 0, k)
	for i, ok := range in {
		if ok {
			top = append(top, uint32(i))
		}
	}
	return top
}

// sparseBruteTopK is the reference top-k of src, indices ascending.
func sparseBruteTopK(src []float32, k int) []uint32 { return sparseTopOf(sparseRanking(src), k) }

// sparseTopKBody splits a top-k body into its indices and values.
func sparseTopKBody(body []byte) ([]uint32, []float32) {
	k := len(body) / 8
	idx, vals := make([]uint32, k), make([]float32, k)
	for i := range k {
		idx[i] = binary.LittleEndian.Uint32(body[4*i:])
		vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*k+4*i:]))
	}
	return idx, vals
}

// sparseParallel runs every call on two workers whatever its size.
var sparseParallel = []Option{WithWorkers(2), WithMinParallel(1)}

func TestSparseSpecs(t *testing.T) {
	valid := []struct {
		spec, canon string
		codec       Codec
	}{
		{"topk:0.01", "topk:0.01", CodecTopK},
		{"topk:0.010", "topk:0.01", CodecTopK},
		{"topk:1", "topk:1", CodecTopK},
		{"topk:0.001:sampled", "topk:0.001:sampled", CodecTopK},
		{"topk:0.5:sampled:lossless=zstd", "topk:0.5:sampled:lossless=zstd", CodecTopK},
		{"topk:0.5:lossless=none", "topk:0.5", CodecTopK},
		{"randomk:0.25", "randomk:0.25", CodecRandomK},
		{"randomk:0.25:seed=7", "randomk:0.25:seed=7", CodecRandomK},
		{"randomk:0.25:seed=0", "randomk:0.25", CodecRandomK},
		{"randomk:0.1:seed=0x10", "randomk:0.1:seed=16", CodecRandomK},
		{"randomk:0.1:seed=18446744073709551615:lossless=huff0", "randomk:0.1:seed=18446744073709551615:lossless=huff0", CodecRandomK},
	}
	for _, v := range valid {
		c, err := Parse(v.spec)
		if err != nil {
			t.Errorf("Parse(%q): %v", v.spec, err)
			continue
		}
		if c.Spec().String() != v.canon || c.Codec() != v.codec {
			t.Errorf("Parse(%q) = %s (%s), want %s (%s)", v.spec, c.Spec(), c.Codec(), v.canon, v.codec)
		}
		if again := mustParse(t, c.Spec().String()); again.Spec() != c.Spec() {
			t.Errorf("canonical spec %q parses to %q", c.Spec(), again.Spec())
		}
	}
	invalid := []string{
		"topk", "topk:0", "topk:-0.1", "topk:1.5", "topk:NaN", "topk:Inf", "topk:abc",
		"topk:0.1:exact", "topk:0.1:sampled:sampled", "topk:sampled", "topk:0.1:seed=3",
		"topk:0.1:0.2", "topk:0.1:lossless=lz4", "topk:0.1::sampled", "topk:0.1:lossless=zstd:sampled",
		"randomk", "randomk:0", "randomk:2", "randomk:0.1:sampled", "randomk:0.1:seed=-1",
		"randomk:0.1:seed=x", "randomk:0.1:seed=1:seed=2", "randomk:0.1:bucket=4",
		"randomk:0.1:seed=18446744073709551616",
	}
	for _, spec := range invalid {
		_, err := Parse(spec)
		var se *SpecError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) = %v, want a *SpecError", spec, err)
		}
	}
}

func TestSparseK(t *testing.T) {
	cases := []struct {
		ratio float64
		n, k  int
	}{
		{0.01, 0, 0}, {1, 0, 0}, {0.01, 1, 1}, {1e-9, 1000, 1}, {0.01, 1000, 10},
		{0.0015, 1000, 2}, {0.0025, 1000, 3}, // round half away from zero: 1.5 → 2, 2.5 → 3
		{1, 1000, 1000}, {0.9999, 3, 3}, {0.5, 3, 2},
	}
	if big := int64(MaxElements); big <= math.MaxInt {
		cases = append(cases, struct {
			ratio float64
			n, k  int
		}{0.01, int(big), 42949673}) // 64-bit int only
	}
	for _, c := range cases {
		if got := sparseK(c.ratio, c.n); got != c.k {
			t.Errorf("sparseK(%v, %d) = %d, want %d", c.ratio, c.n, got, c.k)
		}
	}
}

// TestTopKHeader checks the header fields and the payload length.
func TestTopKHeader(t *testing.T) {
	for _, spec := range []string{"topk:0.1", "topk:0.1:sampled", "randomk:0.1:seed=99"} {
		c := mustParse(t, spec)
		src := sparseData("laplace", 1001, 1)
		key := Key{Bucket: 3, Step: 4}
		p, err := c.Compress([]byte("prefix"), src, key)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		p = p[len("prefix"):]
		if len(p) != c.MaxEncodedLen(len(src)) {
			t.Errorf("%s: payload %d bytes, MaxEncodedLen %d", spec, len(p), c.MaxEncodedLen(len(src)))
		}
		h, _, err := parsePayload(p)
		if err != nil {
			t.Fatal(err)
		}
		wantSeed := uint64(0)
		if c.Codec() == CodecRandomK {
			wantSeed = 99
		}
		if h.paramA != 100 || h.paramB != 0 || h.seed != wantSeed || h.key != key || h.codec != c.Codec() {
			t.Errorf("%s: header %+v", spec, *h)
		}
	}
}

// sparseTopKLengths are lengths around the selection's cut-offs and a few
// random ones.
func sparseTopKLengths() []int {
	ls := []int{1, 2, 3, 7, 8, 9, 15, 16, 17, 100, 1000}
	for _, c := range []int{segMinLen, 2 * segMinLen, sampledMinLen} {
		ls = append(ls, c-1, c, c+1)
	}
	r := rand.New(rand.NewPCG(4, 4))
	for range 4 {
		ls = append(ls, 1+r.IntN(5000))
	}
	return append(ls, sampledMinLen+r.IntN(sampledMinLen), 1<<20+3)
}

// TestTopKExactMatchesBruteForce compares both selection paths with the
// stable-sort reference over lengths around the cut-offs, k from 1 to n,
// heavy-tailed and tie-heavy data, serially and on two workers (lengths
// above 2^17 with fewer ratios, to stay fast).
func TestTopKExactMatchesBruteForce(t *testing.T) {
	kinds := []string{"laplace", "ties", "equal", "zeros", "ramp"}
	for _, n := range sparseTopKLengths() {
		ratios := []float64{1e-9, 0.01, 0.125, 0.3, 1}
		workers := [][]Option{{WithWorkers(1)}, sparseParallel}
		if n > 1<<17 {
			ratios = []float64{1e-9, 0.01, 1}
		}
		for _, kind := range kinds {
			src := sparseData(kind, n, uint64(n))
			ranking := sparseRanking(src)
			for _, ratio := range ratios {
				k := sparseK(ratio, n)
				want := sparseTopOf(ranking, k)
				for _, mode := range []string{"", ":sampled"} {
					spec := "topk:" + strconv.FormatFloat(ratio, 'f', -1, 64) + mode
					for _, opts := range workers {
						p, err := mustParse(t, spec, opts...).Compress(nil, src, Key{})
						if err != nil {
							t.Fatalf("%s n=%d %s: %v", spec, n, kind, err)
						}
						idx, vals := sparseTopKBody(payloadBody(p))
						if !slices.Equal(idx, want) {
							t.Fatalf("%s n=%d %s workers=%d: indices differ from the reference (first %v, want %v)",
								spec, n, kind, len(opts), idx[:min(k, 8)], want[:min(k, 8)])
						}
						for i, p := range idx {
							if math.Float32bits(vals[i]) != math.Float32bits(src[p]) {
								t.Fatalf("%s n=%d %s: value %d is %v, src[%d] = %v", spec, n, kind, i, vals[i], p, src[p])
							}
						}
					}
				}
			}
		}
	}
}

// TestTopKSampledShortcut checks that the sampled path settles typical
// gradients itself (no exact fallback), returns exactly k and has recall 1,
// and that inputs which defeat the sample fall back to the same bytes.
func TestTopKSampledShortcut(t *testing.T) {
	n := 1<<20 + 3
	cases := []struct {
		kind     string
		ratio    float64
		shortcut bool
	}{
		{"laplace", 0.01, true},
		{"laplace", 0.001, true},
		{"laplace", 0.1, true},
		{"ramp", 0.01, true},
		{"equal", 0.01, false}, // every element ties with the threshold: too many candidates
		{"zeros", 0.01, false}, // more zeros than n−k: too many candidates
	}
	for _, c := range cases {
		src := sparseData(c.kind, n, 7)
		k := sparseK(c.ratio, n)
		sc := new(topkScratch)
		sc.splitInput(src)
		body := make([]byte, 8*k)
		done, err := sc.sampled(body, src, k, serial)
		if err != nil || done != c.shortcut {
			t.Errorf("%s %g: sampled settled=%v err=%v, want settled=%v", c.kind, c.ratio, done, err, c.shortcut)
		}
		p, err := mustParse(t, "topk:"+strconv.FormatFloat(c.ratio, 'f', -1, 64)+":sampled").Compress(nil, src, Key{})
		if err != nil {
			t.Fatal(err)
		}
		idx, _ := sparseTopKBody(payloadBody(p))
		want := sparseBruteTopK(src, k)
		if r := sparseRecall(idx, want); len(idx) != k || r != 1 {
			t.Errorf("%s %g: sampled returned %d of k=%d, recall %v", c.kind, c.ratio, len(idx), k, r)
		}
		exact := mustParse(t, "topk:"+strconv.FormatFloat(c.ratio, 'f', -1, 64))
		if pe, err := exact.Compress(nil, src, Key{}); err != nil || !bytes.Equal(pe, p) {
			t.Errorf("%s %g: exact and sampled payloads differ (%v)", c.kind, c.ratio, err)
		}
		if err := exact.Decompress(make([]float32, n), p); err != nil {
			t.Errorf("%s %g: the exact decoder rejects a sampled payload: %v", c.kind, c.ratio, err)
		}
	}
}

// TestTopKSampledMisleadingSample makes every sampled element larger than
// the rest: the estimate is too high, the shortcut finds fewer than k
// (k = n/10 exceeds the sample) and the exact path must take over.
func TestTopKSampledMisleadingSample(t *testing.T) {
	n := 1 << 20
	src := sparseData("laplace", n, 3)
	k := sparseK(0.1, n)
	for j := range sampleBlocks {
		lo := j * n / sampleBlocks
		for i := lo; i < lo+sampleBlock; i++ {
			src[i] = 100 + float32(i)
		}
	}
	sc := new(topkScratch)
	sc.splitInput(src)
	if done, _ := sc.sampled(make([]byte, 8*k), src, k, serial); done {
		t.Fatal("the shortcut settled a sample unlike the input")
	}
	p, err := mustParse(t, "topk:0.1:sampled").Compress(nil, src, Key{})
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := sparseTopKBody(payloadBody(p))
	if !slices.Equal(idx, sparseBruteTopK(src, k)) {
		t.Fatal("sampled top-k after the fallback differs from the reference")
	}
}

// sparseRecall returns the fraction of want found in got (both ascending).
func sparseRecall(got, want []uint32) float64 {
	if len(want) == 0 {
		return 1
	}
	hit := 0
	for i, j := 0, 0; i < len(got) && j < len(want); {
		switch {
		case got[i] == want[j]:
			hit++
			i++
			j++
		case got[i] < want[j]:
			i++
		default:
			j++
		}
	}
	return float64(hit) / float64(len(want))
}

func TestTopKEmptyInput(t *testing.T) {
	for _, spec := range []string{"topk:0.5", "topk:0.5:sampled", "randomk:0.5"} {
		c := mustParse(t, spec)
		p, err := c.Compress(nil, nil, Key{})
		if err != nil || len(p) != HeaderLen+TrailerLen {
			t.Fatalf("%s: empty input gave %d bytes, %v", spec, len(p), err)
		}
		if err := c.Decompress([]float32{}, p); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
	}
}

// TestSparseNonFinite puts NaN and ±Inf at various places: the error names
// the lowest index, whether or not that element would have been selected.
func TestSparseNonFinite(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	for _, n := range []int{1, 9, 1000, sampledMinLen + 5} {
		for _, spec := range []string{"topk:0.01", "topk:0.01:sampled", "randomk:0.01"} {
			bads := [][]int{{0}, {n - 1}, {n / 2, n - 1}, {n / 3, n / 2}}
			if n > 1000 { // more than k non-finite values: the first level's bound rises into their bins
				var many []int
				for i := n / 4; i < n/4+n/50; i++ {
					many = append(many, i)
				}
				bads = append(bads, many)
			}
			for _, bad := range bads {
				for _, v := range []float32{nan, inf, -inf} {
					src := sparseData("laplace", n, 5)
					for _, i := range bad {
						src[i] = v
					}
					for _, opts := range [][]Option{{WithWorkers(1)}, sparseParallel} {
						dst := []byte("keep")
						out, err := mustParse(t, spec, opts...).Compress(dst, src, Key{Step: 1})
						var nf *NonFiniteError
						if !errors.As(err, &nf) || nf.Index != bad[0] || math.Float32bits(nf.Value) != math.Float32bits(v) {
							t.Fatalf("%s n=%d bad=%v %v: err %v, want NonFiniteError at %d", spec, n, bad, v, err, bad[0])
						}
						if string(out) != "keep" {
							t.Fatalf("%s: dst changed on error", spec)
						}
					}
				}
			}
		}
	}
}

// TestSparseSerialParallel compares the bytes of one and two workers.
func TestSparseSerialParallel(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for range 12 {
		n := r.IntN(3 << 18)
		src := sparseData("laplace", n, uint64(n))
		for _, spec := range []string{"topk:0.01", "topk:0.02:sampled", "randomk:0.05:seed=3", "topk:0.01:lossless=zstd"} {
			a, errA := mustParse(t, spec, WithWorkers(1)).Compress(nil, src, Key{Bucket: 1, Step: 2})
			b, errB := mustParse(t, spec, sparseParallel...).Compress(nil, src, Key{Bucket: 1, Step: 2})
			if errA != nil || errB != nil || !bytes.Equal(a, b) {
				t.Fatalf("%s n=%d: serial and parallel payloads differ (%v, %v)", spec, n, errA, errB)
			}
		}
	}
}

// TestSparseDecode checks Decompress (zeros except the selection) and
// DecompressAdd (adds the selection) for every sparse spec, with and
// without a lossless stage.
func TestSparseDecode(t *testing.T) {
	specs := []string{"topk:0.01", "topk:0.01:sampled", "topk:0.05:lossless=zstd", "topk:0.05:lossless=huff0",
		"randomk:0.01:seed=4", "randomk:0.2:lossless=zstd"}
	for _, n := range []int{1, 1000, sampledMinLen + 1} {
		src := sparseData("laplace", n, 11)
		base := sparseData("ties", n, 12)
		for _, spec := range specs {
			for _, opts := range [][]Option{{WithWorkers(1)}, sparseParallel} {
				c := mustParse(t, spec, opts...)
				key := Key{Bucket: 8, Step: uint64(n)}
				p, err := c.Compress(nil, src, key)
				if err != nil {
					t.Fatal(err)
				}
				sel := sparseSelected(t, c, p, src, key)
				want := make([]float32, n)
				for _, i := range sel {
					want[i] = src[i]
				}
				dst := slices.Clone(base)
				if err := c.Decompress(dst, p); err != nil {
					t.Fatalf("%s: %v", spec, err)
				}
				if !slices.Equal(dst, want) {
					t.Fatalf("%s n=%d: Decompress differs", spec, n)
				}
				dst = slices.Clone(base)
				if err := c.DecompressAdd(dst, p); err != nil {
					t.Fatalf("%s: %v", spec, err)
				}
				for i := range dst {
					if dst[i] != base[i]+want[i] {
						t.Fatalf("%s n=%d: DecompressAdd[%d] = %v, want %v", spec, n, i, dst[i], base[i]+want[i])
					}
				}
			}
		}
	}
}

// sparseSelected returns the indices a payload of c carries: from the body
// for top-k, from RandomKIndices for random-k.
func sparseSelected(t *testing.T, c Compressor, p []byte, src []float32, key Key) []uint32 {
	t.Helper()
	h, _, err := parsePayload(p)
	if err != nil {
		t.Fatal(err)
	}
	k := int(h.paramA)
	if c.Codec() == CodecRandomK {
		idx, err := RandomKIndices(nil, len(src), k, h.seed, key)
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
	return sparseBruteTopK(src, k)
}

// TestTopKCorruptBody corrupts the body of a valid payload (and reseals its
// checksum): every corruption is a *CorruptInputError at its offset, and dst
// is untouched.
func TestTopKCorruptBody(t *testing.T) {
	n := 1000
	src := sparseData("laplace", n, 2)
	c := mustParse(t, "topk:0.01")
	good, err := c.Compress(nil, src, Key{})
	if err != nil {
		t.Fatal(err)
	}
	k := 10
	put := func(p []byte, off int, v uint32) { binary.LittleEndian.PutUint32(p[HeaderLen+off:], v) }
	get := func(p []byte, off int) uint32 { return binary.LittleEndian.Uint32(p[HeaderLen+off:]) }
	cases := []struct {
		name   string
		off    int
		mutate func(p []byte)
	}{
		{"descending", 4, func(p []byte) { a, b := get(p, 0), get(p, 4); put(p, 0, b); put(p, 4, a) }},
		{"repeated", 12, func(p []byte) { put(p, 12, get(p, 8)) }},
		{"out of range", 4 * (k - 1), func(p []byte) { put(p, 4*(k-1), uint32(n)) }},
		{"huge", 4 * (k - 1), func(p []byte) { put(p, 4*(k-1), math.MaxUint32) }},
		{"NaN value", 4*k + 8, func(p []byte) { put(p, 4*k+8, 0x7fc00001) }},
		{"Inf value", 8*k - 4, func(p []byte) { put(p, 8*k-4, 0xff800000) }},
	}
	for _, cs := range cases {
		p := slices.Clone(good)
		cs.mutate(p)
		reseal(p)
		dst := make([]float32, n)
		dst[0] = 42
		err := c.Decompress(dst, p)
		var ce *CorruptInputError
		if !errors.As(err, &ce) || ce.Offset != int64(HeaderLen+cs.off) {
			t.Errorf("%s: err %v, want CorruptInputError at %d", cs.name, err, HeaderLen+cs.off)
		}
		if dst[0] != 42 || slices.ContainsFunc(dst[1:], func(v float32) bool { return v != 0 }) {
			t.Errorf("%s: dst changed on error", cs.name)
		}
	}
}

// TestTopKLossless checks that zstd over the delta-coded indices shortens
// the payload and decodes to the same values, and that the inverse transform
// survives arbitrary bytes.
func TestTopKLossless(t *testing.T) {
	n := 1 << 18
	src := sparseData("laplace", n, 4)
	plain, lossy := mustParse(t, "topk:0.01"), mustParse(t, "topk:0.01:lossless=zstd")
	a, err := plain.Compress(nil, src, Key{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := lossy.Compress(nil, src, Key{})
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := parsePayload(b)
	if err != nil || h.lossless != LosslessZstd || len(b) >= len(a) {
		t.Fatalf("zstd payload %d bytes (flag %v, %v), plain %d", len(b), h.lossless, err, len(a))
	}
	da, db := make([]float32, n), make([]float32, n)
	if err := plain.Decompress(da, a); err != nil {
		t.Fatal(err)
	}
	if err := lossy.Decompress(db, b); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(da, db) {
		t.Fatal("zstd round trip changed the values")
	}

	var tc topkCodec
	body := slices.Clone(payloadBody(a))
	tc.forward(body)
	tc.inverse(body)
	if !bytes.Equal(body, payloadBody(a)) {
		t.Fatal("inverse(forward(body)) != body")
	}
	r := rand.New(rand.NewPCG(1, 1))
	junk := make([]byte, 8*64)
	for i := range junk {
		junk[i] = byte(r.Uint32())
	}
	tc.inverse(junk)
	if err := tc.check(junk, &header{n: 1000}); err == nil {
		t.Fatal("check accepted random indices")
	}
}

// TestScanKernels compares firstAtLeast and collectAtLeast with plain loops
// over every alignment, length and position of the first hit, with
// thresholds at the ends of the allowed range (no key reaches 1<<31), and
// collectAtLeast with addends with collectAtLeast of their sums.
func TestScanKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 3))
	sign := func() uint32 { return uint32(r.IntN(2)) << 31 }
	buf, buf2 := make([]float32, 80), make([]float32, 80)
	for _, th := range []uint32{0, 1, 0x3f800000, nonFiniteKey, 1 << 31} {
		for start := range 4 {
			for n := 0; n+start <= len(buf); n++ {
				for hit := -1; hit < n; hit++ {
					vals := buf[start : start+n]
					for i := range vals {
						vals[i] = math.Float32frombits(r.Uint32()%max(th, 1) | sign()) // key < th unless th == 0
					}
					if hit >= 0 {
						vals[hit] = math.Float32frombits(min(th, signMask) | sign())
					}
					want := slices.IndexFunc(vals, func(x float32) bool { return magKey(x) >= th })
					if got := firstAtLeast(vals, th); got != want {
						t.Fatalf("t=%#x start=%d n=%d: firstAtLeast = %d, want %d", th, start, n, got, want)
					}
					var wantPos []uint32
					var wantHist, hist [histBins]uint32
					for i, x := range vals {
						if magKey(x) >= th {
							wantPos = append(wantPos, uint32(100+i))
							wantHist[magKey(x)>>20]++
						}
					}
					pos, got := collectAtLeast(&hist, []uint32{7}, []float32{7}, vals, addends{}, 100, th)
					if !slices.Equal(pos[1:], wantPos) || len(got) != len(pos) || hist != wantHist {
						t.Fatalf("t=%#x start=%d n=%d: collectAtLeast = %v, want %v", th, start, n, pos[1:], wantPos)
					}
					for i, p := range pos[1:] {
						if math.Float32bits(got[i+1]) != math.Float32bits(vals[p-100]) {
							t.Fatalf("t=%#x start=%d n=%d: collected value %d differs", th, start, n, i)
						}
					}

					// e + g with g = ±0 has vals' keys; blk, at the same
					// alignment, holds stale values until it is summed.
					e, g, sum := slices.Clone(vals), make([]float32, n), make([]float32, n)
					for i := range g {
						g[i] = math.Float32frombits(sign())
						sum[i] = e[i] + g[i]
					}
					blk := buf2[start : start+n]
					for i := range blk {
						blk[i] = math.Float32frombits(r.Uint32())
					}
					var h1, h2 [histBins]uint32
					p1, v1 := collectAtLeast(&h1, nil, nil, sum, addends{}, 100, th)
					p2, v2 := collectAtLeast(&h2, nil, nil, blk, addends{e, g}, 100, th)
					if !slices.Equal(p1, p2) || !slices.Equal(bitsOf(v1), bitsOf(v2)) || h1 != h2 || !slices.Equal(bitsOf(blk), bitsOf(sum)) {
						t.Fatalf("t=%#x start=%d n=%d: collectAtLeast with addends differs from collectAtLeast of their sums", th, start, n)
					}
				}
			}
		}
	}
}

// TestFirstNonFinite: with addends, firstNonFinite finds the first NaN or
// Inf of e + g, in the first, a middle or the last block or none, at
// every alignment; when there is none it has set the whole of blk to e +
// g, and a run of NaNs longer than a block ends the scan.
func TestFirstNonFinite(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 5))
	n := 2*collectBlock + 77
	for _, bad := range []int{-1, 0, 31, collectBlock - 1, collectBlock + 5, n - 1} {
		for _, start := range []int{0, 1} {
			e, g := make([]float32, n), make([]float32, n)
			for i := range e {
				e[i], g[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
			}
			if bad >= 0 {
				e[bad], g[bad] = math.MaxFloat32, math.MaxFloat32 // overflows to +Inf
				if bad+1 < n {
					g[bad+1] = float32(math.NaN())
				}
			}
			buf := make([]float32, n+1)
			blk := buf[start : start+n]
			if got := firstNonFinite(blk, addends{e, g}); got != bad {
				t.Fatalf("bad=%d start=%d: firstNonFinite = %d", bad, start, got)
			}
			if bad < 0 {
				for i := range blk {
					if math.Float32bits(blk[i]) != math.Float32bits(e[i]+g[i]) {
						t.Fatalf("start=%d: blk[%d] = %v, want e + g = %v", start, i, blk[i], e[i]+g[i])
					}
				}
			}
		}
	}
	nan := make([]float32, 3*collectBlock)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	if got := firstNonFinite(make([]float32, len(nan)), addends{nan, nan}); got != 0 {
		t.Fatalf("all NaN: firstNonFinite = %d, want 0", got)
	}
}

// bitsOf returns the bit patterns of x.
func bitsOf(x []float32) []uint32 {
	b := make([]uint32, len(x))
	for i, v := range x {
		b[i] = math.Float32bits(v)
	}
	return b
}

// TestTopKKernels runs the accelerated top-k kernels and their generic
// twins on the same inputs, lengths around the vector width (8) and the
// collect step (32) ±1 included, and requires the same bits out (the sums
// addCollect writes included) and no write past the room given or the
// input (sentinels).
func TestTopKKernels(t *testing.T) {
	if !accelerated(histTopKernel, histTopGeneric) {
		t.Skipf("no accelerated top-k kernels in this build or on this CPU (kernels: %s): nothing to compare", kernelSet)
	}
	r := rand.New(rand.NewPCG(10, 4))
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-45, math.MaxFloat32, -math.MaxFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.Float32frombits(0xffffffff)}
	lengths := []int{0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97, 1000}
	for range 8 {
		lengths = append(lengths, r.IntN(3000))
	}
	for _, n := range lengths {
		for trial := range 12 {
			x := make([]float32, n)
			for i := range x {
				switch trial % 3 {
				case 0:
					x[i] = float32(r.NormFloat64())
				case 1:
					x[i] = float32(r.IntN(3)) // ties and zeros
				case 2:
					x[i] = math.Float32frombits(r.Uint32())
				}
			}
			for range trial % 4 {
				if n > 0 {
					x[r.IntN(n)] = special[r.IntN(len(special))]
				}
			}
			y := make([]float32, n) // x + y: error feedback's sum
			for i := range y {
				y[i] = float32(r.NormFloat64())
				if r.IntN(50) == 0 {
					y[i] = special[r.IntN(len(special))]
				}
			}

			var h1, h2 [histBins]uint32
			for b := range h1 {
				h1[b] = r.Uint32() >> 8
				h2[b] = h1[b]
			}
			histTopKernel(&h1, x)
			histTopGeneric(&h2, x)
			if h1 != h2 {
				t.Fatalf("histTop n=%d trial %d: kernel and generic differ", n, trial)
			}
			ts := []uint32{0, 1, nonFiniteKey, 1 << 31, r.Uint32() >> 1}
			if n > 0 {
				ts = append(ts, magKey(x[r.IntN(n)]))
			}
			for _, th := range ts {
				c1, c2 := histAtLeastKernel(&h1, x, th), histAtLeastGeneric(&h2, x, th)
				if h1 != h2 || c1 != c2 {
					t.Fatalf("histAtLeast n=%d t=%#x: kernel (%d counted) and generic (%d) differ", n, th, c1, c2)
				}
				room := []int{0, 31, 32, 33, 64, n + 32}[r.IntN(6)]
				base := r.Uint32()
				type out struct {
					pos         []uint32
					vals        []float32
					read, wrote int
					hist        [histBins]uint32
				}
				const sentinel = 0xa5a5a5a5
				run := func(kernel func(h *[histBins]uint32, pos []uint32, vals []float32) (int, int)) out {
					pos, vals := make([]uint32, room+8), make([]float32, room+8)
					for i := range pos {
						pos[i], vals[i] = sentinel, math.Float32frombits(sentinel)
					}
					o := out{hist: h1}
					o.read, o.wrote = kernel(&o.hist, pos[:room], vals[:room])
					for i := room; i < room+8; i++ {
						if pos[i] != sentinel || math.Float32bits(vals[i]) != sentinel {
							t.Fatalf("collect n=%d room=%d t=%#x: wrote past the room", n, room, th)
						}
					}
					o.pos, o.vals = pos[:o.wrote], vals[:o.wrote]
					return o
				}
				same := func(a, b out) bool {
					return a.read == b.read && a.wrote == b.wrote && a.hist == b.hist && slices.Equal(a.pos, b.pos) &&
						slices.Equal(bitsOf(a.vals), bitsOf(b.vals))
				}
				a := run(func(h *[histBins]uint32, pos []uint32, vals []float32) (int, int) {
					return collectKernel(h, pos, vals, x, base, th)
				})
				b := run(func(h *[histBins]uint32, pos []uint32, vals []float32) (int, int) {
					return collectGeneric(h, pos, vals, x, base, th)
				})
				if !same(a, b) {
					t.Fatalf("collect n=%d room=%d t=%#x: kernel (read %d, wrote %d) and generic (read %d, wrote %d) differ",
						n, room, th, a.read, a.wrote, b.read, b.wrote)
				}

				// The fused sum: x's addends are x and y; the sums go to
				// buffers of stale values (at an odd address every
				// other trial), sentinels past them.
				s1, s2 := make([]float32, n+9), make([]float32, n+9)
				for i := range s1 {
					s1[i], s2[i] = math.Float32frombits(sentinel), math.Float32frombits(sentinel)
				}
				off := trial % 2
				a = run(func(h *[histBins]uint32, pos []uint32, vals []float32) (int, int) {
					return addCollectKernel(h, pos, vals, s1[off:off+n], x, y, base, th)
				})
				b = run(func(h *[histBins]uint32, pos []uint32, vals []float32) (int, int) {
					return addCollectGeneric(h, pos, vals, s2[off:off+n], x, y, base, th)
				})
				if !same(a, b) || !slices.Equal(bitsOf(s1), bitsOf(s2)) {
					t.Fatalf("addCollect n=%d room=%d t=%#x: kernel (read %d, wrote %d) and generic (read %d, wrote %d) differ",
						n, room, th, a.read, a.wrote, b.read, b.wrote)
				}
			}
		}
	}
}

// FuzzTopKSelect tiles arbitrary float bits to up to 3·2^16 elements (so
// that inputs span segments and the first level's bound rises between
// chunks), selects the top k exactly and sampled, on one and two workers,
// and checks the result against the definition in one pass: k ascending
// indices with their values, every key above the k-th largest taken, the
// ties at it taken lowest index first, or a *NonFiniteError for the first
// non-finite value. The kernels must also agree with their generic twins.
func FuzzTopKSelect(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0, 0, 0, 0, 0}, uint32(200000), uint16(9), false)
	f.Add([]byte{1, 2, 3, 4}, uint32(1<<17), uint16(0), true)
	f.Add([]byte{0, 0, 0x80, 0x7f, 0, 0, 0, 0x3f}, uint32(70000), uint16(99), false)
	f.Fuzz(func(t *testing.T, data []byte, n uint32, ratioMil uint16, sampled bool) {
		if len(data) < 4 {
			t.Skip("no element")
		}
		m := len(data) / 4
		src := make([]float32, 1+int(n)%(3<<16))
		for i := range src {
			// Each tile flips other bits of the exponent and mantissa, the
			// top digit's among them: tiles neither tie nor share bins.
			src[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*(i%m):]) ^ uint32(i/m)*0x9e3779b9&0x037000ff)
		}
		var h1, h2 [histBins]uint32
		histTopKernel(&h1, src)
		histTopGeneric(&h2, src)
		c1, c2 := histAtLeastKernel(&h1, src, 0x3f000000), histAtLeastGeneric(&h2, src, 0x3f000000)
		if h1 != h2 || c1 != c2 {
			t.Fatal("histogram kernels differ from their generic twins")
		}

		ratio := float64(ratioMil%1000+1) / 1000
		spec := "topk:" + strconv.FormatFloat(ratio, 'f', -1, 64)
		if sampled {
			spec += ":sampled"
		}
		firstBad := slices.IndexFunc(src, func(x float32) bool { return magKey(x) >= nonFiniteKey })
		var first []byte
		for _, opts := range [][]Option{{WithWorkers(1)}, sparseParallel} {
			p, err := mustParse(t, spec, opts...).Compress(nil, src, Key{})
			if firstBad >= 0 {
				var nf *NonFiniteError
				if !errors.As(err, &nf) || nf.Index != firstBad {
					t.Fatalf("%s n=%d: err %v, want a NonFiniteError at %d", spec, len(src), err, firstBad)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if first != nil && !bytes.Equal(p, first) {
				t.Fatalf("%s n=%d: one and two workers differ", spec, len(src))
			}
			first = p
		}
		if firstBad >= 0 {
			return
		}
		k := sparseK(ratio, len(src))
		idx, vals := sparseTopKBody(payloadBody(first))
		in := make([]bool, len(src))
		kth := uint32(signMask)
		for i, p := range idx {
			if i > 0 && p <= idx[i-1] || int(p) >= len(src) || math.Float32bits(vals[i]) != math.Float32bits(src[p]) {
				t.Fatalf("%s n=%d: entry %d (index %d) is out of order or not the input's", spec, len(src), i, p)
			}
			in[p] = true
			kth = min(kth, magKey(src[p]))
		}
		tieSkipped := false
		for i, x := range src {
			u := magKey(x)
			switch {
			case u > kth && !in[i], u < kth && in[i], u == kth && in[i] && tieSkipped:
				t.Fatalf("%s n=%d k=%d: index %d (key %#x, k-th largest %#x) is wrongly in or out", spec, len(src), k, i, u, kth)
			case u == kth && !in[i]:
				tieSkipped = true
			}
		}
		if len(idx) != k {
			t.Fatalf("%s n=%d: %d indices, want %d", spec, len(src), len(idx), k)
		}
	})
}

// withGenericKernels runs f with the generic inner loops of error
// feedback's sparse path in place of the accelerated ones.
func withGenericKernels(f func()) {
	add, top, coll, addColl, atLeast := addKernel, histTopKernel, collectKernel, addCollectKernel, histAtLeastKernel
	defer func() {
		addKernel, histTopKernel, collectKernel, addCollectKernel, histAtLeastKernel = add, top, coll, addColl, atLeast
	}()
	addKernel, histTopKernel, collectKernel, addCollectKernel, histAtLeastKernel =
		addGeneric, histTopGeneric, collectGeneric, addCollectGeneric, histAtLeastGeneric
	f()
}

// TestSparseFeedbackSum: CompressSelectFeedback of top-k (exact, sampled,
// and sampled falling back: too many candidates, or a sample larger than
// the rest) and of random-k appends the payload and selection
// CompressSelect gives for s = e + g and sets sum to s bit for bit, on one
// and two workers, with the active kernels and with the generic ones (the
// AVX2 and the purego path on the same inputs). A NaN or Inf in s (in g,
// or e + g overflowing below it) is the *NonFiniteError of the lowest
// index with dst and sel unchanged.
func TestSparseFeedbackSum(t *testing.T) {
	n := sampledMinLen + 3 // several segments, and long enough to sample
	for _, kind := range []string{"laplace", "ties", "equal", "zeros", "ramp", "misleading"} {
		var x []float32
		if kind != "misleading" {
			x = sparseData(kind, n, 11)
		} else {
			x = sparseData("laplace", n, 11)
			for j := range sampleBlocks {
				for i := j * n / sampleBlocks; i < j*n/sampleBlocks+sampleBlock; i++ {
					x[i] = 100 + float32(i)
				}
			}
		}
		e, g, s := make([]float32, n), make([]float32, n), make([]float32, n)
		for i, v := range x {
			e[i] = 0.75 * v
			g[i] = v - e[i]
		}
		addGeneric(s, e, g)
		for _, spec := range []string{"topk:0.01", "topk:0.01:sampled", "topk:0.1:sampled", "randomk:0.01:seed=5", "topk:0.01:lossless=zstd"} {
			for _, opts := range [][]Option{{WithWorkers(1)}, sparseParallel} {
				c := mustParse(t, spec, opts...).(SparseFeedbackCompressor)
				key := Key{Bucket: 4, Step: 9}
				want, wantSel, err := c.CompressSelect([]byte("pre"), s, key, []uint32{7})
				if err != nil {
					t.Fatal(err)
				}
				for _, generic := range []bool{false, true} {
					what := fmt.Sprintf("%s %s workers=%d generic=%v", kind, spec, len(opts), generic)
					sum := make([]float32, n)
					for i := range sum {
						sum[i] = float32(math.NaN()) // must all be overwritten
					}
					var got []byte
					var sel []uint32
					call := func() { got, sel, err = c.CompressSelectFeedback([]byte("pre"), e, g, sum, key, []uint32{7}) }
					if generic {
						withGenericKernels(call)
					} else {
						call()
					}
					if err != nil || !bytes.Equal(got, want) || !slices.Equal(sel, wantSel) {
						t.Fatalf("%s: payload or selection differs from CompressSelect's of e + g (%v)", what, err)
					}
					if !slices.EqualFunc(sum, s, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
						t.Fatalf("%s: sum is not e + g", what)
					}
				}
			}
		}
	}

	// A NaN or Inf of s: an Inf in g near the end, e + g overflowing
	// before it, NaNs from +Inf − Inf after.
	inf := float32(math.Inf(1))
	x := sparseData("laplace", n, 12)
	e, g := make([]float32, n), x
	e[n/3], g[n/3] = math.MaxFloat32, math.MaxFloat32
	g[n-5] = inf
	e[n-2], g[n-2] = inf, -inf
	for _, spec := range []string{"topk:0.01", "topk:0.01:sampled", "randomk:0.01"} {
		for _, opts := range [][]Option{{WithWorkers(1)}, sparseParallel} {
			c := mustParse(t, spec, opts...).(SparseFeedbackCompressor)
			out, sel, err := c.CompressSelectFeedback([]byte("keep"), e, g, make([]float32, n), Key{}, []uint32{7})
			var nf *NonFiniteError
			if !errors.As(err, &nf) || nf.Index != n/3 || nf.Value != inf || string(out) != "keep" || !slices.Equal(sel, []uint32{7}) {
				t.Fatalf("%s workers=%d: %q, %v, %v; want dst and sel unchanged and a NonFiniteError at %d", spec, len(opts), out, sel, err, n/3)
			}
		}
	}
}

// TestSampledFromSum: the sampled form's threshold comes from samples of
// s = e + g, not of e or g: a Laplace s whose e is large at the sampled
// places (cancelled by g) settles in the shortcut.
func TestSampledFromSum(t *testing.T) {
	n := 1<<20 + 3
	x := sparseData("laplace", n, 13)
	e, g := make([]float32, n), make([]float32, n)
	copy(g, x)
	for j := range sampleBlocks {
		for i := j * n / sampleBlocks; i < j*n/sampleBlocks+sampleBlock; i++ {
			e[i], g[i] = 100, x[i]-100
		}
	}
	s := make([]float32, n)
	k := sparseK(0.01, n)
	sc := new(topkScratch)
	sc.splitInput(s)
	sc.add = addends{e, g}
	if done, err := sc.sampled(make([]byte, 8*k), s, k, serial); !done || err != nil {
		t.Fatalf("the shortcut did not settle (err %v): its sample is not of e + g", err)
	}
}
