package overlap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
)

// memoryOf returns rank r's error-feedback memories of bucket i on rig g
// (copies; nil where there is none): stage 1, and SRA's stage 2.
func memoryOf(t *testing.T, g *backendRig, r, i int) (e1, e2 []float32) {
	t.Helper()
	gradEF, partEF, err := g.core(r).be.memory("test")
	if err != nil {
		t.Fatal(err)
	}
	if gradEF != nil {
		e1 = gradEF.Residual(uint64(i))
	}
	if partEF != nil {
		e2 = partEF.Residual(uint64(i))
	}
	return e1, e2
}

// TestFeedbackDecayHandComputed runs top-k (k = 1 of 4) with β = 1/2 on 1
// and 2 ranks of both backends, for gradients whose every step is worked
// out by hand below: the averages and each rank's memory after every step
// are those numbers, exactly (they are dyadic: no rounding anywhere).
//
//	rank 0: g = [4 1 2 −1]  s = g                  sends 4 at 0    e = ½·[0 1 2 −1]   = [0 ½ 1 −½]
//	        g = [1 1 1 1]   s = [1 1½ 2 ½]         sends 2 at 2    e = ½·[1 1½ 0 ½]   = [½ ¾ 0 ¼]
//	        g = [0 0 0 −3]  s = [½ ¾ 0 −2¾]        sends −2¾ at 3  e = ½·[½ ¾ 0 0]    = [¼ ⅜ 0 0]
//	rank 1: g = [0 −2 0 1]  s = g                  sends −2 at 1   e = ½·[0 0 0 1]    = [0 0 0 ½]
//	        g = [1 1 1 1]   s = [1 1 1 1½]         sends 1½ at 3   e = ½·[1 1 1 0]    = [½ ½ ½ 0]
//	        g = [0 0 0 −3]  s = [½ ½ ½ −3]         sends −3 at 3   e = ½·[½ ½ ½ 0]    = [¼ ¼ ¼ 0]
func TestFeedbackDecayHandComputed(t *testing.T) {
	grads := [][][]float32{ // [rank][step]
		{{4, 1, 2, -1}, {1, 1, 1, 1}, {0, 0, 0, -3}},
		{{0, -2, 0, 1}, {1, 1, 1, 1}, {0, 0, 0, -3}},
	}
	memory := [][][]float32{ // [rank][step]
		{{0, 0.5, 1, -0.5}, {0.5, 0.75, 0, 0.25}, {0.25, 0.375, 0, 0}},
		{{0, 0, 0, 0.5}, {0.5, 0.5, 0.5, 0}, {0.25, 0.25, 0.25, 0}},
	}
	average := map[int][][]float32{ // ranks → [step]
		1: {{4, 0, 0, 0}, {0, 0, 2, 0}, {0, 0, 0, -2.75}},
		2: {{2, -1, 0, 0}, {0, 0, 1, 0.75}, {0, 0, 0, -2.875}},
	}
	for _, backend := range backends {
		for _, ranks := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/%d", backend, ranks), func(t *testing.T) {
				g := newBackendRig(t, backend, ranks, []int{4}, Config{Spec: "topk:0.25", ErrorFeedback: true, Decision: DecideCompressed, FeedbackDecay: 0.5})
				for s := range 3 {
					in := make([][][]float32, ranks)
					for r := range ranks {
						in[r] = [][]float32{append([]float32(nil), grads[r][s]...)}
					}
					out, stats := g.steps(t, in)
					for r := range ranks {
						if !stats[r].Buckets[0].Compressed {
							t.Fatalf("step %d rank %d went dense: %s", s, r, stats[r].Buckets[0].Reason)
						}
						if i := sameFloats(out[r][0], average[ranks][s]); i >= 0 {
							t.Errorf("step %d rank %d: average %v, want %v", s, r, out[r][0], average[ranks][s])
						}
						if e, _ := memoryOf(t, g, r, 0); sameFloats(e, memory[r][s]) >= 0 {
							t.Errorf("step %d rank %d: memory %v, want %v", s, r, e, memory[r][s])
						}
					}
				}
			})
		}
	}
}

