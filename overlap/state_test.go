package overlap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
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
	want := StateInfo{Version: 6, WorldSize: 2, Rank: 1, NextStep: 1, Spec: engines[1].spec, Strategy: engines[1].Strategy(), ErrorFeedback: true,
		Configured: StrategyAuto, FeedbackDecay: 1, Buckets: sizes}
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

// downgrade turns a flat engine's version-6 state of β = 1 into version
// 5 (without the feedback decay), that into version 4 (without the
// layout) and that into version 3 (without the settings after the
// error-feedback byte): the state as an older build wrote it.
func downgrade(t *testing.T, state []byte, to byte) []byte {
	t.Helper()
	info, err := InspectState(state)
	if err != nil || info.Version < int(to) || info.Layout.Nodes != 0 || info.FeedbackDecay != 1 {
		t.Fatalf("not a flat state of β = 1, version %d or later: %+v, %v", to, info, err)
	}
	at := 4 + 1 + 4 + 4 + 8 + 4 + len(info.Spec) + 2
	settings := 1 + 1 + 8 + 4 + len(info.Schedule)
	out := bytes.Clone(state)
	if info.Version == 6 && to < 6 {
		out = append(out[:at+settings+16], out[at+settings+16+8:]...)
	}
	if info.Version >= 5 && to < 5 {
		out = append(out[:at+settings], out[at+settings+16:]...)
	}
	if to == 3 {
		out = append(out[:at], out[at+settings:]...)
	}
	out[4] = to
	fixCRC(out)
	return out
}

