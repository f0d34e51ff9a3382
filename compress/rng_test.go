package compress

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestDraw32 checks Draw32 and Uniform against rng.go's definition written
// out again, step by step.
func TestDraw32(t *testing.T) {
	for _, seed := range []uint64{0, 1, math.MaxUint64} {
		st := NewRandomStream(seed, Key{Bucket: 5, Step: seed}, DomainRound)
		k0, k1 := uint32(st.base), uint32(st.base>>32)
		for _, i := range []uint32{0, 1, 7, 8, 511, 512, 1 << 31, math.MaxUint32} {
			x := i*0x9e3779b9 + k0
			x = (x ^ x>>16) * 0x7feb352d
			x = (x ^ x>>15 ^ k1) * 0x846ca68b
			want := x ^ x>>16
			if got := st.Draw32(i); got != want {
				t.Errorf("seed %d draw32(%d) = %#x, want %#x", seed, i, got, want)
			}
			if got, want := st.Uniform(i), float32(want>>8)/(1<<24); got != want {
				t.Errorf("seed %d uniform(%d) = %v, want %v", seed, i, got, want)
			}
		}
	}
}

// chiSquare returns the chi-square statistic of counts against equal
// expected counts, and how many standard deviations (√(2·df)) it lies from
// its mean df = len(counts) − 1.
func chiSquare(counts []int) (chi2, z float64) {
	total := 0
	for _, c := range counts {
		total += c
	}
	want := float64(total) / float64(len(counts))
	for _, c := range counts {
		d := float64(c) - want
		chi2 += d * d / want
	}
	df := float64(len(counts) - 1)
	return chi2, (chi2 - df) / math.Sqrt(2*df)
}

// maxChiZ bounds every chi-square test below: a statistic more than 6
// standard deviations from its mean has a probability below 1e-8 for a
// uniform source (the tests are deterministic: the draws are fixed).
const maxChiZ = 6

// TestUniformQuality is the statistical check of the 32-bit lane stream
// that stochastic rounding draws from (rng.go): chi-squares of the top
// bits of uniform(i) along a stream, across neighbouring keys at fixed
// indices, and of consecutive pairs; and the avalanche of hash32.
func TestUniformQuality(t *testing.T) {
	if testing.Short() {
		t.Skip("2^24 draws skipped under -short")
	}
	// Along a stream: top 16 bits of 2^24 consecutive draws, 2^16 bins, 4
	// streams. (draw32 is a bijection of i: draws without replacement
	// from 2^32 values, which moves the expected statistic by −0.7 sd.)
	var st RandomStream
	for s := range uint64(4) {
		st = NewRandomStream(s, Key{Bucket: 1, Step: 2}, DomainRound)
		counts := make([]int, 1<<16)
		for i := range uint32(1 << 24) {
			counts[st.Draw32(i)>>16]++
		}
		chi2, z := chiSquare(counts)
		t.Logf("stream %d, 2^16 bins: chi-square %.0f, %+.2f sd", s, chi2, z)
		if math.Abs(z) > maxChiZ {
			t.Errorf("stream %d, 2^16 bins: chi-square %.0f is %.1f sd from its mean", s, chi2, z)
		}
	}

	// Across streams: index i of 2^16 consecutive steps (and buckets), for
	// 64 indices, top 12 bits, 2^12 bins.
	for _, vary := range []string{"step", "bucket"} {
		counts := make([]int, 1<<12)
		for s := range uint64(1 << 16) {
			key := Key{Bucket: 7, Step: s}
			if vary == "bucket" {
				key = Key{Bucket: s, Step: 9}
			}
			st := NewRandomStream(0, key, DomainRound)
			for i := range uint32(64) {
				counts[st.Draw32(i*4099)>>20]++
			}
		}
		chi2, z := chiSquare(counts)
		t.Logf("across %ss, 2^12 bins: chi-square %.0f, %+.2f sd", vary, chi2, z)
		if math.Abs(z) > maxChiZ {
			t.Errorf("across %ss, 2^12 bins: chi-square %.0f is %.1f sd from its mean", vary, chi2, z)
		}
	}

	// Consecutive pairs: top 6 bits of draws i and i+1, 2^22 pairs, 2^12 bins.
	counts := make([]int, 1<<12)
	for i := range uint32(1 << 22) {
		counts[st.Draw32(2*i)>>26<<6|st.Draw32(2*i+1)>>26]++
	}
	chi2, z := chiSquare(counts)
	t.Logf("pairs, 2^12 bins: chi-square %.0f, %+.2f sd", chi2, z)
	if math.Abs(z) > maxChiZ {
		t.Errorf("pairs, 2^12 bins: chi-square %.0f is %.1f sd from its mean", chi2, z)
	}

	// Avalanche: flipping input bit b of hash32 flips each of the 24
	// uniform bits with probability 1/2. Over 2^14 random inputs per bit
	// the standard deviation of a frequency is 2^-8; lowbias32 is known to
	// deviates by 0.013 at worst here, so the bound is 0.03.
	r := rand.New(rand.NewPCG(11, 12))
	const samples = 1 << 14
	worst := 0.0
	for b := range 32 {
		var flips [24]int
		for range samples {
			x, k1 := r.Uint32(), r.Uint32()
			d := (hash32(x, k1) ^ hash32(x^1<<b, k1)) >> 8
			for d != 0 {
				flips[bits.TrailingZeros32(d)]++
				d &= d - 1
			}
		}
		for o, f := range flips {
			if dev := math.Abs(float64(f)/samples - 0.5); dev > worst {
				worst = dev
				if dev > 0.03 {
					t.Errorf("avalanche: input bit %d flips uniform bit %d with probability %.3f", b, o, float64(f)/samples)
				}
			}
		}
	}
	t.Logf("avalanche: worst deviation from 1/2 is %.4f", worst)
}
