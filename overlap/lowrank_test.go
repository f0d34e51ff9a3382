package overlap

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
)

// The low-rank tests' buckets: bucket 0 holds two matrices PowerSGD
// compresses at rank 2 and a bias it does not; bucket 1 a 10×10 matrix
// (compressed at rank 2: 100 ≥ 2·20·2) and a bias.
var (
	lowRankShapes = [][]Shape{{{64, 48}, {1, 48}, {32, 16}}, {{10, 10}, {1, 7}}}
	lowRankSizes  = []int{64*48 + 48 + 32*16, 107}
)

func lowRankConfig(spec string) Config {
	return Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Shapes: lowRankShapes}
}

// TestLowRankPlan: which tensors are compressed, where their factors lie,
// and the uncompressed ranges, adjacent ones merged.
func TestLowRankPlan(t *testing.T) {
	spec, _ := compress.ParseSpec("powersgd:4")
	pl := planLowRank([]Shape{{1, 5}, {1, 3}, {100, 20}, {3, 3}, {8, 200}, {2, 2}}, spec)
	// 8×200 at rank 4 saves 1600/(208·4) ≈ 1.92×, under the default 2:
	// it goes uncompressed, with its uncompressed neighbours.
	want := []lowrank.Matrix{{Off: 8, Rows: 100, Cols: 20, R: 4, P: 0, Q: 0, Tensor: 2}}
	if !slices.Equal(pl.Mats, want) {
		t.Errorf("matrices %+v, want %+v", pl.Mats, want)
	}
	if flat := [][2]int{{0, 8}, {2008, 3621}}; !slices.Equal(pl.Flat, flat) {
		t.Errorf("uncompressed ranges %v, want %v", pl.Flat, flat)
	}
	if pl.PLen != 400 || pl.QLen != 80 || pl.FlatLen != 8+9+1600+4 {
		t.Errorf("lengths P %d, Q %d, uncompressed %d", pl.PLen, pl.QLen, pl.FlatLen)
	}
	spec.MinCompression = 1.9
	if pl := planLowRank([]Shape{{8, 200}}, spec); len(pl.Mats) != 1 || pl.PLen != 32 || pl.QLen != 800 {
		t.Errorf("min_compression 1.9: %+v, want the matrix compressed", pl)
	}
	spec.MinCompression = 5
	if pl := planLowRank([]Shape{{100, 20}}, spec); len(pl.Mats) != 0 || pl.FlatLen != 2000 {
		t.Errorf("min_compression 5: %+v, want 100×20 at rank 4 (4.2×) uncompressed", pl)
	}
	spec.Rank, spec.MinCompression = 1000, 0
	if pl := planLowRank([]Shape{{3000, 5}}, spec); len(pl.Mats) != 0 {
		t.Errorf("rank clamped to 5 on 3000×5: %+v, want uncompressed (15000 < 2·3005·5)", pl)
	}
}

// lowRankGrads returns, per rank, gradients whose matrices all have
// their columns in one 2-dimensional space shared by the ranks (M_i =
// A·B_iᵀ), so that PowerSGD at rank 2 is exact.
func lowRankGrads(ranks, step int) [][][]float32 {
	rng := rand.New(rand.NewPCG(uint64(step), 7))
	out := make([][][]float32, ranks)
	for r := range out {
		out[r] = make([][]float32, len(lowRankShapes))
	}
	for b, shapes := range lowRankShapes {
		for r := range ranks {
			out[r][b] = make([]float32, 0, lowRankSizes[b])
		}
		for _, s := range shapes {
			a := make([]float64, 2*s.Rows)
			for i := range a {
				a[i] = rng.NormFloat64()
			}
			for r := range ranks {
				bt := make([]float64, 2*s.Cols)
				for i := range bt {
					bt[i] = rng.NormFloat64()
				}
				for i := range s.Rows {
					for j := range s.Cols {
						v := a[2*i]*bt[2*j] + a[2*i+1]*bt[2*j+1]
						if s.Rows == 1 {
							v = rng.NormFloat64() // a bias: anything
						}
						out[r][b] = append(out[r][b], float32(v))
					}
				}
			}
		}
	}
	return out
}

