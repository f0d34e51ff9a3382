package compress

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// quantSpecs are the quantizer configurations the table tests cover: every
// width and rounding mode, the default bucket, one that is not a multiple of
// 8 (buckets share bytes) and a tiny one.
var quantSpecs = []string{
	"int8", "int4", "int2",
	"int8:round=nearest", "int4:round=nearest", "int2:round=nearest",
	"int8:bucket=7:seed=5", "int4:bucket=13", "int2:bucket=3:round=nearest", "int4:bucket=1",
}

func TestQuantParse(t *testing.T) {
	valid := []struct {
		spec, canon string
		codec       Codec
		paramA      uint32
		paramB      uint32
		seed        uint64
	}{
		{"int8", "int8", CodecInt8, 512, 0, 0},
		{"int4", "int4", CodecInt4, 512, 0, 0},
		{"int2", "int2", CodecInt2, 512, 0, 0},
		{"int8:bucket=512:round=stochastic:seed=0", "int8", CodecInt8, 512, 0, 0},
		{"int4:bucket=64:round=nearest:seed=7", "int4:bucket=64:round=nearest:seed=7", CodecInt4, 64, 1, 7},
		{"int2:seed=0x10", "int2:seed=16", CodecInt2, 512, 0, 16},
		{"int8:seed=18446744073709551615", "int8:seed=18446744073709551615", CodecInt8, 512, 0, math.MaxUint64},
		{"int8:bucket=1", "int8:bucket=1", CodecInt8, 1, 0, 0},
		{"int8:bucket=16777216", "int8:bucket=16777216", CodecInt8, 1 << 24, 0, 0},
		{"int8:round=nearest:lossless=zstd", "int8:round=nearest:lossless=zstd", CodecInt8, 512, 1, 0},
		{"sign", "sign", CodecSign, 512, 0, 0},
		{"sign:bucket=100", "sign:bucket=100", CodecSign, 100, 0, 0},
		{"sign:bucket=512:lossless=huff0", "sign:lossless=huff0", CodecSign, 512, 0, 0},
	}
	for _, v := range valid {
		c, err := Parse(v.spec)
		if err != nil {
			t.Errorf("Parse(%q): %v", v.spec, err)
			continue
		}
		if c.Spec().String() != v.canon || c.Codec() != v.codec {
			t.Errorf("Parse(%q): spec %q codec %v, want %q %v", v.spec, c.Spec(), c.Codec(), v.canon, v.codec)
		}
		p, err := c.Compress(nil, []float32{1, -2, 3}, Key{})
		if err != nil {
			t.Fatalf("%s: %v", v.spec, err)
		}
		a, b, s := binary.LittleEndian.Uint32(p[16:]), binary.LittleEndian.Uint32(p[20:]), binary.LittleEndian.Uint64(p[24:])
		if a != v.paramA || b != v.paramB || s != v.seed {
			t.Errorf("%s: header parameters (%d, %d, seed %d), want (%d, %d, seed %d)", v.spec, a, b, s, v.paramA, v.paramB, v.seed)
		}
	}
	invalid := []string{
		"int8:bucket=0", "int8:bucket=16777217", "int8:bucket=-1", "int8:bucket=x", "int8:bucket=",
		"int4:round=up", "int4:round=Nearest", "int2:seed=-1", "int2:seed=1.5", "int8:seed=18446744073709551616",
		"int8:foo=1", "int8:0.5", "int8:bucket=4:bucket=8", "int8:sampled",
		"sign:round=nearest", "sign:seed=1", "sign:bucket=0", "sign:0.1", "int16", "int8:lossless=gzip",
	}
	for _, spec := range invalid {
		_, err := Parse(spec)
		var se *SpecError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) = %v, want a *SpecError", spec, err)
		}
	}
}

