package overlap

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// scheduleSteps runs steps steps of engines with the golden-style
// gradients and returns each step's results and rank 0's statistics.
func scheduleSteps(t *testing.T, engines []*Engine, sizes []int, from, steps int) ([][][][]float32, []StepStats) {
	t.Helper()
	var results [][][][]float32
	var stats []StepStats
	for s := from; s < from+steps; s++ {
		grads := stepGrads(len(engines), s, sizes)
		st, errs := runStep(engines, grads, inOrder(len(sizes)))
		mustNoErrors(t, "step", errs)
		results = append(results, grads)
		stats = append(stats, st[0])
	}
	return results, stats
}

// TestSchedule runs a compression warm-up (top-k 0.25 → 0.1 → target
// 0.02, and int8 → int4 under SRA) against the reference whose codec
// changes on the same steps while its error-feedback memory carries over,
// bit for bit, and checks the bytes each phase sends.
func TestSchedule(t *testing.T) {
	const ranks = 3
	sizes := []int{400, 37}
	for _, c := range []struct {
		target   string
		schedule []Phase
	}{
		{"topk:0.02", []Phase{{2, "topk:0.25"}, {1, "topk:0.1"}}},
		{"int4", []Phase{{2, "int8"}}},
	} {
		t.Run(c.target, func(t *testing.T) {
			cfg := Config{Spec: c.target, ErrorFeedback: true, Decision: DecideCompressed, Warmup: 1, Schedule: c.schedule}
			engines := newEngines(t, ranks, sizes, cfg)
			ref := newRef(t, c.target, engines[0].Strategy(), ranks, true)
			specAt := func(s int) string {
				end := cfg.Warmup
				for _, p := range c.schedule {
					if end += p.Steps; s < end {
						return p.Spec
					}
				}
				return c.target
			}
			steps := cfg.Warmup + 6
			results, stats := scheduleSteps(t, engines, sizes, 0, steps)
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
			t.Logf("%s after %s: bytes sent per step by rank 0: %v", c.target, FormatSchedule(c.schedule), sent)
		})
	}
}

// TestScheduleCheckpoint: a state saved mid-schedule resumes the schedule
// bit-exact (the phase follows the step number the state records).
func TestScheduleCheckpoint(t *testing.T) {
	sizes := []int{300}
	cfg := Config{Spec: "topk:0.02", ErrorFeedback: true, Decision: DecideCompressed, Schedule: []Phase{{2, "topk:0.25"}, {2, "topk:0.1"}}}
	a := newEngines(t, 2, sizes, cfg)
	scheduleSteps(t, a, sizes, 0, 3) // into phase 1
	b := newEngines(t, 2, sizes, cfg)
	for r := range a {
		var buf bytes.Buffer
		if err := a[r].Save(&buf); err != nil {
			t.Fatal(err)
		}
		if err := b[r].Load(&buf); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := scheduleSteps(t, a, sizes, 3, 3) // through the switch to the target
	got, _ := scheduleSteps(t, b, sizes, 3, 3)
	for s := range want {
		if i := sameFloats(got[s][0][0], want[s][0][0]); i >= 0 {
			t.Fatalf("resumed step %d differs at %d", 3+s, i)
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
		{Config{Spec: "topk:0.01", Schedule: []Phase{{5, "topk:0.1"}}}, "Decision compressed or dense"},
		{Config{Spec: "none", Decision: DecideCompressed, Schedule: []Phase{{5, "fp16"}}}, "compressing Spec"},
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