// mean is the element-wise mean over ranks of grads[r][b], in float64.
func mean(grads [][][]float32, b int) []float64 {
	m := make([]float64, len(grads[0][b]))
	for _, g := range grads {
		for i, v := range g[b] {
			m[i] += float64(v)
		}
	}
	for i := range m {
		m[i] /= float64(len(grads))
	}
	return m
}

// relErr is max|got − want| / max|want|.
func relErr(got []float32, want []float64) float64 {
	var d, w float64
	for i := range got {
		d = max(d, math.Abs(float64(got[i])-want[i]))
		w = max(w, math.Abs(want[i]))
	}
	return d / w
}

// TestLowRankExact: gradients of rank 2 are exchanged exactly at rank 2
// (every rank gets the mean, bit for bit the same), with warm start and
// without, and the residual is rounding: float32's in the first step, more
// later, where a warm Q from another step's space can leave P
// ill-conditioned (its columns nearly parallel) for the
// orthogonalization.
func TestLowRankExact(t *testing.T) {
	for _, spec := range []string{"powersgd:2", "powersgd:2:warm=off:seed=9"} {
		t.Run(spec, func(t *testing.T) {
			const ranks = 3
			engines := newEngines(t, ranks, lowRankSizes, lowRankConfig(spec))
			if s := engines[0].Strategy(); s != StrategyLowRank {
				t.Fatalf("strategy %v, want low-rank", s)
			}
			for step := range 3 {
				grads := lowRankGrads(ranks, step)
				want := [][]float64{mean(grads, 0), mean(grads, 1)}
				stats, errs := runStep(engines, grads, reversedOnOdd(2))
				mustNoErrors(t, "step", errs)
				for r := range ranks {
					for b := range lowRankSizes {
						if !stats[r].Buckets[b].Compressed {
							t.Fatalf("step %d rank %d bucket %d went dense: %s", step, r, b, stats[r].Buckets[b].Reason)
						}
						if i := sameFloats(grads[r][b], grads[0][b]); i >= 0 {
							t.Fatalf("step %d bucket %d: rank %d's average differs from rank 0's at %d", step, b, r, i)
						}
					}
				}
				limit := 1e-5
				if step > 0 {
					limit = 1e-2
				}
				for b := range lowRankSizes {
					if e := relErr(grads[0][b], want[b]); e > limit {
						t.Errorf("step %d bucket %d: relative error %g from the mean", step, b, e)
					}
				}
				for r, e := range engines {
					for b := range lowRankSizes {
						for i, v := range e.gradEF.Residual(uint64(b)) {
							if math.Abs(float64(v)) > 10*limit {
								t.Fatalf("step %d rank %d bucket %d: residual[%d] = %g, want rounding", step, r, b, i, v)
							}
						}
					}
				}
			}
		})
	}
}

// TestLowRankFeedback: on gradients no rank-2 approximation holds, error
// feedback keeps exactly what the average did not deliver: over the
// ranks, mean(e_old + g − e_new) is the average, every step.
func TestLowRankFeedback(t *testing.T) {
	const ranks = 3
	engines := newEngines(t, ranks, lowRankSizes, lowRankConfig("powersgd:2"))
	old := make([][][]float32, ranks)
	for r := range old {
		old[r] = [][]float32{make([]float32, lowRankSizes[0]), make([]float32, lowRankSizes[1])}
	}
	for step := range 4 {
		grads := stepGrads(ranks, step, lowRankSizes)
		delivered := make([][]float64, len(lowRankSizes))
		for b, n := range lowRankSizes {
			delivered[b] = make([]float64, n)
			for r := range ranks {
				for i, g := range grads[r][b] {
					delivered[b][i] += (float64(old[r][b][i]) + float64(g)) / ranks
				}
			}
		}
		_, errs := runStep(engines, grads, inOrder(2))
		mustNoErrors(t, "step", errs)
		for b := range lowRankSizes {
			for r, e := range engines {
				res := e.gradEF.Residual(uint64(b))
				for i, v := range res {
					delivered[b][i] -= float64(v) / ranks
				}
				old[r][b] = res
			}
			if e := relErr(grads[0][b], delivered[b]); e > 1e-5 {
				t.Errorf("step %d bucket %d: mean(e_old + g − e_new) is %g (relative) from the average", step, b, e)
			}
		}
	}
	// The residual is not rounding here: the approximation dropped a lot.
	if r := engines[0].gradEF.Residual(0); slices.Max(r) < 0.1 {
		t.Errorf("residual at most %g: the test's gradients were low-rank after all", slices.Max(r))
	}
}