// TestFeedbackDecayMatchesReference runs every strategy of both backends
// with β = 0.75 against the reference (strategies_test.go's, whose stage-1
// residual is multiplied by float32(β) after each step and whose SRA
// second memory is not): every rank's averages bit for bit over five
// steps, and the stage-1 memories at the end.
func TestFeedbackDecayMatchesReference(t *testing.T) {
	const ranks, steps, beta = 3, 5, 0.75
	sizes := []int{300, 37}
	for _, backend := range backends {
		for _, tc := range []struct {
			spec     string
			strategy Strategy
		}{
			{"topk:0.05", StrategyAuto}, {"randomk:0.1", StrategyAuto}, {"int8", StrategyAuto},
			{"int4:bucket=64", StrategyQuantAllGather}, {"fp16", StrategyAuto}, {"sign:bucket=32", StrategyAuto},
			{"int2:round=nearest", StrategySparseGather},
		} {
			t.Run(backend+"/"+tc.spec+"/"+tc.strategy.String(), func(t *testing.T) {
				g := newBackendRig(t, backend, ranks, sizes, Config{Spec: tc.spec, Strategy: tc.strategy, ErrorFeedback: true,
					Decision: DecideCompressed, FeedbackDecay: beta})
				ref := newRef(t, tc.spec, g.refStrategy(), ranks, true)
				ref.beta = beta
				for s := range steps {
					grads := stepGrads(ranks, s, sizes)
					want := make([][]float32, len(sizes))
					for b := range sizes {
						in := make([][]float32, ranks)
						for r := range in {
							in[r] = append([]float32(nil), grads[r][b]...)
						}
						want[b] = ref.step(s, b, in)
					}
					out, _ := g.steps(t, grads)
					for r := range ranks {
						for b := range sizes {
							if i := sameFloats(out[r][b], want[b]); i >= 0 {
								t.Fatalf("step %d rank %d bucket %d: element %d is %v, want %v", s, r, b, i, out[r][b][i], want[b][i])
							}
						}
					}
				}
				for r := range ranks {
					for b := range sizes {
						if e, _ := memoryOf(t, g, r, b); sameFloats(e, ref.e1[[2]int{r, b}]) >= 0 {
							t.Errorf("rank %d bucket %d: stage-1 memory differs from the reference", r, b)
						}
					}
				}
			})
		}
	}
}

// TestFeedbackDecayFirstStep: from empty memory, one step with β leaves
// exactly float32(β) times the memory one step without decay leaves (the
// inputs are the same: e = 0), each element one product; SRA's second
// memory is the same with and without decay. Every strategy, low-rank
// included, on both backends; the sharded hier engine's memory across
// nodes (its per-shard first memory) likewise, on the host.
func TestFeedbackDecayFirstStep(t *testing.T) {
	const ranks, beta = 3, 0.6
	sizes := []int{300, 200}
	shapes := [][]Shape{{{20, 15}}, {{10, 20}}}
	for _, backend := range backends {
		for _, spec := range []string{"topk:0.05", "randomk:0.1", "int8", "int4:round=nearest", "fp16", "powersgd:2"} {
			t.Run(backend+"/"+spec, func(t *testing.T) {
				cfg := Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Shapes: shapes}
				plain := newBackendRig(t, backend, ranks, sizes, cfg)
				cfg.FeedbackDecay = beta
				decayed := newBackendRig(t, backend, ranks, sizes, cfg)
				grads := stepGrads(ranks, 0, sizes)
				a, _ := plain.steps(t, clone3(grads))
				b, _ := decayed.steps(t, clone3(grads))
				for r := range ranks {
					for i := range sizes {
						if j := sameFloats(a[r][i], b[r][i]); j >= 0 {
							t.Fatalf("rank %d bucket %d: the first step's average differs at %d", r, i, j)
						}
						p1, p2 := memoryOf(t, plain, r, i)
						d1, d2 := memoryOf(t, decayed, r, i)
						want := scaled(p1, beta)
						if len(p1) == 0 || len(d1) != len(want) || sameBits(d1, want) >= 0 {
							t.Errorf("rank %d bucket %d: stage-1 memory is not float32(β)·the undecayed one", r, i)
						}
						if sameBits(d2, p2) >= 0 || len(d2) != len(p2) {
							t.Errorf("rank %d bucket %d: the second memory (SRA's, low-rank's warm start) was decayed", r, i)
						}
					}
				}
			})
		}
	}
	t.Run("host/hier", func(t *testing.T) {
		sizes := []int{1000, 37}
		run := func(beta float64) *Engine {
			comms, err := inproc.NewNodeGroup([]int{0, 0, 1, 1})
			if err != nil {
				t.Fatal(err)
			}
			engines := make([]*Engine, len(comms))
			errs := onRanks(comms, func(r int, c comm.Comm) error {
				var err error
				engines[r], err = New(context.Background(), c, sizes, Config{Spec: "int8", Strategy: StrategyHier, ErrorFeedback: true,
					Decision: DecideCompressed, FeedbackDecay: beta})
				return err
			})
			mustNoErrors(t, "New", errs)
			t.Cleanup(func() {
				for _, e := range engines {
					e.Close()
				}
			})
			_, errs = runStep(engines, stepGrads(len(engines), 0, sizes), inOrder(len(sizes)))
			mustNoErrors(t, "step", errs)
			return engines[0]
		}
		p, d := run(0), run(beta)
		if p.hier == nil || d.hier == nil {
			t.Fatal("not the sharded hier shape")
		}
		for i := range sizes {
			want := scaled(residuals(p.hier.inner, i), beta)
			if got := residuals(d.hier.inner, i); len(want) == 0 || len(got) != len(want) || sameBits(got, want) >= 0 {
				t.Errorf("bucket %d: the shard's memory across nodes is not float32(β)·the undecayed one", i)
			}
		}
	})
}