// savedBy runs one step on ranks engines of cfg and returns rank 0's
// state.
func savedBy(t *testing.T, ranks int, sizes []int, cfg Config) []byte {
	t.Helper()
	engines := newEngines(t, ranks, sizes, cfg)
	_, errs := runStep(engines, stepGrads(ranks, 0, sizes), inOrder(len(sizes)))
	mustNoErrors(t, "step", errs)
	var buf bytes.Buffer
	if err := engines[0].Save(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestLoadSettings: a state loads only into an engine whose settings that
// shape the exchange are the state's: each other one is a *StateError
// naming it and both values, from Load and CheckState alike, and the
// engine is unchanged. The strategy may differ where both engines were
// configured auto (a change of world size); the run-time settings may
// change.
func TestLoadSettings(t *testing.T) {
	sizes := []int{64, 20}
	base := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed}
	with := func(f func(*Config)) Config { c := base; f(&c); return c }
	topk := Config{Spec: "topk:0.1", ErrorFeedback: true, Decision: DecideCompressed, Momentum: 0.9}
	for _, c := range []struct {
		name           string
		saved, load    Config
		ranks, loadOn  int
		setting, value string // "": loads
	}{
		{"auto on another world size", base, base, 4, 2, "", ""},
		{"auto, then the strategy it took", base, with(func(c *Config) { c.Strategy = StrategyQuantSRA }), 4, 4, "", ""},
		{"run-time settings", base, with(func(c *Config) {
			c.Decision, c.Warmup, c.Timeout, c.Workers, c.FailOnNonFinite = DecideDense, 3, time.Minute, 1, true
		}), 4, 4, "", ""},
		{"strategy", with(func(c *Config) { c.Strategy = StrategyQuantSRA }), with(func(c *Config) { c.Strategy = StrategySparseGather }), 4, 4,
			"strategy", "saved with strategy sra, this engine has sparse-gather"},
		{"auto, then another strategy", base, with(func(c *Config) { c.Strategy = StrategyQuantAllGather }), 4, 4,
			"strategy", "saved with strategy auto (sra), this engine has allgather"},
		{"spec", base, with(func(c *Config) { c.Spec = "int4" }), 2, 2, "spec", "saved with spec int8, this engine has int4"},
		{"error feedback", base, with(func(c *Config) { c.ErrorFeedback = false }), 2, 2,
			"error feedback", "saved with error feedback on, this engine has off"},
		{"schedule", with(func(c *Config) { c.Schedule = []Phase{{5, "int8:bucket=64"}}; c.Spec = "int4" }), with(func(c *Config) { c.Spec = "int4" }), 2, 2,
			"schedule", "saved with schedule 5@int8:bucket=64, this engine has none"},
		{"accuracy guard", with(func(c *Config) { c.Guard = 1.5 }), with(func(c *Config) { c.Guard = 2 }), 2, 2,
			"accuracy guard", "saved with accuracy guard 1.5, this engine has 2"},
		{"momentum masking", topk, func() Config { c := topk; c.MomentumMasking = true; return c }(), 2, 2,
			"momentum masking", "saved with momentum masking off, this engine has on"},
		{"momentum", topk, func() Config { c := topk; c.Momentum = 0.5; return c }(), 2, 2,
			"momentum", "saved with momentum 0.9, this engine has 0.5"},
	} {
		t.Run(c.name, func(t *testing.T) {
			state := savedBy(t, c.ranks, sizes, c.saved)
			e := newEngines(t, c.loadOn, sizes, c.load)[0]
			before := savedMemory(t, e)
			err := e.Load(bytes.NewReader(state))
			check := CheckState(state, c.load, sizes, c.loadOn, comm.Topology{})
			if c.setting == "" {
				if err != nil || check != nil {
					t.Fatalf("Load = %v, CheckState = %v; want both nil", err, check)
				}
				return
			}
			var se *StateError
			if !errors.As(err, &se) || se.Setting != c.setting || !strings.Contains(err.Error(), c.value) {
				t.Errorf("Load = %v; want a *StateError on %s saying %q", err, c.setting, c.value)
			}
			if check == nil || err == nil || check.Error() != err.Error() {
				t.Errorf("CheckState = %v; want Load's error %v", check, err)
			}
			if !bytes.Equal(savedMemory(t, e), before) {
				t.Error("a refused Load changed the engine")
			}
		})
	}
}

// TestLoadUnknownStrategy: a strategy byte that names no strategy is
// refused in every version, even with its checksum made good; an older
// state loads where its strategy fits.
func TestLoadUnknownStrategy(t *testing.T) {
	sizes := []int{1000, 37}
	cfg := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed}
	v6 := savedBy(t, 4, sizes, cfg)
	v5 := downgrade(t, v6, 5)
	v4 := downgrade(t, v6, 4)
	v3, err := os.ReadFile("testdata/state-v3-int8-sra-rank0.bin")
	if err != nil {
		t.Fatal(err)
	}
	v1, err := os.ReadFile("testdata/state-v1-int8-sra-rank0.bin")
	if err != nil {
		t.Fatal(err)
	}
	const strategyAt = 4 + 1 + 4 + 4 + 8 + 4 + len("int8") // after the spec
	e := newEngines(t, 4, sizes, cfg)[0]
	for name, state := range map[string][]byte{"version 6": v6, "version 5": v5, "version 4": v4, "version 3": v3, "version 1": v1, "downgraded to 3": downgrade(t, v6, 3)} {
		if err := e.Load(bytes.NewReader(state)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for _, at := range []int{strategyAt, strategyAt + 2} {
			if at == strategyAt+2 && state[4] < 4 {
				continue // no configured strategy before version 4
			}
			bad := bytes.Clone(state)
			bad[at] = 77
			fixCRC(bad)
			err := e.Load(bytes.NewReader(bad))
			var se *StateError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), "strategy byte 77 names no strategy") {
				t.Errorf("%s with strategy byte 77 at %d: Load = %v, want a *StateError", name, at, err)
			}
			if check := CheckState(bad, cfg, sizes, 4, comm.Topology{}); check == nil || err == nil || check.Error() != err.Error() {
				t.Errorf("%s with strategy byte 77 at %d: CheckState = %v, want Load's error", name, at, check)
			}
		}
	}
	allgather := cfg
	allgather.Strategy = StrategyQuantAllGather
	e = newEngines(t, 4, sizes, allgather)[0]
	var se *StateError
	if err := e.Load(bytes.NewReader(v3)); !errors.As(err, &se) || se.Setting != "strategy" || se.Saved != "sra" || se.Current != "allgather" {
		t.Errorf("a version-3 SRA state into an allgather engine: %v, want a *StateError on the strategy", err)
	}
}

