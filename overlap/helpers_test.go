package overlap

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
)

// onRanks runs fn for every rank of comms concurrently and returns the
// errors, by rank.
func onRanks(comms []comm.Comm, fn func(r int, c comm.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = fn(r, c) })
	}
	wg.Wait()
	return errs
}

func group(t testing.TB, n int) []comm.Comm {
	t.Helper()
	comms, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	return comms
}

// newEngines builds an engine per rank of a new in-process group.
func newEngines(t testing.TB, n int, sizes []int, cfg Config) []*Engine {
	t.Helper()
	engines := make([]*Engine, n)
	errs := onRanks(group(t, n), func(r int, c comm.Comm) error {
		var err error
		engines[r], err = New(context.Background(), c, sizes, cfg)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: New: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, e := range engines {
			e.Close()
		}
	})
	return engines
}

// gradient returns a deterministic pseudo-random gradient for (rank, step,
// bucket) of n elements, with a few large entries so top-k has a shape.
func gradient(rank, step, bucket, n int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(rank*1000+step), uint64(bucket)))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
		if rng.IntN(50) == 0 {
			g[i] *= 10
		}
	}
	return g
}

// stepGrads is every rank's gradient of every bucket in step step:
// [rank][bucket].
func stepGrads(ranks, step int, sizes []int) [][][]float32 {
	grads := make([][][]float32, ranks)
	for r := range grads {
		for b, n := range sizes {
			grads[r] = append(grads[r], gradient(r, step, b, n))
		}
	}
	return grads
}

// runStep runs one step on every engine: Ready in the order given (per rank)
// then Wait. It returns each rank's stats and error.
func runStep(engines []*Engine, grads [][][]float32, order func(r int) []int) ([]StepStats, []error) {
	stats := make([]StepStats, len(engines))
	errs := make([]error, len(engines))
	var wg sync.WaitGroup
	for r, e := range engines {
		wg.Go(func() {
			if err := e.Step(); err != nil {
				errs[r] = err
				return
			}
			for _, i := range order(r) {
				if err := e.Ready(i, grads[r][i]); err != nil {
					errs[r] = err
					return
				}
			}
			stats[r], errs[r] = e.Wait(context.Background())
		})
	}
	wg.Wait()
	return stats, errs
}

func inOrder(n int) func(int) []int {
	return func(int) []int {
		o := make([]int, n)
		for i := range o {
			o[i] = i
		}
		return o
	}
}

// reversedOnOdd readies buckets in reverse order on odd ranks: the engine
// must still make the collectives in bucket order.
func reversedOnOdd(n int) func(int) []int {
	return func(r int) []int {
		o := inOrder(n)(r)
		if r%2 == 1 {
			for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
				o[i], o[j] = o[j], o[i]
			}
		}
		return o
	}
}

// sameFloats reports the first index where got and want differ (== on
// values, so −0 equals +0 and NaN equals NaN), or -1.
func sameFloats(got, want []float32) int {
	if len(got) != len(want) {
		return 0
	}
	for i := range got {
		g, w := got[i], want[i]
		if g != w && !(math.IsNaN(float64(g)) && math.IsNaN(float64(w))) {
			return i
		}
	}
	return -1
}

func mustNoErrors(t testing.TB, what string, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
}

func clone3(g [][][]float32) [][][]float32 {
	out := make([][][]float32, len(g))
	for r := range g {
		out[r] = make([][]float32, len(g[r]))
		for i := range g[r] {
			out[r][i] = append([]float32(nil), g[r][i]...)
		}
	}
	return out
}

func within(d, limit time.Duration) error {
	if d > limit {
		return fmt.Errorf("took %v, want at most %v", d, limit)
	}
	return nil
}
