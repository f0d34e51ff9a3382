package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// denseAverage is plain DDP's result: the float32 sum in rank order over N.
func denseAverage(grads [][][]float32, bucket int) []float32 {
	out := make([]float32, len(grads[0][bucket]))
	for _, g := range grads {
		for i, v := range g[bucket] {
			out[i] += v
		}
	}
	for i := range out {
		out[i] /= float32(len(grads))
	}
	return out
}

func residuals(e *Engine, bucket int) []float32 {
	if e.gradEF == nil {
		return nil
	}
	return e.gradEF.Residual(uint64(bucket))
}

// TestNonFiniteFallsBackDense: a NaN in one rank's bucket makes every rank
// exchange that bucket dense (the NaN shows where plain DDP shows it),
// reports it, and leaves that bucket's memory as it was; the other bucket
// stays compressed.
func TestNonFiniteFallsBackDense(t *testing.T) {
	sizes := []int{200, 300}
	for _, spec := range []string{"topk:0.1", "int8", "randomk:0.2", "fp16", "int4"} {
		for _, strategy := range []Strategy{StrategyAuto, StrategyQuantAllGather} {
			t.Run(spec+"/"+strategy.String(), func(t *testing.T) {
				const ranks = 3
				engines := newEngines(t, ranks, sizes, Config{Spec: spec, Strategy: strategy, ErrorFeedback: true, Decision: DecideCompressed})
				_, errs := runStep(engines, stepGrads(ranks, 0, sizes), inOrder(2))
				mustNoErrors(t, "step 0", errs)
				before := make([][]float32, ranks)
				for r, e := range engines {
					before[r] = residuals(e, 0)
				}
				grads := stepGrads(ranks, 1, sizes)
				grads[1][0][17] = float32(math.NaN())
				want := denseAverage(grads, 0)
				stats, errs := runStep(engines, grads, inOrder(2))
				mustNoErrors(t, "step 1", errs)
				for r, e := range engines {
					if i := sameFloats(grads[r][0], want); i >= 0 {
						t.Errorf("rank %d: element %d = %v, want the dense average %v", r, i, grads[r][0][i], want[i])
					}
					bs := stats[r].Buckets[0]
					wantReason := "rank 1 has a NaN or Inf (NaN) at element 17"
					if strategy == StrategyAuto && spec == "randomk:0.2" {
						wantReason = "rank 1 has a NaN or Inf"
					}
					if bs.Compressed || !bs.NonFinite || !strings.Contains(bs.Reason, wantReason) {
						t.Errorf("rank %d: bucket 0 stats %+v, want dense, NonFinite, reason naming %q", r, bs, wantReason)
					}
					if b1 := stats[r].Buckets[1]; !b1.Compressed || b1.NonFinite {
						t.Errorf("rank %d: bucket 1 stats %+v, want compressed", r, b1)
					}
					if i := sameFloats(residuals(e, 0), before[r]); i >= 0 {
						t.Errorf("rank %d: bucket 0's memory changed at %d", r, i)
					}
				}
			})
		}
	}
}

// TestNonFiniteDense: on the dense path the NaN shows in the average and is
// reported, on every rank.
func TestNonFiniteDense(t *testing.T) {
	sizes := []int{50}
	engines := newEngines(t, 2, sizes, Config{Spec: "none"})
	grads := stepGrads(2, 0, sizes)
	grads[0][0][3] = float32(math.Inf(1))
	stats, errs := runStep(engines, grads, inOrder(1))
	mustNoErrors(t, "step", errs)
	for r := range engines {
		if !math.IsInf(float64(grads[r][0][3]), 1) || !stats[r].Buckets[0].NonFinite {
			t.Errorf("rank %d: element 3 = %v, stats %+v; want +Inf, NonFinite", r, grads[r][0][3], stats[r].Buckets[0])
		}
	}
}