// TestLowRankVolume: a step sends the two all-reduces' bytes, the
// factors', the uncompressed tensors' and N statuses', within 2 % of
// 2(N−1)/N·(Σ(rows+cols)·r + uncompressed)·4.
func TestLowRankVolume(t *testing.T) {
	const ranks = 4
	engines := newEngines(t, ranks, lowRankSizes, lowRankConfig("powersgd:2"))
	stats, errs := runStep(engines, stepGrads(ranks, 0, lowRankSizes), inOrder(2))
	mustNoErrors(t, "step", errs)
	spec, _ := compress.ParseSpec("powersgd:2")
	for b, shapes := range lowRankShapes {
		var factors, flat int
		for _, s := range shapes {
			if s.Rows == 1 {
				flat += s.Cols
			} else {
				factors += (s.Rows + s.Cols) * 2
			}
		}
		pl := planLowRank(shapes, spec)
		got := stats[0].Buckets[b].BytesSent
		exact := allReduceVolume(ranks, 4*(ranks+pl.PLen+pl.FlatLen)) + allReduceVolume(ranks, 4*pl.QLen)
		paper := 2 * float64(ranks-1) / ranks * float64(factors+flat) * 4
		// The N statuses weigh 8 % of the small bucket 1's bytes.
		if got != exact || b == 0 && math.Abs(float64(got)-paper) > 0.02*paper {
			t.Errorf("bucket %d: %d bytes sent, want %d (the formula without statuses: %.0f)", b, got, exact, paper)
		}
	}
	// Against dense: the MLP 64-1024-1024-10's layers at R = 2.
	mlp := []Shape{{1024, 64}, {1, 1024}, {1024, 1024}, {1, 1024}, {10, 1024}, {1, 10}}
	pl := planLowRank(mlp, spec)
	dense := 64*1024 + 1024 + 1024*1024 + 1024 + 10*1024 + 10
	if ratio := float64(dense) / float64(pl.PLen+pl.QLen+pl.FlatLen); ratio < 80 {
		t.Errorf("MLP 64-1024-1024-10 at rank 2: %.1f× less than dense, want about 100×", ratio)
	}
}

// TestLowRankNonFinite: a NaN on one rank sends that bucket dense on
// every rank, and no memory changes; the other bucket stays compressed.
func TestLowRankNonFinite(t *testing.T) {
	const ranks = 3
	engines := newEngines(t, ranks, lowRankSizes, lowRankConfig("powersgd:2"))
	_, errs := runStep(engines, stepGrads(ranks, 0, lowRankSizes), inOrder(2))
	mustNoErrors(t, "step 0", errs)
	before := make([][2][]float32, ranks)
	for r, e := range engines {
		before[r] = [2][]float32{e.gradEF.Residual(0), e.partEF.Residual(0)}
	}
	grads := stepGrads(ranks, 1, lowRankSizes)
	grads[1][0][100] = float32(math.NaN())
	stats, errs := runStep(engines, grads, inOrder(2))
	mustNoErrors(t, "step 1", errs)
	for r, e := range engines {
		b0, b1 := stats[r].Buckets[0], stats[r].Buckets[1]
		if b0.Compressed || !strings.Contains(b0.Reason, "rank 1 has") || !b1.Compressed {
			t.Errorf("rank %d: bucket 0 compressed %v (%q), bucket 1 compressed %v", r, b0.Compressed, b0.Reason, b1.Compressed)
		}
		if sameFloats(e.gradEF.Residual(0), before[r][0]) >= 0 || sameFloats(e.partEF.Residual(0), before[r][1]) >= 0 {
			t.Errorf("rank %d: bucket 0's memory changed in a step it went dense", r)
		}
	}
}

