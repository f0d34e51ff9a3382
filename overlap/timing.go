package overlap

import (
	"context"
	"time"
)

// timing is where the engine's timing-based decisions take their times
// from: the cost model's link probes and compute measurements at New, and
// verification's step measurements. The engine uses the clock
// (clockTiming); tests inject times, so that what they check is the
// model's arithmetic and every rank's agreement, never the speed of the
// machine they run on. Whatever the times, the ranks take the same
// collective paths: every decision is agreed on by a collective (the cost
// model's broadcast, verification's all-gather).
type timing interface {
	// probe runs one link probe, p's all-reduce of floats float32s on
	// size ranks, and returns its time in seconds.
	probe(ctx context.Context, p prober, size, floats int) (float64, error)
	// paths returns, per stage (encode, between collectives, decode, dense
	// average), the time in seconds of a bucket of each size in ns on p's
	// paths (see prober.timePaths).
	paths(p prober, ns []int) ([4][]float64, error)
	// spans returns the times verification records for a step: measured,
	// the spans the backend measured, or others.
	spans(measured []span) []span
	// trial returns the time of a step of strategy s that chooseShape
	// records: measured, the median it measured, or another.
	trial(s Strategy, measured float64) float64
}

// span is one bucket's share of a step as verification measures it, in
// seconds from the step's first Ready: from the bucket's Ready to the end
// of its decode. clean is false when the bucket fell back to dense, was
// skipped or did not finish; path is densePath or compressedPath.
type span struct {
	ready, done float64
	path        int
	clean       bool
}

// clockTiming is the engine's timing: measured.
type clockTiming struct{}

func (clockTiming) probe(ctx context.Context, p prober, _, floats int) (float64, error) {
	t := time.Now()
	err := p.probeAllReduce(ctx, floats)
	return time.Since(t).Seconds(), err
}

func (clockTiming) paths(p prober, ns []int) ([4][]float64, error) { return p.timePaths(ns) }

func (clockTiming) spans(measured []span) []span { return measured }

func (clockTiming) trial(_ Strategy, measured float64) float64 { return measured }
