package overlap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
)

// momentumRef is the reference of momentum correction: per rank and
// bucket u ← m·u + g (float32, one rounding per operation, as the engine),
// the exchange of u through the strategy's reference, then, for sparse
// codecs with masking (Config.MomentumMasking), u zeroed where the
// payload sent: where the committed residual is exactly zero (the
// reference's gradients never sum to an exact zero).
type momentumRef struct {
	m      float32
	u      map[[2]int][]float32
	ref    *refModel
	sparse bool // and masking
}

func (mr *momentumRef) step(s int, grads [][][]float32) [][]float32 {
	out := make([][]float32, len(grads[0]))
	for b := range out {
		in := make([][]float32, len(grads))
		for r := range grads {
			u := mr.u[[2]int{r, b}]
			if u == nil {
				u = make([]float32, len(grads[r][b]))
			}
			next := make([]float32, len(u))
			for i, g := range grads[r][b] {
				next[i] = float32(mr.m*u[i]) + g
			}
			mr.u[[2]int{r, b}] = next
			in[r] = next
		}
		out[b] = mr.ref.step(s, b, in)
		if mr.sparse {
			for r := range grads {
				e, u := mr.ref.e1[[2]int{r, b}], mr.u[[2]int{r, b}]
				for i := range u {
					if e[i] == 0 {
						u[i] = 0
					}
				}
			}
		}
	}
	return out
}

// TestMomentumCorrection runs the engine with Config.Momentum, with and
// without masking, against the reference for a dense, a sparse and a
// quantizing codec (3 ranks: SRA), bit for bit, on both backends (the
// device's on fake devices, whose kernels are the host's arithmetic).
func TestMomentumCorrection(t *testing.T) {
	const ranks, steps = 3, 4
	sizes := []int{500, 37}
	for _, backend := range backends {
		for _, c := range []struct {
			spec          string
			sparse, masks bool
		}{{"none", false, false}, {"topk:0.05", true, true}, {"topk:0.05", true, false}, {"randomk:0.1", true, true},
			{"randomk:0.1", true, false}, {"int8", false, true}} {
			t.Run(fmt.Sprintf("%s/%s/masking=%v", backend, c.spec, c.masks), func(t *testing.T) {
				cfg := Config{Spec: c.spec, ErrorFeedback: c.spec != "none", Decision: DecideCompressed, Momentum: 0.9,
					MomentumMasking: c.masks}
				g := newBackendRig(t, backend, ranks, sizes, cfg)
				ref := &momentumRef{m: 0.9, u: map[[2]int][]float32{}, sparse: c.sparse && c.masks,
					ref: newRef(t, c.spec, g.refStrategy(), ranks, cfg.ErrorFeedback)}
				for s := range steps {
					grads := stepGrads(ranks, s, sizes)
					want := ref.step(s, clone3(grads))
					out, _ := g.step(t, grads)
					for r := range grads {
						for b := range sizes {
							if i := sameFloats(out[r][b], want[b]); i >= 0 {
								t.Fatalf("step %d rank %d bucket %d element %d: %v, want %v", s, r, b, i, out[r][b][i], want[b][i])
							}
						}
					}
				}
				for r := range ranks {
					for b := range sizes {
						u := g.velocity(t, r, b)
						if i := sameFloats(u, ref.u[[2]int{r, b}]); i >= 0 {
							t.Fatalf("rank %d bucket %d: velocity element %d is %v, want %v", r, b, i, u[i], ref.u[[2]int{r, b}][i])
						}
					}
				}
			})
		}
	}
}

// TestMomentumCheckpointAcrossBackends: with momentum correction and
// masking, the states the host and the device engines save after the
// same steps are the same bytes, and a state of either backend loads into
// the other, which continues as the original does, bit for bit.
func TestMomentumCheckpointAcrossBackends(t *testing.T) {
	const ranks = 2
	sizes := []int{300, 37}
	for _, spec := range []string{"topk:0.05", "int8"} {
		cfg := Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Momentum: 0.5, MomentumMasking: true}
		rigs := map[string]*backendRig{}
		states := map[string][][]byte{}
		for _, b := range backends {
			rigs[b] = newBackendRig(t, b, ranks, sizes, cfg)
			for s := range 2 {
				rigs[b].step(t, stepGrads(ranks, s, sizes))
			}
			states[b] = rigs[b].save(t)
		}
		for r := range ranks {
			if !bytes.Equal(states["host"][r], states["device"][r]) {
				t.Errorf("%s rank %d: the device engine's state differs from the host engine's", spec, r)
			}
		}
		for _, from := range backends {
			for _, to := range backends {
				resumed := newBackendRig(t, to, ranks, sizes, cfg)
				resumed.load(t, states[from])
				grads := stepGrads(ranks, 2, sizes)
				want, _ := rigs[from].step(t, grads)
				got, stats := resumed.step(t, grads)
				if stats.Step != 2 {
					t.Errorf("%s %s → %s: step %d after Load, want 2", spec, from, to, stats.Step)
				}
				for r := range ranks {
					for b := range sizes {
						if i := sameFloats(got[r][b], want[r][b]); i >= 0 {
							t.Fatalf("%s %s → %s: rank %d bucket %d element %d: %v, want %v", spec, from, to, r, b, i, got[r][b][i], want[r][b][i])
						}
					}
				}
				// The original ran a step more: run it on a fresh rig of its
				// own for the next pair.
				rigs[from] = newBackendRig(t, from, ranks, sizes, cfg)
				rigs[from].load(t, states[from])
			}
		}
	}
}