// scaled is float32(beta)·x, element by element.
func scaled(x []float32, beta float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(beta) * v
	}
	return out
}

// TestFeedbackDecayConservation checks what decay keeps, exactly. With
// error feedback of decay β every rank r keeps, after its compressed
// steps j = 1..k (gradients g_rj, payloads decoded d_rj, memory e_rk),
//
//	Σ_j β^(k−j)·d_rj + e_rk/β = Σ_j β^(k−j)·g_rj
//
// (e_rj = β·(e_r,j−1 + g_rj − d_rj) unrolled; β = 1 is plain error
// feedback's Σ sent + e = Σ g: nothing lost). Summed over the N ranks,
// with Σ_r d_rj = N·a_j for the average a_j every rank receives:
//
//	N·Σ_j β^(k−j)·a_j + Σ_r e_rk/β = Σ_r Σ_j β^(k−j)·g_rj
//
// Top-k sends values as they are, and with β = 1/2 and gradients that are
// multiples of 1/64 below 16 every float32 operation is exact, so both
// sides, summed in float64, agree exactly; int8 (β = 0.9) rounds, and the
// sides agree within its roundings (relative to the bucket's largest
// Σ|β^(k−j)·g|: a quantizer's error is relative to the bucket's range).
func TestFeedbackDecayConservation(t *testing.T) {
	const ranks, steps = 2, 8
	sizes := []int{64, 9}
	dyadic := func(r, s, b, i int) float32 { return float32((r*1000003+s*10007+b*101+i*7919)%2003-1001) / 64 }
	for _, tc := range []struct {
		spec string
		beta float64
		tol  float64 // relative to Σ|β^(k−j)·g|
	}{{"topk:0.1", 0.5, 0}, {"topk:0.1", 1, 0}, {"randomk:0.2", 0.5, 0}, {"int8", 0.9, 1e-6}} {
		for _, backend := range backends {
			t.Run(fmt.Sprintf("%s/%s/β=%v", backend, tc.spec, tc.beta), func(t *testing.T) {
				g := newBackendRig(t, backend, ranks, sizes, Config{Spec: tc.spec, ErrorFeedback: true, Decision: DecideCompressed, FeedbackDecay: tc.beta})
				sent := make([][]float64, len(sizes))  // N·Σ_j β^(k−j)·a_j
				given := make([][]float64, len(sizes)) // Σ_r Σ_j β^(k−j)·g_rj
				scale := make([]float64, len(sizes))   // the largest Σ_r Σ_j |β^(k−j)·g_rj| of each bucket: the tolerance's measure
				for b, n := range sizes {
					sent[b], given[b] = make([]float64, n), make([]float64, n)
				}
				abs := make([][]float64, len(sizes))
				for b, n := range sizes {
					abs[b] = make([]float64, n)
				}
				for s := range steps {
					grads := make([][][]float32, ranks)
					for r := range grads {
						for b, n := range sizes {
							x := make([]float32, n)
							for i := range x {
								x[i] = dyadic(r, s, b, i)
							}
							grads[r] = append(grads[r], x)
						}
					}
					out, _ := g.steps(t, clone3(grads))
					for b := range sizes {
						for i := range sent[b] {
							sent[b][i] = tc.beta*sent[b][i] + ranks*float64(out[0][b][i])
							given[b][i], abs[b][i] = tc.beta*given[b][i], tc.beta*abs[b][i]
							for r := range ranks {
								given[b][i] += float64(grads[r][b][i])
								abs[b][i] += math.Abs(float64(grads[r][b][i]))
							}
							scale[b] = max(scale[b], abs[b][i])
						}
					}
				}
				for b := range sizes {
					kept := make([]float64, len(sent[b]))
					for r := range ranks {
						e, _ := memoryOf(t, g, r, b)
						for i, v := range e {
							kept[i] += float64(v) / tc.beta
						}
					}
					for i := range kept {
						if d := math.Abs(sent[b][i] + kept[i] - given[b][i]); d > tc.tol*scale[b] {
							t.Fatalf("bucket %d element %d: sent %v + kept %v = %v, given %v (off by %v)", b, i, sent[b][i], kept[i], sent[b][i]+kept[i], given[b][i], d)
						}
					}
				}
			})
		}
	}
}

