package overlap

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// scheduleSteps runs steps steps of g with the golden-style gradients
// and returns each step's results and rank 0's statistics.
func scheduleSteps(t *testing.T, g *backendRig, sizes []int, from, steps int) ([][][][]float32, []StepStats) {
	t.Helper()
	var results [][][][]float32
	var stats []StepStats
	for s := from; s < from+steps; s++ {
		out, st := g.step(t, stepGrads(g.ranks(), s, sizes))
		results = append(results, out)
		stats = append(stats, st)
	}
	return results, stats
}

// TestSchedule runs a compression warm-up (top-k 0.25 → 0.1 → target
// 0.02, random-k 0.5 → 0.1, and int8 → int4 under SRA) against the
// reference whose codec changes on the same steps while its
// error-feedback memory carries over, bit for bit, on both backends, and
// checks the bytes each phase sends.
func TestSchedule(t *testing.T) {
	const ranks = 3
	sizes := []int{400, 37}
	for _, backend := range backends {
		for _, c := range []struct {
			target   string
			schedule []Phase
		}{
			{"topk:0.02", []Phase{{2, "topk:0.25"}, {1, "topk:0.1"}}},
			{"randomk:0.1", []Phase{{2, "randomk:0.5"}}},
			{"int4", []Phase{{2, "int8"}}},
		} {
			t.Run(backend+"/"+c.target, func(t *testing.T) { testSchedule(t, backend, ranks, sizes, c.target, c.schedule) })
		}
	}
}

// testSchedule is TestSchedule for one backend and schedule.
func testSchedule(t *testing.T, backend string, ranks int, sizes []int, target string, schedule []Phase) {
	cfg := Config{Spec: target, ErrorFeedback: true, Decision: DecideCompressed, Warmup: 1, Schedule: schedule}
	g := newBackendRig(t, backend, ranks, sizes, cfg)
	ref := newRef(t, target, g.refStrategy(), ranks, true)
	specAt := func(s int) string {
		end := cfg.Warmup
		for _, p := range schedule {
			if end += p.Steps; s < end {
				return p.Spec
			}
		}
		return target
	}
	steps := cfg.Warmup + 6
	results, stats := scheduleSteps(t, g, sizes, 0, steps)
	var sent []int64
	for s := range steps {
		grads := stepGrads(ranks, s, sizes)
		var want [][]float32
		if s < cfg.Warmup {
			want = newRef(t, "none", StrategyDense, ranks, false).want(s, grads, nil)
		} else {
			ref.c = compresstest.MustParse(t, specAt(s))
			want = ref.want(s, grads, nil)
		}
		for r := range ranks {
			for b := range sizes {
				if i := sameFloats(results[s][r][b], want[b]); i >= 0 {
					t.Fatalf("step %d (%s) rank %d bucket %d element %d: %v, want %v", s, specAt(s), r, b, i, results[s][r][b][i], want[b][i])
				}
			}
		}
		if s >= cfg.Warmup {
			if !strings.Contains(stats[s].Buckets[0].Reason, "schedule phase") {
				t.Errorf("step %d: reason %q does not name the phase", s, stats[s].Buckets[0].Reason)
			}
			sent = append(sent, stats[s].BytesSent)
		}
	}
	if first, last := sent[0], sent[len(sent)-1]; !(first > last) {
		t.Errorf("bytes per step %v: the warm-up's first phase should send more than the target", sent)
	}
	t.Logf("%s after %s: bytes sent per step by rank 0: %v", target, FormatSchedule(schedule), sent)
	if g.dev == nil {
		return
	}
	for r, e := range g.dev.engines { // every phase's slots freed, once
		if err := e.Close(); err != nil {
			t.Fatalf("rank %d: Close: %v", r, err)
		}
		if n := g.dev.devs[r].Resources().Allocations; n != len(sizes) {
			t.Errorf("rank %d after Close: %d allocations, want the test's %d", r, n, len(sizes))
		}
	}
}

