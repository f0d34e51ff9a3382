package overlap

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
)

// Online verification of the cost model's decisions (DecideAuto only).
// The model predicts from a short probe and a timing at New; on a loaded
// host either can be off by several times. So the engine measures what it
// predicted: a verification window of windowSteps steps runs every bucket
// on its decided path at even positions and on the other path at odd ones
// (the trials), records per bucket and path the smallest time seen
// (compress + exchange + decompress of that bucket, on this rank), and at
// the end of the window's last step the ranks all-gather their records;
// every rank takes, per bucket and path, the slowest rank's time, and keeps
// the decided path unless the other one was measured at least hysteresis
// faster. Every rank computes the same decisions from the same gathered
// bytes, so no broadcast is needed. The first window starts with the first
// step; the next one recheckFirst steps after it, and each window that
// changes nothing doubles the gap (up to recheckMax), one that switches a
// bucket resets it, so trials cost at most 2 steps in recheckFirst and
// fewer as the decision holds.
//
// A trial step is an ordinary step on the other path: a dense step leaves
// the bucket's error-feedback memory untouched (its gradient is delivered
// exactly), a compressed one goes through Begin and Commit as always, so
// error feedback is exact whichever path a step takes.
const (
	windowSteps  = 4    // decided, other, decided, other
	recheckFirst = 100  // steps from the end of the first window to the next
	recheckMax   = 6400 // the longest gap between windows
	hysteresis   = 0.05 // the other path must be measured this much faster to switch
)

// Paths, as indices of the measurements.
const (
	densePath = iota
	compressedPath
)

// verifier is the engine's verification schedule and measurements. Its
// schedule advances once per step that ends without a fatal error, which
// every rank sees alike.
type verifier struct {
	pos   int // position in the current window, or -1 between windows
	wait  int // between windows: steps until the next one
	gap   int // steps between the end of a window and the next
	best  [][2]float64
	steps int // windows completed
}

func newVerifier(buckets int) *verifier {
	return &verifier{gap: recheckFirst, best: make([][2]float64, buckets)}
}

// trial reports whether the step about to start runs buckets the other
// way. e.mu is held.
func (v *verifier) trial() bool { return v.pos >= 0 && v.pos%2 == 1 }

// record keeps, per bucket, the smallest time of the path the bucket took
// in st: compress + exchange + decompress, in seconds. A bucket that fell
// back to dense or was skipped is not recorded.
func (v *verifier) record(st *step) {
	if v.pos < 0 {
		return
	}
	for i, r := range st.runs {
		path := densePath
		switch {
		case r.fallback != "" || r.outcome == pathNone || r.outcome == pathSkipped:
			continue
		case r.outcome == pathCompressed:
			path = compressedPath
		}
		t := (r.stats.Compress + r.stats.Exchange + r.stats.Decompress).Seconds()
		if b := &v.best[i][path]; *b == 0 || t < *b {
			*b = max(t, 1e-9)
		}
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
	return v.pos == windowSteps
}

// verifyStep runs after st's error-feedback memory is settled, when st had
// no fatal failure: it records st's times and, at the end of a window,
// agrees with the other ranks on the measured winners (one all-gather,
// bounded by ctx and Config.Timeout) and applies them. A failed
// agreement is a *StepError.
func (e *Engine) verifyStep(ctx context.Context, st *step) error {
	v := e.verify
	v.record(st)
	if !v.advance() {
		return nil
	}
	mine := make([]byte, 16*len(e.buckets))
	for i, b := range v.best {
		binary.LittleEndian.PutUint64(mine[16*i:], math.Float64bits(b[densePath]))
		binary.LittleEndian.PutUint64(mine[16*i+8:], math.Float64bits(b[compressedPath]))
	}
	all := make([]byte, e.size*len(mine))
	tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.c.AllGather(tctx, all, mine); err != nil {
		return &StepError{Step: st.num, Bucket: -1, Stage: "verification AllGather", Err: err}
	}
	// Per bucket and path the slowest rank's best; 0 where any rank has none.
	for i := range v.best {
		for p := range v.best[i] {
			worst := 0.0
			for q := range e.size {
				x := math.Float64frombits(binary.LittleEndian.Uint64(all[q*len(mine)+16*i+8*p:]))
				if x <= 0 || !(x < math.Inf(1)) {
					worst = 0
					break
				}
				worst = max(worst, x)
			}
			v.best[i][p] = worst
		}
	}
	e.mu.Lock()
	switched := false
	for i, b := range e.buckets {
		r := st.runs[i]
		if e.apply(b, v.best[i]) {
			switched = true
			r.stats.Switched = true
		}
		r.stats.Reason, r.stats.MeasuredDense, r.stats.MeasuredCompressed = b.reason, b.measDense, b.measComp
	}
	e.mu.Unlock()
	v.endWindow(switched)
	return nil
}

// endWindow schedules the next window: recheckFirst steps after one that
// switched a bucket or after the first, twice the last gap (at most
// recheckMax) otherwise.
func (v *verifier) endWindow(switched bool) {
	v.steps++
	if switched {
		v.gap = recheckFirst
	} else if v.steps > 1 {
		v.gap = min(2*v.gap, recheckMax)
	}
	v.pos, v.wait = -1, v.gap
	clear(v.best)
}

// apply sets bucket b's path from its agreed measurements (seconds, dense
// and compressed; 0: not measured) and reports whether it switched. e.mu
// is held.
func (e *Engine) apply(b *bucket, best [2]float64) bool {
	d, c := best[densePath], best[compressedPath]
	if d == 0 || c == 0 {
		b.reason = fmt.Sprintf("verification incomplete (a path was not measured on every rank), kept %s; %s", pathName(b.compressed), b.predicted)
		return false
	}
	b.measDense, b.measComp = seconds(d), seconds(c)
	cur, other := d, c
	if b.compressed {
		cur, other = c, d
	}
	was := b.compressed
	if other < cur*(1-hysteresis) {
		b.compressed = !b.compressed
	}
	verb := "kept"
	if b.compressed != was {
		verb = "switched to"
	}
	b.reason = fmt.Sprintf("measured: %s %s (compressed %v vs dense %v, slowest rank's best over the window); predicted: %s",
		verb, pathName(b.compressed), b.measComp, b.measDense, b.predicted)
	return b.compressed != was
}

func pathName(compressed bool) string {
	if compressed {
		return "compressed"
	}
	return "dense"
}
