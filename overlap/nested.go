package overlap

import (
	"context"
	"errors"

	"github.com/gradcomp/gradcomp/compress"
)

// acrossNodes is what the backends of the sharded StrategyHier share, on
// the host (hierBackend) and on the device (devHier): the engine across
// nodes, whose core keeps every bucket's decision, memories, velocities
// and state (per shard), and whose step the outer step runs inside
// (step.nested).
type acrossNodes struct {
	inner *core // the engine across nodes' core (its backend: inner.be)
}

// nestedCore returns the core of the engine across nodes.
func (a acrossNodes) nestedCore() *core { return a.inner }

// prepare: the engine across nodes prepares its own buckets.
func (a acrossNodes) prepare(*bucket) error { return nil }

// endNested ends the step across nodes of st, if it began (its Wait),
// whose failure, but for a *NonFiniteStepError, fails st, and returns
// st's failure.
func (a acrossNodes) endNested(ctx context.Context, st *step) error {
	if st.nested != nil {
		res, err := a.inner.Wait(ctx)
		st.nestedResult = res
		var nf *NonFiniteStepError
		if err != nil && !errors.As(err, &nf) {
			st.fail(&StepError{Step: st.num, Bucket: -1, Stage: "step across nodes", Err: err})
		}
	}
	return st.failure()
}

// conclude takes each bucket's outcome and statistics from the step across
// nodes, which the backend's wait ended (st.nestedResult).
func (a acrossNodes) conclude(st *step) error {
	for i, r := range st.runs {
		ir := st.nested.runs[i]
		s := st.nestedResult.Buckets[i]
		r.outcome, r.nonFinite, r.heldBack = ir.outcome, ir.nonFinite, ir.heldBack
		r.stats.Reason += "; across nodes: " + s.Reason
		r.stats.BytesSent += s.BytesSent
		r.stats.Exchange += s.Exchange
		r.stats.Compress, r.stats.Decompress = s.Compress, s.Decompress
		r.stats.PredictedDense, r.stats.PredictedCompressed = s.PredictedDense, s.PredictedCompressed
		r.stats.MeasuredDense, r.stats.MeasuredCompressed = s.MeasuredDense, s.MeasuredCompressed
		r.stats.Trial, r.stats.Switched, r.stats.Guarded = s.Trial, s.Switched, s.Guarded
		r.stats.Guard, r.stats.Origin, r.stats.Caution = s.Guard, s.Origin, s.Caution
		if ir.outcome == pathSkipped {
			r.fallback = ir.fallback // core.finish's *NonFiniteStepError lists it
		}
	}
	return nil
}

// settle: the step across nodes settled its memories in its Wait.
func (a acrossNodes) settle(*step, stepEnd) {}

func (a acrossNodes) memory(call string) (gradEF, partEF *compress.ErrorFeedback, err error) {
	return a.inner.be.memory(call)
}

func (a acrossNodes) install(gradEF, partEF *compress.ErrorFeedback) error {
	return a.inner.be.install(gradEF, partEF)
}

func (a acrossNodes) velocity(i int) ([]float32, error) { return a.inner.be.velocity(i) }

func (a acrossNodes) setVelocity(us [][]float32) error { return a.inner.be.setVelocity(us) }

// usePhase: the engine across nodes runs the schedule.
func (a acrossNodes) usePhase() {}

// nester is a backend that runs an engine across nodes (acrossNodes).
type nester interface{ nestedCore() *core }