// TestLowRankResume: engines loaded from states saved after step 2 run
// steps 3 and 4 bit for bit as the engines that saved them.
func TestLowRankResume(t *testing.T) {
	const ranks = 2
	cfg := lowRankConfig("powersgd:3:seed=4")
	a := newEngines(t, ranks, lowRankSizes, cfg)
	var saved []*bytes.Buffer
	averages := make([][]float32, ranks) // steps 3 and 4's
	for step := range 5 {
		if step == 3 {
			for _, e := range a {
				var buf bytes.Buffer
				if err := e.Save(&buf); err != nil {
					t.Fatal(err)
				}
				saved = append(saved, &buf)
			}
		}
		grads := stepGrads(ranks, step, lowRankSizes)
		_, errs := runStep(a, grads, inOrder(2))
		mustNoErrors(t, "step", errs)
		if step >= 3 {
			for r := range ranks {
				averages[r] = append(averages[r], slices.Concat(grads[r]...)...)
			}
		}
	}
	want := make([][]float32, ranks)
	for r, e := range a {
		want[r] = append(e.gradEF.Residual(0), e.partEF.Residual(1)...)
	}
	for r := range ranks {
		want[r] = append(want[r], averages[r]...)
	}
	b := newEngines(t, ranks, lowRankSizes, cfg)
	for r, e := range b {
		if err := e.Load(saved[r]); err != nil {
			t.Fatalf("rank %d: Load: %v", r, err)
		}
	}
	got := make([][]float32, ranks)
	for step := 3; step < 5; step++ {
		grads := stepGrads(ranks, step, lowRankSizes)
		_, errs := runStep(b, grads, inOrder(2))
		mustNoErrors(t, "resumed step", errs)
		for r := range ranks {
			got[r] = append(got[r], slices.Concat(grads[r]...)...)
		}
	}
	for r, e := range b {
		mine := append(append(e.gradEF.Residual(0), e.partEF.Residual(1)...), got[r]...)
		if i := sameFloats(mine, want[r]); i >= 0 {
			t.Errorf("rank %d: the resumed memories and averages differ at %d", r, i)
		}
	}
}

// TestLowRankConfig: what low-rank refuses, on every rank alike.
func TestLowRankConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no shapes", Config{Spec: "powersgd:2"}, "needs Config.Shapes"},
		{"shapes short", Config{Spec: "powersgd:2", Shapes: [][]Shape{{{64, 48}, {1, 48}, {32, 15}}, {{10, 10}, {1, 7}}}}, "bucket 0: its 3 tensors hold 3600 elements, the bucket 3632"},
		{"shapes over", Config{Spec: "powersgd:2", Shapes: [][]Shape{{{64, 60}}, {{10, 10}, {1, 7}}}}, "tensors 0 to 0 already hold 3840 elements, the bucket 3632"},
		{"zero side", Config{Spec: "powersgd:2", Shapes: [][]Shape{{{0, 48}}, {{10, 10}, {1, 7}}}}, "shape 0×48"},
		{"bucket count", Config{Spec: "powersgd:2", Shapes: [][]Shape{{{10, 10}, {1, 7}}}}, "Shapes has 1 buckets, the engine 2"},
		{"sra", Config{Spec: "powersgd:2", Strategy: StrategyQuantSRA, Shapes: lowRankShapes}, "exchanged by strategy low-rank"},
		{"low-rank of int8", Config{Spec: "int8", Strategy: StrategyLowRank}, "low-rank carries codec powersgd, not int8"},
		{"guard", Config{Spec: "powersgd:2", ErrorFeedback: true, Guard: 2, Shapes: lowRankShapes}, "no accuracy guard"},
		{"schedule", Config{Spec: "powersgd:2", Schedule: []Phase{{10, "powersgd:4"}}, Shapes: lowRankShapes}, "takes no Schedule"},
		{"rank 0", Config{Spec: "powersgd:0", Shapes: lowRankShapes}, "rank"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, 2)
			errs := onRanks(comms, func(r int, c comm.Comm) error {
				e, err := New(context.Background(), c, lowRankSizes, tc.cfg)
				if err == nil {
					e.Close()
				}
				return err
			})
			for r, err := range errs {
				var ce *ConfigError
				if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: %v, want a *ConfigError saying %q", r, err, tc.want)
				}
			}
		})
	}
}