// TestFeedbackDecayUntouched: a step that commits no residual leaves the
// memory as it was, undecayed: a NaN on a rank (Engine's dense fallback,
// DeviceEngine's poisoned average), a step FailOnNonFinite skips, warm-up steps, a failed step (Engine: e + g); an
// accuracy-guard flush empties it.
func TestFeedbackDecayUntouched(t *testing.T) {
	sizes := []int{100, 80}
	const ranks, beta = 3, 0.5
	base := Config{Spec: "topk:0.1", ErrorFeedback: true, Decision: DecideCompressed, FeedbackDecay: beta}
	memories := func(g *backendRig) [][]float32 {
		var out [][]float32
		for r := range ranks {
			for b := range sizes {
				e, _ := memoryOf(t, g, r, b)
				out = append(out, e)
			}
		}
		return out
	}
	same := func(what string, got, want [][]float32) {
		t.Helper()
		for k := range want {
			if len(got[k]) != len(want[k]) || sameBits(got[k], want[k]) >= 0 {
				t.Errorf("%s: rank %d bucket %d's memory changed", what, k/len(sizes), k%len(sizes))
			}
		}
	}
	for _, backend := range backends {
		t.Run(backend+"/fallback and skip", func(t *testing.T) {
			for _, fail := range []bool{false, true} {
				cfg := base
				cfg.FailOnNonFinite = fail
				g := newBackendRig(t, backend, ranks, sizes, cfg)
				g.steps(t, stepGrads(ranks, 0, sizes))
				before := memories(g)
				grads := stepGrads(ranks, 1, sizes)
				for b := range sizes {
					grads[1][b][5] = float32(math.NaN())
				}
				_, stats, errs := g.try(grads)
				var nf *NonFiniteStepError
				for r := range ranks {
					switch {
					case fail && !errors.As(errs[r], &nf):
						t.Fatalf("rank %d: %v, want a *NonFiniteStepError", r, errs[r])
					case !fail && (errs[r] != nil || !stats[r].Buckets[0].NonFinite):
						t.Fatalf("rank %d: %v, non-finite %v; want the NaN reported", r, errs[r], stats[r].Buckets[0].NonFinite)
					}
				}
				same(fmt.Sprintf("FailOnNonFinite %v", fail), memories(g), before)
			}
		})
		t.Run(backend+"/warm-up", func(t *testing.T) {
			g := newBackendRig(t, backend, ranks, sizes, base)
			g.steps(t, stepGrads(ranks, 0, sizes))
			states := g.save(t)
			cfg := base
			cfg.Warmup = 3
			w := newBackendRig(t, backend, ranks, sizes, cfg)
			w.load(t, states) // resumes at step 1: steps 1 and 2 are warm-up steps
			before := memories(w)
			same("the loaded state", before, memories(g))
			for s := 1; s < 3; s++ {
				_, stats := w.step(t, stepGrads(ranks, s, sizes))
				if stats.Buckets[0].Compressed {
					t.Fatalf("step %d is not a warm-up step", s)
				}
			}
			same("warm-up", memories(w), before)
		})
		t.Run(backend+"/guard flush", func(t *testing.T) {
			cfg := base
			cfg.Guard = 1e-3 // trips at once
			g := newBackendRig(t, backend, ranks, sizes, cfg)
			g.steps(t, stepGrads(ranks, 0, sizes))
			_, stats := g.step(t, stepGrads(ranks, 1, sizes))
			if !stats.Buckets[0].Guarded {
				t.Fatalf("step 1 did not flush: %s", stats.Buckets[0].Reason)
			}
			for k, e := range memories(g) {
				if sameBits(e, make([]float32, len(e))) >= 0 {
					t.Errorf("rank %d bucket %d: memory not empty after a flush", k/len(sizes), k%len(sizes))
				}
			}
		})
	}
	t.Run("host/failed step", func(t *testing.T) {
		cfg := base
		cfg.Timeout = 200 * time.Millisecond
		engines := newEngines(t, ranks, sizes, cfg)
		_, errs := runStep(engines, stepGrads(ranks, 0, sizes), inOrder(2))
		mustNoErrors(t, "step 0", errs)
		grads := stepGrads(ranks, 1, sizes)
		want := make([][][]float32, ranks)
		for r, e := range engines {
			for b := range sizes {
				w := residuals(e, b)
				for i := range w {
					w[i] += grads[r][b][i]
				}
				want[r] = append(want[r], w)
			}
		}
		errs = onRanks(make([]comm.Comm, ranks), func(r int, _ comm.Comm) error {
			e := engines[r]
			if err := e.Step(); err != nil || r == 2 {
				return err // rank 2 dies
			}
			for b := range sizes {
				if err := e.Ready(b, grads[r][b]); err != nil {
					return err
				}
			}
			_, err := e.Wait(context.Background())
			return err
		})
		for r := range 2 {
			var se *StepError
			if !errors.As(errs[r], &se) {
				t.Fatalf("rank %d: %v, want a *StepError", r, errs[r])
			}
			for b := range sizes {
				if i := sameFloats(residuals(engines[r], b), want[r][b]); i >= 0 {
					t.Errorf("rank %d bucket %d: memory at %d is %v, want e + g = %v, undecayed", r, b, i, residuals(engines[r], b)[i], want[r][b][i])
				}
			}
		}
	})
}

