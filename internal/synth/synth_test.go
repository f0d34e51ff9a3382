package synth

import (
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestGenerateDeterministic(t *testing.T) {
	const n = 3*genBlock + 17 // several blocks and a partial one
	for _, d := range Distributions() {
		a := Generate(d, n, 7)
		prev := runtime.GOMAXPROCS(1)
		b := Generate(d, n, 7)
		runtime.GOMAXPROCS(prev)
		if !slices.Equal(a, b) {
			t.Errorf("%s: same seed, different values with GOMAXPROCS 1 and %d", d.Name(), prev)
		}
		if short := Generate(d, genBlock+5, 7); !slices.Equal(short, a[:len(short)]) {
			t.Errorf("%s: a shorter gradient is not a prefix of a longer one", d.Name())
		}
		c := Generate(d, n, 8)
		same := 0
		for i := range a {
			if a[i] == c[i] {
				same++
			}
		}
		if same > n/100 {
			t.Errorf("%s: seeds 7 and 8 agree on %d of %d values", d.Name(), same, n)
		}
		for i, v := range a {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 65504 {
				t.Fatalf("%s: value %v at %d is not finite or exceeds fp16's range", d.Name(), v, i)
			}
		}
	}
}

// moments returns the mean |x| and the excess kurtosis of x.
func moments(x []float32) (meanAbs, kurt float64) {
	var s1, s2, s4 float64
	for _, v := range x {
		f := float64(v)
		s1 += math.Abs(f)
		s2 += f * f
	}
	n := float64(len(x))
	variance := s2 / n
	for _, v := range x {
		f := float64(v) * float64(v)
		s4 += f * f
	}
	return s1 / n, s4/n/(variance*variance) - 3
}

// TestGenerateTails checks each distribution's tail against its law: the
// excess kurtosis of 1Mi values is ≈ 0 for the Gaussian, ≈ 3 for Laplace and
// far above for Student-t (ν = 3, infinite in theory) and the mixture.
func TestGenerateTails(t *testing.T) {
	n := 1 << 20
	if testing.Short() {
		n = 1 << 18
	}
	cases := []struct {
		name           string
		kurtLo, kurtHi float64
		absLo, absHi   float64 // bounds of mean |x|
	}{
		{"normal", -0.1, 0.1, 0.79 * Scale, 0.81 * Scale},
		{"laplace", 2.5, 3.5, 0.99 * Scale, 1.01 * Scale},
		{"student-t", 8, math.Inf(1), 0.5 * Scale, 2 * Scale},
		{"mixture", 10, math.Inf(1), 0.5 * Scale, 5 * Scale},
	}
	for _, c := range cases {
		d, err := ByName(c.name)
		if err != nil {
			t.Fatal(err)
		}
		meanAbs, kurt := moments(Generate(d, n, 1))
		t.Logf("%s: mean |x| %.3g, excess kurtosis %.2f", c.name, meanAbs, kurt)
		if kurt < c.kurtLo || kurt > c.kurtHi {
			t.Errorf("%s: excess kurtosis %.2f, want in [%g, %g]", c.name, kurt, c.kurtLo, c.kurtHi)
		}
		if meanAbs < c.absLo || meanAbs > c.absHi {
			t.Errorf("%s: mean |x| %.3g, want in [%.3g, %.3g]", c.name, meanAbs, c.absLo, c.absHi)
		}
	}
}

func TestByName(t *testing.T) {
	if len(Distributions()) == 0 || Distributions()[0].Name() != "mixture" {
		t.Fatalf("the first (default) distribution is not mixture: %v", Distributions())
	}
	_, err := ByName("cauchy")
	if err == nil || !strings.Contains(err.Error(), "cauchy") || !strings.Contains(err.Error(), "laplace") {
		t.Fatalf("ByName(cauchy) error %v: want it to name the input and the valid names", err)
	}
}
