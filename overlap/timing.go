package overlap

import (
	"context"
	"time"

	"github.com/gradcomp/gradcomp/comm"
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
	// probe runs one link probe, an all-reduce of buf on c, and returns
	// its time in seconds.
	probe(ctx context.Context, c comm.Comm, buf []float32) (float64, error)
	// paths returns, per stage (encode, between collectives, decode, dense
	// average), the time in seconds of a bucket of each size in ns on e's
	// paths (see timePath).
	paths(e *Engine, ns []int) ([4][]float64, error)
	// spans returns the times verification records for a step: measured,
	// the spans the backend measured, or others.
	spans(measured []span) []span
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

func (clockTiming) probe(ctx context.Context, c comm.Comm, buf []float32) (float64, error) {
	t := time.Now()
	err := c.AllReduce(ctx, buf)
	return time.Since(t).Seconds(), err
}

func (clockTiming) paths(e *Engine, ns []int) ([4][]float64, error) { return timePath(e, ns) }

func (clockTiming) spans(measured []span) []span { return measured }