// TestScheduleCheckpoint: a state saved mid-schedule resumes the schedule
// bit-exact (the phase follows the step number the state records), from
// either backend into either; the host and device engines' states after
// the same steps are the same bytes.
func TestScheduleCheckpoint(t *testing.T) {
	sizes := []int{300, 37}
	for _, c := range []struct {
		spec     string
		schedule []Phase
	}{{"topk:0.02", []Phase{{2, "topk:0.25"}, {2, "topk:0.1"}}}, {"int4", []Phase{{2, "int8"}, {2, "int4:bucket=64"}}}} {
		cfg := Config{Spec: c.spec, ErrorFeedback: true, Decision: DecideCompressed, Momentum: 0.5, Schedule: c.schedule}
		states := map[string][][]byte{}
		for _, b := range backends {
			g := newBackendRig(t, b, 3, sizes, cfg)
			scheduleSteps(t, g, sizes, 0, 3) // into phase 1
			states[b] = g.save(t)
		}
		for r := range states["host"] {
			if !bytes.Equal(states["host"][r], states["device"][r]) {
				t.Errorf("%s rank %d: the device engine's state differs from the host engine's", c.spec, r)
			}
		}
		for _, from := range backends {
			a := newBackendRig(t, from, 3, sizes, cfg)
			a.load(t, states[from])
			want, _ := scheduleSteps(t, a, sizes, 3, 3) // through the switch to the target
			for _, to := range backends {
				b := newBackendRig(t, to, 3, sizes, cfg)
				b.load(t, states[from])
				got, _ := scheduleSteps(t, b, sizes, 3, 3)
				for s := range want {
					for r := range want[s] {
						for i := range sizes {
							if j := sameFloats(got[s][r][i], want[s][r][i]); j >= 0 {
								t.Fatalf("%s %s → %s: resumed step %d rank %d bucket %d differs at %d", c.spec, from, to, 3+s, r, i, j)
							}
						}
					}
				}
			}
		}
	}
}

// TestScheduleConfig: schedules the engine refuses, on every rank, and
// ranks that differ in theirs.
func TestScheduleConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Spec: "topk:0.01", Decision: DecideCompressed, Schedule: []Phase{{0, "topk:0.1"}}}, "0 steps"},
		{Config{Spec: "topk:0.01", Decision: DecideCompressed, Schedule: []Phase{{5, "topk:2"}}}, "schedule phase 0"},
		{Config{Spec: "topk:0.01", Decision: DecideCompressed, Schedule: []Phase{{5, "int8"}}}, "a schedule keeps one strategy"},
		{Config{Spec: "topk:0.01", Decision: DecideCompressed, Schedule: []Phase{{5, "topk:0.1:lossless=zstd"}}}, "lossless"},
		{Config{Spec: "none", Decision: DecideCompressed, Schedule: []Phase{{5, "fp16"}}}, "compressing Spec"},
		{Config{Spec: "topk:0.1", Decision: DecideCompressed, Schedule: []Phase{{5, "topk:0.01"}}}, "compresses more than the next"},
		{Config{Spec: "topk:0.01", Decision: DecideCompressed, Schedule: []Phase{{5, "topk:0.05"}, {5, "topk:0.25"}}}, "phase 0 (topk:0.05) compresses more"},
		{Config{Spec: "int4", Decision: DecideCompressed, Schedule: []Phase{{5, "sign"}}}, "compresses more than the next"},
		{Config{Spec: "int8", Strategy: StrategyQuantSRA, Decision: DecideCompressed, Schedule: []Phase{{5, "fp16"}}}, "different kinds of codec"},
		{Config{Spec: "topk:0.01", Strategy: StrategySparseGather, Decision: DecideCompressed, Schedule: []Phase{{5, "randomk:0.5"}}}, "different kinds of codec"},
	} {
		errs := onRanks(group(t, 2), func(r int, cm comm.Comm) error {
			_, err := New(t.Context(), cm, []int{100}, c.cfg)
			return err
		})
		for r, err := range errs {
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v, rank %d: %v; want a *ConfigError saying %q", c.cfg.Schedule, r, err, c.want)
			}
		}
	}
	errs := onRanks(group(t, 2), func(r int, cm comm.Comm) error {
		_, err := New(t.Context(), cm, []int{100}, Config{Spec: "topk:0.01", Decision: DecideCompressed,
			Schedule: []Phase{{5 + r, "topk:0.1"}}})
		return err
	})
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || !strings.Contains(err.Error(), "schedule") {
			t.Errorf("rank %d: %v; want a *ConfigMismatchError on the schedule", r, err)
		}
	}
	for _, s := range []string{"5", "@topk:0.1", "0@topk:0.1", "x@int8", "5@"} {
		if _, err := ParseSchedule(s); err == nil {
			t.Errorf("ParseSchedule(%q) accepted it", s)
		}
	}
	if ps, err := ParseSchedule("100@topk:0.25,50@topk:0.0625"); err != nil || FormatSchedule(ps) != "100@topk:0.25,50@topk:0.0625" {
		t.Errorf("ParseSchedule round trip: %v, %v", ps, err)
	}
}