// refQuantBody is the quantizer's definition (see quantCodec) written out
// element by element, the slow way: the codec must produce these bytes.
func refQuantBody(x []float32, bucket int, bits uint, nearest bool, seed uint64, key Key) []byte {
	levels := 1<<bits - 1
	nb := (len(x) + bucket - 1) / bucket
	body := make([]byte, 8*nb+(len(x)*int(bits)+7)/8)
	codes := body[8*nb:]
	st := NewRandomStream(seed, key, DomainRound)
	for j := range nb {
		xs := x[j*bucket : min((j+1)*bucket, len(x))]
		lo, hi := xs[0], xs[0]
		for _, v := range xs {
			if v < lo {
				lo = v
			}
			if v > hi {
				hi = v
			}
		}
		lo, hi = lo+0, hi+0
		d := float64(hi) - float64(lo)
		scale := float32(d / float64(levels))
		var inv float32
		if scale != 0 {
			inv = float32(math.Min(float64(levels)/d, math.MaxFloat32))
		}
		binary.LittleEndian.PutUint32(body[8*j:], math.Float32bits(lo))
		binary.LittleEndian.PutUint32(body[8*j+4:], math.Float32bits(scale))
		for k, v := range xs {
			i := j*bucket + k
			t := float32(float32(v-lo) * inv)
			r := float32(0.5)
			if !nearest {
				r = st.Uniform(uint32(i))
			}
			c := int(float32(t + r))
			if c > levels {
				c = levels
			}
			codes[i*int(bits)/8] |= byte(c) << (i * int(bits) % 8)
		}
	}
	return body
}

// refDequant decodes a quantizer body by the definition.
func refDequant(body []byte, n, bucket int, bits uint) []float32 {
	nb := (n + bucket - 1) / bucket
	out := make([]float32, n)
	for i := range out {
		j := i / bucket
		lo := math.Float32frombits(binary.LittleEndian.Uint32(body[8*j:]))
		scale := math.Float32frombits(binary.LittleEndian.Uint32(body[8*j+4:]))
		c := body[8*nb+i*int(bits)/8] >> (i * int(bits) % 8) & (1<<bits - 1)
		out[i] = lo + float32(float32(c)*scale)
	}
	return out
}

// testDistributions returns named inputs of n elements that stress the
// quantizer: ordinary, heavy-tailed, constant, far from zero, subnormal,
// near the float32 limit, signed zeros, sparse and monotone.
func testDistributions(n int, seed uint64) map[string][]float32 {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	gen := func(f func(i int) float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = f(i)
		}
		return x
	}
	return map[string][]float32{
		"normal":   gen(func(int) float32 { return float32(r.NormFloat64()) }),
		"student2": gen(func(int) float32 { return float32(1e-3 * r.NormFloat64() / math.Sqrt(r.ExpFloat64())) }),
		"constant": gen(func(int) float32 { return 3.25 }),
		"offset":   gen(func(int) float32 { return float32(1000 + 1e-3*r.NormFloat64()) }),
		"tiny":     gen(func(int) float32 { return float32(1e-40 * r.NormFloat64()) }),
		"huge":     gen(func(int) float32 { return float32(1.6e38 * (2*r.Float64() - 1)) }),
		"zeros": gen(func(i int) float32 {
			return [...]float32{0, float32(math.Copysign(0, -1)), 1e-3, -2e-3}[r.IntN(4)]
		}),
		"sparse": gen(func(int) float32 {
			if r.IntN(100) == 0 {
				return float32(r.NormFloat64())
			}
			return 0
		}),
		"ramp": gen(func(i int) float32 { return float32(i) - float32(n)/3 }),
	}
}

// quantBound returns the documented error bound of an element of a bucket
// with range [lo, hi] (see quantCodec).
func quantBound(lo, hi float32, levels int, nearest bool) float64 {
	s := (float64(hi) - float64(lo)) / float64(levels)
	f := 1.0
	if nearest {
		f = 0.5
	}
	return s*(f+0x1p-14) + quantSlack(lo, hi)
}

// quantSlack is the float32 rounding term of the error bound.
func quantSlack(lo, hi float32) float64 {
	return 0x1p-20*math.Max(math.Abs(float64(lo)), math.Abs(float64(hi))) + 0x1p-120
}

// testLengths returns the lengths around the cut-offs of a bucket size.
func testLengths(bucket int) []int {
	return []int{0, 1, 2, 7, 8, 9, bucket - 1, bucket, bucket + 1, 8*bucket - 1, 8*bucket + 3, 1001}
}