// TestFeedbackDecayConfig: a β outside (0, 1], one that is 0 as a float32,
// and a β ≠ 1 without error feedback are refused on both backends (and by
// CheckState) with an error naming FeedbackDecay; 0 and 1 are no decay,
// with or without error feedback.
func TestFeedbackDecayConfig(t *testing.T) {
	sizes := []int{16}
	state := savedBy(t, 1, sizes, Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed})
	for _, tc := range []struct {
		cfg  Config
		want string // "": accepted
	}{
		{Config{Spec: "int8", ErrorFeedback: true, FeedbackDecay: math.NaN()}, "FeedbackDecay NaN is not in (0, 1]"},
		{Config{Spec: "int8", ErrorFeedback: true, FeedbackDecay: -0.5}, "FeedbackDecay -0.5 is not in (0, 1]"},
		{Config{Spec: "int8", ErrorFeedback: true, FeedbackDecay: 1.5}, "FeedbackDecay 1.5 is not in (0, 1]"},
		{Config{Spec: "int8", ErrorFeedback: true, FeedbackDecay: math.Inf(1)}, "FeedbackDecay +Inf is not in (0, 1]"},
		{Config{Spec: "int8", ErrorFeedback: true, FeedbackDecay: 1e-50}, "FeedbackDecay 1e-50 rounds to 0 as a float32"},
		{Config{Spec: "int8", FeedbackDecay: 0.9}, "FeedbackDecay 0.9 needs ErrorFeedback"},
		{Config{Spec: "int8", FeedbackDecay: 1}, ""},
		{Config{Spec: "int8"}, ""},
		{Config{Spec: "int8", ErrorFeedback: true, FeedbackDecay: 1}, ""},
		{Config{Spec: "int8", ErrorFeedback: true, FeedbackDecay: math.SmallestNonzeroFloat32}, ""},
	} {
		for _, backend := range backends {
			cfg := tc.cfg
			cfg.Decision = DecideCompressed
			var err error
			if backend == "host" {
				var e *Engine
				if e, err = New(context.Background(), group(t, 1)[0], sizes, cfg); err == nil {
					e.Close()
				}
			} else {
				_, errs := newDevRig(t, sizes, []Config{cfg}, time.Second)
				err = errs[0]
			}
			var ce *ConfigError
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s %+v: %v, want it accepted", backend, tc.cfg, err)
			case tc.want != "" && (!errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%s %+v: %v, want a *ConfigError saying %q", backend, tc.cfg, err, tc.want)
			}
		}
		if tc.want == "" {
			continue
		}
		var ce *ConfigError
		if err := CheckState(state, tc.cfg, sizes, 1, comm.Topology{}); !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckState with %+v: %v, want a *ConfigError saying %q", tc.cfg, err, tc.want)
		}
	}
}

