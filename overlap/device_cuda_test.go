//go:build cuda

package overlap

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/comm/ncclcomm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/gputest"
	"github.com/gradcomp/gradcomp/kernels"
	"github.com/gradcomp/gradcomp/nccl"
)

// deviceRig is device 0's context and a one-rank NCCL communicator on it,
// with its host Comm.
type deviceRig struct {
	ctx  *kernels.Context
	dc   comm.DeviceComm
	host comm.Comm
}

// openRig opens the rig once per test binary (gputest.Opener): one H200,
// and NCCL refuses two ranks on one GPU. $GRADCOMP_NCCL names libnccl.so.2
// (scripts/gpu-check sets it to the nvidia-nccl wheel's copy).
var openRig = gputest.Opener(func() (deviceRig, error) {
	ctx, err := kernels.Open(0)
	if err != nil {
		return deviceRig{}, err
	}
	lib, err := nccl.Open()
	if err != nil {
		return deviceRig{}, fmt.Errorf("set %s: %w", nccl.EnvPath, err)
	}
	hosts, err := inproc.NewGroup(1)
	if err != nil {
		return deviceRig{}, err
	}
	dc, err := ncclcomm.New(context.Background(), lib, hosts[0], nccl.WithDevice(0), nccl.WithTimeout(30*time.Second))
	return deviceRig{ctx, dc, hosts[0]}, err
}, kernels.ErrNoDevice, nccl.ErrNotFound)

// testDevice returns the rig's parts, or skips the test with the reason
// when there is no GPU or no libnccl.so.2.
func testDevice(tb testing.TB) (*kernels.Context, comm.DeviceComm, comm.Comm) {
	tb.Helper()
	r := openRig(tb)
	return r.ctx, r.dc, r.host
}

// gpuBuffers allocates one device buffer per size, freed at cleanup.
func gpuBuffers(tb testing.TB, ctx *kernels.Context, sizes []int) []gpu.Ptr {
	tb.Helper()
	var ps []gpu.Ptr
	for _, n := range sizes {
		p, err := ctx.Alloc(4 * n)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { ctx.Free(p) })
		ps = append(ps, p)
	}
	return ps
}

