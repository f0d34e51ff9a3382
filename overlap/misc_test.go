package overlap

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

func TestParseStrategy(t *testing.T) {
	for s := StrategyAuto; s <= StrategyQuantAllGather; s++ {
		if got, err := ParseStrategy(s.String()); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %v, %v", s.String(), got, err)
		}
	}
	for d := DecideAuto; d <= DecideDense; d++ {
		if got, err := ParseDecision(d.String()); err != nil || got != d {
			t.Errorf("ParseDecision(%q) = %v, %v", d.String(), got, err)
		}
	}
	if _, err := ParseStrategy("ring"); err == nil {
		t.Error("ParseStrategy(ring) succeeded")
	}
	if _, err := ParseDecision("maybe"); err == nil {
		t.Error("ParseDecision(maybe) succeeded")
	}
	if s := Strategy(42).String(); s != "Strategy(42)" {
		t.Errorf("Strategy(42) = %q", s)
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		s     Strategy
		codec compress.Codec
		ranks int
		want  Strategy // StrategyAuto: an error
	}{
		{StrategyAuto, compress.CodecNone, 4, StrategyDense},
		{StrategyAuto, compress.CodecBF16, 4, StrategyDense},
		{StrategyAuto, compress.CodecRandomK, 4, StrategySharedIndex},
		{StrategyAuto, compress.CodecTopK, 4, StrategySparseGather},
		{StrategyAuto, compress.CodecInt4, 3, StrategyQuantSRA},
		{StrategyAuto, compress.CodecSign, 2, StrategyQuantAllGather},
		{StrategyAuto, compress.CodecInt8, 1, StrategyQuantAllGather},
		{StrategyQuantSRA, compress.CodecTopK, 4, StrategyQuantSRA},
		{StrategyDense, compress.CodecInt8, 4, StrategyAuto},
		{StrategySharedIndex, compress.CodecTopK, 4, StrategyAuto},
		{StrategyQuantSRA, compress.CodecNone, 4, StrategyAuto},
		{Strategy(9), compress.CodecInt8, 4, StrategyAuto},
	} {
		got, err := resolve(tc.s, tc.codec, tc.ranks)
		if tc.want == StrategyAuto && err == nil || tc.want != StrategyAuto && (err != nil || got != tc.want) {
			t.Errorf("resolve(%v, %v, %d) = %v, %v; want %v", tc.s, tc.codec, tc.ranks, got, err, tc.want)
		}
	}
}

func TestBucketSizes(t *testing.T) {
	for _, tc := range []struct {
		params  []int
		cap     int
		buckets [][]int
		sizes   []int
	}{
		{[]int{10, 20, 30, 40}, 200, [][]int{{3}, {2, 1}, {0}}, []int{40, 50, 10}},
		{[]int{5, 100, 5}, 40, [][]int{{2}, {1}, {0}}, []int{5, 100, 5}},
		{[]int{0, 3, -2}, 40, [][]int{{2, 1, 0}}, []int{3}},
		{[]int{1 << 20, 1 << 20, 1 << 23}, 0, [][]int{{2}, {1, 0}}, []int{1 << 23, 1 << 21}},
		{nil, 0, nil, nil},
	} {
		b, s := BucketSizes(tc.params, tc.cap)
		if !reflect.DeepEqual(b, tc.buckets) || !reflect.DeepEqual(s, tc.sizes) {
			t.Errorf("BucketSizes(%v, %d) = %v, %v; want %v, %v", tc.params, tc.cap, b, s, tc.buckets, tc.sizes)
		}
	}
}

// TestBytesSent checks the volume accounting for each strategy against
// the formulas of the package doc.
func TestBytesSent(t *testing.T) {
	const ranks, n = 4, 1000
	slot := func(spec string, elems int) int64 {
		return int64(slotHead(false) + compresstest.MustParse(t, spec).MaxEncodedLen(elems))
	}
	for _, tc := range []struct {
		spec string
		want int64
	}{
		{"none", 2 * 3 * 4 * n / 4},
		{"topk:0.01", 3 * slot("topk:0.01", n)},
		{"int8", 3*slot("int8", n/4) + 3*slot("int8", n/4)},
		{"randomk:0.01", 2 * 3 * 4 * (ranks + 10) / 4},
	} {
		engines := newEngines(t, ranks, []int{n}, Config{Spec: tc.spec, Decision: DecideCompressed})
		stats, errs := runStep(engines, stepGrads(ranks, 0, []int{n}), inOrder(1))
		mustNoErrors(t, tc.spec, errs)
		s := stats[1]
		if s.BytesSent != tc.want || s.Buckets[0].BytesSent != tc.want {
			t.Errorf("%s: BytesSent %d (bucket %d), want %d", tc.spec, s.BytesSent, s.Buckets[0].BytesSent, tc.want)
		}
		if s.ExchangeTotal != s.Buckets[0].Exchange || s.Exposed > s.Total || s.Total <= 0 || s.Step != 0 {
			t.Errorf("%s: inconsistent stats %+v", tc.spec, s)
		}
	}
}