// TestFailOnNonFinite: every rank's Wait fails with the same error, and
// the step is skipped on every rank alike: each rank's saved state (both
// error-feedback memories, the momentum velocities) is what it was before
// the step, whether or not that rank's gradient held the NaN; the engine
// goes on.
func TestFailOnNonFinite(t *testing.T) {
	sizes := []int{100, 80}
	for _, spec := range []string{"topk:0.1", "int8", "randomk:0.5", "none"} {
		t.Run(spec, func(t *testing.T) {
			const ranks = 3
			engines := newEngines(t, ranks, sizes, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, FailOnNonFinite: true, Momentum: 0.5})
			_, errs := runStep(engines, stepGrads(ranks, 0, sizes), inOrder(2))
			mustNoErrors(t, "step 0", errs)
			grads := stepGrads(ranks, 1, sizes)
			grads[1][1][5] = float32(math.NaN())
			before := make([][]byte, ranks)
			for r, e := range engines {
				before[r] = savedMemory(t, e)
			}
			_, errs = runStep(engines, grads, inOrder(2))
			for r, err := range errs {
				var nf *NonFiniteStepError
				if !errors.As(err, &nf) || len(nf.Buckets) != 1 || nf.Buckets[0] != 1 || nf.Step != 1 {
					t.Fatalf("rank %d: got %v, want a *NonFiniteStepError for bucket 1 of step 1", r, err)
				}
				if !bytes.Equal(savedMemory(t, engines[r]), before[r]) {
					t.Errorf("rank %d: the skipped step changed the saved state", r)
				}
			}
			_, errs = runStep(engines, stepGrads(ranks, 2, sizes), inOrder(2))
			mustNoErrors(t, "the step after", errs)
		})
	}
}

// savedMemory is e's saved state without its step number and checksum:
// the memories, velocities and settings.
func savedMemory(t *testing.T, e *Engine) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := e.Save(&buf); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()[:buf.Len()-4]
	clear(b[13:21]) // "GCOV", version, world size, rank, then the next step
	return b
}

// TestUnrepresentableFallsBack: a finite value fp16 cannot hold sends the
// bucket dense, even with FailOnNonFinite, and the result is exact.
func TestUnrepresentableFallsBack(t *testing.T) {
	sizes := []int{64}
	engines := newEngines(t, 2, sizes, Config{Spec: "fp16", Decision: DecideCompressed, FailOnNonFinite: true})
	grads := stepGrads(2, 0, sizes)
	grads[0][0][9] = 1e5
	want := denseAverage(grads, 0)
	stats, errs := runStep(engines, grads, inOrder(1))
	mustNoErrors(t, "step", errs)
	for r := range engines {
		bs := stats[r].Buckets[0]
		if i := sameFloats(grads[r][0], want); i >= 0 || bs.Compressed || bs.NonFinite || !strings.Contains(bs.Reason, "cannot represent (100000) at element 9") {
			t.Errorf("rank %d: mismatch at %d, stats %+v", r, i, bs)
		}
	}
}

// TestDeadRank: a rank that stops calling makes the others' Wait fail
// within the timeout; their memory then holds e + g, and the engine is
// broken. With top-k both buckets' all-gathers are in flight at once when
// the rank dies (comm/inproc is a comm.Starter); with PowerSGD the
// survivors wait in its first all-reduce.
func TestDeadRank(t *testing.T) {
	sizes := []int{300, 200}
	shapes := [][]Shape{{{20, 15}}, {{10, 20}}} // low-rank's: both compressed at rank 2
	const ranks, timeout = 3, 200 * time.Millisecond
	for _, spec := range []string{"topk:0.05", "int8", "powersgd:2"} {
		t.Run(spec, func(t *testing.T) {
			engines := newEngines(t, ranks, sizes, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Timeout: timeout, Shapes: shapes})
			_, errs := runStep(engines, stepGrads(ranks, 0, sizes), inOrder(2))
			mustNoErrors(t, "step 0", errs)
			before := make([][][]float32, ranks)
			for r, e := range engines {
				before[r] = [][]float32{residuals(e, 0), residuals(e, 1)}
			}
			grads := stepGrads(ranks, 1, sizes)
			in := clone3(grads)
			took := make([]time.Duration, ranks)
			errs = onRanks(make([]comm.Comm, ranks), func(r int, _ comm.Comm) error {
				e := engines[r]
				if err := e.Step(); err != nil {
					return err
				}
				if r == 2 {
					return nil // dies: never readies, never waits
				}
				for i := range sizes {
					if err := e.Ready(i, grads[r][i]); err != nil {
						return err
					}
				}
				t0 := time.Now()
				_, err := e.Wait(context.Background())
				took[r] = time.Since(t0)
				return err
			})
			for r := range 2 {
				var se *StepError
				if !errors.As(errs[r], &se) || se.Step != 1 || se.Bucket != 0 {
					t.Fatalf("rank %d: got %v, want a *StepError of bucket 0 in step 1", r, errs[r])
				}
				if err := within(took[r], timeout+time.Second); err != nil {
					t.Errorf("rank %d: Wait %v", r, err)
				}
				for b := range sizes {
					want := make([]float32, sizes[b])
					for i := range want {
						want[i] = before[r][b][i] + in[r][b][i]
					}
					if i := sameFloats(residuals(engines[r], b), want); i >= 0 {
						t.Errorf("rank %d, bucket %d: memory at %d is %v, want e + g = %v", r, b, i, residuals(engines[r], b)[i], want[i])
					}
				}
				var be *BrokenError
				if err := engines[r].Step(); !errors.As(err, &be) || !errors.Is(err, se) {
					t.Errorf("rank %d: Step after the failure: %v, want a *BrokenError wrapping it", r, err)
				}
			}
		})
	}
}

