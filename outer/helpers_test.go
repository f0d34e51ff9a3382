package outer

import (
	"context"
	"math"
	"sync"
	"testing"

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

func mustNoErrors(t testing.TB, what string, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
}

// quad is the tests' model: tensors of the given sizes, and on rank r the
// loss ½‖θ − target_r‖² plus a step-dependent linear term, so each rank
// pulls toward its own data: the gradient of tensor t, element i at inner
// step k is θ − target_r + noise(r, k, t, i).
type quad struct{ sizes []int }

func (q quad) target(r, t, i int) float32 {
	return float32(math.Sin(float64(1+r)*0.7+float64(t)*1.3+float64(i)*0.37)) * float32(1+r)
}

func (q quad) noise(r, k, t, i int) float32 {
	return 0.1 * float32(math.Cos(float64(k)*0.91+float64(r)*2.1+float64(t)*0.5+float64(i)*1.7))
}

// grad is rank r's gradient at inner step k for weights p.
func (q quad) grad(r, k int, p [][]float32) [][]float32 {
	g := make([][]float32, len(p))
	for t := range p {
		g[t] = make([]float32, len(p[t]))
		for i, v := range p[t] {
			g[t][i] = v - q.target(r, t, i) + q.noise(r, k, t, i)
		}
	}
	return g
}

// sgd is the inner optimizer: p ← p − lr·g, in place.
func sgd(p, g [][]float32, lr float32) {
	for t := range p {
		for i := range p[t] {
			p[t][i] -= lr * g[t][i]
		}
	}
}

// innerLR is the tests' inner learning rate.
const innerLR = 0.1

// init returns rank r's initial weights (they differ by rank: New makes
// rank 0's everyone's).
func (q quad) init(r int) [][]float32 {
	p := make([][]float32, len(q.sizes))
	for t, n := range q.sizes {
		p[t] = make([]float32, n)
		for i := range p[t] {
			p[t][i] = float32(r+1) * 0.01 * float32(i-t)
		}
	}
	return p
}

// newLoops builds a Loop per rank of comms over params[r], failing the
// test on an error; the Loops are closed at cleanup.
func newLoops(t testing.TB, comms []comm.Comm, params [][][]float32, cfg Config) []*Loop {
	t.Helper()
	loops := make([]*Loop, len(comms))
	errs := onRanks(comms, func(r int, c comm.Comm) error {
		var err error
		loops[r], err = New(context.Background(), c, params[r], cfg)
		return err
	})
	mustNoErrors(t, "New", errs)
	t.Cleanup(func() {
		for _, l := range loops {
			l.Close()
		}
	})
	return loops
}

// setup is a group of n ranks training q, each from q.init(r), with
// Loops of cfg.
func setup(t testing.TB, q quad, n int, cfg Config) ([]*Loop, [][][]float32) {
	t.Helper()
	params := make([][][]float32, n)
	for r := range params {
		params[r] = q.init(r)
	}
	return newLoops(t, group(t, n), params, cfg), params
}

// train runs inner steps from, from+1, …, from+steps−1 (k counts from 0;
// the Loop's s is k+1 from a fresh start) on every rank: an inner SGD
// step of q, then hook (if not nil), then Step; it returns every rank's
// reports.
func train(t testing.TB, q quad, loops []*Loop, params [][][]float32, from, steps int, hook func(r, k int)) [][]Report {
	t.Helper()
	reports := make([][]Report, len(loops))
	errs := onRanks(commsOf(loops), func(r int, _ comm.Comm) error {
		for k := from; k < from+steps; k++ {
			sgd(params[r], q.grad(r, k, params[r]), innerLR)
			if hook != nil {
				hook(r, k)
			}
			rep, err := loops[r].Step(context.Background())
			reports[r] = append(reports[r], rep)
			if err != nil {
				return err
			}
		}
		return nil
	})
	mustNoErrors(t, "train", errs)
	return reports
}

// closeTo reports the first element where got and want differ by more
// than tol·(1 + |want|), or -1, -1.
func closeTo(got, want [][]float32, tol float64) (int, int) {
	for t := range want {
		for i := range want[t] {
			if d := math.Abs(float64(got[t][i]) - float64(want[t][i])); !(d <= tol*(1+math.Abs(float64(want[t][i])))) {
				return t, i
			}
		}
	}
	return -1, -1
}

// identical reports the first element where got and want differ in any
// bit, or -1, -1.
func identical(got, want [][]float32) (int, int) {
	for t := range want {
		for i := range want[t] {
			if math.Float32bits(got[t][i]) != math.Float32bits(want[t][i]) {
				return t, i
			}
		}
	}
	return -1, -1
}

// average is the float32 mean over ranks, summed in rank order.
func average(xs [][][]float32) [][]float32 {
	out := zeros(sizesOf(xs[0]))
	for _, x := range xs {
		for t := range x {
			for i, v := range x[t] {
				out[t][i] += v
			}
		}
	}
	for t := range out {
		for i := range out[t] {
			out[t][i] /= float32(len(xs))
		}
	}
	return out
}

func sizesOf(x [][]float32) []int {
	s := make([]int, len(x))
	for i := range x {
		s[i] = len(x[i])
	}
	return s
}

// commsOf is the Loops' comms, for onRanks.
func commsOf(loops []*Loop) []comm.Comm {
	comms := make([]comm.Comm, len(loops))
	for r, l := range loops {
		comms[r] = l.c
	}
	return comms
}
