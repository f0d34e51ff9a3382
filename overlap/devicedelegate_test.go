package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/fakegpu"
)

// delegation is how devRig.delegateStep hands a step's buckets over.
type delegation struct {
	buckets []int           // delegated; the others are made Ready
	callers []*fakegpu.Comm // by rank: the caller's own communicator, for its all-reduces
	// before runs on each rank after Step, before any hand-over; after
	// once every bucket is handed over, before the caller's all-reduces.
	// An error is the rank's.
	before, after func(r int, e *DeviceEngine) error
}

// callerComms returns, per rank of g, a communicator of the caller's own
// (not the engine's) on the rank's fake device.
func callerComms(t *testing.T, g *devRig) []*fakegpu.Comm {
	t.Helper()
	comms := group(t, len(g.engines))
	out := make([]*fakegpu.Comm, len(comms))
	for r, c := range comms {
		out[r] = fakegpu.NewComm(c, g.devs[r], 2*time.Second)
	}
	return out
}

// delegateStep runs one step of grads on every rank of g: each bucket's
// gradient is copied in on the caller's stream, then handed over in
// order(r), Ready or, for the buckets in d.buckets, Delegate (each checked
// Delegable first), whose all-reduce the caller then enqueues on its
// stream over d.callers[r]; then Done (unless a hand-over failed) and
// Wait, and the delegated buckets are divided by the ranks (DDP's
// average). It returns each rank's gradients, stats and first error.
func (g *devRig) delegateStep(grads [][][]float32, order func(r int) []int, d delegation) ([][][]float32, []StepStats, []error) {
	n := len(g.engines)
	out := make([][][]float32, n)
	stats := make([]StepStats, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			e, dev, s := g.engines[r], g.devs[r], g.caller[r]
			fail := func(err error) {
				if errs[r] == nil {
					errs[r] = err
				}
			}
			if err := e.Step(); err != nil {
				fail(err)
				return
			}
			if d.before != nil {
				fail(d.before(r, e))
			}
			for _, i := range order(r) {
				dev.CopyIn(s, g.grads[r][i], f32.Bytes(grads[r][i]))
				switch {
				case !slices.Contains(d.buckets, i):
					fail(e.Ready(i, g.grads[r][i], s))
				case !e.Delegable(i):
					fail(fmt.Errorf("bucket %d is not Delegable", i))
				default:
					fail(e.Delegate(i))
				}
			}
			if d.after != nil {
				fail(d.after(r, e))
			}
			for _, i := range d.buckets {
				fail(d.callers[r].AllReduce(context.Background(), g.grads[r][i], g.sizes[i], s))
			}
			if errs[r] == nil {
				fail(e.Done(s))
			}
			st, err := e.Wait(context.Background())
			stats[r] = st
			fail(err)
			for i, sz := range g.sizes {
				x := make([]float32, sz)
				dev.CopyOut(s, f32.Bytes(x), g.grads[r][i])
				if slices.Contains(d.buckets, i) {
					compress.Average(x, n)
				}
				out[r] = append(out[r], x)
			}
		})
	}
	wg.Wait()
	return out, stats, errs
}

// rankAverage is DDP's average of bucket i over the ranks of grads: the
// sum in rank order, divided by the ranks.
func rankAverage(grads [][][]float32, i int) []float32 {
	want := slices.Clone(grads[0][i])
	for _, g := range grads[1:] {
		for j, v := range g[i] {
			want[j] += v
		}
	}
	compress.Average(want, len(grads))
	return want
}

// saveStates returns every rank's saved state.
func saveStates(t *testing.T, g *devRig) [][]byte {
	t.Helper()
	out := make([][]byte, len(g.engines))
	for r, e := range g.engines {
		var buf bytes.Buffer
		if err := e.Save(&buf); err != nil {
			t.Fatalf("rank %d: Save: %v", r, err)
		}
		out[r] = buf.Bytes()
	}
	return out
}