// TestUsageErrors walks the calls the engine's state forbids.
func TestUsageErrors(t *testing.T) {
	e := newEngines(t, 1, []int{4, 5}, Config{Spec: "topk:0.5", ErrorFeedback: true})[0]
	g0, g1 := make([]float32, 4), make([]float32, 5)
	ctx := context.Background()
	check := func(what string, err, want error) {
		t.Helper()
		var ue *UsageError
		if !errors.As(err, &ue) || !errors.Is(err, want) {
			t.Errorf("%s: got %v, want a *UsageError with %v", what, err, want)
		}
	}
	check("Ready without Step", e.Ready(0, g0), ErrNoStep)
	_, err := e.Wait(ctx)
	check("Wait without Step", err, ErrNoStep)
	if err := e.Step(); err != nil {
		t.Fatal(err)
	}
	check("Step during a step", e.Step(), ErrStepInFlight)
	check("Ready(2)", e.Ready(2, g0), ErrUnknownBucket)
	check("Ready(-1)", e.Ready(-1, g0), ErrUnknownBucket)
	check("Ready with a short gradient", e.Ready(1, g0), ErrLength)
	if err := e.Ready(0, g0); err != nil {
		t.Fatal(err)
	}
	check("Ready twice", e.Ready(0, g0), ErrAlreadyReady)
	check("Save during a step", e.Save(&strings.Builder{}), ErrStepInFlight)
	if err := e.Ready(1, g1); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	check("Step after Close", e.Step(), ErrEngineClosed)
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestWaitBeforeReady: Wait with a bucket never readied fails at once and
// breaks the engine (the other ranks would wait for it).
func TestWaitBeforeReady(t *testing.T) {
	e := newEngines(t, 1, []int{4, 5}, Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed})[0]
	if err := e.Step(); err != nil {
		t.Fatal(err)
	}
	if err := e.Ready(1, make([]float32, 5)); err != nil {
		t.Fatal(err)
	}
	_, err := e.Wait(context.Background())
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "buckets [0]") {
		t.Fatalf("got %v, want ErrNotReady naming bucket 0", err)
	}
	if err := e.Ready(0, make([]float32, 4)); !errors.As(err, new(*BrokenError)) {
		t.Errorf("Ready after: %v, want a *BrokenError", err)
	}
}

// TestWaitContext: Wait's context ending abandons the step.
func TestWaitContext(t *testing.T) {
	engines := newEngines(t, 2, []int{10}, Config{Spec: "topk:0.5", Decision: DecideCompressed, Timeout: 10 * time.Second})
	e := engines[0]
	if err := e.Step(); err != nil {
		t.Fatal(err)
	}
	if err := e.Ready(0, make([]float32, 10)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := e.Wait(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > 2*time.Second {
		t.Errorf("got %v after %v, want DeadlineExceeded promptly", err, time.Since(t0))
	}
}

// TestCloseDuringStep: Close abandons a step and releases a Wait.
func TestCloseDuringStep(t *testing.T) {
	engines := newEngines(t, 2, []int{10}, Config{Spec: "topk:0.5", Decision: DecideCompressed})
	e := engines[0]
	if err := e.Step(); err != nil {
		t.Fatal(err)
	}
	if err := e.Ready(0, make([]float32, 10)); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error)
	go func() {
		_, err := e.Wait(context.Background())
		waited <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if _, err := e.Wait(context.Background()); !errors.Is(err, ErrWaiting) {
		t.Errorf("a second Wait: %v, want ErrWaiting", err)
	}
	if err := e.Ready(0, make([]float32, 10)); !errors.Is(err, ErrWaiting) {
		t.Errorf("Ready during Wait: %v, want ErrWaiting", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; !errors.Is(err, ErrEngineClosed) {
		t.Errorf("Wait: %v, want ErrEngineClosed", err)
	}
}

// TestSparseGatherOverflow: top-k values that overflow when the ranks'
// payloads are summed make the bucket's average non-finite; sparse-gather,
// which sums and averages block by block, reports the lowest such index as
// the full pass over the bucket would.
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