// TestScheduleCostModel: with DecideAuto the cost model decides for Spec
// (here: compressed on a slow link), the buckets it compresses take the
// schedule's phases exactly as a pinned engine's do, and verification's
// trials start only after the last phase (until the first, the results
// equal the pinned engine's).
func TestScheduleCostModel(t *testing.T) {
	sizes := []int{1 << 12, 300}
	const warmup, steps = 1, 9
	schedule := []Phase{{2, "topk:0.25"}, {2, "topk:0.1"}}
	tm := &fixedTiming{alpha: 200e-6, perByte: 1 / 20e6, enc: line{1e-5, 2e-9}, dec: line{2e-5, 1e-9}, avg: line{1e-6, 1e-10},
		dense: 2e-3, compressed: 1e-3}
	auto := newTimedEngines(t, group(t, 2), sizes, Config{Spec: "topk:0.02", ErrorFeedback: true, Warmup: warmup, Schedule: schedule}, tm)
	pinned := newEngines(t, 2, sizes, Config{Spec: "topk:0.02", ErrorFeedback: true, Warmup: warmup, Schedule: schedule, Decision: DecideCompressed})
	for r, e := range auto {
		if got := e.Compressed(); !slices.Equal(got, []bool{true, true}) {
			t.Fatalf("rank %d: the cost model decided %v on a slow link, want every bucket compressed", r, got)
		}
	}
	end := warmup + 2 + 2 // the first step of Spec's phase
	for s := range steps {
		if s > end+1 {
			t.Fatal("no trial after the schedule")
		}
		grads := stepGrads(2, s, sizes)
		want := clone3(grads)
		stats, errs := runStep(auto, grads, inOrder(len(sizes)))
		mustNoErrors(t, "auto step", errs)
		_, errs = runStep(pinned, want, inOrder(len(sizes)))
		mustNoErrors(t, "pinned step", errs)
		trial := false
		for _, bs := range stats[0].Buckets {
			trial = trial || bs.Trial
		}
		switch {
		case s < end && trial:
			t.Fatalf("step %d, inside the schedule, is a verification trial", s)
		case s == end+1 && !trial:
			t.Fatalf("step %d, the second after the schedule, is not verification's first trial", s)
		case trial:
			return // the other path: from here the memories differ from the pinned engine's
		}
		for r := range grads {
			for b := range sizes {
				if i := sameFloats(grads[r][b], want[r][b]); i >= 0 {
					t.Fatalf("step %d rank %d bucket %d: element %d differs from the pinned engine's (%s)", s, r, b, i, stats[r].Buckets[b].Reason)
				}
			}
		}
	}
}
