package overlap

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestAverage compares average with its definition, element by element
// dst[i] / float32(n), then the first non-finite index: bits and index.
func TestAverage(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, n := range []int{1, 2, 3, 4, 6, 8} {
		for _, bad := range [][]int{nil, {5}, {9, 2}, {0}, {11}} {
			x := make([]float32, 12)
			for i := range x {
				x[i] = float32(i*i-30) * 0.37
			}
			x[7] = math.MaxFloat32
			x[8] = math.SmallestNonzeroFloat32
			for j, i := range bad {
				x[i] = []float32{inf, nan}[j%2]
			}
			want := make([]float32, len(x))
			wantBad := -1
			for i, v := range x {
				want[i] = v / float32(n)
				if f := float64(want[i]); (math.IsNaN(f) || math.IsInf(f, 0)) && wantBad < 0 {
					wantBad = i
				}
			}
			got := append([]float32(nil), x...)
			gotBad := average(got, n)
			what := fmt.Sprintf("n=%d, non-finite at %v", n, bad)
			if gotBad != wantBad {
				t.Errorf("%s: average returned %d, want %d", what, gotBad, wantBad)
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
					t.Errorf("%s: element %d = %v, want %v", what, i, got[i], want[i])
				}
			}
		}
	}
}

// TestSparseGatherOverflow: top-k values that overflow when the ranks'
// payloads are summed make the bucket's average non-finite; sparse-gather,
// which averages only the indices the payloads carry, reports the lowest
// such index as the full pass over the bucket would.
func TestSparseGatherOverflow(t *testing.T) {
	for _, ranks := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("N=%d", ranks), func(t *testing.T) {
			const n = 200
			engines := newEngines(t, ranks, []int{n}, Config{Spec: "topk:0.05", Decision: DecideCompressed})
			grads := make([][][]float32, ranks)
			in := make([][]float32, ranks)
			for r := range grads {
				g := gradient(r, 0, 0, n)
				g[150], g[40] = math.MaxFloat32, math.MaxFloat32
				grads[r] = [][]float32{g}
				in[r] = append([]float32(nil), g...)
			}
			want := newRef(t, "topk:0.05", StrategySparseGather, ranks, false).step(0, 0, in)
			stats, errs := runStep(engines, grads, inOrder(1))
			mustNoErrors(t, "step", errs)
			for r := range ranks {
				if i := sameFloats(grads[r][0], want); i >= 0 {
					t.Errorf("rank %d: element %d = %v, want %v", r, i, grads[r][0][i], want[i])
				}
				bs := stats[r].Buckets[0]
				if !bs.NonFinite || !strings.Contains(bs.Reason, "at element 40 ") {
					t.Errorf("rank %d: NonFinite %v, reason %q; want the overflow at element 40 reported", r, bs.NonFinite, bs.Reason)
				}
				if g := grads[r][0]; !math.IsInf(float64(g[40]), 1) || !math.IsInf(float64(g[150]), 1) {
					t.Errorf("rank %d: averages %v at 40 and %v at 150, want +Inf", r, g[40], g[150])
				}
			}
		})
	}
}
