package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
)

// shapeCase is one engine shape of TestLoadReshaped: a layout and a
// strategy.
type shapeCase struct {
	nodes, local int
	strategy     Strategy
}

func (s shapeCase) String() string { return fmt.Sprintf("%d×%d %v", s.nodes, s.local, s.strategy) }

// TestLoadReshaped: states saved by engines of one shape load, through
// LoadReshaped, into engines of another — flat to hierarchical and back, a
// node size that changes, a world that grows (the new ranks passing no
// state) — and what the memories and velocities add to the average
// carries over: with a zero gradient, the new engines' first step gives
// what the old engines' next step gives, within the codec's rounding of
// both, and resumes at the old step number.
func TestLoadReshaped(t *testing.T) {
	sizes := []int{4096, 1001, 7}
	for _, tc := range []struct {
		from, to shapeCase
		momentum float64
	}{
		{shapeCase{2, 2, StrategyQuantSRA}, shapeCase{2, 2, StrategyHier}, 0},
		{shapeCase{2, 2, StrategyHier}, shapeCase{2, 2, StrategyQuantSRA}, 0.9},
		{shapeCase{2, 2, StrategyHier}, shapeCase{1, 4, StrategyHier}, 0},
		{shapeCase{2, 2, StrategyHier}, shapeCase{4, 1, StrategyHier}, 0.9},
		{shapeCase{1, 2, StrategyQuantAllGather}, shapeCase{2, 2, StrategyHier}, 0},
	} {
		t.Run(fmt.Sprintf("%v to %v, momentum %v", tc.from, tc.to, tc.momentum), func(t *testing.T) {
			cfg := Config{Spec: "int8:round=nearest", ErrorFeedback: true, Decision: DecideCompressed, Momentum: tc.momentum}
			build := func(s shapeCase) []*Engine {
				c := cfg
				c.Strategy = s.strategy
				return newEnginesOn(t, nodeGroup(t, s.nodes, s.local), sizes, c)
			}
			old := build(tc.from)
			n0 := len(old)
			for step := range 3 {
				_, errs := runStep(old, stepGrads(n0, step, sizes), inOrder(len(sizes)))
				mustNoErrors(t, "old step", errs)
			}
			states := saveAll(t, old)
			// What the old engines' next step adds, with a zero gradient.
			zero := func(n int) [][][]float32 {
				g := stepGrads(n, 0, sizes)
				for r := range g {
					for b := range g[r] {
						clear(g[r][b])
					}
				}
				return g
			}
			want := zero(n0)
			_, errs := runStep(old, want, inOrder(len(sizes)))
			mustNoErrors(t, "old zero step", errs)

			fresh := build(tc.to)
			errs = onRanks(commsOf(fresh), func(r int, _ comm.Comm) error {
				if r >= len(states) {
					return fresh[r].LoadReshaped(context.Background(), nil)
				}
				return fresh[r].LoadReshaped(context.Background(), bytes.NewReader(states[r]))
			})
			mustNoErrors(t, "LoadReshaped", errs)
			got := zero(len(fresh))
			stats, errs := runStep(fresh, got, inOrder(len(sizes)))
			mustNoErrors(t, "new zero step", errs)
			for r := range fresh {
				if stats[r].Step != 3 {
					t.Errorf("rank %d resumed at step %d, want 3", r, stats[r].Step)
				}
				for b := range sizes {
					var num, den float64
					for i, v := range got[r][b] {
						d := float64(v - want[0][b][i])
						num += d * d
						den += float64(want[0][b][i]) * float64(want[0][b][i])
					}
					if den == 0 || math.Sqrt(num/den) > 0.05 {
						t.Errorf("rank %d bucket %d: the first step adds %.3g (relative) off what the old engines' next adds (norm %.3g)", r, b, math.Sqrt(num/den), math.Sqrt(den))
					}
				}
			}
		})
	}
}

// TestLoadReshapedBadInput: a rank's state of another spec, states that
// resume at different steps, no state at all, and a step in flight: every
// rank's LoadReshaped fails (the faulty rank naming why) and nothing
// changes.
func TestLoadReshapedBadInput(t *testing.T) {
	sizes := []int{100}
	cfg := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed, Strategy: StrategyHier}
	source := func(spec string, steps int) [][]byte {
		c := cfg
		c.Spec = spec
		old := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, c)
		for step := range steps {
			_, errs := runStep(old, stepGrads(4, step, sizes), inOrder(1))
			mustNoErrors(t, "old step", errs)
		}
		return saveAll(t, old)
	}
	good, other, later := source("int8", 2), source("int4", 2), source("int8", 3)
	for _, tc := range []struct {
		name   string
		states [][]byte
		want   string
	}{
		{"another spec on rank 1", [][]byte{good[0], other[1], good[2], good[3]}, "spec"},
		{"another step on rank 2", [][]byte{good[0], good[1], later[2], good[3]}, "resumes at step"},
		{"no state", [][]byte{nil, nil, nil, nil}, "no rank passed a state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engines := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, cfg)
			errs := onRanks(commsOf(engines), func(r int, _ comm.Comm) error {
				if tc.states[r] == nil {
					return engines[r].LoadReshaped(context.Background(), nil)
				}
				return engines[r].LoadReshaped(context.Background(), bytes.NewReader(tc.states[r]))
			})
			for r, err := range errs {
				var se *StateError
				if !errors.As(err, &se) {
					t.Errorf("rank %d: %v, want a *StateError", r, err)
				}
			}
			if !strings.Contains(fmt.Sprint(errs), tc.want) {
				t.Errorf("errors %v, want one saying %q", errs, tc.want)
			}
			// Nothing changed: the engines run from step 0.
			stats, errs := runStep(engines, stepGrads(4, 0, sizes), inOrder(1))
			mustNoErrors(t, "step", errs)
			if stats[0].Step != 0 {
				t.Errorf("step %d after a failed LoadReshaped, want 0", stats[0].Step)
			}
		})
	}
	engines := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, cfg)
	if err := engines[0].Step(); err != nil {
		t.Fatal(err)
	}
	var ue *UsageError
	if err := engines[0].LoadReshaped(context.Background(), bytes.NewReader(good[0])); !errors.As(err, &ue) {
		t.Errorf("LoadReshaped with a step in flight: %v, want a *UsageError", err)
	}
}

// commsOf is the engines' comms, for onRanks.
func commsOf(engines []*Engine) []comm.Comm {
	cs := make([]comm.Comm, len(engines))
	for r, e := range engines {
		cs[r] = e.c
	}
	return cs
}
