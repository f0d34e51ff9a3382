package outer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/overlap"
)

// streaming is the checkpoint tests' configuration: two fragments
// (tensors 0–1 and 2–3 of stateModel), H = 6, τ = 2, so fragment 0
// starts at 3, 9, 15, 21 and finishes at 5, 11, 17, 23, fragment 1 starts
// at 6, 12, 18 and finishes at 8, 14, 20; at s = 4 fragment 0 is in flight.
func streaming(spec string) Config {
	return Config{SyncEvery: 6, Fragments: 2, Delay: 2, Alpha: 0.25,
		Engine: overlap.Config{Spec: spec, ErrorFeedback: true, Decision: overlap.DecideCompressed}}
}

var stateModel = quad{sizes: []int{10, 7, 13, 5}}

// saveAll saves every Loop's state, on every rank at once.
func saveAll(t testing.TB, loops []*Loop) [][]byte {
	t.Helper()
	states := make([][]byte, len(loops))
	errs := onRanks(commsOf(loops), func(r int, _ comm.Comm) error {
		var b bytes.Buffer
		err := loops[r].Save(&b)
		states[r] = b.Bytes()
		return err
	})
	mustNoErrors(t, "Save", errs)
	return states
}

// loadAll loads states[r] (nil: none) into every Loop, on every rank at
// once, and returns the errors.
func loadAll(loops []*Loop, states [][]byte) []error {
	return onRanks(commsOf(loops), func(r int, _ comm.Comm) error {
		if r >= len(states) || states[r] == nil {
			return loops[r].Load(context.Background(), nil)
		}
		return loops[r].Load(context.Background(), bytes.NewReader(states[r]))
	})
}

func cloneAll(params [][][]float32) [][][]float32 {
	out := make([][][]float32, len(params))
	for r, p := range params {
		out[r] = clone(p)
	}
	return out
}

// TestResumeBitExact: a run saved at a step where a fragment's exchange
// is in flight and resumed in new Loops (with the caller's weights of that
// step) ends bit for bit where the saved run and a run never saved end:
// every rank's local and global weights and momentum. Also when the sync
// in flight is one whose average was not finite: both runs skip it.
func TestResumeBitExact(t *testing.T) {
	q := stateModel
	const ranks, saveAt, total = 3, 4, 22
	for _, nan := range []bool{false, true} {
		t.Run(fmt.Sprintf("non-finite %v", nan), func(t *testing.T) {
			cfg := streaming("topk:0.2")
			// With nan, rank 1's weight 1[3] (fragment 0's) is NaN at the
			// sync of s = 3, and restored after the next inner step.
			hook := func(params [][][]float32) func(r, k int) {
				var held float32
				return func(r, k int) {
					switch {
					case !nan || r != 1:
					case k == 2:
						held, params[r][1][3] = params[r][1][3], float32(math.NaN())
					case k == 3:
						params[r][1][3] = held
					}
				}
			}
			a, aParams := setup(t, q, ranks, cfg)
			train(t, q, a, aParams, 0, total, hook(aParams))

			b, bParams := setup(t, q, ranks, cfg)
			bHook := hook(bParams)
			train(t, q, b, bParams, 0, saveAt, bHook)
			states := saveAll(t, b)
			saved := cloneAll(bParams)
			bReports := train(t, q, b, bParams, saveAt, total-saveAt, bHook)

			c, cParams := setup(t, q, ranks, cfg)
			mustNoErrors(t, "Load", loadAll(c, states))
			for r := range cParams {
				for ti := range cParams[r] {
					copy(cParams[r][ti], saved[r][ti]) // the caller's checkpoint
				}
			}
			cReports := train(t, q, c, cParams, saveAt, total-saveAt, hook(cParams))

			for r := range ranks {
				// Step 5 finishes the sync that was in flight at the save.
				bSync, cSync := bReports[r][0].Finished, cReports[r][0].Finished
				if len(bSync) != 1 || len(cSync) != 1 || (bSync[0].Skipped == nil) != !nan || (cSync[0].Skipped == nil) != !nan ||
					nan && bSync[0].Skipped.Error() != cSync[0].Skipped.Error() {
					t.Errorf("rank %d: step 5 finished %+v in the saved run, %+v in the resumed one; want fragment 0's sync, skipped: %v", r, bSync, cSync, nan)
				}
				for _, run := range []struct {
					name   string
					l      *Loop
					params [][]float32
				}{{"saved", b[r], bParams[r]}, {"resumed", c[r], cParams[r]}} {
					if ti, i := identical(run.params, aParams[r]); ti >= 0 {
						t.Errorf("rank %d, %s run: local tensor %d[%d] = %v, the uninterrupted run's %v", r, run.name, ti, i, run.params[ti][i], aParams[r][ti][i])
					}
					if ti, i := identical(run.l.Global(), a[r].Global()); ti >= 0 {
						t.Errorf("rank %d, %s run: global tensor %d[%d] = %v, the uninterrupted run's %v", r, run.name, ti, i, run.l.Global()[ti][i], a[r].Global()[ti][i])
					}
					if ti, i := identical(run.l.momentum, a[r].momentum); ti >= 0 {
						t.Errorf("rank %d, %s run: momentum tensor %d[%d] differs", r, run.name, ti, i)
					}
				}
			}
		})
	}
}

