package bench

import "fmt"

// Recall returns |S_sampled ∩ S_exact| / |S_exact|, where S_v is the set of
// positions at which v is nonzero. Given the decoded outputs of a sampled
// top-k and of exact top-k over the same input, it is the fraction of the k
// largest magnitudes the sampled selection found. A selected element whose
// value is exactly zero is invisible to both sets (with continuous inputs
// this does not happen). Both slices must have the same length and exact
// must have a nonzero element; otherwise Recall returns an error.
func Recall(sampled, exact []float32) (float64, error) {
	if len(sampled) != len(exact) {
		return 0, fmt.Errorf("bench: recall of %d sampled against %d exact elements: lengths differ", len(sampled), len(exact))
	}
	var k, hit int
	for i, e := range exact {
		if e != 0 {
			k++
			if sampled[i] != 0 {
				hit++
			}
		}
	}
	if k == 0 {
		return 0, fmt.Errorf("bench: recall against an exact top-k with no nonzero element")
	}
	return float64(hit) / float64(k), nil
}