// TestMomentumCheckpoint: a state saved mid-run resumes bit-exact; states
// of another momentum, a version-1 state into a momentum engine, and a
// non-finite velocity are refused with the engine unchanged; the version-1
// state of tests/golden (before momentum) still loads.
func TestMomentumCheckpoint(t *testing.T) {
	sizes := []int{300}
	cfg := Config{Spec: "topk:0.05", ErrorFeedback: true, Decision: DecideCompressed, Momentum: 0.5}
	run := func(es []*Engine, s int) [][][]float32 {
		grads := [][][]float32{{gradient(0, s, 0, 300)}, {gradient(1, s, 0, 300)}}
		_, errs := runStep(es, grads, inOrder(1))
		mustNoErrors(t, "step", errs)
		return grads
	}
	a := newEngines(t, 2, sizes, cfg)
	run(a, 0)
	run(a, 1)
	saved := make([][]byte, 2)
	for r, e := range a {
		var buf bytes.Buffer
		if err := e.Save(&buf); err != nil {
			t.Fatal(err)
		}
		saved[r] = buf.Bytes()
	}
	b := newEngines(t, 2, sizes, cfg)
	for r, e := range b {
		if err := e.Load(bytes.NewReader(saved[r])); err != nil {
			t.Fatal(err)
		}
	}
	want, got := run(a, 2), run(b, 2)
	if i := sameFloats(got[0][0], want[0][0]); i >= 0 {
		t.Fatalf("resumed step 2 differs at %d: %v, want %v", i, got[0][0][i], want[0][0][i])
	}

	refuse := func(e *Engine, state []byte, why string) {
		t.Helper()
		var before, after bytes.Buffer
		e.Save(&before)
		err := e.Load(bytes.NewReader(state))
		var se *StateError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), why) {
			t.Errorf("Load = %v; want a *StateError saying %q", err, why)
		}
		e.Save(&after)
		if !bytes.Equal(before.Bytes(), after.Bytes()) {
			t.Errorf("a refused Load (%s) changed the engine", why)
		}
	}
	other := newEngines(t, 1, sizes, Config{Spec: "topk:0.05", ErrorFeedback: true, Momentum: 0.9})[0]
	refuse(other, saved[0], "saved with momentum 0.5, this engine has 0.9")

	v1, err := os.ReadFile("testdata/state-v1-int8-sra-rank0.bin")
	if err != nil {
		t.Fatal(err)
	}
	plain := newEngines(t, 4, []int{1000, 37}, Config{Spec: "int8", Strategy: StrategyQuantSRA, ErrorFeedback: true})[0]
	if err := plain.Load(bytes.NewReader(v1)); err != nil {
		t.Errorf("a version-1 state does not load: %v", err)
	}
	withMomentum := newEngines(t, 4, []int{1000, 37}, Config{Spec: "int8", Strategy: StrategyQuantSRA, ErrorFeedback: true, Momentum: 0.9})[0]
	refuse(withMomentum, v1, "saved with momentum 0, this engine has 0.9")

	// A NaN in a velocity, checksum made good again.
	bad := append([]byte(nil), saved[0]...)
	at := len(bad) - 4 - 2 - 4*300 // the velocity's first element (before the guard part and the checksum)
	copy(bad[at:], []byte{0, 0, 0xc0, 0x7f})
	fixCRC(bad)
	refuse(b[0], bad, "momentum velocity of bucket 0 holds NaN")
}

// TestMomentumNonFinite: a gradient with NaN leaves that rank's velocity
// as it was; the other ranks' advance; on both backends.
func TestMomentumNonFinite(t *testing.T) {
	sizes := []int{64}
	for _, backend := range backends {
		g := newBackendRig(t, backend, 2, sizes, Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed, Momentum: 0.5})
		g.step(t, [][][]float32{{gradient(0, 0, 0, 64)}, {gradient(1, 0, 0, 64)}})
		before := [][]float32{g.velocity(t, 0, 0), g.velocity(t, 1, 0)}
		grads := [][][]float32{{gradient(0, 1, 0, 64)}, {gradient(1, 1, 0, 64)}}
		grads[0][0][5] = float32(math.NaN())
		g.step(t, grads)
		if i := sameFloats(g.velocity(t, 0, 0), before[0]); i >= 0 {
			t.Errorf("%s: rank 0's velocity changed at %d after a NaN gradient", backend, i)
		}
		if sameFloats(g.velocity(t, 1, 0), before[1]) < 0 {
			t.Errorf("%s: rank 1's velocity did not advance", backend)
		}
	}
}

