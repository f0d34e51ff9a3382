package bench

import (
	"fmt"

	"github.com/gradcomp/gradcomp/internal/synth"
)

// Scale is the typical magnitude of a synthetic gradient element (the
// Laplace mean |x|).
const Scale = synth.Scale

// Distribution is a law synthetic gradients are drawn from (package
// internal/synth, which netbench and the tests share).
type Distribution = synth.Distribution

// Distributions lists the built-in distributions; "mixture" is the CLI's
// default.
func Distributions() []Distribution { return synth.Distributions() }

// DistributionByName returns the built-in distribution called name.
func DistributionByName(name string) (Distribution, error) {
	d, err := synth.ByName(name)
	if err != nil {
		return d, fmt.Errorf("bench: %w", err)
	}
	return d, nil
}

// Generate returns n values drawn from d, a function of (d, n, seed) alone.
func Generate(d Distribution, n int, seed uint64) []float32 { return synth.Generate(d, n, seed) }
