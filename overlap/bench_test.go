package overlap

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// benchStep runs one step on every engine: per bucket, compute (a busy
// loop of the given duration, standing in for backward) then Ready; then
// Wait. It returns rank 0's stats.
func benchStep(b *testing.B, engines []*Engine, grads [][][]float32, compute time.Duration) StepStats {
	var stats StepStats
	var wg sync.WaitGroup
	for r, e := range engines {
		wg.Go(func() {
			if err := e.Step(); err != nil {
				b.Error(err)
				return
			}
			for i, g := range grads[r] {
				spin(compute)
				if err := e.Ready(i, g); err != nil {
					b.Error(err)
					return
				}
			}
			s, err := e.Wait(context.Background())
			if err != nil {
				b.Error(err)
			}
			if r == 0 {
				stats = s
			}
		})
	}
	wg.Wait()
	return stats
}

// spin keeps the caller's goroutine busy for d, yielding to the runtime
// between polls of the clock. Without the yield, on a 2-core machine with
// 2 ranks in one process, the spinning callers would hold both cores and
// Go would preempt them for the engine's goroutines only every 10 ms: the
// yield models compute that leaves the host's scheduler alone, as an
// accelerator's kernels or cores the engine does not share do.
func spin(d time.Duration) {
	for t := time.Now(); time.Since(t) < d; {
		runtime.Gosched()
	}
}

func benchEngines(b *testing.B, comms []comm.Comm, sizes []int, cfg Config) []*Engine {
	engines := make([]*Engine, len(comms))
	errs := onRanks(comms, func(r int, c comm.Comm) error {
		var err error
		engines[r], err = New(context.Background(), c, sizes, cfg)
		return err
	})
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, e := range engines {
			e.Close()
		}
	})
	return engines
}

// BenchmarkOverlap: 2 ranks over an emulated 1 Gbit/s link (in-process
// ranks behind a sleep of 50 µs + V/125 MB/s per collective, which costs
// no CPU), 16 buckets of 128 Ki float32s, and per bucket a busy loop
// before Ready of 1.25× the bucket's pipeline time (compress + exchange +
// decompress, measured in a step without compute). Reported:
// exposed/exchange, the time Wait blocked over the time in collectives
// (0 when every collective hides behind compute); exposed/step; the step
// time.
//
//	go test ./overlap -run '^$' -bench Overlap -benchtime 10x
func BenchmarkOverlap(b *testing.B) {
	const ranks, buckets, n = 2, 16, 1 << 17
	sizes := make([]int, buckets)
	for i := range sizes {
		sizes[i] = n
	}
	for _, spec := range []string{"none", "topk:0.01", "int8", "fp16"} {
		b.Run(spec, func(b *testing.B) {
			engines := benchEngines(b, slowGroup(group(b, ranks), 50*time.Microsecond, 125e6), sizes,
				Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed})
			grads := stepGrads(ranks, 0, sizes)
			// Calibrate: a bucket's pipeline time, without compute.
			var pipeline time.Duration
			for _, bs := range benchStep(b, engines, grads, 0).Buckets {
				pipeline += bs.Compress + bs.Exchange + bs.Decompress
			}
			compute := pipeline * 5 / 4 / buckets
			var exposed, exchange, total time.Duration
			b.ResetTimer()
			for range b.N {
				s := benchStep(b, engines, grads, compute)
				exposed += s.Exposed
				exchange += s.ExchangeTotal
				total += s.Total
			}
			b.ReportMetric(float64(exposed)/float64(exchange), "exposed/exchange")
			b.ReportMetric(float64(exposed)/float64(total), "exposed/step")
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/step")
			b.ReportMetric(float64(compute.Microseconds()), "µs-compute/bucket")
		})
	}
}

// BenchmarkUnlimitedLink: 4 in-process ranks (memory copies, no emulated
// delay), 8 buckets of 256 Ki float32s, no compute. Per codec it builds
// engines with the cost model on (DecideAuto), with the compressed path
// pinned, and dense (codec none), runs the first verification window
// (firstWindowSteps steps, each engine in turn) and then times each iteration's
// three steps side by side. Reported: auto/dense, the steady-state step
// time ratio (≤ 1 when the cost model never loses to dense); pinned/dense; window/dense, the ratio over
// the verification window's steps (what verifying costs, once per
// recheck); how many buckets the model predicted compressed and how many
// verification kept compressed; the model's predicted compressed/dense
// time for bucket 0.
//
//	go test ./overlap -run '^$' -bench UnlimitedLink -benchtime 20x
func BenchmarkUnlimitedLink(b *testing.B) {
	benchAutoVsDense(b, func(b *testing.B) []comm.Comm { return group(b, 4) })
}

// BenchmarkSlowLink is BenchmarkUnlimitedLink over an emulated 1 Gbit/s
// link (50 µs + V/125 MB/s per collective, a sleep): where compression
// pays, auto should match pinned.
//
//	go test ./overlap -run '^$' -bench SlowLink -benchtime 5x
func BenchmarkSlowLink(b *testing.B) {
	benchAutoVsDense(b, func(b *testing.B) []comm.Comm { return slowGroup(group(b, 4), 50*time.Microsecond, 125e6) })
}

func benchAutoVsDense(b *testing.B, link func(b *testing.B) []comm.Comm) {
	const buckets, n = 8, 1 << 18
	sizes := make([]int, buckets)
	for i := range sizes {
		sizes[i] = n
	}
	comms := link(b)
	ranks := len(comms)
	grads := stepGrads(ranks, 0, sizes)
	dense := benchEngines(b, comms, sizes, Config{Spec: "none"})
	for _, spec := range []string{"fp16", "bf16", "topk:0.01", "randomk:0.01", "int8", "int4", "int2", "sign"} {
		b.Run(spec, func(b *testing.B) {
			auto := benchEngines(b, link(b), sizes, Config{Spec: spec, ErrorFeedback: true})
			pinned := benchEngines(b, link(b), sizes, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed})
			predicted := count(auto[0].Compressed())
			bk := auto[0].buckets[0]
			predRatio := float64(bk.predComp) / float64(bk.predDense)
			steps := func(k int) (tDense, tAuto, tPinned time.Duration) {
				for range k {
					for _, run := range []struct {
						e []*Engine
						t *time.Duration
					}{{dense, &tDense}, {auto, &tAuto}, {pinned, &tPinned}} {
						t := time.Now()
						benchStep(b, run.e, clone3(grads), 0)
						*run.t += time.Since(t)
					}
				}
				return
			}
			wDense, wAuto, _ := steps(firstWindowSteps)
			b.ResetTimer()
			tDense, tAuto, tPinned := steps(b.N)
			b.ReportMetric(float64(tAuto)/float64(tDense), "auto/dense")
			b.ReportMetric(float64(tPinned)/float64(tDense), "pinned/dense")
			b.ReportMetric(float64(wAuto)/float64(wDense), "window/dense")
			b.ReportMetric(float64(predicted), "predicted-compressed")
			b.ReportMetric(float64(count(auto[0].Compressed())), "verified-compressed")
			b.ReportMetric(predRatio, "predicted-comp/dense")
			b.ReportMetric(float64(tDense.Microseconds())/float64(b.N), "µs-dense/step")
		})
	}
}

func count(v []bool) int {
	k := 0
	for _, x := range v {
		if x {
			k++
		}
	}
	return k
}
