package overlap

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// TestSaveLoad: engines restored from a state continue exactly as the
// originals, both memories included.
func TestSaveLoad(t *testing.T) {
	sizes := []int{100, 51}
	for _, spec := range []string{"int8", "topk:0.1", "randomk:0.2", "fp16"} {
		t.Run(spec, func(t *testing.T) {
			const ranks = 3
			cfg := Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed}
			orig := newEngines(t, ranks, sizes, cfg)
			for s := range 2 {
				_, errs := runStep(orig, stepGrads(ranks, s, sizes), inOrder(2))
				mustNoErrors(t, "warm-up", errs)
			}
			states := make([][]byte, ranks)
			for r, e := range orig {
				var buf bytes.Buffer
				if err := e.Save(&buf); err != nil {
					t.Fatal(err)
				}
				states[r] = buf.Bytes()
			}
			restored := newEngines(t, ranks, sizes, cfg)
			for r, e := range restored {
				if err := e.Load(bytes.NewReader(states[r])); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			for s := 2; s < 4; s++ {
				a, b := stepGrads(ranks, s, sizes), stepGrads(ranks, s, sizes)
				sa, errs := runStep(orig, a, inOrder(2))
				mustNoErrors(t, "original", errs)
				sb, errs := runStep(restored, b, inOrder(2))
				mustNoErrors(t, "restored", errs)
				for r := range ranks {
					if sa[r].Step != sb[r].Step {
						t.Errorf("step numbers %d and %d", sa[r].Step, sb[r].Step)
					}
					for i := range sizes {
						if j := sameFloats(a[r][i], b[r][i]); j >= 0 {
							t.Fatalf("step %d, rank %d, bucket %d: restored engine differs at %d", s, r, i, j)
						}
					}
				}
			}
		})
	}
}

// TestLoadErrors: bad states are refused and change nothing.
func TestLoadErrors(t *testing.T) {
	sizes := []int{40, 30}
	cfg := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed}
	engines := newEngines(t, 2, sizes, cfg)
	_, errs := runStep(engines, stepGrads(2, 0, sizes), inOrder(2))
	mustNoErrors(t, "step", errs)
	var good bytes.Buffer
	if err := engines[0].Save(&good); err != nil {
		t.Fatal(err)
	}
	state := good.Bytes()
	before := residuals(engines[1], 0)
	flipped := bytes.Clone(state)
	flipped[len(flipped)/2] ^= 1
	for name, in := range map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("XXXX"), state[4:]...),
		"version":   append(append([]byte("GCOV"), 9), state[5:]...),
		"truncated": state[:len(state)-7],
		"flipped":   flipped,
	} {
		err := engines[1].Load(bytes.NewReader(in))
		var se *StateError
		if !errors.As(err, &se) {
			t.Errorf("%s: got %v, want a *StateError", name, err)
		}
	}
	other := func(cfg Config, sizes []int) {
		t.Helper()
		e := newEngines(t, 2, sizes, cfg)[0]
		err := e.Load(bytes.NewReader(state))
		var se *StateError
		if !errors.As(err, &se) {
			t.Errorf("%+v %v: got %v, want a *StateError", cfg, sizes, err)
		}
		t.Log(err)
	}
	other(Config{Spec: "int4", ErrorFeedback: true, Decision: DecideCompressed}, sizes)
	other(Config{Spec: "int8", Decision: DecideCompressed}, sizes)
	other(cfg, []int{40, 31})
	other(cfg, []int{40})
	if i := sameFloats(residuals(engines[1], 0), before); i >= 0 {
		t.Errorf("a failed Load changed the memory at %d", i)
	}
}

// TestLoadOtherWorldSize: the stage-1 memory follows a state into a group
// of another size; SRA's second memory starts empty there.
func TestLoadOtherWorldSize(t *testing.T) {
	sizes := []int{64}
	cfg := Config{Spec: "int8", Strategy: StrategyQuantSRA, ErrorFeedback: true, Decision: DecideCompressed}
	two := newEngines(t, 2, sizes, cfg)
	_, errs := runStep(two, stepGrads(2, 0, sizes), inOrder(1))
	mustNoErrors(t, "step", errs)
	var buf bytes.Buffer
	if err := two[0].Save(&buf); err != nil {
		t.Fatal(err)
	}
	if len(two[0].partEF.Buckets()) != 1 {
		t.Fatalf("no second memory to save")
	}
	four := newEngines(t, 4, sizes, cfg)
	if err := four[0].Load(&buf); err != nil {
		t.Fatal(err)
	}
	if i := sameFloats(residuals(four[0], 0), residuals(two[0], 0)); i >= 0 {
		t.Errorf("stage-1 memory differs at %d", i)
	}
	if got := four[0].partEF.Buckets(); len(got) != 0 {
		t.Errorf("second memory has buckets %v, want none", got)
	}
	if four[0].next != 1 {
		t.Errorf("next step %d, want 1", four[0].next)
	}
}

// TestInspectState: InspectState reads back what Save wrote about the
// engine, and refuses a state with a flipped byte or cut short.
func TestInspectState(t *testing.T) {
	sizes := []int{100, 7}
	engines := newEngines(t, 2, sizes, Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed})
	grads := [][][]float32{{gradient(0, 0, 0, 100), gradient(0, 0, 1, 7)}, {gradient(1, 0, 0, 100), gradient(1, 0, 1, 7)}}
	_, errs := runStep(engines, grads, inOrder(2))
	mustNoErrors(t, "step", errs)
	var buf bytes.Buffer
	if err := engines[1].Save(&buf); err != nil {
		t.Fatal(err)
	}
	info, err := InspectState(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := StateInfo{WorldSize: 2, Rank: 1, NextStep: 1, Spec: engines[1].spec, Strategy: engines[1].Strategy(), ErrorFeedback: true, Buckets: sizes}
	if !reflect.DeepEqual(info, want) {
		t.Fatalf("InspectState = %+v, want %+v", info, want)
	}
	for _, bad := range [][]byte{buf.Bytes()[:buf.Len()-1], append([]byte(nil), buf.Bytes()...), buf.Bytes()[:3]} {
		if len(bad) == buf.Len() {
			bad[10] ^= 1
		}
		var se *StateError
		if _, err := InspectState(bad); !errors.As(err, &se) {
			t.Errorf("InspectState of a damaged state (%d bytes): %v, want *StateError", len(bad), err)
		}
	}
}