// reducedSince returns the element counts of the all-reduces the engine
// of rank r enqueued on its DeviceComm after the first from.
func (g *devRig) reducedSince(r, from int) []int {
	f := g.dcs[r]
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reduced[from:])
}

// TestDeviceDelegate: in warm-up steps a device engine's buckets are
// Delegable on every rank. Delegating buckets 0 and 2 (bucket 1 made
// Ready first, so the delegated bucket 0 must not hold back its launch)
// and all-reducing them on the caller's stream over a communicator of the
// caller's gives every rank, bit for bit, what an engine that readied
// every bucket gives; the engine's own DeviceComm carries bucket 1 alone;
// the statistics say which buckets were delegated; and the error-feedback
// memory a compressed step left is untouched (the states saved after the
// step are the other engine's). A step that delegates every bucket, in
// reverse order, does the same (Done has nothing of the engine's to wait
// for).
func TestDeviceDelegate(t *testing.T) {
	const ranks = 3
	sizes := []int{300, 37, 500}
	cfg := Config{Spec: "topk:0.05", ErrorFeedback: true, Decision: DecideCompressed}
	src := mustDevRig(t, ranks, sizes, cfg)
	_, _, errs := src.step(stepGrads(ranks, 0, sizes), inOrder(len(sizes)))
	mustNoErrors(t, "the compressed step", errs)
	states := saveStates(t, src)

	cfg.Warmup = 10
	del, ref := mustDevRig(t, ranks, sizes, cfg), mustDevRig(t, ranks, sizes, cfg)
	for _, g := range []*devRig{del, ref} {
		for r, e := range g.engines {
			if err := e.Load(bytes.NewReader(states[r])); err != nil {
				t.Fatalf("rank %d: Load: %v", r, err)
			}
		}
	}
	callers := callerComms(t, del)
	for num, tc := range []struct {
		delegated []int
		order     []int
	}{{[]int{0, 2}, []int{1, 0, 2}}, {[]int{2, 1, 0}, []int{2, 1, 0}}} {
		what := fmt.Sprintf("step %d delegating %v", num+1, tc.delegated)
		grads := stepGrads(ranks, num+1, sizes)
		order := func(int) []int { return tc.order }
		from := make([]int, ranks)
		for r := range ranks {
			from[r] = len(del.reducedSince(r, 0))
		}
		got, stats, errs := del.delegateStep(grads, order, delegation{buckets: tc.delegated, callers: callers})
		mustNoErrors(t, what, errs)
		want, _, errs := ref.step(cloneGrads(grads), order)
		mustNoErrors(t, what+": the reference", errs)
		var wire []int
		for i, n := range sizes {
			if !slices.Contains(tc.delegated, i) {
				wire = append(wire, n)
			}
		}
		for r := range ranks {
			for i := range sizes {
				if j := sameBits(got[r][i], want[r][i]); j >= 0 {
					t.Fatalf("%s rank %d bucket %d element %d: %v, the engine's dense path gives %v", what, r, i, j, got[r][i][j], want[r][i][j])
				}
				b := stats[r].Buckets[i]
				delegated := slices.Contains(tc.delegated, i)
				if b.Delegated != delegated || b.Compressed || b.NonFinite || b.BytesSent != allReduceVolume(ranks, 4*sizes[i]) ||
					strings.Contains(b.Reason, "(Delegate)") != delegated || (b.Exchange > 0) == delegated {
					t.Errorf("%s rank %d bucket %d: %+v", what, r, i, b)
				}
			}
			if w := del.reducedSince(r, from[r]); !slices.Equal(w, wire) {
				t.Errorf("%s rank %d: the engine all-reduced %v elements, want %v", what, r, w, wire)
			}
		}
		refStates := saveStates(t, ref)
		for r, s := range saveStates(t, del) {
			if !bytes.Equal(s, refStates[r]) {
				t.Fatalf("%s rank %d: the saved state differs from the engine's that made every bucket Ready", what, r)
			}
		}
	}
}

