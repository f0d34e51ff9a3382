package overlap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
)

// guardRef is the reference of the accuracy guard over refModel: a bucket
// whose largest ρ = ‖e‖/‖g‖ over the ranks passed the threshold goes dense
// with e + g next step (summed in rank order and divided by N, as the
// dense all-reduce of in-process ranks), which empties every rank's
// memory of it.
type guardRef struct {
	ref     *refModel
	limit   float64
	pending map[int]bool // bucket → flushes next step
}

// step returns the averages of step s, and per bucket whether it was a
// flush and the largest ρ (0 for a flush).
func (g *guardRef) step(s int, grads [][][]float32) (out [][]float32, flushed []bool, rho []float64) {
	ranks := len(grads)
	for b := range grads[0] {
		in := make([][]float32, ranks)
		for r := range in {
			in[r] = grads[r][b]
		}
		if g.pending[b] {
			sum := make([]float32, len(in[0]))
			for r := range ranks {
				e := g.ref.e1[[2]int{r, b}]
				for i := range sum {
					sum[i] += e[i] + in[r][i]
				}
				clear(e)
			}
			divide(sum, ranks)
			out, flushed, rho = append(out, sum), append(flushed, true), append(rho, 0)
			g.pending[b] = false
			continue
		}
		out = append(out, g.ref.step(s, b, in))
		m := 0.0
		for r := range ranks {
			var e2, g2 float64
			for i, v := range g.ref.e1[[2]int{r, b}] {
				e2 += float64(v) * float64(v)
				g2 += float64(in[r][i]) * float64(in[r][i])
			}
			m = max(m, math.Sqrt(e2)/math.Sqrt(g2))
		}
		flushed, rho = append(flushed, false), append(rho, m)
		g.pending[b] = m > g.limit
	}
	return out, flushed, rho
}

// TestAccuracyGuard runs the guard on every strategy of both backends
// against the reference: averages bit for bit, ρ within rounding (the
// host's sums and the device's kernels.GuardRatio differ in order),
// flushes on the same steps on every rank; the threshold is set so that
// some steps flush and some do not, and no ρ is near it.
func TestAccuracyGuard(t *testing.T) {
	const ranks, steps = 3, 10
	sizes := []int{500, 37}
	for _, backend := range backends {
		for spec, limit := range map[string]float64{"topk:0.05": 1.6, "randomk:0.1": 1.6, "int2": 1.6, "sign:bucket=32": 1.6, "int4:bucket=64": 0.23} {
			t.Run(backend+"/"+spec, func(t *testing.T) {
				cfg := Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Guard: limit}
				if spec == "int4:bucket=64" {
					cfg.Strategy = StrategyQuantAllGather
				}
				g := newBackendRig(t, backend, ranks, sizes, cfg)
				ref := &guardRef{ref: newRef(t, spec, g.refStrategy(), ranks, true), limit: limit, pending: map[int]bool{}}
				flushes := 0
				for s := range steps {
					grads := stepGrads(ranks, s, sizes)
					want, flushed, rho := ref.step(s, clone3(grads))
					out, stats := g.steps(t, grads)
					for r := range ranks {
						for b := range sizes {
							if i := sameFloats(out[r][b], want[b]); i >= 0 {
								t.Fatalf("step %d rank %d bucket %d: element %d is %v, want %v", s, r, b, i, out[r][b][i], want[b][i])
							}
							bs := stats[r].Buckets[b]
							if bs.Guarded != flushed[b] || bs.Compressed == flushed[b] {
								t.Fatalf("step %d rank %d bucket %d: Guarded %v, Compressed %v; the reference flushes: %v (%s)", s, r, b, bs.Guarded, bs.Compressed, flushed[b], bs.Reason)
							}
							if math.Abs(bs.HeldBack-rho[b]) > 1e-6*rho[b] {
								t.Fatalf("step %d rank %d bucket %d: HeldBack %v, reference %v", s, r, b, bs.HeldBack, rho[b])
							}
							if math.Abs(rho[b]-limit) < 1e-4 {
								t.Fatalf("step %d bucket %d: ρ %v too close to the threshold to test", s, b, rho[b])
							}
							if flushed[b] && !strings.Contains(bs.Reason, "accuracy guard: dense with the residual") {
								t.Fatalf("a flush's reason does not say so: %s", bs.Reason)
							}
							guard, origin := GuardClear, OriginPinned
							if ref.pending[b] {
								guard = GuardTripped
							}
							if flushed[b] {
								origin = OriginGuard
							}
							if bs.Guard != guard || bs.Origin != origin || bs.GuardThreshold != limit {
								t.Fatalf("step %d rank %d bucket %d: Guard %v, Origin %v, GuardThreshold %v; want %v, %v, %v", s, r, b, bs.Guard, bs.Origin, bs.GuardThreshold, guard, origin, limit)
							}
						}
					}
					for _, f := range flushed {
						if f {
							flushes++
						}
					}
				}
				if flushes == 0 || flushes == steps*len(sizes) {
					t.Fatalf("%d flushes in %d bucket-steps: the threshold tests nothing", flushes, steps*len(sizes))
				}
			})
		}
	}
}

