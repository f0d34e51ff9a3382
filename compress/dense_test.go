package compress

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestFP16RoundTripExhaustive converts every binary16 value to float32 and back.
func TestFP16RoundTripExhaustive(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := Float32FromFP16(uint16(h))
		got := FP16FromFloat32(f)
		if math.IsNaN(float64(f)) {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, got)
		}
	}
}

// TestFP16NearestEven checks random float32 values against a brute-force
// nearest-even search among the two neighbouring binary16 values.
func TestFP16NearestEven(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(x float32) {
		h := FP16FromFloat32(x)
		if math.Abs(float64(x)) >= 65520 {
			if h&0x7fff != 0x7c00 {
				t.Fatalf("%v: got %#04x, want Inf", x, h)
			}
			return
		}
		got := float64(Float32FromFP16(h))
		// neighbours of the result
		for _, nb := range []uint16{h + 1, h - 1} {
			v := float64(Float32FromFP16(nb))
			if nb&0x7c00 == 0x7c00 || math.IsNaN(v) || (nb^h)&0x8000 != 0 && v != 0 {
				continue
			}
			dg, dn := math.Abs(got-float64(x)), math.Abs(v-float64(x))
			if dn < dg || (dn == dg && h&1 == 1) {
				t.Fatalf("%v (%#08x): got %#04x (%v), neighbour %#04x (%v) is nearer or even", x, math.Float32bits(x), h, got, nb, v)
			}
		}
	}
	for range 1 << 20 {
		check(math.Float32frombits(r.Uint32() & 0xc7ffffff)) // exponents up to 2^16
	}
	for h := 0; h < 0x7c00; h++ { // exact ties between neighbours
		a, b := Float32FromFP16(uint16(h)), Float32FromFP16(uint16(h+1))
		check(float32((float64(a) + float64(b)) / 2))
		check(-float32((float64(a) + float64(b)) / 2))
	}
}

