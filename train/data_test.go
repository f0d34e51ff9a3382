package train

import (
	"math"
	"slices"
	"testing"
)

func TestDigitsDeterministic(t *testing.T) {
	tr, te, err := Digits(7, 50, 20)
	if err != nil {
		t.Fatal(err)
	}
	tr2, te2, err := Digits(7, 50, 20)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr.X, tr2.X) || !slices.Equal(tr.Y, tr2.Y) || !slices.Equal(te.X, te2.X) {
		t.Fatal("same seed, different data")
	}
	// Example i depends on (seed, i) only, not on the sizes.
	small, smallTest, err := Digits(7, 30, 5)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(small.X, tr.X[:30*Features]) || !slices.Equal(smallTest.X, te.X[:5*Features]) {
		t.Error("a smaller set is not a prefix of the larger one")
	}
	other, _, err := Digits(8, 50, 0)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(other.X, tr.X) {
		t.Error("seeds 7 and 8 give the same data")
	}
	if slices.Equal(te.X, tr.X[:20*Features]) {
		t.Error("test set equals the start of the train set")
	}
	counts := make([]int, Classes)
	for _, y := range tr.Y {
		counts[y]++
	}
	for c, n := range counts {
		if n != 5 {
			t.Errorf("class %d has %d of 50 examples, want 5", c, n)
		}
	}
	var ink float64
	for _, v := range tr.X {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 3 {
			t.Fatalf("pixel value %v", v)
		}
		ink += float64(v)
	}
	// Strokes cover a fair part of the image: the mean is well above the
	// noise's zero mean and below a full image.
	if mean := ink / float64(len(tr.X)); mean < 0.1 || mean > 0.6 {
		t.Errorf("mean pixel %.3f, want strokes on a dark background", mean)
	}
	if _, _, err := Digits(1, -1, 0); err == nil {
		t.Error("negative size accepted")
	}
}

// TestDigitsClassesDiffer checks that the classes are told apart by their
// mean images: each class's test examples are nearest, on average, to the
// mean of the same class's train examples more often than chance.
func TestDigitsClassesDiffer(t *testing.T) {
	tr, te, err := Digits(1, 1000, 500)
	if err != nil {
		t.Fatal(err)
	}
	var means [Classes][Features]float64
	for i, y := range tr.Y {
		for j, v := range tr.Example(i) {
			means[y][j] += float64(v) / float64(tr.Len()/Classes)
		}
	}
	correct := 0
	for i, y := range te.Y {
		best, bestD := 0, math.Inf(1)
		for c := range Classes {
			var d float64
			for j, v := range te.Example(i) {
				d += (float64(v) - means[c][j]) * (float64(v) - means[c][j])
			}
			if d < bestD {
				best, bestD = c, d
			}
		}
		if best == int(y) {
			correct++
		}
	}
	// Nearest class mean is a weak classifier: well above chance (10%),
	// well below perfect on these jittered, noisy images.
	if acc := float64(correct) / float64(te.Len()); acc < 0.3 || acc > 0.95 {
		t.Errorf("nearest-mean accuracy %.2f, want between 0.3 and 0.95", acc)
	}
}