// TestAccuracyGuardCheckpoint: a state saved while a flush is pending
// resumes it, on either backend: the resumed engines' results equal the
// uninterrupted ones'.
func TestAccuracyGuardCheckpoint(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) { testAccuracyGuardCheckpoint(t, backend) })
	}
}

func testAccuracyGuardCheckpoint(t *testing.T, backend string) {
	const ranks, steps = 2, 8
	sizes := []int{400}
	cfg := Config{Spec: "topk:0.05", ErrorFeedback: true, Decision: DecideCompressed, Guard: 1.2}
	a := newBackendRig(t, backend, ranks, sizes, cfg)
	var states [][]byte
	cut, reason := -1, ""
	var want [][][][]float32
	for s := range steps {
		out, _ := a.step(t, stepGrads(ranks, s, sizes))
		want = append(want, out)
		if cut < 0 && a.core(0).buckets[0].guard != "" {
			cut, reason = s, a.core(0).buckets[0].guard
			states = a.save(t)
		}
	}
	if cut < 0 || cut == steps-1 {
		t.Fatalf("no flush pending before the last step (cut %d)", cut)
	}
	b := newBackendRig(t, backend, ranks, sizes, cfg)
	b.load(t, states)
	for s := cut + 1; s < steps; s++ {
		out, stats := b.step(t, stepGrads(ranks, s, sizes))
		if s == cut+1 && !stats.Buckets[0].Guarded {
			t.Fatalf("step %d after the resume is not the pending flush: %s", s, stats.Buckets[0].Reason)
		}
		for r := range ranks {
			if i := sameFloats(out[r][0], want[s][r][0]); i >= 0 {
				t.Fatalf("resumed step %d rank %d: element %d differs", s, r, i)
			}
		}
	}

	// Version 2 (no guard part) still loads, with no flush pending.
	v3 := downgrade(t, states[0], 3)
	v2 := append([]byte(nil), v3[:len(v3)-4-2-len(reason)]...)
	v2 = append(v2, 0, 0, 0, 0)
	v2[4] = 2
	fixCRC(v2)
	if err := b.core(0).Load(bytes.NewReader(v2)); err != nil {
		t.Fatalf("a version-2 state: %v", err)
	}
	if b.core(0).buckets[0].guard != "" {
		t.Fatal("a version-2 state left a flush pending")
	}
	// A guard reason longer than the format allows, checksum made good.
	bad := append([]byte(nil), states[0]...)
	at := len(bad) - 4 - 2 - len(reason)
	binary.LittleEndian.PutUint16(bad[at:], maxGuardLen+1)
	fixCRC(bad)
	var se *StateError
	if err := b.core(0).Load(bytes.NewReader(bad)); !errors.As(err, &se) || !strings.Contains(err.Error(), "accuracy-guard reason") {
		t.Fatalf("a state with an oversized guard reason: %v; want a *StateError", err)
	}
}

