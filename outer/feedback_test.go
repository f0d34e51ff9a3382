package outer

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/overlap"
)

// TestErrorFeedbackConserves: with a compressing codec and error feedback
// on the pseudo-gradients (SparseLoCo), nothing is lost over the syncs:
// the averages the Loop applied plus what the ranks' engines hold back on
// average add up to the sum of the average pseudo-gradients, element by
// element. The residuals are read from the engines' own states.
func TestErrorFeedbackConserves(t *testing.T) {
	q := quad{sizes: []int{40, 25, 60}}
	const ranks, syncs = 3, 5
	loops, params := setup(t, q, ranks, Config{SyncEvery: 2, BucketElements: 50, Optimizer: Optimizer{Kind: None},
		Engine: overlap.Config{Spec: "topk:0.1", ErrorFeedback: true, Decision: overlap.DecideCompressed}})
	sumDelta, sumSent := zeros64(q.sizes), zeros64(q.sizes)
	for k := range 2 * syncs {
		deltas := make([][][]float32, ranks)
		reports := train(t, q, loops, params, k, 1, func(r, _ int) {
			deltas[r] = zeros(q.sizes)
			for ti, g := range loops[r].Global() {
				for i := range g {
					deltas[r][ti][i] = g[i] - params[r][ti][i]
				}
			}
		})
		if len(reports[0][0].Finished) == 0 {
			continue
		}
		for r := range deltas {
			add(sumDelta, deltas[r], 1/float64(ranks))
		}
		add(sumSent, inTensors(loops[0], 0, loops[0].frags[0].bufs), 1)
	}
	resid := zeros64(q.sizes)
	for _, l := range loops {
		add(resid, inTensors(l, 0, residuals(t, l.frags[0])), 1/float64(ranks))
	}
	var largest float64
	for ti := range sumDelta {
		for i, want := range sumDelta[ti] {
			got := sumSent[ti][i] + resid[ti][i]
			if math.Abs(got-want) > 1e-5*(1+math.Abs(want)) {
				t.Errorf("tensor %d[%d]: sent %v + held back %v = %v, the pseudo-gradients sum to %v", ti, i, sumSent[ti][i], resid[ti][i], got, want)
			}
			largest = max(largest, math.Abs(resid[ti][i]))
		}
	}
	if largest < 1e-3 {
		t.Errorf("the residuals are at most %v: the codec held nothing back, the test shows nothing", largest)
	}
}

func zeros64(sizes []int) [][]float64 {
	out := make([][]float64, len(sizes))
	for i, n := range sizes {
		out[i] = make([]float64, n)
	}
	return out
}

func add(dst [][]float64, x [][]float32, scale float64) {
	for ti := range dst {
		for i := range dst[ti] {
			dst[ti][i] += float64(x[ti][i]) * scale
		}
	}
}

// inTensors lays fragment f's per-bucket values out as the Loop's tensors
// (zero where the tensor is another fragment's).
func inTensors(l *Loop, f int, buckets [][]float32) [][]float32 {
	out := zeros(l.s.sizes)
	for _, g := range l.frags[f].segs {
		copy(out[g.tensor][g.at:g.at+g.n], buckets[g.bucket][g.off:g.off+g.n])
	}
	return out
}

// residuals reads fragment f's engine's stage-1 error-feedback memory,
// per bucket, from the engine's state (overlap's format, version 6, of a
// flat strategy: the header, then the memory as compress.ErrorFeedback
// saves it).
func residuals(t *testing.T, f *fragment) [][]float32 {
	t.Helper()
	var b bytes.Buffer
	if err := f.eng.Save(&b); err != nil {
		t.Fatal(err)
	}
	s := b.Bytes()
	if string(s[:4]) != "GCOV" || s[4] != 6 {
		t.Fatalf("engine state %q version %d: this test reads version 6", s[:4], s[4])
	}
	at := 4 + 1 + 4 + 4 + 8
	at += 4 + int(binary.LittleEndian.Uint32(s[at:])) // spec
	at += 1 + 1 + 1 + 1 + 8                           // strategies, error feedback, masking, guard
	at += 4 + int(binary.LittleEndian.Uint32(s[at:])) // schedule
	at += 16                                          // layout
	at += 8                                           // feedback decay
	at += 4 + 8*int(binary.LittleEndian.Uint32(s[at:]))
	if s[at] != 1 {
		t.Fatal("the engine state has no error-feedback memory")
	}
	ef := compress.NewErrorFeedback(nil)
	if err := ef.Load(bytes.NewReader(s[at+1:])); err != nil {
		t.Fatal(err)
	}
	out := make([][]float32, len(f.sizes))
	for i, n := range f.sizes {
		out[i] = ef.Residual(uint64(i))
		if out[i] == nil {
			out[i] = make([]float32, n)
		}
	}
	return out
}
