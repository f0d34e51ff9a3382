package overlap

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

// TestVerdicts: BucketStats' Origin, Caution, Guard and GuardThreshold on
// both backends, step by step, every rank alike: codec none, pinned
// decisions under warm-up, the random-k caution, a NaN's fallback (the
// host sends the bucket dense; the device, which keeps no copy to send,
// exchanges it compressed as decided; both skip it under
// FailOnNonFinite). The guard's states are TestAccuracyGuard's, the cost
// model's and verification's origins TestVerifyConverges' and
// TestDeviceEngineVerifies'.
func TestVerdicts(t *testing.T) {
	const ranks = 2
	sizes := []int{300, 40}
	for _, backend := range backends {
		for _, tc := range []struct {
			name    string
			cfg     Config
			nan     bool     // rank 1's bucket 0 holds a NaN at step 1
			origins []Origin // bucket 0's at steps 0, 1, 2 (the device's where device is nil)
			device  []Origin
			caution Caution
		}{
			{name: "codec none", cfg: Config{Spec: "none", Warmup: 2},
				origins: []Origin{OriginCodec, OriginCodec, OriginCodec}},
			{name: "pinned compressed after warm-up", cfg: Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed, Warmup: 2},
				origins: []Origin{OriginWarmup, OriginWarmup, OriginPinned}},
			{name: "pinned dense", cfg: Config{Spec: "int8", Decision: DecideDense, Warmup: 2},
				origins: []Origin{OriginPinned, OriginPinned, OriginPinned}},
			{name: "random-k below its ratio", cfg: Config{Spec: "randomk:0.1", ErrorFeedback: true, Decision: DecideCompressed},
				origins: []Origin{OriginPinned, OriginPinned, OriginPinned}, caution: CautionRandomKRatio},
			{name: "random-k at its ratio", cfg: Config{Spec: "randomk:0.25", ErrorFeedback: true, Decision: DecideCompressed},
				origins: []Origin{OriginPinned, OriginPinned, OriginPinned}},
			{name: "NaN", cfg: Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed}, nan: true,
				origins: []Origin{OriginPinned, OriginFallback, OriginPinned}, device: []Origin{OriginPinned, OriginPinned, OriginPinned}},
			{name: "NaN skipped", cfg: Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed, FailOnNonFinite: true}, nan: true,
				origins: []Origin{OriginPinned, OriginFallback, OriginPinned}},
		} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				g := newBackendRig(t, backend, ranks, sizes, tc.cfg)
				want := tc.origins
				if backend == "device" && tc.device != nil {
					want = tc.device
				}
				for s, origin := range want {
					grads := stepGrads(ranks, s, sizes)
					nan := tc.nan && s == 1
					if nan {
						grads[1][0][7] = float32(math.NaN())
					}
					_, stats, errs := g.try(grads)
					var nf *NonFiniteStepError
					for r, err := range errs {
						if err != nil && !(nan && tc.cfg.FailOnNonFinite && errors.As(err, &nf)) {
							t.Fatalf("step %d rank %d: %v", s, r, err)
						}
					}
					for r := range ranks {
						bs := stats[r].Buckets[0]
						if bs.Origin != origin || bs.Caution != tc.caution || bs.Guard != GuardOff || bs.GuardThreshold != 0 || bs.NonFinite != nan {
							t.Errorf("step %d rank %d: Origin %v, Caution %v, Guard %v, GuardThreshold %v, NonFinite %v; want %v, %v, off, 0, %v (%s)",
								s, r, bs.Origin, bs.Caution, bs.Guard, bs.GuardThreshold, bs.NonFinite, origin, tc.caution, nan, bs.Reason)
						}
					}
				}
			})
		}
	}
}

// TestVerdictNames: each enumeration's names are distinct and non-empty,
// String gives them by value (and says the type past the list), and the
// strategies' and decisions' parse back.
func TestVerdictNames(t *testing.T) {
	check := func(kind string, names []string, past string) {
		t.Helper()
		for i, n := range names {
			if n == "" || slices.Index(names, n) != i {
				t.Errorf("%s %d: name %q empty or repeated in %q", kind, i, n, names)
			}
		}
		if want := fmt.Sprintf("%s(%d)", kind, len(names)); past != want {
			t.Errorf("%s past the list: %q, want %q", kind, past, want)
		}
	}
	check("Strategy", stringsOf(Strategies()), Strategy(len(Strategies())).String())
	check("Decision", stringsOf(Decisions()), Decision(len(Decisions())).String())
	check("Origin", stringsOf(Origins()), Origin(len(Origins())).String())
	check("Caution", stringsOf(Cautions()), Caution(len(Cautions())).String())
	check("GuardState", stringsOf(GuardStates()), GuardState(len(GuardStates())).String())
	for _, s := range Strategies() {
		if got, err := ParseStrategy(s.String()); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v", s, got, err)
		}
	}
	for _, d := range Decisions() {
		if got, err := ParseDecision(d.String()); err != nil || got != d {
			t.Errorf("ParseDecision(%q) = %v, %v", d, got, err)
		}
	}
	if !slices.Contains(stringsOf(Strategies()), "low-rank") || Strategies()[0] != StrategyAuto {
		t.Errorf("Strategies() = %v: want StrategyAuto first and low-rank among them", Strategies())
	}
}

func stringsOf[T interface{ String() string }](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	return out
}