// TestFeedbackDecayHandshake: ranks with different β get the same
// *ConfigMismatchError on every rank, naming "feedback decay" and both
// values, on both backends; FeedbackDecay 0 and 1 agree (no decay).
func TestFeedbackDecayHandshake(t *testing.T) {
	sizes := []int{16}
	cfg := func(beta float64) Config {
		return Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed, FeedbackDecay: beta}
	}
	build := func(backend string, betas ...float64) []error {
		cfgs := make([]Config, len(betas))
		for r, b := range betas {
			cfgs[r] = cfg(b)
		}
		if backend == "device" {
			_, errs := newDevRig(t, sizes, cfgs, 2*time.Second)
			return errs
		}
		return onRanks(group(t, len(betas)), func(r int, c comm.Comm) error {
			e, err := New(context.Background(), c, sizes, cfgs[r])
			if err == nil {
				e.Close()
			}
			return err
		})
	}
	for _, backend := range backends {
		errs := build(backend, 0.9, 0.9, 0.5)
		for r, err := range errs {
			var me *ConfigMismatchError
			if !errors.As(err, &me) || me.Field != "feedback decay" || me.Rank != 2 || me.Value != "0.5" || me.OtherRank != 0 || me.OtherValue != "0.9" {
				t.Errorf("%s rank %d: %v, want a *ConfigMismatchError on feedback decay, rank 2 0.5 against rank 0 0.9", backend, r, err)
			}
			if err != nil && err.Error() != errs[0].Error() {
				t.Errorf("%s rank %d: %v, rank 0 got %v", backend, r, err, errs[0])
			}
		}
		for r, err := range build(backend, 0, 1) {
			if err != nil {
				t.Errorf("%s rank %d: FeedbackDecay 0 against 1: %v, want agreement", backend, r, err)
			}
		}
	}
}

