package overlap

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"
)

// Online verification of the cost model's decisions (DecideAuto only).
// The model predicts from a short probe and a timing at New; on a loaded
// host either can be off by several times. So the engine measures what it
// predicted: a verification window runs the buckets as decided at even
// positions and, at odd ones (the trials), an alternative: every bucket
// dense if all are decided compressed, every bucket compressed if all are
// decided dense, and for a mix both in turn (all dense at positions 1, 5,
// ...; all compressed at 3, 7, ...). Per configuration it records the smallest step time
// seen (from the first Ready to the last bucket's end of decode: what the
// exchanges cost the step, overlap counted), and per bucket and path the
// smallest time the bucket added to a step (for the stats). At the end of
// the window's last step the ranks all-gather their records; every rank
// takes the slowest rank's times and switches to the faster alternative
// when it was measured at least hysteresis faster as a whole. Every rank computes
// the same decisions from the same gathered bytes, so no broadcast is
// needed.
//
// The decision is per step, not per bucket: a bucket's share of a
// pipelined step depends on its neighbours' paths (the first compressed
// bucket pays the pipeline's fill), so per-bucket times measured with all
// buckets flipped do not add up to the time of a mix, and choosing per
// bucket from them made steps slower on the loaded host this was written
// on. Comparing whole configurations, the engine only ever switches to a
// configuration it measured faster, and all dense is an alternative to
// anything compressed: it is never kept slower than dense by more than
// the measurement's noise plus hysteresis. A mix also meets all
// compressed (at 8 ranks on a 1 Gbit/s link a mix measured against all
// dense alone was kept at 0.83× the default step where all compressed took
// 0.72×).
//
// The first window starts with the first step and lasts firstWindowSteps,
// four steps per configuration: a path's first steps are slow (a
// backend's first collectives, buffers touched for the first time; on 4
// gloo ranks the first two compressed steps of a DDP run took 1.5 to 4
// times the later ones, enough for a best of two to keep dense where
// compressed was twice as fast), and the best of four leaves them out.
// Later windows, once both paths have run, last windowSteps. The next
// window starts recheckFirst steps after the first, and each window that
// changes nothing doubles the gap (up to recheckMax), one that switches
// resets it, so trials cost at most 2 steps in recheckFirst and fewer as
// the decision holds.
//
// A trial step is an ordinary step on the other path: a dense step leaves
// the bucket's error-feedback memory untouched (its gradient is delivered
// exactly), a compressed one goes through Begin and Commit as always, so
// error feedback is exact whichever path a step takes.
// VerifyWindow is how many steps the first verification window lasts
// with DecideAuto: an engine's first VerifyWindow steps alternate the
// decided configuration with the alternative, so a benchmark of its
// steady state starts timing after them.
const VerifyWindow = firstWindowSteps

const (
	firstWindowSteps = 8    // decided, alternative, ... : four of each
	windowSteps      = 4    // later windows: decided, alternative, decided, alternative
	recheckFirst     = 100  // steps from the end of the first window to the next
	recheckMax       = 6400 // the longest gap between windows
	hysteresis       = 0.05 // the alternative must be measured this much faster to switch
)

// Paths and configurations, as indices of the measurements.
const (
	densePath = iota
	compressedPath
)

const (
	decidedConfig    = iota
	denseConfig      // every bucket dense
	compressedConfig // every bucket compressed
)

// verifier is the engine's verification schedule and measurements. Its
// schedule advances once per step that ends without a fatal error, which
// every rank sees alike. Times are seconds, 0 for none.
type verifier struct {
	pos   int // position in the current window, or -1 between windows
	size  int // the current (or next) window's steps
	wait  int // between windows: steps until the next one
	gap   int // steps between the end of a window and the next
	steps int // windows completed
	// config is the best step time per configuration (decidedConfig,
	// denseConfig, compressedConfig); best the best time per bucket and
	// path.
	config [3]float64
	best   [][2]float64
}

func newVerifier(buckets int) *verifier {
	return &verifier{size: firstWindowSteps, gap: recheckFirst, best: make([][2]float64, buckets)}
}

// measured reports whether verification records st's times: st is a
// step of a verification window. Every rank answers alike.
func (c *core) measured(st *step) bool { return c.verifying(st) && c.verify.pos >= 0 }

// trial reports whether the step about to start is a trial. e.mu is held.
func (v *verifier) trial() bool { return v.pos >= 0 && v.pos%2 == 1 }

// trialPath returns the path every bucket takes in the trial about to
// start (compressed or not): dense if every bucket is decided compressed,
// compressed if every one is decided dense, and for a mix dense at
// positions 1, 5, ... and compressed at 3, 7, .... e.mu is held.
func (e *core) trialPath() bool {
	some, all := false, true
	for _, b := range e.buckets {
		some = some || b.compressed
		all = all && b.compressed
	}
	switch {
	case all:
		return false
	case !some:
		return true
	}
	return e.verify.pos%4 == 3
}

// configOf returns the configuration of the step about to be recorded
// (the verifier's position not yet advanced). e.mu is held.
func (e *core) configOf() int {
	switch {
	case !e.verify.trial():
		return decidedConfig
	case e.trialPath():
		return compressedConfig
	}
	return denseConfig
}

// keepMin sets *best to t if it has none or t is smaller.
func keepMin(best *float64, t float64) {
	if t = max(t, 1e-9); *best == 0 || t < *best {
		*best = t
	}
}