// TestAccuracyGuardConfig: invalid thresholds, a guard without error
// feedback (on either backend), and ranks with different thresholds are
// refused.
func TestAccuracyGuardConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Spec: "topk:0.1", ErrorFeedback: true, Guard: -1},
		{Spec: "topk:0.1", ErrorFeedback: true, Guard: math.NaN()},
		{Spec: "topk:0.1", ErrorFeedback: true, Guard: math.Inf(1)},
		{Spec: "topk:0.1", Guard: 2},
	} {
		errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
			_, err := New(t.Context(), c, []int{10}, cfg)
			return err
		})
		for r, err := range errs {
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "Guard") {
				t.Errorf("guard %v (error feedback %v), rank %d: %v; want a *ConfigError naming Guard", cfg.Guard, cfg.ErrorFeedback, r, err)
			}
		}
	}
	errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
		_, err := New(t.Context(), c, []int{10}, Config{Spec: "topk:0.1", ErrorFeedback: true, Guard: 2 + float64(r)})
		return err
	})
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || !strings.Contains(err.Error(), "accuracy guard") {
			t.Errorf("rank %d: %v; want a *ConfigMismatchError on the accuracy guard", r, err)
		}
	}
	_, errs = newDevRig(t, []int{10}, []Config{{Spec: "int8", Guard: 2}}, fakeTimeout)
	var ce *ConfigError
	if !errors.As(errs[0], &ce) || !strings.Contains(errs[0].Error(), "Guard") {
		t.Errorf("NewDevice with a guard and no error feedback: %v; want a *ConfigError naming Guard", errs[0])
	}
}

// TestAccuracyGuardNonFinite: a NaN in a flush step, on either backend,
// is reported, with every memory as it was and the flush still pending:
// the next step flushes as if the NaN step had not happened.
func TestAccuracyGuardNonFinite(t *testing.T) {
	const ranks, steps = 2, 8
	sizes := []int{400}
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			g := newBackendRig(t, backend, ranks, sizes, Config{Spec: "topk:0.05", ErrorFeedback: true, Decision: DecideCompressed, Guard: 1.2})
			ref := &guardRef{ref: newRef(t, "topk:0.05", g.refStrategy(), ranks, true), limit: 1.2, pending: map[int]bool{}}
			poisoned := false
			for s := range steps {
				grads := stepGrads(ranks, s, sizes)
				if ref.pending[0] && !poisoned {
					poisoned = true
					bad := clone3(grads)
					bad[1][0][17] = float32(math.NaN())
					if _, stats := g.step(t, bad); !stats.Buckets[0].NonFinite || !stats.Buckets[0].Guarded || stats.Buckets[0].Guard != GuardPending {
						t.Fatalf("NaN in a flush step: NonFinite %v, Guarded %v, Guard %v (%s)", stats.Buckets[0].NonFinite, stats.Buckets[0].Guarded, stats.Buckets[0].Guard, stats.Buckets[0].Reason)
					}
				}
				want, flushed, _ := ref.step(s, clone3(grads))
				out, stats := g.steps(t, grads)
				for r := range ranks {
					if i := sameFloats(out[r][0], want[0]); i >= 0 {
						t.Fatalf("step %d rank %d: element %d is %v, want %v", s, r, i, out[r][0][i], want[0][i])
					}
					if stats[r].Buckets[0].Guarded != flushed[0] {
						t.Fatalf("step %d rank %d: Guarded %v, want %v", s, r, stats[r].Buckets[0].Guarded, flushed[0])
					}
				}
			}
			if !poisoned {
				t.Fatal("no flush was pending: the test tested nothing")
			}
		})
	}
}