func TestBF16NearestEven(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81}, // above the tie
		{0x7f7fffff, 0x7f80}, // max float32 overflows to Inf
		{0x80000001, 0x8000}, // tiny negative to -0
	}
	for _, c := range cases {
		if got := BF16FromFloat32(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("BF16FromFloat32(%#08x) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}

// TestDenseKernels compares the dense codecs' accelerated conversions
// (dense_amd64.s) with their generic twins, bit for bit, on every sign and
// exponent of float32 with mantissas at and around binary16's and
// bfloat16's rounding boundaries, on random values, and on lengths that
// leave tails; the encoders' finite flags too, and the decoders on every
// 16-bit pattern, setting and adding.
func TestDenseKernels(t *testing.T) {
	if !accelerated(fp16Kernel, fp16Generic) {
		t.Skip("no accelerated dense kernels in this build or on this CPU: nothing to compare")
	}
	r := rand.New(rand.NewPCG(3, 16))
	var x []float32
	// Every high half (sign, exponent, 7 mantissa bits), with low halves
	// that sit on, next to and between the rounding points of both formats.
	lows := []uint32{0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x7fff, 0x8000, 0x8001, 0xffff}
	for hi := range uint32(1 << 16) {
		for _, lo := range lows {
			x = append(x, math.Float32frombits(hi<<16|lo))
		}
		x = append(x, math.Float32frombits(hi<<16|r.Uint32()&0xffff))
	}
	for range 1 << 16 {
		x = append(x, float32(r.NormFloat64()*math.Exp(r.NormFloat64()*8)))
	}
	kernels := []struct {
		name          string
		kernel, twin  func([]byte, []float32) bool
		decode, dtwin func([]float32, []byte, bool)
	}{
		{"fp16", fp16Kernel, fp16Generic, fp16DecodeKernel, fp16DecodeGeneric},
		{"bf16", bf16Kernel, bf16Generic, bf16DecodeKernel, bf16DecodeGeneric},
	}
	for _, k := range kernels {
		got, want := make([]byte, 2*len(x)), make([]byte, 2*len(x))
		// Whole blocks of finite values, then every block of 8 on its own,
		// where the flag says whether that block had a non-finite result.
		for from := 0; from < len(x); from += 8 {
			blk := x[from:min(from+8, len(x))]
			okGot, okWant := k.kernel(got[2*from:], blk), k.twin(want[2*from:], blk)
			if okGot != okWant {
				t.Fatalf("%s: finite %v, generic %v, for %v", k.name, okGot, okWant, blk)
			}
		}
		// One non-finite input in a block of values finite in both formats,
		// at each position: among them the NaNs whose bfloat16 rounding
		// carries out of the word (0x7fffffff + 0x8000).
		for _, bad := range []uint32{0x7f800000, 0xff800000, 0x7f800001, 0x7fc00000, 0x7fffffff, 0xffffffff} {
			for at := range 8 {
				blk := []float32{1, -2, 3.5, 1e-3, -7, 0.25, 1000, -0.5}
				blk[at] = math.Float32frombits(bad)
				if k.kernel(make([]byte, 16), blk) || k.twin(make([]byte, 16), blk) {
					t.Fatalf("%s: %#08x at %d: reported finite", k.name, bad, at)
				}
			}
		}
		for i := 0; i < len(got); i += 2 {
			if math.IsNaN(float64(x[i/2])) {
				continue // a NaN fails the encode whatever its bits
			}
			if got[i] != want[i] || got[i+1] != want[i+1] {
				t.Fatalf("%s: %v (%#08x) -> %#02x%02x, generic %#02x%02x", k.name, x[i/2], math.Float32bits(x[i/2]), got[i+1], got[i], want[i+1], want[i])
			}
		}
		for _, n := range []int{1, 7, 8, 9, 15, 16, 17, 1023, 1024, 1025} {
			from := r.IntN(len(x) - n)
			blk := x[from : from+n]
			a, b := make([]byte, 2*n), make([]byte, 2*n)
			if okA, okB := k.kernel(a, blk), k.twin(b, blk); okA != okB || okA && string(a) != string(b) {
				t.Fatalf("%s: length %d from %d: finite %v vs %v, bytes differ %v", k.name, n, from, okA, okB, string(a) != string(b))
			}
		}
		// Decoding: every 16-bit pattern, set and added to random values.
		in := make([]byte, 2<<16+2*5) // a tail of 5 too
		for h := range 1<<16 + 5 {
			in[2*h], in[2*h+1] = byte(h), byte(h>>8)
		}
		base := make([]float32, len(in)/2)
		for i := range base {
			base[i] = float32(r.NormFloat64())
		}
		for _, add := range []bool{false, true} {
			a, b := slices.Clone(base), slices.Clone(base)
			k.decode(a, in, add)
			k.dtwin(b, in, add)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(math.IsNaN(float64(a[i])) && math.IsNaN(float64(b[i]))) {
					t.Fatalf("%s decode add=%v: %#04x -> %v, generic %v", k.name, add, i&0xffff, a[i], b[i])
				}
			}
		}
	}
}

// TestFirstHalfNonFinite puts an Inf, a NaN and the largest finite value of
// each half format at every position of a body, the words' lanes and the
// tail included, among values with every other exponent.
func TestFirstHalfNonFinite(t *testing.T) {
	for _, f := range []struct {
		mask, largest uint16
	}{{0x7c00, 0x7bff}, {0x7f80, 0x7f7f}} {
		const n = 37
		body := make([]byte, 2*n)
		fill := func() {
			for i := range n {
				low := f.mask & -f.mask
				exp := uint16(i*5) % (f.mask / low) * low // never all ones
				h := exp | uint16(i)&^f.mask | uint16(i%2)<<15
				body[2*i], body[2*i+1] = byte(h), byte(h>>8)
			}
		}
		fill()
		if got := firstHalfNonFinite(body, f.mask); got != -1 {
			t.Fatalf("mask %#04x: finite body, got index %d", f.mask, got)
		}
		for at := range n {
			for _, h := range []uint16{f.mask, f.mask | 1, 0x8000 | f.mask | 0x40, f.largest, 0x8000 | f.largest} {
				fill()
				body[2*at], body[2*at+1] = byte(h), byte(h>>8)
				want := -1
				if h&f.mask == f.mask {
					want = at
				}
				if got := firstHalfNonFinite(body, f.mask); got != want {
					t.Fatalf("mask %#04x: %#04x at %d: got %d, want %d", f.mask, h, at, got, want)
				}
			}
		}
	}
}