// TestLowRankAuto: with DecideAuto the cost model predicts each bucket
// from its own shapes (the volumes of its two all-reduces), every rank
// alike, and verification's first window then measures both paths.
func TestLowRankAuto(t *testing.T) {
	const ranks = 2
	cfg := lowRankConfig("powersgd:2")
	cfg.Decision = DecideAuto
	engines := newEngines(t, ranks, lowRankSizes, cfg)
	if a, b := engines[0].Compressed(), engines[1].Compressed(); !slices.Equal(a, b) {
		t.Errorf("ranks decided %v and %v at New", a, b)
	}
	var last []StepStats
	for step := range firstWindowSteps {
		stats, errs := runStep(engines, stepGrads(ranks, step, lowRankSizes), inOrder(2))
		mustNoErrors(t, "step", errs)
		last = stats
	}
	for b := range lowRankSizes {
		reason := last[0].Buckets[b].Reason
		if !strings.HasPrefix(reason, "measured: ") || !strings.Contains(reason, "predicted: cost model: compressed") {
			t.Errorf("bucket %d: reason %q, want verification's, after the model's", b, reason)
		}
	}
	if a, b := engines[0].Compressed(), engines[1].Compressed(); !slices.Equal(a, b) {
		t.Errorf("ranks decided %v and %v", a, b)
	}
	// The model's volumes are the bucket's own: bucket 0's two all-reduces
	// carry N + 64·2 + 32·2 + 48 and 48·2 + 16·2 floats.
	m := &costModel{perByte: 1}
	x := engines[0].exchanger
	want := float64(allReduceVolume(ranks, 4*(ranks+128+64+48)) + allReduceVolume(ranks, 4*(96+32)))
	if got := x.linkCost(m, engines[0].buckets[0]); got != want {
		t.Errorf("bucket 0's predicted link time %v, want %v (its volumes)", got, want)
	}
}

// TestLowRankShapesMismatch: ranks that give different shapes for a
// bucket get a *ConfigMismatchError naming it, on every rank.
func TestLowRankShapesMismatch(t *testing.T) {
	other := [][]Shape{{{48, 64}, {1, 48}, {32, 16}}, {{10, 10}, {1, 7}}}
	errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
		cfg := lowRankConfig("powersgd:2")
		if r == 1 {
			cfg.Shapes = other
		}
		e, err := New(context.Background(), c, lowRankSizes, cfg)
		if err == nil {
			e.Close()
		}
		return err
	})
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || me.Field != "bucket 0 shapes" || !strings.Contains(err.Error(), "48x64,1x48,32x16") {
			t.Errorf("rank %d: %v, want a *ConfigMismatchError of bucket 0's shapes", r, err)
		}
	}
}

