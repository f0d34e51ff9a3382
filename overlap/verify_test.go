package overlap

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// gatherDelay makes the compressed path's collectives (all-gather,
// all-to-all) slow and leaves the dense all-reduce fast: a link on which
// dense wins whatever the model predicted.
type gatherDelay struct {
	comm.Comm
	d time.Duration
}

func (g *gatherDelay) AllGather(ctx context.Context, dst, src []byte) error {
	err := g.Comm.AllGather(ctx, dst, src)
	time.Sleep(g.d)
	return err
}

func (g *gatherDelay) AllToAll(ctx context.Context, dst, src []byte) error {
	err := g.Comm.AllToAll(ctx, dst, src)
	time.Sleep(g.d)
	return err
}

// TestVerifySchedule: a first window of firstWindowSteps steps at step 0,
// then windows of windowSteps after gaps of recheckFirst, doubling while
// nothing switches, reset by a switch; trials at the windows' odd
// positions.
func TestVerifySchedule(t *testing.T) {
	v := newVerifier(1)
	var starts, trials []int
	switches := map[int]bool{2: true} // the third window switches
	windows := 0
	for step := range 1200 {
		if v.pos == 0 {
			starts = append(starts, step)
		}
		if v.trial() {
			trials = append(trials, step)
		}
		if v.advance() {
			v.endWindow(switches[windows])
			windows++
		}
	}
	// 0; +8+100; +4+200; switched: +4+100; +4+200; +4+400.
	if want := []int{0, 108, 312, 416, 620, 1024}; !slices.Equal(starts, want) {
		t.Errorf("windows start at %v, want %v", starts, want)
	}
	if want := []int{1, 3, 5, 7, 109, 111}; !slices.Equal(trials[:6], want) {
		t.Errorf("trials at %v, want %v first", trials, want)
	}
}

// TestVerifyConverges: whatever the model predicted, after the first
// window every rank runs the buckets on the path measured faster, the
// window's last step reports the switch, and the trials are in the stats.
func TestVerifyConverges(t *testing.T) {
	sizes := []int{1 << 14, 1 << 13}
	for _, tc := range []struct {
		name string
		tm   *fixedTiming // the measured step times
		want bool         // compressed
	}{
		{"compressed measured faster", &fixedTiming{dense: 2e-3, compressed: 1e-3}, true},
		{"dense measured faster", &fixedTiming{dense: 1e-3, compressed: 2e-3}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engines := newTimedEngines(t, group(t, 2), sizes, Config{Spec: "topk:0.01", ErrorFeedback: true}, tc.tm)
			for _, e := range engines { // predict the wrong path
				for _, b := range e.buckets {
					b.compressed = !tc.want
				}
			}
			for step := range firstWindowSteps + 2 {
				stats, errs := runStep(engines, stepGrads(2, step, sizes), inOrder(len(sizes)))
				mustNoErrors(t, "step", errs)
				trial := step < firstWindowSteps && step%2 == 1
				for r, s := range stats {
					for i, bs := range s.Buckets {
						decided := tc.want
						if step < firstWindowSteps {
							decided = !tc.want
						}
						if bs.Trial != trial || bs.Compressed != (decided != trial) {
							t.Errorf("step %d, rank %d, bucket %d: trial %v compressed %v, want %v %v", step, r, i, bs.Trial, bs.Compressed, trial, decided != trial)
						}
						origin := OriginVerification
						switch {
						case trial:
							origin = OriginTrial
						case step < firstWindowSteps:
							origin = OriginCostModel
						}
						if bs.Origin != origin {
							t.Errorf("step %d, rank %d, bucket %d: Origin %v, want %v", step, r, i, bs.Origin, origin)
						}
						if step == firstWindowSteps-1 {
							faster := bs.MeasuredCompressed < bs.MeasuredDense
							if !bs.Switched || faster != tc.want || !strings.HasPrefix(bs.Reason, "measured: switched every bucket to "+pathName(tc.want)) ||
								!strings.Contains(bs.Reason, "predicted: cost model: ") || bs.MeasuredDense != stats[0].Buckets[i].MeasuredDense {
								t.Errorf("window's end, rank %d, bucket %d: %+v", r, i, bs)
							}
						}
					}
				}
			}
			for r, e := range engines {
				if got := e.Compressed(); !slices.Equal(got, []bool{tc.want, tc.want}) {
					t.Errorf("rank %d: decisions %v, want compressed = %v", r, got, tc.want)
				}
			}
		})
	}
}

