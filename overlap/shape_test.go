package overlap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// TestShapeChoice: StrategyAuto on 2 nodes × 2 ranks times both shapes
// and keeps hierarchical when it is more than shapeMargin faster, flat
// otherwise (the trials' times fixed here), every rank alike and saying
// why; the engine it keeps starts as a new one of its strategy would — the
// same results bit for bit from step 0, its warm-up still ahead — so the
// trials leave nothing in its memories or step count.
func TestShapeChoice(t *testing.T) {
	sizes := []int{4096, 1001, 7}
	for _, tc := range []struct {
		spec       string
		flat, hier float64 // the trials' step times
		want       Strategy
	}{
		{"int8", 1.0, 0.5, StrategyHier},
		{"int8", 1.0, 0.95, StrategyQuantSRA},
		{"none", 1.0, 0.6, StrategyHier},
		{"topk:0.1", 1.0, 0.8, StrategyHier},
		{"topk:0.1", 0.5, 1.0, StrategySparseGather},
	} {
		t.Run(fmt.Sprintf("%s/%v-%v", tc.spec, tc.flat, tc.hier), func(t *testing.T) {
			cfg := Config{Spec: tc.spec, ErrorFeedback: true, Decision: DecideCompressed, Warmup: 1}
			flat, _ := resolve(StrategyAuto, mustCodec(t, tc.spec), 4)
			tm := &fixedTiming{shapes: map[Strategy]float64{flat: tc.flat, StrategyHier: tc.hier}}
			engines := newTimedEngines(t, nodeGroup(t, 2, 2), sizes, cfg, tm)
			ref := cfg
			ref.Strategy = tc.want
			twins := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, ref)
			for step := range 3 {
				grads := stepGrads(4, step, sizes)
				want := clone3(grads)
				stats, errs := runStep(engines, grads, inOrder(len(sizes)))
				mustNoErrors(t, "step", errs)
				_, errs = runStep(twins, want, inOrder(len(sizes)))
				mustNoErrors(t, "twin step", errs)
				for r, e := range engines {
					if e.Strategy() != tc.want || stats[r].Step != uint64(step) {
						t.Fatalf("rank %d: strategy %v at step %d, want %v at %d", r, e.Strategy(), stats[r].Step, tc.want, step)
					}
					b := stats[r].Buckets[0]
					warm := step == 0 && tc.spec != "none" // codec none has no warm-up: it is always dense
					if !strings.Contains(b.Reason, "auto on 2 nodes × 2 ranks: hierarchical") || warm != strings.Contains(b.Reason, "warm-up") {
						t.Errorf("rank %d step %d: reason %q", r, step, b.Reason)
					}
					for i := range sizes {
						if j := sameFloats(grads[r][i], want[r][i]); j >= 0 {
							t.Fatalf("step %d rank %d bucket %d element %d: %v, a new %v engine gives %v", step, r, i, j, grads[r][i][j], tc.want, want[r][i][j])
						}
					}
				}
			}
		})
	}
}

// TestShapeNoTrial: an explicit strategy, one node, or a node of one
// rank takes no trial: the engine is what was configured, and its
// reasons say nothing of a choice.
func TestShapeNoTrial(t *testing.T) {
	for _, tc := range []struct {
		name         string
		nodes, local int
		strategy     Strategy
	}{{"explicit", 2, 2, StrategyQuantSRA}, {"one node", 1, 4, StrategyAuto}, {"one rank per node", 4, 1, StrategyAuto}} {
		t.Run(tc.name, func(t *testing.T) {
			tm := &fixedTiming{shapes: map[Strategy]float64{StrategyHier: 0}}
			engines := newTimedEngines(t, nodeGroup(t, tc.nodes, tc.local), []int{100}, Config{Spec: "int8", Strategy: tc.strategy, Decision: DecideCompressed}, tm)
			stats, errs := runStep(engines, stepGrads(4, 0, []int{100}), inOrder(1))
			mustNoErrors(t, "step", errs)
			for r, e := range engines {
				if e.Strategy() == StrategyHier || strings.Contains(stats[r].Buckets[0].Reason, "auto on") {
					t.Errorf("rank %d: %v, %q", r, e.Strategy(), stats[r].Buckets[0].Reason)
				}
			}
		})
	}
}

// TestShapeBadLayout: ranks that see their layout differently. One that
// sees a single node where the others see two takes no trial: every rank
// fails New on the handshake's "shape". Ranks that all see several nodes
// but not one layout keep the flat engine, saying why.
func TestShapeBadLayout(t *testing.T) {
	comms := nodeGroup(t, 2, 2)
	errs := onRanks(comms, func(r int, c comm.Comm) error {
		if r == 3 {
			c = liar{c, comm.Topology{Node: 0, Nodes: 1, LocalRank: 3, LocalSize: 4}}
		}
		e, err := New(context.Background(), c, []int{64}, Config{Spec: "int8", Timeout: 10e9})
		if err == nil {
			e.Close()
		}
		return err
	})
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || me.Field != "shape" {
			t.Errorf("rank %d: %v, want a *ConfigMismatchError on shape", r, err)
		}
	}

	comms = nodeGroup(t, 2, 2)
	engines := make([]*Engine, 4)
	mustNoErrors(t, "New", onRanks(comms, func(r int, c comm.Comm) error {
		if r == 1 {
			c = liar{c, comm.Topology{Node: 0, Nodes: 2, LocalRank: 0, LocalSize: 2}}
		}
		var err error
		engines[r], err = New(context.Background(), c, []int{64}, Config{Spec: "int8", Decision: DecideCompressed, Timeout: 10e9})
		return err
	}))
	stats, errs := runStep(engines, stepGrads(4, 0, []int{64}), inOrder(1))
	mustNoErrors(t, "step", errs)
	for r, e := range engines {
		if e.Strategy() != StrategyQuantSRA || !strings.Contains(stats[r].Buckets[0].Reason, "do not describe one layout") {
			t.Errorf("rank %d: %v, %q", r, e.Strategy(), stats[r].Buckets[0].Reason)
		}
		e.Close()
	}
}

// mustCodec is spec's codec.
func mustCodec(t *testing.T, spec string) compress.Codec {
	t.Helper()
	s, err := compress.ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	return s.Codec
}