// TestLowRankDeadColumn: a column of the warm Q that the
// orthogonalization zeroed (here: a gradient of rank 1 at R = 2) is drawn
// again the next step, so a later gradient of rank 2 is exchanged exactly
// rather than through one column forever.
func TestLowRankDeadColumn(t *testing.T) {
	const ranks = 2
	shapes := [][]Shape{{{32, 24}}}
	sizes := []int{32 * 24}
	cfg := Config{Spec: "powersgd:2", ErrorFeedback: false, Decision: DecideCompressed, Shapes: shapes}
	engines := newEngines(t, ranks, sizes, cfg)
	grads := func(rank2 bool) [][][]float32 {
		out := make([][][]float32, ranks)
		for r := range out {
			g := make([]float32, 32*24)
			for i := range 32 {
				for j := range 24 {
					v := float32(i%5-2) * float32(j%3+r)
					if rank2 {
						v += float32(i%3-1) * float32(j%4-1+r)
					}
					g[i*24+j] = v
				}
			}
			out[r] = [][]float32{g}
		}
		return out
	}
	_, errs := runStep(engines, grads(false), inOrder(1))
	mustNoErrors(t, "rank-1 step", errs)
	for step := range 2 {
		g := grads(true)
		want := mean(g, 0)
		_, errs := runStep(engines, g, inOrder(1))
		mustNoErrors(t, "rank-2 step", errs)
		if e := relErr(g[0][0], want); step == 1 && e > 1e-4 {
			t.Errorf("rank-2 step %d after a rank-1 one: relative error %g, want the mean (a dead Q column?)", step, e)
		}
	}
}

// TestLowRankHier: StrategyHier carries powersgd in the two-level shape:
// low-rank's all-reduces over two-level collectives, on 2 nodes of 2
// ranks. Every rank gets the same bits; the result is the flat
// exchange's up to the order of the sums (the P's sums differ in their
// last bits, so the orthogonalized P̂ does); the state saved resumes;
// StrategyAuto times both shapes and takes one on every rank.
func TestLowRankHier(t *testing.T) {
	cfg := lowRankConfig("powersgd:2")
	cfg.Strategy = StrategyLowRank
	flat := newEnginesOn(t, nodeGroup(t, 2, 2), lowRankSizes, cfg)
	cfg.Strategy = StrategyHier
	hier := newEnginesOn(t, nodeGroup(t, 2, 2), lowRankSizes, cfg)
	for step := range 3 {
		gf, gh := stepGrads(4, step, lowRankSizes), stepGrads(4, step, lowRankSizes)
		_, errs := runStep(flat, gf, inOrder(2))
		mustNoErrors(t, "flat", errs)
		stats, errs := runStep(hier, gh, reversedOnOdd(2))
		mustNoErrors(t, "hier", errs)
		for r := range gh {
			for b := range lowRankSizes {
				if i := sameBits(gh[r][b], gh[0][b]); i >= 0 {
					t.Fatalf("step %d bucket %d: rank %d differs from rank 0 at %d", step, b, r, i)
				}
				want := make([]float64, len(gf[r][b]))
				for i, v := range gf[r][b] {
					want[i] = float64(v)
				}
				if e := relErr(gh[r][b], want); e > 1e-4 {
					t.Errorf("step %d rank %d bucket %d: relative difference %g from the flat exchange", step, r, b, e)
				}
				if s := stats[r].Buckets[b]; s.Strategy != StrategyHier || !s.Compressed || !strings.Contains(s.Reason, "two-level") {
					t.Fatalf("step %d rank %d bucket %d: %+v", step, r, b, s)
				}
			}
		}
	}
	auto := newEnginesOn(t, nodeGroup(t, 2, 2), lowRankSizes, lowRankConfig("powersgd:2"))
	for r, e := range auto {
		if s := e.Strategy(); s != auto[0].Strategy() || (s != StrategyLowRank && s != StrategyHier) {
			t.Errorf("auto: rank %d took %v, rank 0 %v", r, s, auto[0].Strategy())
		}
	}
	states := saveAll(t, hier)
	again := newEnginesOn(t, nodeGroup(t, 2, 2), lowRankSizes, cfg)
	for r, e := range again {
		if err := e.Load(bytes.NewReader(states[r])); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if reloaded := saveAll(t, again); !bytes.Equal(reloaded[1], states[1]) {
		t.Error("the restored engine saves another state")
	}
}
