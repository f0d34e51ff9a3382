package outer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/overlap"
)

// TestBalanced: the default fragments are contiguous, each non-empty, and
// balanced by elements.
func TestBalanced(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		f     int
		want  []int
	}{
		{[]int{10, 10, 10, 10}, 2, []int{0, 0, 1, 1}},
		{[]int{10, 10, 10, 10}, 4, []int{0, 1, 2, 3}},
		{[]int{100, 1, 1, 1}, 2, []int{0, 1, 1, 1}},
		{[]int{1, 1, 1, 100}, 2, []int{0, 0, 0, 1}},
		{[]int{1, 1, 1, 100}, 4, []int{0, 1, 2, 3}},
		{[]int{5, 5, 5, 5, 5, 5}, 3, []int{0, 0, 1, 1, 2, 2}},
		{[]int{3, 9, 4, 4, 7, 2, 5, 6}, 4, []int{0, 0, 1, 1, 2, 2, 3, 3}},
		{[]int{7}, 1, []int{0}},
	} {
		if got := balanced(tc.sizes, tc.f); !slices.Equal(got, tc.want) {
			t.Errorf("balanced(%v, %d) = %v, want %v", tc.sizes, tc.f, got, tc.want)
		}
	}
}

// TestLayOut: a fragment's tensors in buckets of at most BucketElements,
// along tensor boundaries where they fit; a larger tensor split (or, with
// Shapes, whole).
func TestLayOut(t *testing.T) {
	sizes := []int{40, 25, 0, 120, 5}
	s := &settings{Config: Config{BucketElements: 50}, sizes: sizes, fragmentOf: []int{0, 0, 0, 0, 0}}
	l := layOut(s, 0)
	wantSegs := []segment{
		{tensor: 0, at: 0, bucket: 0, off: 0, n: 40},
		{tensor: 1, at: 0, bucket: 1, off: 0, n: 25},
		{tensor: 3, at: 0, bucket: 2, off: 0, n: 50},
		{tensor: 3, at: 50, bucket: 3, off: 0, n: 50},
		{tensor: 3, at: 100, bucket: 4, off: 0, n: 20},
		{tensor: 4, at: 0, bucket: 4, off: 20, n: 5},
	}
	if !slices.Equal(l.sizes, []int{40, 25, 50, 50, 25}) || !slices.Equal(l.segs, wantSegs) {
		t.Errorf("layout %+v", l)
	}
	s.Shapes = []overlap.Shape{{Rows: 4, Cols: 10}, {Rows: 5, Cols: 5}, {}, {Rows: 12, Cols: 10}, {Rows: 1, Cols: 5}}
	l = layOut(s, 0)
	wantShapes := [][]overlap.Shape{{{Rows: 4, Cols: 10}}, {{Rows: 5, Cols: 5}}, {{Rows: 12, Cols: 10}}, {{Rows: 1, Cols: 5}}}
	if !slices.Equal(l.sizes, []int{40, 25, 120, 5}) || fmt.Sprint(l.shapes) != fmt.Sprint(wantShapes) {
		t.Errorf("layout with shapes: sizes %v, shapes %v", l.sizes, l.shapes)
	}
}

// TestPowerSGDShapes: with Shapes the fragments' engines get each
// bucket's matrices, whole, and spec powersgd runs; without them its
// engine refuses, saying so.
func TestPowerSGDShapes(t *testing.T) {
	q := quad{sizes: []int{6, 4, 12}}
	engine := overlap.Config{Spec: "powersgd:1", ErrorFeedback: true, Decision: overlap.DecideCompressed}
	shapes := []overlap.Shape{{Rows: 2, Cols: 3}, {Rows: 1, Cols: 4}, {Rows: 3, Cols: 4}}
	loops, params := setup(t, q, 2, Config{SyncEvery: 1, BucketElements: 10, Shapes: shapes, Engine: engine})
	f := loops[0].frags[0]
	if want := [][]overlap.Shape{shapes[:2], shapes[2:]}; fmt.Sprint(f.cfg.Shapes) != fmt.Sprint(want) {
		t.Errorf("engine shapes %v, want %v", f.cfg.Shapes, want)
	}
	reports := train(t, q, loops, params, 0, 3, nil)
	if s := reports[0][2].Finished[0].Stats; len(s.Buckets) != 2 || s.Buckets[0].Strategy != overlap.StrategyLowRank {
		t.Errorf("step 3's stats %+v, want 2 buckets of strategy low-rank", s)
	}
	_, err := New(context.Background(), group(t, 1)[0], q.init(0), Config{SyncEvery: 1, Engine: engine})
	var ce *overlap.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "needs Config.Shapes") {
		t.Errorf("powersgd without Shapes: %v, want the engine's *overlap.ConfigError", err)
	}
}
