package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/fakegpu"
)

// Device is what fakegpu's devices are.
var _ Device = (*fakegpu.Device)(nil)

// devRig is one device engine per rank, each on its own device (its GPU)
// of one fake platform, with a caller stream and a device buffer per
// bucket.
type devRig struct {
	sizes   []int
	devs    []*fakegpu.Device
	dcs     []*loggedComm
	engines []*DeviceEngine
	caller  []gpu.Stream
	grads   [][]gpu.Ptr
}

// newDevRig builds the engines with per-rank configurations; it returns
// New's errors by rank (the engines of failed ranks are nil).
func newDevRig(t *testing.T, sizes []int, cfgs []Config, timeout time.Duration, tm ...timing) (*devRig, []error) {
	t.Helper()
	return newDevRigOn(t, group(t, len(cfgs)), group(t, len(cfgs)), sizes, cfgs, timeout, tm...)
}

// newDevRigOn is newDevRig over the given host comms and the comms under
// the fake DeviceComms (wire).
func newDevRigOn(t *testing.T, host, wire []comm.Comm, sizes []int, cfgs []Config, timeout time.Duration, tm ...timing) (*devRig, []error) {
	t.Helper()
	n := len(cfgs)
	g := &devRig{sizes: sizes, devs: make([]*fakegpu.Device, n), dcs: make([]*loggedComm, n),
		engines: make([]*DeviceEngine, n), caller: make([]gpu.Stream, n), grads: make([][]gpu.Ptr, n)}
	plat := fakegpu.New(n)
	for r := range n {
		g.devs[r] = plat.Device(r)
		g.dcs[r] = &loggedComm{Comm: fakegpu.NewComm(wire[r], g.devs[r], timeout)}
		var err error
		if g.caller[r], err = g.devs[r].NewStream(); err != nil {
			t.Fatal(err)
		}
		for _, sz := range sizes {
			p, err := g.devs[r].Alloc(4 * sz)
			if err != nil {
				t.Fatal(err)
			}
			g.grads[r] = append(g.grads[r], p)
		}
	}
	errs := onRanks(host, func(r int, c comm.Comm) error {
		var err error
		if len(tm) > 0 {
			g.engines[r], err = newDevice(context.Background(), g.devs[r], g.dcs[r], c, sizes, cfgs[r], tm[0])
		} else {
			g.engines[r], err = NewDevice(context.Background(), g.devs[r], g.dcs[r], c, sizes, cfgs[r])
		}
		return err
	})
	t.Cleanup(func() {
		for _, e := range g.engines {
			if e != nil {
				e.Close()
			}
		}
		plat.Close()
	})
	return g, errs
}

// loggedComm is a fake DeviceComm that logs the element counts of the
// all-reduces enqueued on it, in order.
type loggedComm struct {
	*fakegpu.Comm
	mu      sync.Mutex
	reduced []int
}

func (l *loggedComm) AllReduce(ctx context.Context, buf gpu.Ptr, n int, s gpu.Stream) error {
	l.mu.Lock()
	l.reduced = append(l.reduced, n)
	l.mu.Unlock()
	return l.Comm.AllReduce(ctx, buf, n, s)
}

// deviceFloats is the host view of n float32 elements at p on d.
func deviceFloats(t *testing.T, d *fakegpu.Device, p gpu.Ptr, n int) []float32 {
	b, err := d.View(p, 4*n)
	if err != nil {
		t.Error(err)
		return make([]float32, n)
	}
	return f32.Floats(b)
}

// mustDevRig is newDevRig with one configuration for every rank, failing
// the test on any error.
func mustDevRig(t *testing.T, ranks int, sizes []int, cfg Config) *devRig {
	t.Helper()
	cfgs := make([]Config, ranks)
	for r := range cfgs {
		cfgs[r] = cfg
	}
	g, errs := newDevRig(t, sizes, cfgs, 2*time.Second)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: NewDevice: %v", r, err)
		}
	}
	return g
}

// step runs one step on every rank: each bucket's gradient is copied in on
// the caller's stream, then Ready in order(r), Done and Wait. It returns
// each rank's averaged gradients, stats and first error.
func (g *devRig) step(grads [][][]float32, order func(r int) []int) ([][][]float32, []StepStats, []error) {
	return g.delegateStep(grads, order, delegation{})
}