// TestLoadRefused: a corrupt state, one of another model, schedule,
// optimizer or codec, states that disagree between ranks or no state at
// all are refused on every rank with a *StateError saying why, and the
// Loops are unchanged.
func TestLoadRefused(t *testing.T) {
	q := stateModel
	const ranks = 2
	cfg := streaming("topk:0.2")
	loops, params := setup(t, q, ranks, cfg)
	train(t, q, loops, params, 0, 4, nil)
	good := saveAll(t, loops)
	train(t, q, loops, params, 4, 2, nil)
	later := saveAll(t, loops)
	corrupt := func(b []byte, at int) []byte {
		c := bytes.Clone(b)
		c[at] ^= 0x40
		return c
	}
	other := func(change func(*Config)) Config {
		c := cfg
		change(&c)
		return c
	}
	for _, tc := range []struct {
		name   string
		cfg    Config
		sizes  []int
		states [][]byte
		field  string // the StateError's Field, or
		says   string // what its message says
	}{
		{"checksum", cfg, nil, [][]byte{corrupt(good[0], 100), corrupt(good[1], 100)}, "", "checksum"},
		{"truncated", cfg, nil, [][]byte{good[0][:7], good[1][:7]}, "", "truncated"},
		{"magic", cfg, nil, [][]byte{corrupt(good[0], 0), corrupt(good[1], 0)}, "", "not an outer state"},
		{"version", cfg, nil, [][]byte{corrupt(good[0], 4), corrupt(good[1], 4)}, "", "format version 65"},
		{"another model", cfg, []int{10, 7, 14, 5}, good, "tensor 2 elements", ""},
		{"other fragments", other(func(c *Config) { c.FragmentOf = []int{0, 1, 1, 1} }), nil, good, "tensor 1 fragment", ""},
		{"another H", other(func(c *Config) { c.SyncEvery = 8 }), nil, good, "SyncEvery", ""},
		{"another τ", other(func(c *Config) { c.Delay = 1 }), nil, good, "Delay", ""},
		{"another α", other(func(c *Config) { c.Alpha = 0 }), nil, good, "Alpha", ""},
		{"another optimizer", other(func(c *Config) { c.Optimizer = Optimizer{Kind: SGD, LR: 1} }), nil, good, "Optimizer", ""},
		{"another bucket size", other(func(c *Config) { c.BucketElements = 8 }), nil, good, "BucketElements", ""},
		{"another codec", other(func(c *Config) { c.Engine.Spec = "topk:0.3" }), nil, good, "", "fragment 0's engine state"},
		{"ranks at other steps", cfg, nil, [][]byte{good[0], later[1]}, "", "rank 1's state is at inner step 6, rank 0's at 4"},
		{"one rank's state twice", cfg, nil, [][]byte{good[0], good[0]}, "", "both passed the state of saved rank 0"},
		{"no state", cfg, nil, [][]byte{nil, nil}, "", "no rank passed a state"},
		{"one corrupt", cfg, nil, [][]byte{good[0], corrupt(good[1], 200)}, "", "rank 1 cannot load its state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := q
			if tc.sizes != nil {
				m = quad{sizes: tc.sizes}
			}
			fresh, freshParams := setup(t, m, ranks, tc.cfg)
			train(t, m, fresh, freshParams, 0, 1, nil)
			before := saveAll(t, fresh)
			errs := loadAll(fresh, tc.states)
			for r, err := range errs {
				var se *StateError
				if tc.name == "one corrupt" && r == 1 {
					continue // its own error says "checksum"
				}
				if !errors.As(err, &se) || se.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("rank %d: %v, want a *StateError on %q saying %q", r, err, tc.field, tc.says)
				}
			}
			if after := saveAll(t, fresh); !equalStates(after, before) {
				t.Error("a refused Load changed the Loops")
			}
		})
	}
}

func equalStates(a, b [][]byte) bool {
	for r := range a {
		if !bytes.Equal(a[r], b[r]) {
			return false
		}
	}
	return true
}