// TestDeviceEngineCUDA runs the device engine on the GPU, one NCCL rank,
// with error feedback, for 3 steps per codec and strategy, and compares
// every bucket bit for bit with the CPU engine of the same strategy (the
// kernels are bit-identical to package compress); step 2 puts an Inf in
// bucket 1, which must come back NaN (dense: Inf) and flagged. The last
// cases add momentum correction (with masking) and a compression
// warm-up, pinned compressed, the accuracy guard (thresholds below
// the CPU engine's ρ of about 0.61 for top-k and 2.5 for int2 here, so
// step 0 trips it and step 1 flushes), whose flushes and ρ must match the
// CPU engine's (ρ within 1e-6 relative), and PowerSGD (its kernels' sums
// in the CPU kernels' orders: the same bits).
func TestDeviceEngineCUDA(t *testing.T) {
	ctx, dc, host := testDevice(t)
	sizes := []int{1 << 20, 300_001, 4097}
	for _, tc := range []struct {
		spec     string
		strategy Strategy
		momentum float64
		schedule string
		guard    float64
	}{
		{"none", StrategyAuto, 0, "", 0}, {"int8", StrategyAuto, 0, "", 0}, {"int8", StrategyQuantSRA, 0, "", 0}, {"int4", StrategyAuto, 0, "", 0},
		{"sign", StrategyQuantSRA, 0, "", 0}, {"topk:0.01", StrategyAuto, 0, "", 0}, {"topk:0.01:sampled", StrategyAuto, 0, "", 0},
		{"randomk:0.01", StrategyAuto, 0, "", 0}, {"fp16", StrategyQuantSRA, 0, "", 0}, {"bf16", StrategyAuto, 0, "", 0},
		{"none", StrategyAuto, 0.9, "", 0}, {"topk:0.01", StrategyAuto, 0.9, "1@topk:0.1", 0},
		{"randomk:0.01", StrategyAuto, 0.9, "", 0}, {"int4", StrategyQuantSRA, 0.9, "1@int8", 0},
		{"topk:0.01", StrategyAuto, 0, "", 0.5}, {"int2", StrategyQuantSRA, 0, "", 1.5},
		{"powersgd:4", StrategyAuto, 0, "", 0}, {"powersgd:2:warm=off", StrategyAuto, 0.9, "", 0},
	} {
		name := tc.spec + "/" + tc.strategy.String()
		if tc.momentum != 0 {
			name += fmt.Sprintf("/momentum=%v/schedule=%q", tc.momentum, tc.schedule)
		}
		if tc.guard != 0 {
			name += fmt.Sprintf("/guard=%v", tc.guard)
		}
		t.Run(name, func(t *testing.T) {
			schedule, err := ParseSchedule(tc.schedule)
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{Spec: tc.spec, Strategy: tc.strategy, ErrorFeedback: true, Momentum: tc.momentum,
				MomentumMasking: tc.momentum != 0, Schedule: schedule, Guard: tc.guard}
			if strings.HasPrefix(tc.spec, "powersgd") {
				// A square matrix, a wide one with a bias, an odd one.
				cfg.Shapes = [][]Shape{{{1024, 1024}}, {{300, 1000}, {1, 1}}, {{17, 241}}}
			}
			cfg.Decision = DecideCompressed // the CPU twins' paths
			e, err := NewDevice(context.Background(), CUDA(ctx), dc, host, sizes, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			cpu := cpuTwins(t, e, 1, sizes)
			s, err := ctx.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer ctx.DestroyStream(s)
			grads := gpuBuffers(t, ctx, sizes)
			for num := range 3 {
				hg := stepGrads(1, num, sizes)
				if num == 2 {
					hg[0][1][77] = float32(math.Inf(-1))
				}
				if err := e.Step(); err != nil {
					t.Fatal(err)
				}
				for i := range sizes {
					if err := ctx.CopyIn(s, grads[i], f32.Bytes(hg[0][i])); err != nil {
						t.Fatal(err)
					}
					if err := e.Ready(i, grads[i], s); err != nil {
						t.Fatal(err)
					}
				}
				if err := e.Done(s); err != nil {
					t.Fatal(err)
				}
				t0 := time.Now()
				stats, err := e.Wait(context.Background())
				if err != nil {
					t.Fatalf("step %d: %v", num, err)
				}
				wait := time.Since(t0)
				want := cloneGrads(hg)
				cpuStats, errs := runStep(cpu, want, inOrder(len(sizes)))
				if errs[0] != nil {
					t.Fatal(errs[0])
				}
				for i, n := range sizes {
					got := make([]float32, n)
					if err := ctx.CopyOut(s, f32.Bytes(got), grads[i]); err != nil {
						t.Fatal(err)
					}
					if num == 2 && i == 1 {
						if !stats.Buckets[i].NonFinite || (tc.spec != "none" && !math.IsNaN(float64(got[0]))) {
							t.Errorf("step 2 bucket 1 with an Inf: stats %+v, element 0 %v", stats.Buckets[i], got[0])
						}
						continue
					}
					if j := sameBits(got, want[0][i]); j >= 0 {
						t.Fatalf("step %d bucket %d element %d: %v, the CPU engine has %v", num, i, j, got[j], want[0][i][j])
					}
					g, c := stats.Buckets[i], cpuStats[0].Buckets[i]
					if g.Guarded != c.Guarded || math.Abs(g.HeldBack-c.HeldBack) > 1e-6*c.HeldBack {
						t.Fatalf("step %d bucket %d: Guarded %v, HeldBack %v; the CPU engine has %v, %v", num, i, g.Guarded, g.HeldBack, c.Guarded, c.HeldBack)
					}
				}
				b0 := stats.Buckets[0]
				t.Logf("step %d: wait %v; bucket 0: compress %v, exchange %v, decompress %v, %d bytes", num, wait, b0.Compress, b0.Exchange, b0.Decompress, b0.BytesSent)
			}
		})
	}
}

// BenchmarkDeviceOverlap is issue 4's overlap target on one GPU: a
// synthetic backward (per bucket R SGEMMs of 1024³ and the gradient's
// fill, on the caller's stream) with the device engine compressing and
// exchanging each bucket (one NCCL rank) on its own streams, against the
// same backward alone. R is calibrated so that the compute of a bucket is
// at least twice the engine's time for it measured alone (the exchange
// fits under compute). Metrics: step/compute (the step time ÷ the
// compute-only time, medians of the same run; target ≤ 1.1), and both
// times and the engine-alone time in ms.
func BenchmarkDeviceOverlap(b *testing.B) {
	for _, spec := range []string{"none", "int8", "topk:0.01"} {
		b.Run(spec, func(b *testing.B) { overlapBench(b, spec) })
	}
}

func overlapBench(b *testing.B, spec string) {
	ctx, dc, host := testDevice(b)
	const nb, n, dim = 8, 4 << 20, 1024
	sizes := slices.Repeat([]int{n}, nb)
	e, err := NewDevice(context.Background(), CUDA(ctx), dc, host, sizes, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	s, err := ctx.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer ctx.DestroyStream(s)
	grads := gpuBuffers(b, ctx, sizes)
	mats := gpuBuffers(b, ctx, []int{dim * dim, dim * dim, dim * dim})
	for i, m := range mats[:2] {
		if err := kernels.FillLaplace(ctx, s, m, dim*dim, 7, compress.Key{Bucket: uint64(i)}); err != nil {
			b.Fatal(err)
		}
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	// step runs one training step with r GEMMs per bucket, through the
	// engine or not, and returns its wall time (host to host).
	step := func(num, r int, engine bool) time.Duration {
		t0 := time.Now()
		if engine {
			must(e.Step())
		}
		for i := range nb {
			for range r {
				must(kernels.SGEMM(ctx, s, mats[2], mats[0], mats[1], dim, dim, dim))
			}
			must(kernels.FillLaplace(ctx, s, grads[i], n, 1, compress.Key{Bucket: uint64(i), Step: uint64(num)}))
			if engine {
				must(e.Ready(i, grads[i], s))
			}
		}
		if engine {
			must(e.Done(s))
			_, err := e.Wait(context.Background())
			must(err)
		}
		must(ctx.Synchronize(s))
		return time.Since(t0)
	}
	median := func(k, r int, engine bool) time.Duration {
		ts := make([]time.Duration, k)
		for j := range ts {
			ts[j] = step(j, r, engine)
		}
		slices.Sort(ts)
		return ts[k/2]
	}
	median(3, 1, true) // warm up: JIT, NCCL, caches
	fillOnly := median(5, 0, false)
	alone := median(5, 0, true) - fillOnly // the engine's work, nothing to hide behind
	perGemm := (median(3, 4, false) - fillOnly) / (4 * nb)
	r := max(1, int(math.Ceil(2*float64(alone)/float64(nb)/float64(perGemm))))
	b.ResetTimer()
	var compute, withEngine []time.Duration
	for j := range b.N { // paired: compute-only and engine steps alternate
		compute = append(compute, step(j, r, false))
		withEngine = append(withEngine, step(j, r, true))
	}
	b.StopTimer()
	slices.Sort(compute)
	slices.Sort(withEngine)
	c, w := compute[len(compute)/2], withEngine[len(withEngine)/2]
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.ReportMetric(float64(w)/float64(c), "step/compute")
	b.ReportMetric(ms(c), "compute_ms")
	b.ReportMetric(ms(w), "step_ms")
	b.ReportMetric(ms(alone), "engine_alone_ms")
	b.ReportMetric(float64(r), "gemms/bucket")
}

// TestDeviceEngineCostModelCUDA runs DecideAuto's cost model on the GPU
// (one NCCL rank): the link probed with NCCL all-reduces, the codec's
// kernels timed by CUDA events on scratch buffers. Every bucket must carry
// the model's prediction and reason, and a step must then run; the
// predictions are logged for the report.
func TestDeviceEngineCostModelCUDA(t *testing.T) {
	ctx, dc, host := testDevice(t)
	sizes := []int{1 << 22, 1 << 12}
	for _, spec := range []string{"int8", "topk:0.01", "randomk:0.01"} {
		t.Run(spec, func(t *testing.T) {
			e, err := NewDevice(context.Background(), CUDA(ctx), dc, host, sizes, Config{Spec: spec, ErrorFeedback: true})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			for i, b := range e.buckets {
				if !strings.Contains(b.reason, "cost model") || b.predComp <= 0 || b.predDense <= 0 {
					t.Errorf("bucket %d: %q, predicted %v and %v", i, b.reason, b.predComp, b.predDense)
				}
				t.Logf("%s bucket %d (%d elements): compressed %v, dense %v", spec, i, b.n, b.predComp, b.predDense)
			}
			s, err := ctx.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer ctx.DestroyStream(s)
			grads := gpuBuffers(t, ctx, sizes)
			if err := e.Step(); err != nil {
				t.Fatal(err)
			}
			for i, n := range sizes {
				if err := ctx.CopyIn(s, grads[i], f32.Bytes(stepGrads(1, 0, []int{n})[0][0])); err != nil {
					t.Fatal(err)
				}
				if err := e.Ready(i, grads[i], s); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := e.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