// spans returns st's buckets as verification measures them (see span).
func (st *step) spans() []span {
	out := make([]span, len(st.runs))
	var first time.Time
	for _, r := range st.runs {
		if !r.readyAt.IsZero() && (first.IsZero() || r.readyAt.Before(first)) {
			first = r.readyAt
		}
	}
	for i, r := range st.runs {
		s := &out[i]
		s.clean = r.fallback == "" && !r.doneAt.IsZero() && (r.outcome == pathCompressed || r.outcome == pathDense)
		if r.outcome == pathCompressed {
			s.path = compressedPath
		}
		if s.clean {
			s.ready, s.done = r.readyAt.Sub(first).Seconds(), r.doneAt.Sub(first).Seconds()
		}
	}
	return out
}

// record keeps a step's time for its configuration, unless a bucket fell
// back to dense or was skipped, and, per bucket, the time it added to the
// step: from the later of its Ready and the previous bucket's end of
// decode to its own end of decode (buckets end in order, on one decode
// stream).
func (v *verifier) record(spans []span, config int) {
	if v.pos < 0 {
		return
	}
	first, prev := 0.0, 0.0
	started, clean := false, true
	for i, s := range spans {
		if !s.clean {
			clean = false
			continue
		}
		from := s.ready
		if !started || from < first {
			first = from
		}
		if started && prev > from {
			from = prev
		}
		started, prev = true, s.done
		keepMin(&v.best[i][s.path], s.done-from)
	}
	if clean && started {
		keepMin(&v.config[config], prev-first)
	}
}

// advance moves the schedule past a step and reports whether that step
// ended a window.
func (v *verifier) advance() bool {
	if v.pos < 0 {
		if v.wait--; v.wait <= 0 {
			v.pos = 0
		}
		return false
	}
	v.pos++
	return v.pos == v.size
}

// verifyStep runs after st's error-feedback memory is settled, when st had
// no fatal failure: it records st's times and, at the end of a window,
// agrees with the other ranks on the measurements (one all-gather, bounded
// by ctx and Config.Timeout) and applies them. A failed agreement is a
// *StepError.
func (e *core) verifyStep(ctx context.Context, st *step) error {
	v := e.verify
	e.mu.Lock()
	config := e.configOf()
	e.mu.Unlock()
	v.record(e.timing.spans(st.spans()), config)
	if !v.advance() {
		return nil
	}
	nc := len(v.config)
	vals := append(v.config[:], make([]float64, 2*len(v.best))...)
	for i, b := range v.best {
		vals[nc+2*i], vals[nc+1+2*i] = b[densePath], b[compressedPath]
	}
	mine := make([]byte, 8*len(vals))
	for i, x := range vals {
		binary.LittleEndian.PutUint64(mine[8*i:], math.Float64bits(x))
	}
	all := make([]byte, e.size*len(mine))
	tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.host.AllGather(tctx, all, mine); err != nil {
		return &StepError{Step: st.num, Bucket: -1, Stage: "verification AllGather", Err: err}
	}
	// The slowest rank's time; 0 where any rank has none.
	for i := range vals {
		worst := 0.0
		for q := range e.size {
			x := math.Float64frombits(binary.LittleEndian.Uint64(all[q*len(mine)+8*i:]))
			if !(x > 0 && x < math.Inf(1)) {
				worst = 0
				break
			}
			worst = max(worst, x)
		}
		vals[i] = worst
	}
	e.mu.Lock()
	// The alternatives the window ran (a mix: both), and the faster.
	decided := vals[decidedConfig]
	var alts []string
	best, to := 0.0, false
	for _, c := range []struct {
		config     int
		compressed bool
	}{{denseConfig, false}, {compressedConfig, true}} {
		if t := vals[c.config]; t > 0 {
			alts = append(alts, fmt.Sprintf("%v all %s", seconds(t), pathName(c.compressed)))
			if best == 0 || t < best {
				best, to = t, c.compressed
			}
		}
	}
	switched := decided > 0 && best > 0 && best < decided*(1-hysteresis)
	verdict := "kept the decisions"
	switch {
	case decided == 0 || best == 0:
		verdict = "incomplete (a configuration had no clean step on some rank), kept the decisions"
	case switched:
		verdict = "switched every bucket to " + pathName(to)
	}
	for i, b := range e.buckets {
		r := st.runs[i]
		if switched {
			b.compressed = to
		}
		b.measDense, b.measComp = seconds(vals[nc+2*i]), seconds(vals[nc+1+2*i])
		b.origin = OriginVerification
		b.reason = fmt.Sprintf("measured: %s (step %v as decided vs %s; this bucket added %v dense, %v compressed); predicted: %s",
			verdict, seconds(decided), strings.Join(alts, ", "), b.measDense, b.measComp, b.predicted)
		r.stats.Switched = switched
		r.stats.Reason, r.stats.MeasuredDense, r.stats.MeasuredCompressed = b.reason, b.measDense, b.measComp
	}
	e.mu.Unlock()
	v.endWindow(switched)
	return nil
}

// endWindow schedules the next window: recheckFirst steps after one that
// switched or after the first, twice the last gap (at most recheckMax)
// otherwise.
func (v *verifier) endWindow(switched bool) {
	v.steps++
	if switched {
		v.gap = recheckFirst
	} else if v.steps > 1 {
		v.gap = min(2*v.gap, recheckMax)
	}
	v.pos, v.wait, v.size = -1, v.gap, windowSteps
	v.config = [3]float64{}
	clear(v.best)
}

func pathName(compressed bool) string {
	if compressed {
		return "compressed"
	}
	return "dense"
}