// TestDeviceDelegateUsage: Delegate and DelegateDone refuse what Engine's
// refuse, with a *UsageError naming the call, and a refused call takes
// nothing: without a step; an unknown bucket; a bucket already ready or
// delegated; DelegateDone of a bucket readied, and twice (once is a
// no-op, and optional: the step of a bucket never reported ends too).
func TestDeviceDelegateUsage(t *testing.T) {
	const ranks = 2
	sizes := []int{64, 32}
	g := mustDevRig(t, ranks, sizes, Config{Spec: "none"})
	for r, e := range g.engines {
		if e.Delegable(0) {
			t.Errorf("rank %d: Delegable without a step", r)
		}
		for _, err := range []error{e.Delegate(0), e.DelegateDone(0)} {
			if !errors.Is(err, ErrNoStep) {
				t.Errorf("rank %d without a step: %v, want ErrNoStep", r, err)
			}
		}
	}
	refusals := func(r int, e *DeviceEngine) error {
		for _, c := range []struct {
			call string
			err  error
			want error
		}{
			{"Delegate(1)", e.Delegate(1), ErrAlreadyReady}, {"Delegate(0)", e.Delegate(0), ErrAlreadyReady},
			{"Delegate(2)", e.Delegate(2), ErrUnknownBucket}, {"DelegateDone(1)", e.DelegateDone(1), ErrNotDelegated},
			{"DelegateDone(-1)", e.DelegateDone(-1), ErrUnknownBucket},
		} {
			var ue *UsageError
			if !errors.Is(c.err, c.want) || !errors.As(c.err, &ue) || ue.Call != c.call {
				return fmt.Errorf("%s: %v, want a *UsageError of %s: %v", c.call, c.err, c.call, c.want)
			}
		}
		if e.Delegable(0) || e.Delegable(1) || e.Delegable(2) || e.Delegable(-1) {
			return errors.New("a bucket handed over, or unknown, is Delegable")
		}
		return nil
	}
	for num, report := range []bool{true, false} {
		d := delegation{buckets: []int{0}, callers: callerComms(t, g), after: func(r int, e *DeviceEngine) error {
			if err := refusals(r, e); err != nil || !report {
				return err
			}
			if err := e.DelegateDone(0); err != nil {
				return fmt.Errorf("DelegateDone(0): %v", err)
			}
			if err := e.DelegateDone(0); !errors.Is(err, ErrAlreadyReady) {
				return fmt.Errorf("a second DelegateDone(0): %v, want ErrAlreadyReady", err)
			}
			return nil
		}}
		grads := stepGrads(ranks, num, sizes)
		got, stats, errs := g.delegateStep(grads, func(r int) []int { return []int{1, 0} }, d)
		mustNoErrors(t, fmt.Sprintf("step %d", num), errs)
		for r := range ranks {
			for i := range sizes {
				want := rankAverage(grads, i)
				if j := sameBits(got[r][i], want); j >= 0 || stats[r].Buckets[i].Delegated != (i == 0) {
					t.Errorf("step %d rank %d bucket %d: element %d, stats %+v", num, r, i, j, stats[r].Buckets[i])
				}
			}
		}
	}
}