// TestCheckStateConfig: CheckState refuses a configuration New would
// refuse with a *ConfigError of no rank, and checks a good state.
func TestCheckStateConfig(t *testing.T) {
	sizes := []int{64}
	cfg := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed}
	state := savedBy(t, 2, sizes, cfg)
	if err := CheckState(state, cfg, sizes, 2, comm.Topology{}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		cfg   Config
		sizes []int
		world int
	}{
		"spec":       {Config{Spec: "int8:nope"}, sizes, 2},
		"sizes":      {cfg, []int{0}, 2},
		"world size": {cfg, sizes, 0},
	} {
		var ce *ConfigError
		if err := CheckState(state, c.cfg, c.sizes, c.world, comm.Topology{}); !errors.As(err, &ce) || ce.Rank != -1 {
			t.Errorf("%s: CheckState = %v, want a *ConfigError of rank -1", name, err)
		}
	}
	var se *StateError
	if err := CheckState(state[:len(state)-1], cfg, sizes, 2, comm.Topology{}); !errors.As(err, &se) {
		t.Errorf("a cut state: CheckState = %v, want a *StateError", err)
	}
}

// TestLoadBadPlace: a state whose header gives its rank no place in its
// world (world size 0, a rank outside the world, a layout of nodes that is
// not the world's or does not hold the rank), checksum made good, is a
// *StateError naming the field from InspectState, CheckState and Load on
// both backends, in every version, and the engine is unchanged.
func TestLoadBadPlace(t *testing.T) {
	const ranks = 4
	sizes := []int{1000, 37}
	cfg := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed}
	v6 := savedBy(t, ranks, sizes, cfg)
	v5 := downgrade(t, v6, 5)
	v1, err := os.ReadFile("testdata/state-v1-int8-sra-rank0.bin")
	if err != nil {
		t.Fatal(err)
	}
	u32 := func(state []byte, at int, v uint32) []byte {
		bad := bytes.Clone(state)
		binary.LittleEndian.PutUint32(bad[at:], v)
		fixCRC(bad)
		return bad
	}
	const worldAt, rankAt = 5, 9
	layoutAt := 4 + 1 + 4 + 4 + 8 + 4 + len("int8") + 2 + 1 + 1 + 8 + 4 // after the schedule (none)
	bad := map[string][]byte{}
	for name, state := range map[string][]byte{"version 6": v6, "version 5": v5, "version 3": downgrade(t, v6, 3), "version 1": v1} {
		bad[name+", world size 0"] = u32(state, worldAt, 0)
		bad[name+", rank 4 of 4"] = u32(state, rankAt, ranks)
		bad[name+", rank 2³²−1"] = u32(state, rankAt, math.MaxUint32)
	}
	for name, state := range map[string][]byte{"version 6": v6, "version 5": v5} {
		bad[name+", 2 nodes × 3 ranks of 4"] = u32(u32(state, layoutAt, 2), layoutAt+4, 3)
		bad[name+", node 2 of 2"] = u32(u32(u32(state, layoutAt, 2), layoutAt+4, 2), layoutAt+8, 2)
	}
	for _, backend := range backends {
		g := newBackendRig(t, backend, ranks, sizes, cfg)
		g.steps(t, stepGrads(ranks, 0, sizes))
		before := g.save(t)
		for name, state := range bad {
			field := "world size 0"
			switch {
			case strings.Contains(name, "rank 4"):
				field = "rank 4 in the header is outside its world size 4"
			case strings.Contains(name, "rank 2³²−1"):
				field = "rank 4294967295 in the header"
			case strings.Contains(name, "nodes"):
				field = "layout of 2 node(s) × 3 rank(s) in the header, world size 4"
			case strings.Contains(name, "node 2"):
				field = "place node 2, local rank 0 in the header is outside its layout"
			}
			var se *StateError
			_, inspect := InspectState(state)
			load := g.core(0).Load(bytes.NewReader(state))
			check := CheckState(state, cfg, sizes, ranks, comm.Topology{})
			for call, err := range map[string]error{"InspectState": inspect, "Load": load, "CheckState": check} {
				if !errors.As(err, &se) || !strings.Contains(err.Error(), field) {
					t.Errorf("%s: %s, %s = %v; want a *StateError saying %q", backend, name, call, err, field)
				}
			}
		}
		if after := g.save(t); !bytes.Equal(after[0], before[0]) {
			t.Errorf("%s: a refused state changed the engine", backend)
		}
	}
}