// TestErrorFeedbackEffect: with a fixed gradient, top-k 10% with error
// feedback delivers the sum of the gradients over steps up to a bounded
// residual; without it the same 10% is sent every step and most of the
// gradient never arrives.
func TestErrorFeedbackEffect(t *testing.T) {
	const ranks, n, steps = 2, 500, 40
	relErr := map[bool]float64{}
	for _, ef := range []bool{false, true} {
		engines := newEngines(t, ranks, []int{n}, Config{Spec: "topk:0.1", ErrorFeedback: ef, Decision: DecideCompressed})
		fixed := stepGrads(ranks, 0, []int{n})
		want := denseAverage(fixed, 0)
		got := make([]float64, n)
		for range steps {
			g := clone3(fixed)
			_, errs := runStep(engines, g, inOrder(1))
			mustNoErrors(t, "step", errs)
			for i, v := range g[0][0] {
				got[i] += float64(v)
			}
		}
		var num, den float64
		for i := range got {
			d := got[i] - steps*float64(want[i])
			num += d * d
			den += steps * steps * float64(want[i]) * float64(want[i])
		}
		relErr[ef] = math.Sqrt(num / den)
	}
	t.Logf("relative error of the summed updates: %.3f with error feedback, %.3f without", relErr[true], relErr[false])
	if relErr[true] > relErr[false]/3 {
		t.Errorf("error feedback: %.3f, not well below %.3f without", relErr[true], relErr[false])
	}
}

// TestStream: work runs in enqueue order, an event fires after the work
// before it, a wait holds the stream, close runs what is queued.
func TestStream(t *testing.T) {
	a, b := newStream(), newStream()
	var mu sync.Mutex
	var log []string
	note := func(s string) func() {
		return func() { mu.Lock(); log = append(log, s); mu.Unlock() }
	}
	gate := newEvent()
	a.enqueue(note("a1"))
	a.waitEvent(gate)
	a.enqueue(note("a2"))
	evA := a.record()
	b.waitEvent(evA)
	b.enqueue(note("b1"))
	evB := b.record()
	time.Sleep(10 * time.Millisecond)
	select {
	case <-evB.fired():
		t.Fatal("b ran past a's unfired gate")
	default:
	}
	gate.fire()
	<-evB.fired()
	a.enqueue(note("a3"))
	a.close()
	b.close()
	if got := fmt.Sprint(log); got != "[a1 a2 b1 a3]" {
		t.Errorf("order %s", got)
	}
}

// TestWarmup: steps numbered below Config.Warmup exchange every bucket
// dense (the plain average, error-feedback memory untouched); the steps
// after them compress as decided.
func TestWarmup(t *testing.T) {
	const ranks, warm = 3, 2
	sizes := []int{300, 77}
	engines := newEngines(t, ranks, sizes, Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed, Warmup: warm})
	for s := range warm + 1 {
		grads := make([][][]float32, ranks)
		want := make([][]float32, len(sizes))
		for r := range ranks {
			grads[r] = make([][]float32, len(sizes))
			for i, n := range sizes {
				grads[r][i] = gradient(r, s, i, n)
				if want[i] == nil {
					want[i] = make([]float32, n)
				}
				for j, v := range grads[r][i] {
					want[i][j] += v
				}
			}
		}
		stats, errs := runStep(engines, grads, inOrder(len(sizes)))
		mustNoErrors(t, "step", errs)
		for r := range ranks {
			for i := range sizes {
				bs := stats[r].Buckets[i]
				if bs.Compressed != (s >= warm) {
					t.Fatalf("step %d rank %d bucket %d: Compressed %v, want %v (%s)", s, r, i, bs.Compressed, s >= warm, bs.Reason)
				}
				if s < warm {
					if !strings.Contains(bs.Reason, "warm-up") {
						t.Errorf("step %d bucket %d: Reason %q does not say warm-up", s, i, bs.Reason)
					}
					avg := make([]float32, len(want[i]))
					for j, v := range want[i] {
						avg[j] = v / ranks
					}
					if j := sameFloats(grads[r][i], avg); j >= 0 {
						t.Fatalf("step %d rank %d bucket %d: element %d is %v, want the dense average %v", s, r, i, j, grads[r][i][j], avg[j])
					}
				}
			}
			if s < warm {
				if n := len(engines[r].gradEF.Buckets()); n != 0 {
					t.Fatalf("step %d rank %d: error-feedback memory holds %d buckets after warm-up steps, want none", s, r, n)
				}
			} else if n := len(engines[r].gradEF.Buckets()); n != len(sizes) {
				t.Fatalf("after the first compressed step rank %d's memory holds %d buckets, want %d", r, n, len(sizes))
			}
		}
	}
}