// TestFeedbackDecayCheckpoint: a state records β. Engines restored from
// it, on either backend, continue exactly as the originals; an engine of
// another β refuses it (Load, CheckState and LoadReshaped alike) with a
// *StateError naming the setting and both values, unchanged; a state
// older than version 6 is one of β = 1: it loads where FeedbackDecay is 0
// or 1 and is refused elsewhere; a header whose β is not in (0, 1] is
// refused by InspectState.
func TestFeedbackDecayCheckpoint(t *testing.T) {
	const ranks = 2
	sizes := []int{200, 30}
	cfg := Config{Spec: "topk:0.1", ErrorFeedback: true, Decision: DecideCompressed, FeedbackDecay: 0.8}
	for _, from := range backends {
		for _, to := range backends {
			t.Run(from+" to "+to, func(t *testing.T) {
				a := newBackendRig(t, from, ranks, sizes, cfg)
				for s := range 2 {
					a.steps(t, stepGrads(ranks, s, sizes))
				}
				states := a.save(t)
				b := newBackendRig(t, to, ranks, sizes, cfg)
				b.load(t, states)
				for s := 2; s < 4; s++ {
					want, _ := a.steps(t, stepGrads(ranks, s, sizes))
					got, _ := b.steps(t, stepGrads(ranks, s, sizes))
					for r := range ranks {
						for i := range sizes {
							if j := sameBits(got[r][i], want[r][i]); j >= 0 {
								t.Fatalf("step %d rank %d bucket %d: the restored engine differs at %d", s, r, i, j)
							}
						}
					}
				}
			})
		}
	}
	state := savedBy(t, ranks, sizes, cfg)
	info, err := InspectState(state)
	if err != nil || info.Version != 6 || info.FeedbackDecay != 0.8 {
		t.Fatalf("InspectState = %+v, %v; want version 6 with feedback decay 0.8", info, err)
	}
	refuse := func(what string, state []byte, load Config, saved, current string) {
		t.Helper()
		e := newEngines(t, ranks, sizes, load)
		before := savedMemory(t, e[0])
		err := e[0].Load(bytes.NewReader(state))
		var se *StateError
		want := fmt.Sprintf("saved with feedback decay %s, this engine has %s", saved, current)
		if !errors.As(err, &se) || se.Setting != "feedback decay" || se.Saved != saved || se.Current != current || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Load = %v; want a *StateError saying %q", what, err, want)
		}
		if check := CheckState(state, load, sizes, ranks, comm.Topology{}); check == nil || err == nil || check.Error() != err.Error() {
			t.Errorf("%s: CheckState = %v, want Load's error", what, check)
		}
		if !bytes.Equal(savedMemory(t, e[0]), before) {
			t.Errorf("%s: a refused Load changed the engine", what)
		}
		errs := onRanks(make([]comm.Comm, ranks), func(r int, _ comm.Comm) error {
			return e[r].LoadReshaped(context.Background(), bytes.NewReader(state))
		})
		for r, err := range errs {
			if !errors.As(err, &se) || r == 0 && !strings.Contains(err.Error(), want) {
				t.Errorf("%s: rank %d's LoadReshaped = %v; want a *StateError (rank 0's saying %q)", what, r, err, want)
			}
		}
	}
	other := cfg
	other.FeedbackDecay = 0.5
	refuse("another β", state, other, "0.8", "0.5")
	none := cfg
	none.FeedbackDecay = 0
	refuse("no decay", state, none, "0.8", "1")

	plain := savedBy(t, ranks, sizes, none)
	v5 := downgrade(t, plain, 5)
	if info, err := InspectState(v5); err != nil || info.Version != 5 || info.FeedbackDecay != 1 {
		t.Fatalf("InspectState of a version-5 state = %+v, %v; want feedback decay 1", info, err)
	}
	for _, beta := range []float64{0, 1} {
		c := cfg
		c.FeedbackDecay = beta
		e := newEngines(t, ranks, sizes, c)[0]
		if err := e.Load(bytes.NewReader(v5)); err != nil {
			t.Errorf("a version-5 state into FeedbackDecay %v: %v", beta, err)
		}
	}
	refuse("a version-5 state", v5, cfg, "1", "0.8")

	at := 4 + 1 + 4 + 4 + 8 + 4 + len(info.Spec) + 2 + 1 + 1 + 8 + 4 + 16 // after the layout
	for _, bad := range []float64{0, -1, 2, math.NaN(), math.Inf(1), 1e-50} {
		b := bytes.Clone(state)
		binary.LittleEndian.PutUint64(b[at:], math.Float64bits(bad))
		fixCRC(b)
		var se *StateError
		if _, err := InspectState(b); !errors.As(err, &se) || !strings.Contains(err.Error(), "feedback decay") {
			t.Errorf("a state of feedback decay %v: InspectState = %v, want a *StateError", bad, err)
		}
	}
}