// stepBoth runs one step of grads on the device engines and on the CPU
// engines cpu, and fails the test (naming what) on an error or where a
// rank's result is not the CPU engine's, bit for bit. It returns the
// device engines' statistics.
func (g *devRig) stepBoth(t *testing.T, cpu []*Engine, grads [][][]float32, order func(r int) []int, what string) []StepStats {
	t.Helper()
	out, stats, errs := g.step(grads, order)
	want := cloneGrads(grads)
	_, cpuErrs := runStep(cpu, want, order)
	for r := range g.engines {
		if errs[r] != nil || cpuErrs[r] != nil {
			t.Fatalf("%s rank %d: device %v, CPU %v", what, r, errs[r], cpuErrs[r])
		}
		for i := range g.sizes {
			if j := sameBits(out[r][i], want[r][i]); j >= 0 {
				t.Fatalf("%s rank %d bucket %d element %d: %v, the CPU engine has %v", what, r, i, j, out[r][i][j], want[r][i][j])
			}
		}
	}
	return stats
}

func sameBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// cpuTwins returns CPU engines that exchange as the device engine e
// does: the same spec, error feedback and strategy, pinned compressed.
func cpuTwins(t *testing.T, e *DeviceEngine, ranks int, sizes []int) []*Engine {
	t.Helper()
	cfg := e.cfg
	cfg.Strategy, cfg.Decision = e.strategy, DecideCompressed
	return newEngines(t, ranks, sizes, cfg)
}

// mustResolve is the strategy Engine resolves ask to for spec on ranks.
func mustResolve(t *testing.T, ask Strategy, spec string, ranks int) Strategy {
	t.Helper()
	sp, err := compress.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	s, err := resolve(ask, sp.Codec, ranks)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func cloneGrads(g [][][]float32) [][][]float32 {
	out := make([][][]float32, len(g))
	for r := range g {
		for _, b := range g[r] {
			out[r] = append(out[r], append([]float32(nil), b...))
		}
	}
	return out
}

// TestDeviceEngineResults checks, for every device strategy and codec on
// 2 and 3 ranks, StrategyAuto resolving as Engine's does, 3 steps with
// error feedback and buckets made ready in different orders on different
// ranks: every rank ends each step with exactly the CPU engine's result
// of the same strategy, keys and memory (the package doc's), and the
// statistics' accounting.
func TestDeviceEngineResults(t *testing.T) {
	sizes := []int{1000, 37, 300, 2}
	for _, tc := range []struct {
		spec     string
		ranks    int
		ask      Strategy // Config.Strategy
		strategy Strategy // what it resolves to, on both backends
	}{
		{"none", 3, StrategyAuto, StrategyDense}, {"topk:0.05", 3, StrategyAuto, StrategySparseGather},
		{"randomk:0.1", 3, StrategyAuto, StrategySharedIndex}, {"randomk:0.1", 2, StrategyQuantAllGather, StrategyQuantAllGather},
		{"int8", 2, StrategyAuto, StrategyQuantAllGather}, {"int8", 3, StrategyAuto, StrategyQuantSRA},
		{"int4:round=nearest", 3, StrategyAuto, StrategyQuantSRA}, {"sign:bucket=64", 3, StrategyAuto, StrategyQuantSRA},
		{"fp16", 3, StrategyAuto, StrategyDense}, {"bf16", 2, StrategyAuto, StrategyDense},
		{"bf16", 2, StrategyQuantAllGather, StrategyQuantAllGather}, {"int8", 3, StrategySparseGather, StrategySparseGather},
	} {
		t.Run(fmt.Sprintf("%s/%d/%v", tc.spec, tc.ranks, tc.ask), func(t *testing.T) {
			g := mustDevRig(t, tc.ranks, sizes, Config{Decision: DecideCompressed, Spec: tc.spec, ErrorFeedback: true, Strategy: tc.ask})
			for r, e := range g.engines {
				if s := e.Strategy(); s != mustResolve(t, tc.ask, tc.spec, tc.ranks) {
					t.Fatalf("rank %d: strategy %v, Engine resolves %v", r, s, mustResolve(t, tc.ask, tc.spec, tc.ranks))
				}
			}
			if s := g.engines[0].Strategy(); s != tc.strategy {
				t.Fatalf("strategy %v, want %v", s, tc.strategy)
			}
			cpu := cpuTwins(t, g.engines[0], tc.ranks, sizes)
			order := func(r int) []int { return [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 2, 0}}[r] }
			for num := range 3 {
				stats := g.stepBoth(t, cpu, stepGrads(tc.ranks, num, sizes), order, fmt.Sprintf("step %d", num))
				for r := range tc.ranks {
					for i := range sizes {
						bs := stats[r].Buckets[i]
						if bs.Compressed != (tc.spec != "none") || bs.NonFinite || bs.Strategy != tc.strategy {
							t.Errorf("step %d rank %d bucket %d stats %+v", num, r, i, bs)
						}
						if bs.BytesSent <= 0 || bs.Exchange <= 0 {
							t.Errorf("step %d rank %d bucket %d: BytesSent %d, Exchange %v", num, r, i, bs.BytesSent, bs.Exchange)
						}
					}
				}
			}
		})
	}
}

