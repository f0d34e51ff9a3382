package compress

import (
	"math"
	"math/rand/v2"
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