// TestQuantRoundTrip checks, for every configuration, distribution and
// length: the body equals the reference definition byte for byte, the
// decoded values equal the reference decoding, and every element is within
// the documented error bound of its input.
func TestQuantRoundTrip(t *testing.T) {
	key := Key{Bucket: 11, Step: 42}
	for _, spec := range quantSpecs {
		c := mustParse(t, spec)
		q := backend(c).impl.(*quantCodec)
		for _, n := range testLengths(q.bucket) {
			for name, x := range testDistributions(n, 1) {
				checkQuantRoundTrip(t, fmt.Sprintf("%s/n=%d/%s", spec, n, name), c, q, x, key)
			}
		}
	}
}

// TestQuantRoundTripLarge runs the round trip on 2^20+3 elements, enough for
// the parallel runner to split the work.
func TestQuantRoundTripLarge(t *testing.T) {
	x := testDistributions(1<<20+3, 2)["student2"]
	for _, spec := range []string{"int8", "int4:round=nearest", "int2:bucket=13"} {
		c := mustParse(t, spec, WithWorkers(2))
		checkQuantRoundTrip(t, spec, c, backend(c).impl.(*quantCodec), x, Key{Bucket: 1, Step: 2})
	}
}

func checkQuantRoundTrip(t *testing.T, name string, c Compressor, q *quantCodec, x []float32, key Key) {
	t.Helper()
	p, err := c.Compress(nil, x, key)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(p) != c.MaxEncodedLen(len(x)) {
		t.Fatalf("%s: payload of %d bytes, MaxEncodedLen says %d", name, len(p), c.MaxEncodedLen(len(x)))
	}
	want := refQuantBody(x, q.bucket, q.bits, q.nearest, q.rngSeed, key)
	if got := payloadBody(p); !bytes.Equal(got, want) {
		t.Fatalf("%s: body differs from the reference definition at byte %d", name, firstDiff(got, want))
	}
	dec := make([]float32, len(x))
	if err := c.Decompress(dec, p); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	ref := refDequant(want, len(x), q.bucket, q.bits)
	for b := 0; b < len(x); b += q.bucket {
		lo, hi := sliceRange(x[b:min(b+q.bucket, len(x))])
		bound := quantBound(lo, hi, int(q.levels()), q.nearest)
		for i := b; i < min(b+q.bucket, len(x)); i++ {
			if math.Float32bits(dec[i]) != math.Float32bits(ref[i]) {
				t.Fatalf("%s: element %d decodes to %v, the definition gives %v", name, i, dec[i], ref[i])
			}
			if e := math.Abs(float64(dec[i]) - float64(x[i])); e > bound {
				t.Fatalf("%s: element %d = %v decodes to %v, error %g > bound %g", name, i, x[i], dec[i], e, bound)
			}
		}
	}
}