// TestDeviceEngineWaitsForCallerStream holds each rank's caller stream
// before its gradients are written: Ready and Done must return at once
// (nothing blocks the host), the engine must not read the gradients
// before the caller's stream passed Ready (the results are of the values
// written after the hold), and work the caller enqueues after Done must
// see the averages.
func TestDeviceEngineWaitsForCallerStream(t *testing.T) {
	sizes := []int{300, 500}
	const ranks = 2
	g := mustDevRig(t, ranks, sizes, Config{Decision: DecideCompressed, Spec: "int8", ErrorFeedback: true})
	grads := stepGrads(ranks, 0, sizes)
	want := newRef(t, "int8", g.engines[0].Strategy(), ranks, true).want(0, grads, nil)
	gate := make(chan struct{})
	seen := make([][][]float32, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		e, d, s := g.engines[r], g.devs[r], g.caller[r]
		if err := e.Step(); err != nil {
			t.Fatal(err)
		}
		d.LaunchHostFunc(s, func() { <-gate }) // backward is still running
		for i := range sizes {
			d.CopyIn(s, g.grads[r][i], f32.Bytes(grads[r][i]))
			if err := e.Ready(i, g.grads[r][i], s); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Done(s); err != nil {
			t.Fatal(err)
		}
		d.LaunchHostFunc(s, func() { // the optimizer
			for i, n := range sizes {
				seen[r] = append(seen[r], append([]float32(nil), deviceFloats(t, d, g.grads[r][i], n)...))
			}
		})
		if ok, _ := d.EventQuery(e.done); ok {
			t.Errorf("rank %d: the step is done while the caller's stream is held", r)
		}
		wg.Go(func() { _, errs[r] = e.Wait(context.Background()) })
	}
	time.Sleep(20 * time.Millisecond)
	close(gate)
	wg.Wait()
	for r := range ranks {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if err := g.devs[r].Synchronize(g.caller[r]); err != nil {
			t.Fatal(err)
		}
		for i := range sizes {
			if j := sameBits(seen[r][i], want[i]); j >= 0 {
				t.Errorf("rank %d bucket %d element %d: the optimizer saw %v, want %v", r, i, j, seen[r][i][j], want[i][j])
			}
		}
	}
}

// TestDeviceEngineNonFinite puts a NaN in one rank's bucket: every rank's
// bucket becomes NaN, the stats say who had what, the other bucket is
// exchanged as usual, and the bucket's memories skip the step (the saved
// state before and after agree on it, and the next step matches the CPU
// engine's, which discards it too). With FailOnNonFinite every rank's
// Wait returns the same *NonFiniteStepError, every bucket's memory skips the
// step, and the engine stays usable. 2 ranks: allgather; 3 ranks: SRA,
// where the NaN reaches the others through its owner's stage-2 status.
func TestDeviceEngineNonFinite(t *testing.T) {
	sizes := []int{200, 100}
	for _, ranks := range []int{2, 3} {
		for _, fail := range []bool{false, true} {
			cfg := Config{Decision: DecideCompressed, Spec: "int8", ErrorFeedback: true, FailOnNonFinite: fail}
			g := mustDevRig(t, ranks, sizes, cfg)
			cpu := cpuTwins(t, g.engines[0], ranks, sizes)
			// Step 0 fills the memories; step 1 has the NaN.
			if _, _, errs := g.step(stepGrads(ranks, 0, sizes), inOrder(len(sizes))); errs[0] != nil {
				t.Fatal(errs)
			}
			runStep(cpu, stepGrads(ranks, 0, sizes), inOrder(len(sizes)))
			before := saveResiduals(t, g, cpuTwins(t, g.engines[0], ranks, sizes))
			grads := stepGrads(ranks, 1, sizes)
			grads[1][0][5] = float32(math.NaN())
			want := cloneGrads(grads)
			out, stats, errs := g.step(grads, inOrder(len(sizes)))
			runStep(cpu, want, inOrder(len(sizes)))
			after := saveResiduals(t, g, cpuTwins(t, g.engines[0], ranks, sizes))
			for r := range ranks {
				for i := range sizes {
					if same := sameBits(before[r][i], after[r][i]) < 0; same != (i == 0 || fail) {
						t.Errorf("%d ranks, FailOnNonFinite %v, rank %d bucket %d: memory unchanged by the NaN step: %v", ranks, fail, r, i, same)
					}
				}
			}
			for r := range ranks {
				var nf *NonFiniteStepError
				switch {
				case fail && (!errors.As(errs[r], &nf) || len(nf.Buckets) != 1 || nf.Buckets[0] != 0):
					t.Fatalf("%d ranks, FailOnNonFinite, rank %d: %v, want a *NonFiniteStepError for bucket 0", ranks, r, errs[r])
				case !fail && errs[r] != nil:
					t.Fatalf("%d ranks, rank %d: %v", ranks, r, errs[r])
				}
				for j, v := range out[r][0] {
					if !math.IsNaN(float64(v)) {
						t.Fatalf("%d ranks, rank %d bucket 0 element %d: %v, want NaN", ranks, r, j, v)
					}
				}
				if j := sameBits(out[r][1], want[r][1]); j >= 0 {
					t.Fatalf("%d ranks, rank %d bucket 1 element %d: %v, want %v", ranks, r, j, out[r][1][j], want[r][1][j])
				}
				b := stats[r].Buckets[0]
				if !b.NonFinite || !strings.Contains(b.Reason, "NaN") || (ranks == 2 && !strings.Contains(b.Reason, "rank 1 has")) {
					t.Errorf("%d ranks, rank %d bucket 0: NonFinite %v, Reason %q", ranks, r, b.NonFinite, b.Reason)
				}
				if stats[r].Buckets[1].NonFinite {
					t.Errorf("%d ranks, rank %d bucket 1 reported non-finite", ranks, r)
				}
			}
			if fail {
				continue // the CPU engine kept e + g: the next steps differ by design
			}
			grads = stepGrads(ranks, 2, sizes)
			want = cloneGrads(grads)
			out, _, errs = g.step(grads, inOrder(len(sizes)))
			runStep(cpu, want, inOrder(len(sizes)))
			for r := range ranks {
				if errs[r] != nil {
					t.Fatalf("step after the NaN, rank %d: %v", r, errs[r])
				}
				for i := range sizes {
					if j := sameBits(out[r][i], want[r][i]); j >= 0 {
						t.Fatalf("%d ranks, step after the NaN, rank %d bucket %d element %d: %v, want %v", ranks, r, i, j, out[r][i][j], want[r][i][j])
					}
				}
			}
		}
	}
}

// TestDeviceEngineDeadPeer: a rank that never joins the step makes the
// other's Wait end with a *StepError within the transport's timeout, and
// break the engine.
func TestDeviceEngineDeadPeer(t *testing.T) {
	sizes := []int{100}
	g, errs := newDevRig(t, sizes, []Config{{Decision: DecideCompressed, Spec: "topk:0.1"}, {Decision: DecideCompressed, Spec: "topk:0.1"}}, 300*time.Millisecond)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	e := g.engines[0]
	if err := e.Step(); err != nil {
		t.Fatal(err)
	}
	if err := e.Ready(0, g.grads[0][0], g.caller[0]); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, err := e.Wait(context.Background())
	var se *StepError
	if !errors.As(err, &se) || se.Stage != "Wait" {
		t.Fatalf("Wait: %v, want a *StepError in Wait", err)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("Wait took %v with a 300ms timeout", d)
	}
	var be *BrokenError
	if err := e.Step(); !errors.As(err, &be) {
		t.Errorf("Step after the failure: %v, want a *BrokenError", err)
	}
}

// TestDeviceEngineLaunchFailure: a kernel launch that fails ends the step
// at once (Ready returns the *StepError, Wait too), breaks the engine, and
// leaves the error-feedback memory as it was (no swap).
func TestDeviceEngineLaunchFailure(t *testing.T) {
	g := mustDevRig(t, 1, []int{64}, Config{Decision: DecideCompressed, Spec: "int4", ErrorFeedback: true})
	e, d := g.engines[0], g.devs[0]
	b := e.bufs[0]
	resid, out := b.resid.Ptr(), b.resid.Out()
	failed := errors.New("CUDA_ERROR_LAUNCH_FAILED")
	d.InjectLaunchError(failed)
	if err := e.Step(); err != nil {
		t.Fatal(err)
	}
	var se *StepError
	if err := e.Ready(0, g.grads[0][0], g.caller[0]); !errors.As(err, &se) || !errors.Is(err, failed) {
		t.Fatalf("Ready: %v, want a *StepError wrapping the launch failure", err)
	}
	if _, err := e.Wait(context.Background()); !errors.As(err, &se) {
		t.Fatalf("Wait: %v, want the *StepError", err)
	}
	if b.resid.Ptr() != resid || b.resid.Out() != out {
		t.Error("error-feedback buffers swapped after a failed step")
	}
	for j, v := range deviceFloats(t, d, resid, 64) {
		if v != 0 {
			t.Fatalf("error-feedback memory element %d is %v after a failed first step, want 0", j, v)
		}
	}
}

// TestDeviceEngineUsage checks misuse: each is a *UsageError that changes
// nothing, until Wait with a bucket missing fails the step.
func TestDeviceEngineUsage(t *testing.T) {
	g := mustDevRig(t, 1, []int{16, 16}, Config{Decision: DecideCompressed, Spec: "int8"})
	e, s := g.engines[0], g.caller[0]
	grad := g.grads[0][0]
	want := func(what string, err, sentinel error) {
		t.Helper()
		var ue *UsageError
		if !errors.As(err, &ue) || !errors.Is(err, sentinel) {
			t.Errorf("%s: %v, want a *UsageError %v", what, err, sentinel)
		}
	}
	want("Ready without Step", e.Ready(0, grad, s), ErrNoStep)
	want("Done without Step", e.Done(s), ErrNoStep)
	_, err := e.Wait(context.Background())
	want("Wait without Step", err, ErrNoStep)
	if err := e.Step(); err != nil {
		t.Fatal(err)
	}
	want("Step twice", e.Step(), ErrStepInFlight)
	want("unknown bucket", e.Ready(2, grad, s), ErrUnknownBucket)
	want("null gradient", e.Ready(0, 0, s), ErrBadPointer)
	want("misaligned gradient", e.Ready(0, grad+2, s), ErrBadPointer)
	if err := e.Ready(0, grad, s); err != nil {
		t.Fatal(err)
	}
	want("Ready twice", e.Ready(0, grad, s), ErrAlreadyReady)
	want("Done with bucket 1 missing", e.Done(s), ErrNotReady)
	_, err = e.Wait(context.Background())
	want("Wait with bucket 1 missing", err, ErrNotReady)
	var be *BrokenError
	if err := e.Step(); !errors.As(err, &be) {
		t.Errorf("Step after the failed step: %v, want a *BrokenError", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	want("Step after Close", e.Step(), ErrEngineClosed)
}

// TestDeviceEngineConfig checks the handshake and the configurations the
// device refuses, and that Close frees every buffer and handle.
func TestDeviceEngineConfig(t *testing.T) {
	_, errs := newDevRig(t, []int{10}, []Config{{Decision: DecideCompressed, Spec: "int8"}, {Decision: DecideCompressed, Spec: "int4"}}, time.Second)
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || me.Field != "spec" {
			t.Errorf("rank %d: %v, want a spec *ConfigMismatchError", r, err)
		}
	}
	for _, cfg := range []Config{
		{Spec: "randomk:0.1", Strategy: StrategyQuantSRA},
		{Spec: "topk:0.1", Strategy: StrategySharedIndex},
		{Spec: "topk:0.1:lossless=zstd"},
		{Spec: "int8", Strategy: StrategyDense},
		{Spec: "int9"},
		{Spec: "int8", Timeout: -time.Second},
	} {
		_, errs := newDevRig(t, []int{10}, []Config{cfg}, time.Second)
		var ce *ConfigError
		if !errors.As(errs[0], &ce) {
			t.Errorf("%+v: %v, want a *ConfigError", cfg, errs[0])
		}
	}
	g := mustDevRig(t, 2, []int{100, 7}, Config{Decision: DecideCompressed, Spec: "topk:0.1", ErrorFeedback: true})
	if _, _, errs := g.step(stepGrads(2, 0, g.sizes), inOrder(len(g.sizes))); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	for r, e := range g.engines {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if res := g.devs[r].Resources(); res != (fakegpu.Resources{Allocations: len(g.sizes), Streams: 1}) {
			t.Errorf("rank %d after Close: %d allocations (want the test's %d), %d events, %d streams (want the caller's)",
				r, res.Allocations, len(g.sizes), res.Events, res.Streams)
		}
	}
}

// TestDeviceEngineRefusesChunkedTopK: top-k's chunk= and bits= have no
// device kernels, so NewDevice refuses them with a *ConfigError that names
// the options, before any kernel (fakegpu's CPU codecs included) runs.
func TestDeviceEngineRefusesChunkedTopK(t *testing.T) {
	for spec, want := range map[string]string{
		"topk:0.02:chunk=4096:bits=2": "options chunk=4096 and bits=2 of topk: not supported on the device",
		"topk:0.1:chunk=64":           "option chunk=64 of topk: not supported on the device",
	} {
		for _, cfg := range []Config{
			{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed},
			{Spec: "topk:0.01", Schedule: []Phase{{Spec: spec, Steps: 5}}},
		} {
			_, errs := newDevRig(t, []int{10000}, []Config{cfg}, time.Second)
			var ce *ConfigError
			if !errors.As(errs[0], &ce) || !strings.Contains(errs[0].Error(), want) {
				t.Errorf("%+v: %v, want a *ConfigError saying %q", cfg, errs[0], want)
			}
		}
	}
}

// TestDeviceEngineCheckpoint saves the device engines' state after two
// steps and loads it into new device engines and into CPU engines of the
// same strategy: the third step of all three must be bit for bit the same
// (the device engine's results and keys are the CPU engine's, and the
// state format is shared). A state of another spec is a *StateError that
// changes nothing.
func TestDeviceEngineCheckpoint(t *testing.T) {
	sizes := []int{500, 64}
	const ranks = 2
	for _, tc := range []struct {
		spec     string
		strategy Strategy
	}{{"int8", StrategyQuantAllGather}, {"topk:0.1", StrategySparseGather}} {
		t.Run(tc.spec, func(t *testing.T) {
			cfg := Config{Decision: DecideCompressed, Spec: tc.spec, ErrorFeedback: true}
			old := mustDevRig(t, ranks, sizes, cfg)
			for num := range 2 {
				if _, _, errs := old.step(stepGrads(ranks, num, sizes), inOrder(len(sizes))); errs[0] != nil || errs[1] != nil {
					t.Fatal(errs)
				}
			}
			states := make([][]byte, ranks)
			for r, e := range old.engines {
				var buf bytes.Buffer
				if err := e.Save(&buf); err != nil {
					t.Fatal(err)
				}
				states[r] = buf.Bytes()
			}
			fresh := mustDevRig(t, ranks, sizes, cfg)
			cpuCfg := cfg
			cpuCfg.Strategy, cpuCfg.Decision = tc.strategy, DecideCompressed
			cpu := newEngines(t, ranks, sizes, cpuCfg)
			for r := range ranks {
				if err := fresh.engines[r].Load(bytes.NewReader(states[r])); err != nil {
					t.Fatalf("device Load: %v", err)
				}
				if err := cpu[r].Load(bytes.NewReader(states[r])); err != nil {
					t.Fatalf("CPU Load of a device state: %v", err)
				}
			}
			grads := stepGrads(ranks, 2, sizes)
			want, _, errs := old.step(grads, inOrder(len(sizes)))
			got, stats, errs2 := fresh.step(grads, inOrder(len(sizes)))
			cpuGrads := stepGrads(ranks, 2, sizes)
			_, cpuErrs := runStep(cpu, cpuGrads, inOrder(len(sizes)))
			for r := range ranks {
				if errs[r] != nil || errs2[r] != nil || cpuErrs[r] != nil {
					t.Fatal(errs, errs2, cpuErrs)
				}
				if stats[r].Step != 2 {
					t.Errorf("rank %d: step %d after Load, want 2", r, stats[r].Step)
				}
				for i := range sizes {
					if j := sameBits(got[r][i], want[r][i]); j >= 0 {
						t.Fatalf("rank %d bucket %d element %d after Load: %v, want %v", r, i, j, got[r][i][j], want[r][i][j])
					}
					if j := sameBits(cpuGrads[r][i], want[r][i]); j >= 0 {
						t.Fatalf("rank %d bucket %d element %d: the CPU engine has %v, the device engine %v", r, i, j, cpuGrads[r][i][j], want[r][i][j])
					}
				}
			}
			other := mustDevRig(t, 1, sizes, Config{Decision: DecideCompressed, Spec: "int4", ErrorFeedback: true})
			var se *StateError
			if err := other.engines[0].Load(bytes.NewReader(states[0])); !errors.As(err, &se) {
				t.Errorf("Load of an %s state into an int4 engine: %v, want a *StateError", tc.spec, err)
			}
		})
	}
}

// saveResiduals saves every device engine's state and loads it into the
// CPU engines twins, and returns their stage-1 residuals, by rank and bucket
// (with SRA, the stage-2 ones appended).
func saveResiduals(t *testing.T, g *devRig, twins []*Engine) [][][]float32 {
	t.Helper()
	out := make([][][]float32, len(g.engines))
	for r, e := range g.engines {
		var buf bytes.Buffer
		if err := e.Save(&buf); err != nil {
			t.Fatal(err)
		}
		if err := twins[r].Load(&buf); err != nil {
			t.Fatal(err)
		}
		for i := range g.sizes {
			res := residuals(twins[r], i)
			if twins[r].partEF != nil {
				res = append(res, twins[r].partEF.Residual(uint64(i))...)
			}
			out[r] = append(out[r], res)
		}
	}
	return out
}

// TestDeviceEngineDecideDense: a pinned dense decision exchanges a
// compressing spec's buckets by the float32 all-reduce, as codec none.
func TestDeviceEngineDecideDense(t *testing.T) {
	sizes := []int{300, 5}
	const ranks = 3
	g := mustDevRig(t, ranks, sizes, Config{Spec: "int8", ErrorFeedback: true, Decision: DecideDense})
	if got := g.engines[0].Compressed(); got[0] || got[1] {
		t.Fatalf("Compressed() = %v under DecideDense", got)
	}
	cpu := newEngines(t, ranks, sizes, Config{Decision: DecideCompressed, Spec: "none"})
	grads := stepGrads(ranks, 0, sizes)
	want := cloneGrads(grads)
	out, stats, errs := g.step(grads, inOrder(len(sizes)))
	runStep(cpu, want, inOrder(len(sizes)))
	for r := range ranks {
		if errs[r] != nil {
			t.Fatal(errs[r])
		}
		for i := range sizes {
			if j := sameBits(out[r][i], want[r][i]); j >= 0 {
				t.Fatalf("rank %d bucket %d element %d: %v, want %v", r, i, j, out[r][i][j], want[r][i][j])
			}
			if b := stats[r].Buckets[i]; b.Compressed || b.BytesSent != allReduceVolume(ranks, 4*sizes[i]) || !strings.Contains(b.Reason, "pinned: dense") {
				t.Errorf("rank %d bucket %d stats %+v", r, i, b)
			}
		}
	}
}

// TestDeviceEngineVerifies: with DecideAuto the device engine runs
// Engine's cost model on its own collectives and kernels, then
// verification decides as on Engine: measured slower, every rank switches
// to dense after the first window, and says so; measured faster, it keeps
// compressing. The times (the link probes, the kernels' events, the
// steps' events) are fixed ones here, so each prediction is exactly the
// model's arithmetic on the device's slots.
func TestDeviceEngineVerifies(t *testing.T) {
	sizes := []int{300, 200}
	slowLink := fixedTiming{alpha: 1e-4, perByte: 1e-6, enc: line{0, 1e-9}, dec: line{0, 1e-9}, avg: line{0, 1e-10}}
	for _, tc := range []struct {
		name  string
		tm    fixedTiming
		model bool // the cost model compresses
		want  bool // compressed after the window
	}{
		{"dense measured faster", slowLink, true, false},
		{"compressed measured faster", slowLink, true, true},
		{"fast link", fixedTiming{alpha: 1e-5, enc: line{0, 1e-6}, dec: line{0, 1e-6}, avg: line{0, 1e-10}}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := tc.tm
			tm.dense, tm.compressed = 1e-3, 2e-3
			if tc.want {
				tm.dense, tm.compressed = 2e-3, 1e-3
			}
			cfg := Config{Spec: "int8", ErrorFeedback: true}
			g, errs := newDevRig(t, sizes, []Config{cfg, cfg}, 2*time.Second, &tm)
			mustNoErrors(t, "NewDevice", errs)
			for r, e := range g.engines {
				if c := e.Compressed(); c[0] != tc.model || c[1] != tc.model {
					t.Fatalf("rank %d: %v before any step, want the cost model's %v", r, c, tc.model)
				}
				for i, b := range e.buckets {
					slot := e.slotHead() + (e.codec.BodyLen(b.n)+15)&^15
					x := tm.alpha + float64(allGatherVolume(2, slot))*tm.perByte
					comp := x + max(0, tm.enc.at(b.n)-x) + max(0, tm.dec.at(b.n)-x)
					ar := tm.alpha + float64(allReduceVolume(2, 4*b.n))*tm.perByte
					dense := ar + max(0, tm.avg.at(b.n)-ar)
					if !nearly(b.predComp, seconds(comp)) || !nearly(b.predDense, seconds(dense)) || !strings.Contains(b.reason, "cost model") {
						t.Errorf("rank %d bucket %d: predicted compressed %v, dense %v (%s); want %v, %v",
							r, i, b.predComp, b.predDense, b.reason, seconds(comp), seconds(dense))
					}
				}
			}
			if !tc.model {
				return
			}
			switched := false
			for s := range firstWindowSteps + 1 {
				_, stats, errs := g.step(stepGrads(2, s, sizes), inOrder(2))
				mustNoErrors(t, fmt.Sprintf("step %d", s), errs)
				switched = switched || stats[0].Buckets[0].Switched
				bs := stats[1].Buckets[1]
				origin := OriginVerification // after the window
				switch {
				case bs.Trial:
					origin = OriginTrial
				case s < firstWindowSteps:
					origin = OriginCostModel
				}
				if bs.Origin != origin {
					t.Errorf("step %d: rank 1 bucket 1's Origin %v (trial %v), want %v", s, bs.Origin, bs.Trial, origin)
				}
			}
			for r, e := range g.engines {
				if c := e.Compressed(); c[0] != tc.want || c[1] != tc.want {
					t.Errorf("rank %d: %v after the window, want every bucket compressed=%v", r, c, tc.want)
				}
			}
			if switched == tc.want {
				t.Errorf("Switched reported %v, want %v", switched, !tc.want)
			}
		})
	}
}

// TestDeviceCostModelMeasures runs the device's cost model on the clock:
// its kernels timed by the fake device's events, its link probed on the
// fake DeviceComm. Whatever the times, every rank takes the same
// decisions, each bucket's reason is the model's, and every stage its
// mechanism has took time (the work between collectives only under SRA).
func TestDeviceCostModelMeasures(t *testing.T) {
	sizes := []int{4096, 300}
	for _, tc := range []struct {
		spec  string
		ranks int
	}{{"int8", 3}, {"int4", 2}, {"topk:0.05", 2}, {"randomk:0.1", 3}, {"fp16", 3}} {
		t.Run(fmt.Sprintf("%s/%d", tc.spec, tc.ranks), func(t *testing.T) {
			cfgs := slices.Repeat([]Config{{Spec: tc.spec, ErrorFeedback: true, Guard: 0.5}}, tc.ranks)
			g, errs := newDevRig(t, sizes, cfgs, 5*time.Second)
			mustNoErrors(t, "NewDevice", errs)
			want := g.engines[0].Compressed()
			for r, e := range g.engines {
				if c := e.Compressed(); !slices.Equal(c, want) {
					t.Errorf("rank %d decided %v, rank 0 %v", r, c, want)
				}
				for i, b := range e.buckets {
					if !strings.Contains(b.reason, "cost model") || b.predComp <= 0 || b.predDense <= 0 {
						t.Errorf("rank %d bucket %d: %q, predicted %v and %v", r, i, b.reason, b.predComp, b.predDense)
					}
				}
			}
			times, err := g.engines[0].timePaths([]int{4096})
			if err != nil {
				t.Fatal(err)
			}
			sra := g.engines[0].mech == StrategyQuantSRA
			for k, ts := range times {
				if (ts[0] > 0) != (k != 1 || sra) {
					t.Errorf("stage %d took %v s (SRA: %v)", k, ts[0], sra)
				}
			}
		})
	}
}