// TestLoadReshaped: a state saved by 4 ranks loads into 2, and one saved
// by 2 into 4 (the new ranks passing none): every new rank has the saved
// step, global weights, momentum and sync in flight, applies that sync
// at its finish as the saved run does, and its engines hold on average
// what the saved ranks held back (4 → 2: what saved ranks 0 and 1 held;
// the others' is dropped). The memories compared are the per-rank ones of
// every strategy (SRA's part memories, which LoadReshaped also carries,
// exist only on the 4 ranks of 2 → 4, where the new ranks start them
// empty).
func TestLoadReshaped(t *testing.T) {
	q := stateModel
	for _, tc := range []struct {
		from, to int
		spec     string
	}{
		{4, 2, "topk:0.2"},           // sparse-gather on both: per-rank memories only
		{2, 4, "int8:round=nearest"}, // allgather on 2 ranks, SRA on 4
	} {
		t.Run(fmt.Sprintf("%d to %d, %s", tc.from, tc.to, tc.spec), func(t *testing.T) {
			cfg := streaming(tc.spec)
			old, oldParams := setup(t, q, tc.from, cfg)
			train(t, q, old, oldParams, 0, 4, nil)
			states := saveAll(t, old)
			var wantResid [][][]float32 // per fragment, the average new ranks should hold
			for f := range old[0].frags {
				var sum [][]float32
				for r := range min(tc.from, tc.to) {
					res := residuals(t, old[r].frags[f])
					if sum == nil {
						sum = zeros(sizesOf(res))
					}
					for b := range res {
						for i, v := range res[b] {
							sum[b][i] += v / float32(tc.from)
						}
					}
				}
				wantResid = append(wantResid, sum)
			}
			fresh, freshParams := setup(t, q, tc.to, cfg)
			mustNoErrors(t, "Load", loadAll(fresh, states))
			for r, l := range fresh {
				switch f := l.frags[0]; {
				case l.InnerSteps() != 4:
					t.Errorf("rank %d: at inner step %d, want 4", r, l.InnerSteps())
				case f.flight == nil || f.flight.started != 3 || !f.flight.waited || l.frags[1].flight != nil:
					t.Errorf("rank %d: syncs in flight %+v, %+v; want fragment 0's of step 3, arrived", r, f.flight, l.frags[1].flight)
				}
				if ti, i := identical(l.Global(), old[0].Global()); ti >= 0 {
					t.Errorf("rank %d: global tensor %d[%d] differs from the saved", r, ti, i)
				}
				if ti, i := identical(l.momentum, old[0].momentum); ti >= 0 {
					t.Errorf("rank %d: momentum tensor %d[%d] differs from the saved", r, ti, i)
				}
				for f := range l.frags {
					var b bytes.Buffer
					if err := l.frags[f].eng.Save(&b); err != nil {
						t.Fatal(err)
					}
					// Fragment 0 has made one exchange, fragment 1 none.
					if info, err := overlap.InspectState(b.Bytes()); err != nil || info.NextStep != uint64(1-f) || info.WorldSize != tc.to {
						t.Errorf("rank %d: fragment %d's engine state %+v (%v), want %d ranks resuming at engine step %d", r, f, info, err, tc.to, 1-f)
					}
					got := residuals(t, l.frags[f])
					for bk := range got {
						for i, v := range got[bk] {
							if w := wantResid[f][bk][i]; math.Abs(float64(v-w)) > 1e-6*(1+math.Abs(float64(w))) {
								t.Errorf("rank %d: fragment %d bucket %d residual[%d] = %v, want %v", r, f, bk, i, v, w)
							}
						}
					}
				}
			}
			// Step 5 finishes fragment 0's sync with the saved average, on
			// the old ranks and the new ones alike.
			for r := range freshParams {
				for ti := range freshParams[r] {
					copy(freshParams[r][ti], oldParams[r%tc.from][ti])
				}
			}
			train(t, q, old, oldParams, 4, 1, nil)
			reports := train(t, q, fresh, freshParams, 4, 1, nil)
			for r, l := range fresh {
				if got := reports[r][0].Finished; len(got) != 1 || got[0].Fragment != 0 || got[0].Skipped != nil {
					t.Errorf("rank %d: step 5 finished %+v, want fragment 0's sync applied", r, got)
				}
				if ti, i := identical(l.Global(), old[0].Global()); ti >= 0 {
					t.Errorf("rank %d: after step 5, global tensor %d[%d] = %v, the saved run's %v", r, ti, i, l.Global()[ti][i], old[0].Global()[ti][i])
				}
			}
			train(t, q, fresh, freshParams, 5, 6, nil) // and goes on
		})
	}
}