// TestDeviceDelegateRefuses: a bucket whose dense step a plain all-reduce
// would not reproduce is not Delegable on any rank, and Delegate refuses
// it (ErrNotDelegable, saying why) without taking it, so Ready then does:
// compressed this step, Config.Momentum, FailOnNonFinite, StrategyHier
// (in warm-up, where the buckets are dense).
func TestDeviceDelegateRefuses(t *testing.T) {
	sizes := []int{64, 48}
	for _, tc := range []struct {
		name string
		cfg  Config
		hier bool
		why  string
	}{
		{"compressed", Config{Spec: "topk:0.1", ErrorFeedback: true, Decision: DecideCompressed}, false, "compressed"},
		{"momentum", Config{Spec: "topk:0.1", ErrorFeedback: true, Momentum: 0.9, Decision: DecideCompressed, Warmup: 1}, false, "Momentum"},
		{"fail on non-finite", Config{Spec: "none", FailOnNonFinite: true}, false, "FailOnNonFinite"},
		{"hier", Config{Spec: "int8", Strategy: StrategyHier, ErrorFeedback: true, Decision: DecideCompressed, Warmup: 1}, true, "StrategyHier"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g *devRig
			if tc.hier {
				g = mustDevHierRig(t, sizes, tc.cfg)
			} else {
				g = mustDevRig(t, 2, sizes, tc.cfg)
			}
			refuse := func(r int, e *DeviceEngine) error {
				for i := range sizes {
					err := e.Delegate(i)
					var ue *UsageError
					if e.Delegable(i) || !errors.Is(err, ErrNotDelegable) || !errors.As(err, &ue) || !strings.Contains(ue.Detail, tc.why) {
						return fmt.Errorf("bucket %d: Delegable %v, Delegate %v; want ErrNotDelegable saying %q", i, e.Delegable(i), err, tc.why)
					}
				}
				return nil
			}
			_, stats, errs := g.delegateStep(stepGrads(len(g.engines), 0, sizes), inOrder(len(sizes)), delegation{before: refuse})
			mustNoErrors(t, "the step", errs)
			for r, s := range stats {
				for _, b := range s.Buckets {
					if b.Delegated {
						t.Errorf("rank %d bucket %d: Delegated after a refusal", r, b.Bucket)
					}
				}
			}
		})
	}
}

// TestDeviceDelegateVerification: with DecideAuto, no bucket is Delegable
// in a step verification measures (it times the dense path by events on
// the engine's streams), a trial's dense step included; once the window
// switched every bucket to dense, the steps between windows delegate, and
// their result is the all-reduced average.
func TestDeviceDelegateVerification(t *testing.T) {
	const ranks = 2
	sizes := []int{300, 200}
	tm := fixedTiming{alpha: 1e-4, perByte: 1e-6, enc: line{0, 1e-9}, dec: line{0, 1e-9}, avg: line{0, 1e-10}, dense: 1e-3, compressed: 2e-3}
	cfg := Config{Spec: "int8", ErrorFeedback: true}
	g, errs := newDevRig(t, sizes, []Config{cfg, cfg}, 2*time.Second, &tm)
	mustNoErrors(t, "NewDevice", errs)
	refuse := func(r int, e *DeviceEngine) error {
		for i := range sizes {
			if err := e.Delegate(i); e.Delegable(i) || !errors.Is(err, ErrNotDelegable) {
				return fmt.Errorf("bucket %d: Delegable %v, Delegate %v; want ErrNotDelegable", i, e.Delegable(i), err)
			}
		}
		return nil
	}
	for s := range firstWindowSteps {
		_, stats, errs := g.delegateStep(stepGrads(ranks, s, sizes), inOrder(len(sizes)), delegation{before: refuse})
		mustNoErrors(t, fmt.Sprintf("step %d", s), errs)
		if s == 1 && stats[0].Buckets[0].Compressed {
			t.Fatalf("step 1, a trial of the dense path: %+v", stats[0].Buckets[0])
		}
	}
	if c := g.engines[0].Compressed(); c[0] || c[1] {
		t.Fatalf("after the window: %v, want every bucket switched to dense", c)
	}
	grads := stepGrads(ranks, firstWindowSteps, sizes)
	got, stats, errs := g.delegateStep(grads, inOrder(len(sizes)), delegation{buckets: []int{0, 1}, callers: callerComms(t, g)})
	mustNoErrors(t, "the step after the window", errs)
	for r := range ranks {
		for i := range sizes {
			want := rankAverage(grads, i)
			if j := sameBits(got[r][i], want); j >= 0 || !stats[r].Buckets[i].Delegated {
				t.Errorf("rank %d bucket %d: element %d, stats %+v", r, i, j, stats[r].Buckets[i])
			}
		}
	}
}
