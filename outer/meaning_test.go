package outer

import (
	"fmt"
	"testing"

	"github.com/gradcomp/gradcomp/overlap"
)

var dense = overlap.Config{Spec: "none"}

// TestDataParallelEquivalence: with H = 1, an outer SGD of lr 1 and a
// dense exchange, every inner step is averaged at once, and the Loop is
// data-parallel SGD: the average of the ranks' gradients applied, to
// float32 rounding, step after step.
func TestDataParallelEquivalence(t *testing.T) {
	q := quad{sizes: []int{7, 4, 9}}
	const ranks = 3
	loops, params := setup(t, q, ranks, Config{SyncEvery: 1, Optimizer: Optimizer{Kind: SGD, LR: 1}, Engine: dense})
	theta := q.init(0) // New makes rank 0's weights everyone's
	for k := range 6 {
		grads := make([][][]float32, ranks)
		for r := range grads {
			grads[r] = q.grad(r, k, theta)
		}
		sgd(theta, average(grads), innerLR)
		reports := train(t, q, loops, params, k, 1, nil)
		for r, l := range loops {
			if got := reports[r][0].Finished; len(got) != 1 || got[0].Skipped != nil {
				t.Fatalf("step %d, rank %d: finished %+v, want fragment 0 applied", k+1, r, got)
			}
			if ti, i := closeTo(l.Global(), theta, 1e-6); ti >= 0 {
				t.Fatalf("step %d, rank %d: global tensor %d[%d] = %v, data-parallel SGD gives %v", k+1, r, ti, i, l.Global()[ti][i], theta[ti][i])
			}
			if ti, i := identical(params[r], l.Global()); ti >= 0 {
				t.Fatalf("step %d, rank %d: local tensor %d[%d] = %v, want the global %v", k+1, r, ti, i, params[r][ti][i], l.Global()[ti][i])
			}
		}
	}
}

// TestPlainDiLoCo: one fragment without delay is DiLoCo, equal to a
// reference of a few lines (the float32 average of the pseudo-gradients in
// rank order, torch's Nesterov step) at H = 1, 10 and 50.
func TestPlainDiLoCo(t *testing.T) {
	q := quad{sizes: []int{5, 12, 3}}
	const ranks = 3
	for _, h := range []int{1, 10, 50} {
		t.Run(fmt.Sprintf("H=%d", h), func(t *testing.T) {
			loops, params := setup(t, q, ranks, Config{SyncEvery: h, Engine: dense})
			// The reference.
			global := q.init(0)
			local := [][][]float32{clone(global), clone(global), clone(global)}
			m := zeros(q.sizes)
			const lr, mu = float32(0.7), float32(0.9)
			steps := 3 * h
			for k := range steps {
				for r := range local {
					sgd(local[r], q.grad(r, k, local[r]), innerLR)
				}
				if (k+1)%h != 0 {
					continue
				}
				deltas := make([][][]float32, ranks)
				for r := range deltas {
					deltas[r] = zeros(q.sizes)
					for ti := range global {
						for i := range global[ti] {
							deltas[r][ti][i] = global[ti][i] - local[r][ti][i]
						}
					}
				}
				avg := average(deltas)
				for ti := range global {
					for i, d := range avg[ti] {
						m[ti][i] = mu*m[ti][i] + d
						global[ti][i] -= lr * (d + mu*m[ti][i])
					}
				}
				for r := range local {
					local[r] = clone(global)
				}
			}
			train(t, q, loops, params, 0, steps, nil)
			for r, l := range loops {
				if ti, i := closeTo(l.Global(), global, 1e-6); ti >= 0 {
					t.Errorf("rank %d: global tensor %d[%d] = %v, the reference %v", r, ti, i, l.Global()[ti][i], global[ti][i])
				}
				if ti, i := closeTo(l.momentum, m, 1e-6); ti >= 0 {
					t.Errorf("rank %d: momentum tensor %d[%d] = %v, the reference %v", r, ti, i, l.momentum[ti][i], m[ti][i])
				}
				if ti, i := closeTo(params[r], local[r], 1e-6); ti >= 0 {
					t.Errorf("rank %d: local tensor %d[%d] = %v, the reference %v", r, ti, i, params[r][ti][i], local[r][ti][i])
				}
			}
		})
	}
}

// TestPseudoGradientSign: Δ = θ_global − θ_local moves the global weights
// toward the local ones: with Optimizer None one sync makes them the
// average of the ranks' local weights, with SGD of lr 0.5 they go halfway
// there; and with α = 0.5 the local weights become the mean of what they
// are at the finish and the new global weights.
func TestPseudoGradientSign(t *testing.T) {
	q := quad{sizes: []int{6, 10}}
	const ranks = 2
	// snapshots records every rank's local weights before the Step of inner
	// step k.
	snapshots := func(params [][][]float32, k int) ([][][]float32, func(r, k int)) {
		snap := make([][][]float32, len(params))
		return snap, func(r, at int) {
			if at == k {
				snap[r] = clone(params[r])
			}
		}
	}
	for _, tc := range []struct {
		name string
		opt  Optimizer
		frac float32 // of the way from the old global weights to the average
	}{
		{"none", Optimizer{Kind: None}, 1},
		{"sgd 0.5", Optimizer{Kind: SGD, LR: 0.5}, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loops, params := setup(t, q, ranks, Config{SyncEvery: 2, Optimizer: tc.opt, Engine: dense})
			old := clone(loops[0].Global())
			snap, hook := snapshots(params, 1)
			train(t, q, loops, params, 0, 2, hook)
			avg := average(snap)
			want := zeros(q.sizes)
			for ti := range want {
				for i := range want[ti] {
					want[ti][i] = old[ti][i] + tc.frac*(avg[ti][i]-old[ti][i])
				}
			}
			for r, l := range loops {
				if ti, i := closeTo(l.Global(), want, 1e-6); ti >= 0 {
					t.Errorf("rank %d: global tensor %d[%d] = %v, want %v (old %v, local average %v)", r, ti, i, l.Global()[ti][i], want[ti][i], old[ti][i], avg[ti][i])
				}
			}
		})
	}
	t.Run("blend", func(t *testing.T) {
		// F = 1, H = 3, τ = 1: the sync starts at s = 3 (k = 2) and is
		// applied at s = 4 (k = 3).
		loops, params := setup(t, q, ranks, Config{SyncEvery: 3, Delay: 1, Alpha: 0.5, Optimizer: Optimizer{Kind: None}, Engine: dense})
		atStart, hookStart := snapshots(params, 2)
		atFinish, hookFinish := snapshots(params, 3)
		train(t, q, loops, params, 0, 4, func(r, k int) { hookStart(r, k); hookFinish(r, k) })
		avg := average(atStart)
		for r, l := range loops {
			if ti, i := closeTo(l.Global(), avg, 1e-6); ti >= 0 {
				t.Errorf("rank %d: global tensor %d[%d] = %v, want the average of the local weights at the start %v", r, ti, i, l.Global()[ti][i], avg[ti][i])
			}
			want := zeros(q.sizes)
			for ti := range want {
				for i := range want[ti] {
					want[ti][i] = 0.5*atFinish[r][ti][i] + 0.5*l.Global()[ti][i]
				}
			}
			if ti, i := identical(params[r], want); ti >= 0 {
				t.Errorf("rank %d: local tensor %d[%d] = %v, want 0.5·%v + 0.5·%v", r, ti, i, params[r][ti][i], atFinish[r][ti][i], l.Global()[ti][i])
			}
		}
	})
}
