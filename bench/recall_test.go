package bench

import "testing"

func TestRecall(t *testing.T) {
	cases := []struct {
		name           string
		sampled, exact []float32
		want           float64
	}{
		{"identical", []float32{0, 3, 0, -2}, []float32{0, 3, 0, -2}, 1},
		{"half", []float32{1, 0, 0, 5}, []float32{0, 3, 0, 5}, 0.5},
		{"disjoint", []float32{1, 0, 0, 0}, []float32{0, 3, 0, 0}, 0},
		{"sampled keeps more", []float32{1, 2, 3, 4}, []float32{0, 2, 0, 4}, 1},
		{"sampled keeps fewer", []float32{0, 0, 0, 4}, []float32{1, 2, 3, 4}, 0.25},
		{"values differ, positions count", []float32{0, -7, 0, 0}, []float32{0, 3, 0, 0}, 1},
	}
	for _, c := range cases {
		got, err := Recall(c.sampled, c.exact)
		if err != nil || got != c.want {
			t.Errorf("%s: Recall = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := Recall([]float32{1}, []float32{1, 2}); err == nil {
		t.Error("Recall accepted slices of different lengths")
	}
	if _, err := Recall([]float32{1, 2}, []float32{0, 0}); err == nil {
		t.Error("Recall accepted an exact selection with no nonzero element")
	}
}