// TestVerifyMixed: a mix meets both alternatives in turn (all dense at
// trial positions 1 and 5, all compressed at 3 and 7); a mix neither
// alternative beats by hysteresis is kept, and one that all compressed
// beats switches to it.
func TestVerifyMixed(t *testing.T) {
	sizes := []int{1 << 14, 1 << 13}
	for _, tc := range []struct {
		name string
		tm   *fixedTiming
		want []bool
	}{
		// Compressed buckets add 1 ms, dense 1.02: all dense is slower
		// than the mix, all compressed 1 % faster: the mix is kept.
		{"kept", &fixedTiming{dense: 1.02e-3, compressed: 1e-3}, []bool{true, false}},
		// Dense 2 ms, compressed 1: all compressed takes 2 ms against the
		// mix's 3.
		{"to all compressed", &fixedTiming{dense: 2e-3, compressed: 1e-3}, []bool{true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engines := newTimedEngines(t, group(t, 2), sizes, Config{Spec: "topk:0.01", ErrorFeedback: true}, tc.tm)
			for _, e := range engines {
				e.buckets[0].compressed, e.buckets[1].compressed = true, false
			}
			for step := range firstWindowSteps {
				stats, errs := runStep(engines, stepGrads(2, step, sizes), inOrder(len(sizes)))
				mustNoErrors(t, "step", errs)
				trial := step%2 == 1
				for i, bs := range stats[0].Buckets {
					want := i == 0 && !trial || trial && step%4 == 3
					if bs.Trial != trial || bs.Compressed != want {
						t.Errorf("step %d, bucket %d: trial %v compressed %v, want %v %v", step, i, bs.Trial, bs.Compressed, trial, want)
					}
					if step == firstWindowSteps-1 && (!strings.Contains(bs.Reason, "all dense, ") || !strings.Contains(bs.Reason, "all compressed;")) {
						t.Errorf("window's end, bucket %d: reason %q, want both alternatives' times", i, bs.Reason)
					}
				}
			}
			for r, e := range engines {
				if got := e.Compressed(); !slices.Equal(got, tc.want) {
					t.Errorf("rank %d: decisions %v, want %v", r, got, tc.want)
				}
			}
		})
	}
}

// TestVerifyPinned: pinned decisions are never verified or changed.
func TestVerifyPinned(t *testing.T) {
	sizes := []int{1 << 10}
	comms := group(t, 2)
	for r, c := range comms {
		comms[r] = &gatherDelay{Comm: c, d: time.Millisecond}
	}
	engines := newEnginesOn(t, comms, sizes, Config{Spec: "topk:0.01", ErrorFeedback: true, Decision: DecideCompressed})
	for step := range firstWindowSteps + 1 {
		stats, errs := runStep(engines, stepGrads(2, step, sizes), inOrder(1))
		mustNoErrors(t, "step", errs)
		if bs := stats[0].Buckets[0]; !bs.Compressed || bs.Trial || bs.Switched || bs.Reason != "pinned: compressed" {
			t.Errorf("step %d: %+v", step, bs)
		}
	}
}

// TestVerifyErrorFeedbackExact: a bucket that alternates between dense and
// compressed steps (the verification window) gives, bit for bit, the
// averages and the error-feedback memories (both of SRA's) of pinned
// engines taking the same path each step with the memory handed over
// through Save and Load.
func TestVerifyErrorFeedbackExact(t *testing.T) {
	const ranks = 3
	sizes := []int{3001}
	cfg := Config{Spec: "int4", Strategy: StrategyQuantSRA, ErrorFeedback: true}
	auto := newEngines(t, ranks, sizes, cfg)
	cfg.Decision = DecideCompressed
	comp := newEngines(t, ranks, sizes, cfg)
	cfg.Decision = DecideDense
	dense := newEngines(t, ranks, sizes, cfg)
	var prev []*Engine
	paths := ""
	for step := range firstWindowSteps + 2 {
		grads := stepGrads(ranks, step, sizes)
		stats, errs := runStep(auto, grads, inOrder(1))
		mustNoErrors(t, "auto step", errs)
		ref := dense
		paths += pathName(stats[0].Buckets[0].Compressed)[:1]
		if stats[0].Buckets[0].Compressed {
			ref = comp
		}
		if prev != nil && &prev[0] != &ref[0] {
			for r := range ranks { // hand the memory over
				var buf bytes.Buffer
				if err := prev[r].Save(&buf); err != nil {
					t.Fatal(err)
				}
				if err := ref[r].Load(&buf); err != nil {
					t.Fatal(err)
				}
			}
		}
		prev = ref
		want := stepGrads(ranks, step, sizes)
		_, errs = runStep(ref, want, inOrder(1))
		mustNoErrors(t, "reference step", errs)
		for r := range ranks {
			if i := sameFloats(grads[r][0], want[r][0]); i >= 0 {
				t.Fatalf("step %d (%s), rank %d: element %d is %v, reference %v", step, paths, r, i, grads[r][0][i], want[r][0][i])
			}
		}
	}
	if !strings.Contains(paths, "dc") || !strings.Contains(paths, "cd") {
		t.Fatalf("paths %s: want switches both ways", paths)
	}
	for r := range ranks {
		var a, b bytes.Buffer
		if err := auto[r].Save(&a); err != nil {
			t.Fatal(err)
		}
		if err := prev[r].Save(&b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Errorf("rank %d: saved state differs from the reference's (paths %s)", r, paths)
		}
	}
	t.Logf("paths %s", paths)
}