func sliceRange(x []float32) (lo, hi float32) {
	lo, hi = x[0], x[0]
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestQuantGolden pins the bytes of fixed inputs, so that a change to the
// definition (here and in the reference alike) fails loudly: other backends
// and stored payloads depend on it.
func TestQuantGolden(t *testing.T) {
	x := []float32{-1.5, -0.25, 0, 0.1, 0.2, 0.3, 1.75, 2, -0.75, 0.5, 3e-3, -1e-3, 0.625}
	key := Key{Bucket: 3, Step: 17}
	cases := []struct{ spec, body string }{
		{"int8:bucket=8:seed=99", "0000c0bfe1e0603c000040bfb1b0b03b005b6d757c84edff00e88b8aff"},
		{"int4:bucket=8:seed=99", "0000c0bfefee6e3e000040bfbcbbbb3d507687fee0880f"},
		{"int2:bucket=8:seed=99", "0000c0bf5555953f000040bfabaaea3e94f95c03"},
		// Worked by hand: lo −1.5, scale 3.5/15, codes 0 5 6 7 7 8 14 15;
		// lo −0.75, scale 1.375/15, codes 0 14 8 8 15.
		{"int4:bucket=8:round=nearest", "0000c0bfefee6e3e000040bfbcbbbb3d507687fee0880f"},
	}
	for _, c := range cases {
		p, err := mustParse(t, c.spec).Compress(nil, x, key)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(payloadBody(p)); got != c.body {
			t.Errorf("%s: body %s, want %s", c.spec, got, c.body)
		}
	}
	// Signed zeros: the bucket minimum is stored as +0.
	p, err := mustParse(t, "int8").Compress(nil, []float32{float32(math.Copysign(0, -1))}, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(payloadBody(p)); got != "000000000000000000" {
		t.Errorf("int8 of −0: body %s, want lo = +0, scale = +0, code 0", got)
	}
}

// TestQuantDeterminism: the same (seed, key) gives the same bytes; another
// step or seed gives other codes under stochastic rounding and the same
// codes under nearest rounding.
func TestQuantDeterminism(t *testing.T) {
	x := testDistributions(4096, 3)["normal"]
	codes := func(spec string, key Key) []byte {
		p, err := mustParse(t, spec).Compress(nil, x, key)
		if err != nil {
			t.Fatal(err)
		}
		return payloadBody(p)[8*8:]
	}
	k := Key{Bucket: 9, Step: 100}
	for _, spec := range []string{"int8", "int4", "int2"} {
		a := codes(spec, k)
		if !bytes.Equal(a, codes(spec, k)) {
			t.Errorf("%s: two runs with the same key differ", spec)
		}
		if bytes.Equal(a, codes(spec, Key{Bucket: 9, Step: 101})) {
			t.Errorf("%s: steps 100 and 101 give the same codes", spec)
		}
		if bytes.Equal(a, codes(spec, Key{Bucket: 10, Step: 100})) {
			t.Errorf("%s: buckets 9 and 10 give the same codes", spec)
		}
		if bytes.Equal(a, codes(spec+":seed=1", k)) {
			t.Errorf("%s: seeds 0 and 1 give the same codes", spec)
		}
		nearest := spec + ":round=nearest"
		if !bytes.Equal(codes(nearest, k), codes(nearest, Key{Bucket: 1, Step: 2})) {
			t.Errorf("%s: codes depend on the key", nearest)
		}
	}
}

// TestQuantUnbiased averages the decoded values of fixed inputs over many
// steps: stochastic rounding must be unbiased. Per element the decoded value
// is ⌊t⌋·s or (⌊t⌋+1)·s above lo, with standard deviation at most s/2, so the
// mean of K draws deviates from x by more than 5·s/(2√K) with probability
// below 6e-7 per element (the test is deterministic: the draws are fixed by
// the keys). Over all elements together the mean signed error, in units of
// s, must be within 5/(2√(K·n)).
func TestQuantUnbiased(t *testing.T) {
	const steps = 1500
	for _, spec := range []string{"int8", "int4", "int2"} {
		c := mustParse(t, spec)
		q := backend(c).impl.(*quantCodec)
		x := testDistributions(2*q.bucket, 4)["normal"]
		sum := make([]float64, len(x))
		dec := make([]float32, len(x))
		var p []byte
		for step := range uint64(steps) {
			var err error
			if p, err = c.Compress(p[:0], x, Key{Bucket: 1, Step: step}); err != nil {
				t.Fatal(err)
			}
			if err := c.Decompress(dec, p); err != nil {
				t.Fatal(err)
			}
			for i, v := range dec {
				sum[i] += float64(v)
			}
		}
		total := 0.0
		for i := range x {
			b := i / q.bucket * q.bucket
			lo, hi := sliceRange(x[b : b+q.bucket])
			s := (float64(hi) - float64(lo)) / float64(q.levels())
			bias := sum[i]/steps - float64(x[i])
			if tol := 5*s/(2*math.Sqrt(steps)) + quantSlack(lo, hi); math.Abs(bias) > tol {
				t.Errorf("%s: element %d = %v: mean decoded value is off by %g > %g", spec, i, x[i], bias, tol)
			}
			total += bias / s
		}
		if mean, tol := total/float64(len(x)), 5/(2*math.Sqrt(steps*float64(len(x)))); math.Abs(mean) > tol {
			t.Errorf("%s: mean signed error %g·s, want within ±%g·s", spec, mean, tol)
		}
	}
}

// TestQuantParallel: any number of workers writes the same bytes and decodes
// the same values as one.
func TestQuantParallel(t *testing.T) {
	x := testDistributions(100_003, 5)["student2"]
	for _, spec := range append(quantSpecs, "sign", "sign:bucket=13") {
		serial := mustParse(t, spec, WithWorkers(1))
		want, err := serial.Compress(nil, x, Key{Bucket: 4, Step: 8})
		if err != nil {
			t.Fatal(err)
		}
		wantDec := make([]float32, len(x))
		if err := serial.Decompress(wantDec, want); err != nil {
			t.Fatal(err)
		}
		for _, w := range []int{2, 3, 8} {
			par := mustParse(t, spec, WithWorkers(w), WithMinParallel(1))
			got, err := par.Compress(nil, x, Key{Bucket: 4, Step: 8})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s with %d workers: payload differs at byte %d", spec, w, firstDiff(got, want))
			}
			dec := make([]float32, len(x))
			if err := par.Decompress(dec, got); err != nil {
				t.Fatal(err)
			}
			for i := range dec {
				if math.Float32bits(dec[i]) != math.Float32bits(wantDec[i]) {
					t.Fatalf("%s with %d workers: element %d decodes to %v, serially %v", spec, w, i, dec[i], wantDec[i])
				}
			}
		}
	}
}

// TestQuantNonFinite: a NaN or ±Inf, or a bucket range beyond float32, is a
// *NonFiniteError for the lowest offending index; dst and the error-feedback
// residual stay as they were.
func TestQuantNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		name  string
		set   map[int]float32
		index int
	}{
		{"NaN first", map[int]float32{0: nan}, 0},
		{"NaN mid", map[int]float32{777: nan}, 777},
		{"+Inf", map[int]float32{4000: inf}, 4000},
		{"-Inf", map[int]float32{5: -inf}, 5},
		{"two buckets", map[int]float32{3000: nan, 1500: -inf}, 1500},
		{"same bucket", map[int]float32{1030: inf, 1029: nan}, 1029},
		{"range overflow", map[int]float32{2046: 3e38, 2047: -3e38}, 2046},
		{"last element", map[int]float32{9999: nan}, 9999},
	}
	for _, spec := range append(quantSpecs, "sign", "sign:bucket=7") {
		for _, w := range []int{1, 2} {
			c := mustParse(t, spec, WithWorkers(w), WithMinParallel(1))
			for _, tc := range cases {
				if tc.name == "range overflow" && (spec[:4] == "sign" || spec == "int4:bucket=1") {
					continue // no bucket holds both extremes
				}
				x := testDistributions(10000, 6)["normal"]
				for i, v := range tc.set {
					x[i] = v
				}
				prefix := []byte("keep")
				dst := append(make([]byte, 0, 1<<20), prefix...)
				out, err := c.Compress(dst, x, Key{})
				var nf *NonFiniteError
				if !errors.As(err, &nf) || nf.Index != tc.index || math.Float32bits(nf.Value) != math.Float32bits(x[tc.index]) {
					t.Errorf("%s/%d workers/%s: error %v, want a *NonFiniteError at index %d", spec, w, tc.name, err, tc.index)
				}
				if !bytes.Equal(out, prefix) {
					t.Errorf("%s/%s: dst changed to %d bytes on error", spec, tc.name, len(out))
				}

				if w > 1 {
					continue
				}
				ef := NewErrorFeedback(c)
				good := testDistributions(10000, 7)["normal"]
				if _, err := ef.Compress(nil, good, Key{Step: 1}); err != nil {
					t.Fatal(err)
				}
				before := ef.Residual(0)
				if _, err := ef.Compress(nil, x, Key{Step: 2}); !errors.As(err, &nf) {
					t.Errorf("%s/%s: error feedback returned %v, want a *NonFiniteError", spec, tc.name, err)
				}
				for i, e := range ef.Residual(0) {
					if math.Float32bits(e) != math.Float32bits(before[i]) {
						t.Fatalf("%s/%s: residual element %d changed from %v to %v", spec, tc.name, i, before[i], e)
					}
				}
			}
		}
	}
}