// TestMomentumConfig: a momentum outside [0, 1) is refused on every rank,
// and ranks that differ in it fail the handshake.
func TestMomentumConfig(t *testing.T) {
	for _, m := range []float64{-0.1, 1, 1.5, math.NaN(), math.Inf(1)} {
		errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
			_, err := New(t.Context(), c, []int{10}, Config{Spec: "int8", Momentum: m})
			return err
		})
		for r, err := range errs {
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "Momentum") {
				t.Errorf("momentum %v, rank %d: %v; want a *ConfigError naming Momentum", m, r, err)
			}
		}
	}
	errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
		_, err := New(t.Context(), c, []int{10}, Config{Spec: "int8", Momentum: 0.5 + 0.4*float64(r)})
		return err
	})
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || !strings.Contains(err.Error(), "momentum") {
			t.Errorf("rank %d: %v; want a *ConfigMismatchError on momentum", r, err)
		}
	}
	errs = onRanks(group(t, 2), func(r int, c comm.Comm) error {
		_, err := New(t.Context(), c, []int{10}, Config{Spec: "int8", MomentumMasking: true})
		return err
	})
	for r, err := range errs {
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "MomentumMasking needs Momentum") {
			t.Errorf("masking without momentum, rank %d: %v; want a *ConfigError", r, err)
		}
	}
	errs = onRanks(group(t, 2), func(r int, c comm.Comm) error {
		_, err := New(t.Context(), c, []int{10}, Config{Spec: "topk:0.1", Momentum: 0.9, MomentumMasking: r == 0})
		return err
	})
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || !strings.Contains(err.Error(), "momentum masking") {
			t.Errorf("rank %d: %v; want a *ConfigMismatchError on momentum masking", r, err)
		}
	}
}

// fixCRC rewrites the trailing CRC32C of a saved state after an edit.
func fixCRC(state []byte) {
	body := state[:len(state)-4]
	binary.LittleEndian.PutUint32(state[len(state)-4:], crc32.Checksum(body, castagnoli))
}

// TestRandomKAdvice: a random-k ratio below RandomKMinRatio is run, with
// a caution in every bucket's reason; one at it is not cautioned.
func TestRandomKAdvice(t *testing.T) {
	for _, c := range []struct {
		spec string
		warn bool
	}{{"randomk:0.01", true}, {"randomk:0.25", false}, {"topk:0.01", false}} {
		e := newEngines(t, 1, []int{64}, Config{Spec: c.spec, ErrorFeedback: true, Decision: DecideCompressed})[0]
		stats, errs := runStep([]*Engine{e}, [][][]float32{{gradient(0, 0, 0, 64)}}, inOrder(1))
		mustNoErrors(t, c.spec, errs)
		if got := strings.Contains(stats[0].Buckets[0].Reason, "caution: random-k"); got != c.warn {
			t.Errorf("%s: reason %q; caution %v, want %v", c.spec, stats[0].Buckets[0].Reason, got, c.warn)
		}
	}
}

// TestMomentumMaskingQuantizedTopK: top-k with bits= sends quantized
// values, so its memory has no index set to mask with: MomentumMasking is
// a *ConfigError with it (as Spec or as a schedule phase), momentum
// correction alone and chunked top-k with float32 values are not.
func TestMomentumMaskingQuantizedTopK(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		fail bool
	}{
		{Config{Spec: "topk:0.05:chunk=64:bits=2", Momentum: 0.5, MomentumMasking: true}, true},
		{Config{Spec: "topk:0.01", Momentum: 0.5, MomentumMasking: true, Schedule: []Phase{{Spec: "topk:0.05:chunk=64:bits=2", Steps: 3}}}, true},
		{Config{Spec: "topk:0.05:chunk=64:bits=2", Momentum: 0.5}, false},
		{Config{Spec: "topk:0.05:chunk=64", Momentum: 0.5, MomentumMasking: true}, false},
	} {
		tc.cfg.ErrorFeedback, tc.cfg.Decision = true, DecideCompressed
		errs := onRanks(group(t, 1), func(_ int, c comm.Comm) error {
			e, err := New(context.Background(), c, []int{300}, tc.cfg)
			if err == nil {
				e.Close()
			}
			return err
		})
		var ce *ConfigError
		switch {
		case tc.fail && (!errors.As(errs[0], &ce) || !strings.Contains(errs[0].Error(), "MomentumMasking with spec topk:0.05:chunk=64:bits=2")):
			t.Errorf("%+v: %v, want a *ConfigError about MomentumMasking", tc.cfg, errs[0])
		case !tc.fail && errs[0] != nil:
			t.Errorf("%+v: %v", tc.cfg, errs[0])
		}
	}
}
