package hosted_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/overlap"
)

// TestHierEngine: overlap's StrategyHier runs over hosted transports with
// a topology (4 ranks as 2 nodes × 2), its node and cross-node collectives
// carried out at once by Go hosts, one per group, and leaves the average
// in every bucket on every rank (top-k: its two-level exchange runs over
// the Split's comms too).
func TestHierEngine(t *testing.T) {
	const n, k = 4, 2
	for _, spec := range []string{"none", "int8", "topk:0.5"} {
		ts := hierGroup(t, n, k)
		sizes := []int{1001, 37, 4096}
		grad := func(r, s, b, i int) float32 { return float32((r*7+s*3+b*5+i*11)%64-32) / 16 }
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r, tr := range ts {
			wg.Go(func() {
				ctx := context.Background()
				e, err := overlap.New(ctx, tr.Host(), sizes, overlap.Config{Spec: spec, Strategy: overlap.StrategyHier,
					ErrorFeedback: spec != "none", Decision: overlap.DecideCompressed, Timeout: 10 * time.Second})
				if err != nil {
					errs[r] = err
					return
				}
				defer e.Close()
				for s := range 3 {
					if err := e.Step(); err != nil {
						errs[r] = err
						return
					}
					gs := make([][]float32, len(sizes))
					for b := len(sizes) - 1; b >= 0; b-- {
						gs[b] = make([]float32, sizes[b])
						for i := range gs[b] {
							gs[b][i] = grad(r, s, b, i)
						}
						if err := e.Ready(b, gs[b]); err != nil {
							errs[r] = err
							return
						}
					}
					if _, err := e.Wait(ctx); err != nil {
						errs[r] = err
						return
					}
					tol := 0.0
					switch spec {
					case "int8":
						tol = 0.2 // int8 with error feedback: within a quantization step of the average
					case "topk:0.5":
						tol = 4 // top-k's two-level exchange (node and cross comms of the Split): it runs; error feedback holds the rest
					}
					for b, g := range gs {
						for i, v := range g {
							var want float64
							for q := range n {
								want += float64(grad(q, s, b, i))
							}
							want /= n
							if math.Abs(float64(v)-want) > tol {
								t.Errorf("%s: rank %d step %d bucket %d [%d] = %v, want %v", spec, r, s, b, i, v, want)
								return
							}
						}
					}
				}
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Errorf("%s: rank %d: %v", spec, r, err)
			}
		}
	}
}