// TestQuantCorrupt changes one field of a valid payload (and reseals its
// CRC): check must report a *CorruptInputError at the field's offset.
func TestQuantCorrupt(t *testing.T) {
	f32 := func(v float32) uint32 { return math.Float32bits(v) }
	cases := []struct {
		name string
		off  int // within the body
		bits uint32
	}{
		{"NaN minimum", 8, 0x7fc00000},
		{"+Inf minimum", 0, f32(float32(math.Inf(1)))},
		{"negative scale", 12, f32(-1)},
		{"-0 scale", 4, 0x80000000},
		{"Inf scale", 4, 0x7f800000},
		{"NaN scale", 4, 0x7fc00001},
		{"top overflows", 4, f32(3e38)},
	}
	for _, spec := range []string{"int8", "int4", "int2"} {
		c := mustParse(t, spec)
		x := testDistributions(1027, 8)["normal"]
		valid, err := c.Compress(nil, x, Key{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range cases {
			p := bytes.Clone(valid)
			binary.LittleEndian.PutUint32(p[HeaderLen+tc.off:], tc.bits)
			expectCorrupt(t, spec+"/"+tc.name, c, p, HeaderLen+tc.off, len(x))
		}
		// 1027 elements leave padding bits in the last byte (except for int8).
		if spec != "int8" {
			p := bytes.Clone(valid)
			p[len(p)-TrailerLen-1] |= 0x80
			expectCorrupt(t, spec+"/padding", c, p, len(p)-TrailerLen-1, len(x))
		}
	}
}

// expectCorrupt checks that Decompress and DecompressAdd of p (resealed)
// fail with a *CorruptInputError at offset and leave dst alone.
func expectCorrupt(t *testing.T, name string, c Compressor, p []byte, offset, n int) {
	t.Helper()
	reseal(p)
	dst := make([]float32, n)
	for i := range dst {
		dst[i] = 7
	}
	for _, dec := range []func([]float32, []byte) error{c.Decompress, c.DecompressAdd} {
		err := dec(dst, p)
		var ce *CorruptInputError
		if !errors.As(err, &ce) || ce.Offset != int64(offset) {
			t.Errorf("%s: error %v, want a *CorruptInputError at offset %d", name, err, offset)
		}
	}
	for i, v := range dst {
		if v != 7 {
			t.Fatalf("%s: dst[%d] changed to %v", name, i, v)
		}
	}
}

// TestQuantDecompressAdd: DecompressAdd adds to dst exactly what Decompress
// writes.
func TestQuantDecompressAdd(t *testing.T) {
	for _, spec := range append(quantSpecs, "sign", "sign:bucket=5") {
		c := mustParse(t, spec)
		x := testDistributions(3001, 9)["normal"]
		p, err := c.Compress(nil, x, Key{Step: 3})
		if err != nil {
			t.Fatal(err)
		}
		dec := make([]float32, len(x))
		if err := c.Decompress(dec, p); err != nil {
			t.Fatal(err)
		}
		acc := testDistributions(3001, 10)["normal"]
		want := make([]float32, len(acc))
		for i := range acc {
			want[i] = acc[i] + dec[i]
		}
		if err := c.DecompressAdd(acc, p); err != nil {
			t.Fatal(err)
		}
		for i := range acc {
			if math.Float32bits(acc[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d: DecompressAdd gave %v, want %v", spec, i, acc[i], want[i])
			}
		}
	}
}

// TestQuantLossless: the lossless stages round-trip the quantizer bodies.
func TestQuantLossless(t *testing.T) {
	x := testDistributions(50_000, 11)["student2"]
	for _, spec := range []string{"int8:lossless=zstd", "int4:lossless=huff0", "sign:lossless=zstd"} {
		c := mustParse(t, spec)
		plain := mustParse(t, spec[:4])
		p, err := c.Compress(nil, x, Key{})
		if err != nil {
			t.Fatal(err)
		}
		got, want := make([]float32, len(x)), make([]float32, len(x))
		if err := c.Decompress(got, p); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		q, _ := plain.Compress(nil, x, Key{})
		if err := plain.Decompress(want, q); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: element %d: %v, without the stage %v", spec, i, got[i], want[i])
			}
		}
	}
}

// TestQuantClamp finds, for each width, an element whose draw pushes
// float32(L + r) up to L+1, and checks that its code is clamped to L (an
// unclamped code would spill into its neighbour's bits).
func TestQuantClamp(t *testing.T) {
	key := Key{Bucket: 2, Step: 3}
	st := NewRandomStream(0, key, DomainRound)
	for _, spec := range []string{"int8:bucket=2", "int4:bucket=2", "int2:bucket=2"} {
		c := mustParse(t, spec)
		levels := backend(c).impl.(*quantCodec).levels()
		i := 0
		for int32(float32(float32(levels)+st.Uniform(uint32(i)))) <= levels {
			i++
		}
		x := make([]float32, i+2)
		x[i] = 1 // its bucket is {0, 1}: t = L exactly
		p, err := c.Compress(nil, x, key)
		if err != nil {
			t.Fatal(err)
		}
		dec := make([]float32, len(x))
		if err := c.Decompress(dec, p); err != nil {
			t.Fatal(err)
		}
		for k, v := range dec {
			if v != x[k] {
				t.Fatalf("%s: element %d = %v decodes to %v (draw %v)", spec, k, x[k], v, st.Uniform(uint32(i)))
			}
		}
	}
}

// TestKernels runs each accelerated inner loop and its generic twin on the
// same inputs, lengths around the vector width included, and requires the
// same bits out.
func TestKernels(t *testing.T) {
	if kernelSet == "generic" {
		t.Skip("no accelerated kernels in this build or on this CPU: nothing to compare")
	}
	t.Logf("kernels in use: %s", kernelSet) // shown with -v
	// Each kernel that this build and CPU replace (arm64 replaces only the
	// quantizer's range and quantize loops).
	minMaxOn, quantOn, dequantOn := accelerated(minMaxKernel, minMaxGeneric), accelerated(quantKernel, quantGeneric), accelerated(dequantKernel, dequantGeneric)
	addOn, subOn := accelerated(addKernel, addGeneric), accelerated(subKernel, subGeneric)
	signOn, unsignOn := accelerated(signKernel, signGeneric), accelerated(unsignKernel, unsignGeneric)
	r := rand.New(rand.NewPCG(7, 7))
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-45, -1e-45, math.MaxFloat32, -math.MaxFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	input := func(n int, specials int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for range specials {
			if n > 0 {
				x[r.IntN(n)] = special[r.IntN(len(special))]
			}
		}
		return x
	}
	same := func(a, b []float32) bool {
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				return false
			}
		}
		return len(a) == len(b)
	}
	// Lengths around the vector width (8) and the default bucket (512),
	// ±1, then random ones.
	lengths := []int{1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 511, 512, 513, 1000, 1023, 1024, 1025}
	for range 8 {
		lengths = append(lengths, 8*r.IntN(300)+r.IntN(3))
	}
	for _, n := range lengths {
		for trial := range 20 {
			x := input(n, trial%4)
			if minMaxOn {
				lo1, hi1, f1 := minMaxKernel(x)
				lo2, hi2, f2 := minMaxGeneric(x)
				if f1 != f2 || f1 && (lo1 != lo2 || hi1 != hi2) {
					t.Fatalf("minMax n=%d %v: (%v %v %v), generic (%v %v %v)", n, x, lo1, hi1, f1, lo2, hi2, f2)
				}
			}

			m := n &^ 7
			y := input(m, 0)
			lo, hi := float32(-2.5), float32(3)
			if m > 0 {
				lo, hi = sliceRange(y)
			}
			for _, bits := range []uint{8, 4, 2} {
				levels := int32(1)<<bits - 1
				inv := float32(float64(levels) / (float64(hi) - float64(lo)))
				ctr, k1 := r.Uint32(), r.Uint32()
				if trial == 0 {
					ctr = -uint32(m / 2) // the counter wraps mid-slice
				}
				nearest := trial%3 == 2
				// 8 sentinel bytes past the codes: the kernels must not write there.
				o1, o2 := make([]byte, m*int(bits)/8+8), make([]byte, m*int(bits)/8+8)
				for i := range o1 {
					o1[i], o2[i] = 0xa5, 0xa5
				}
				quantKernel(o1[:m*int(bits)/8], y, lo, inv, levels, bits, ctr, k1, nearest)
				quantGeneric(o2[:m*int(bits)/8], y, lo, inv, levels, bits, ctr, k1, nearest)
				if quantOn && !bytes.Equal(o1, o2) {
					t.Fatalf("quant n=%d bits=%d nearest=%v: kernels differ at byte %d", m, bits, nearest, firstDiff(o1, o2))
				}
				if quantOn && !bytes.Equal(o1[m*int(bits)/8:], bytes.Repeat([]byte{0xa5}, 8)) {
					t.Fatalf("quant n=%d bits=%d: wrote past the end of out", m, bits)
				}
				o1 = o1[:m*int(bits)/8]
				scale := float32(r.NormFloat64())
				for _, add := range []bool{false, true} {
					d1, d2 := input(m, 0), make([]float32, m)
					copy(d2, d1)
					dequantKernel(d1, o1, lo, scale, bits, add)
					dequantGeneric(d2, o1, lo, scale, bits, add)
					if dequantOn && !same(d1, d2) {
						t.Fatalf("dequant n=%d bits=%d add=%v: kernels differ", m, bits, add)
					}
				}
			}

			a, b := input(n, trial%4), input(n, 0)
			s1, s2 := make([]float32, n+1), make([]float32, n+1)
			s1[n], s2[n] = 7, 7 // a sentinel past the sum
			addKernel(s1[:n], a, b)
			addGeneric(s2[:n], a, b)
			if addOn && (!same(s1, s2) || s1[n] != 7) {
				t.Fatalf("add n=%d: kernels differ or wrote past the end", n)
			}

			// subKernel: res = src − res, the residual's subtraction.
			r1 := append(input(n, trial%4), 7) // a sentinel past the residual
			r2 := append([]float32(nil), r1...)
			subKernel(r1[:n], a)
			subGeneric(r2[:n], a)
			if subOn && (!same(r1, r2) || r1[n] != 7) {
				t.Fatalf("sub n=%d: kernels differ or wrote past the end", n)
			}

			s := input(m, trial%4)
			for i := range s {
				if r.IntN(8) == 0 {
					s[i] = special[r.IntN(2)] // signed zeros
				}
			}
			b1, b2 := make([]byte, m/8), make([]byte, m/8)
			acc1 := [8]float64{1, 2, 3, 4, 5, 6, 7, 0.5}
			acc2 := acc1
			signKernel(b1, s, &acc1)
			signGeneric(b2, s, &acc2)
			if signOn && !bytes.Equal(b1, b2) {
				t.Fatalf("sign n=%d: bits differ at byte %d", m, firstDiff(b1, b2))
			}
			for k := range acc1 {
				if signOn && math.Float64bits(acc1[k]) != math.Float64bits(acc2[k]) && !(math.IsNaN(acc1[k]) && math.IsNaN(acc2[k])) {
					t.Fatalf("sign n=%d: lane %d sums %v, generic %v", m, k, acc1[k], acc2[k])
				}
			}
			sb := math.Float32bits(float32(r.ExpFloat64()))
			for _, add := range []bool{false, true} {
				d1, d2 := input(m, 0), make([]float32, m)
				copy(d2, d1)
				unsignKernel(d1, b1, sb, add)
				unsignGeneric(d2, b1, sb, add)
				if unsignOn && !same(d1, d2) {
					t.Fatalf("unsign n=%d add=%v: kernels differ", m, add)
				}
			}
		}
	}
}

// TestQuantClampInKernel is TestQuantClamp with the clamped element inside
// a bucket's whole groups of 8, where the inner loop (quantKernel), not the
// per-element head and tail, encodes it: the generic loop takes a separate
// path for the rare block that needs the clamp.
func TestQuantClampInKernel(t *testing.T) {
	const bucket = 4096
	for _, bits := range []uint{8, 4, 2} {
		levels := int32(1)<<bits - 1
		key, hit := Key{Bucket: 5}, -1
		for hit < 0 {
			key.Step++
			st := NewRandomStream(0, key, DomainRound)
			for i := 8; i < bucket-8 && hit < 0; i++ {
				if int32(float32(float32(levels)+st.Uniform(uint32(i)))) > levels {
					hit = i
				}
			}
		}
		x := make([]float32, bucket)
		x[hit] = 1 // the bucket is {0, 1}: t = L exactly
		spec := fmt.Sprintf("int%d:bucket=%d", bits, bucket)
		p, err := mustParse(t, spec).Compress(nil, x, key)
		if err != nil {
			t.Fatal(err)
		}
		want := refQuantBody(x, bucket, bits, false, 0, key)
		if got := payloadBody(p); !bytes.Equal(got, want) {
			t.Fatalf("%s, step %d, clamped element %d: body differs from the definition at byte %d", spec, key.Step, hit, firstDiff(got, want))
		}
	}
}
