package outer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/overlap"
)

// TestConfigRefused: New refuses each invalid configuration with a
// *ConfigError naming the field and the values.
func TestConfigRefused(t *testing.T) {
	three := []int{4, 5, 6}
	for _, tc := range []struct {
		name  string
		cfg   Config
		sizes []int
		field string
		says  string
	}{
		{"H 0", Config{}, three, "SyncEvery", "0: want at least 1"},
		{"F negative", Config{SyncEvery: 4, Fragments: -1}, three, "Fragments", "-1"},
		{"F above the tensors", Config{SyncEvery: 4, Fragments: 4}, three, "Fragments", "4 for 3 tensors"},
		{"τ negative", Config{SyncEvery: 4, Delay: -1}, three, "Delay", "-1"},
		{"τ·F = H", Config{SyncEvery: 4, Fragments: 2, Delay: 2}, three, "Delay", "2 with Fragments 2 and SyncEvery 4"},
		{"τ = H", Config{SyncEvery: 4, Delay: 4}, three, "Delay", "Delay·Fragments < SyncEvery"},
		{"τ·F overflows", Config{SyncEvery: 4, Fragments: 2, Delay: math.MaxInt}, three, "Delay", "with Fragments 2 and SyncEvery 4"},
		{"α 1", Config{SyncEvery: 4, Alpha: 1}, three, "Alpha", "1: want 0 ≤ Alpha < 1"},
		{"α negative", Config{SyncEvery: 4, Alpha: -0.5}, three, "Alpha", "-0.5"},
		{"α NaN", Config{SyncEvery: 4, Alpha: math.NaN()}, three, "Alpha", "NaN"},
		{"optimizer kind", Config{SyncEvery: 4, Optimizer: Optimizer{Kind: 7}}, three, "Optimizer.Kind", "OptimizerKind(7)"},
		{"sgd without lr", Config{SyncEvery: 4, Optimizer: Optimizer{Kind: SGD}}, three, "Optimizer.LR", "give a learning rate"},
		{"sgd with momentum", Config{SyncEvery: 4, Optimizer: Optimizer{Kind: SGD, LR: 1, Momentum: 0.9}}, three, "Optimizer.Momentum", "0.9 with kind sgd"},
		{"nesterov μ 1", Config{SyncEvery: 4, Optimizer: Optimizer{Momentum: 1}}, three, "Optimizer.Momentum", "1: want 0 < Momentum < 1"},
		{"nesterov lr negative", Config{SyncEvery: 4, Optimizer: Optimizer{LR: -1}}, three, "Optimizer.LR", "-1"},
		{"sgd lr Inf", Config{SyncEvery: 4, Optimizer: Optimizer{Kind: SGD, LR: math.Inf(1)}}, three, "Optimizer.LR", "+Inf"},
		{"none with lr", Config{SyncEvery: 4, Optimizer: Optimizer{Kind: None, LR: 0.5}}, three, "Optimizer.LR", "with kind none"},
		{"on non-finite", Config{SyncEvery: 4, OnNonFinite: 3}, three, "OnNonFinite", "NonFinitePolicy(3)"},
		{"bucket elements", Config{SyncEvery: 4, BucketElements: -1}, three, "BucketElements", "-1"},
		{"engine shapes", Config{SyncEvery: 4, Engine: overlap.Config{Spec: "none", Shapes: [][]overlap.Shape{{{Rows: 1, Cols: 15}}}}}, three, "Engine.Shapes", "leave it nil"},
		{"engine timeout", Config{SyncEvery: 4, Engine: overlap.Config{Timeout: -time.Second}}, three, "Engine.Timeout", "-1s"},
		{"shapes count", Config{SyncEvery: 4, Shapes: []overlap.Shape{{Rows: 2, Cols: 2}}}, three, "Shapes", "1 entries for 3 tensors"},
		{"shape size", Config{SyncEvery: 4, Shapes: []overlap.Shape{{Rows: 2, Cols: 2}, {Rows: 2, Cols: 3}, {Rows: 2, Cols: 3}}}, three, "Shapes[1]", "2×3 for tensor 1 of 5 elements"},
		{"fragment of too short", Config{SyncEvery: 4, FragmentOf: []int{0, 0}}, three, "FragmentOf", "tensor 2 is in no fragment"},
		{"fragment of too long", Config{SyncEvery: 4, FragmentOf: []int{0, 0, 0, 0}}, three, "FragmentOf", "4 entries for 3 tensors"},
		{"fragment negative", Config{SyncEvery: 4, FragmentOf: []int{0, -1, 0}}, three, "FragmentOf[1]", "-1"},
		{"fragment beyond F", Config{SyncEvery: 4, Fragments: 2, FragmentOf: []int{0, 1, 2}}, three, "FragmentOf[2]", "2: want a fragment from 0 to 1"},
		{"fragment without tensor", Config{SyncEvery: 9, Fragments: 3, FragmentOf: []int{0, 2, 0}}, three, "FragmentOf", "fragment 1 has no tensor"},
		{"fragment gap", Config{SyncEvery: 9, FragmentOf: []int{0, 2, 0}}, three, "FragmentOf", "fragment 1 has no tensor"},
		{"fragment of empty tensors", Config{SyncEvery: 4, FragmentOf: []int{0, 1, 0}}, []int{4, 0, 6}, "FragmentOf", "fragment 1 holds no elements"},
		{"no tensors", Config{SyncEvery: 4}, nil, "params", "no tensors"},
		{"empty tensors", Config{SyncEvery: 4}, []int{0, 0}, "params", "all empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := zeros(tc.sizes)
			_, err := New(context.Background(), group(t, 1)[0], params, tc.cfg)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || ce.Rank != 0 || !strings.Contains(ce.Reason, tc.says) {
				t.Errorf("New: %v, want a *ConfigError of rank 0 on %s saying %q", err, tc.field, tc.says)
			}
		})
	}
}

// TestInvalidRankTellsOthers: a rank whose configuration is invalid fails
// at once, and so does every other rank, naming it and why.
func TestInvalidRankTellsOthers(t *testing.T) {
	comms := group(t, 3)
	errs := onRanks(comms, func(r int, c comm.Comm) error {
		cfg := Config{SyncEvery: 4, Engine: dense}
		if r == 2 {
			cfg.Delay = -1
		}
		l, err := New(context.Background(), c, zeros([]int{3, 3}), cfg)
		if err == nil {
			l.Close()
		}
		return err
	})
	for r, err := range errs {
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Rank != 2 || ce.Field != "Delay" || !strings.Contains(err.Error(), "rank 2: invalid Delay: -1") {
			t.Errorf("rank %d: %v, want rank 2's invalid Delay", r, err)
		}
	}
}

// TestRefuseTellsOthers: a rank that cannot even read its configuration
// refuses through Refuse, and every other rank's New fails at once,
// naming it, the field and why; Refuse returns that rank's own error.
func TestRefuseTellsOthers(t *testing.T) {
	comms := group(t, 3)
	errs := onRanks(comms, func(r int, c comm.Comm) error {
		if r == 1 {
			return Refuse(context.Background(), c, 0, &ConfigError{Field: "ocfg->size", Reason: "99: not a size this library reads"})
		}
		l, err := New(context.Background(), c, zeros([]int{3, 3}), Config{SyncEvery: 4, Engine: dense})
		if err == nil {
			l.Close()
		}
		return err
	})
	for r, err := range errs {
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Rank != 1 || ce.Field != "ocfg->size" || !strings.Contains(err.Error(), "rank 1: invalid ocfg->size: 99: not a size") {
			t.Errorf("rank %d: %v, want rank 1's invalid ocfg->size", r, err)
		}
	}
}

// TestRanksDisagree: ranks whose configurations differ in H, F, τ, α, the
// optimizer, the policy, the tensors or the codec fail on every rank at
// once, with the same error naming the field and both values.
func TestRanksDisagree(t *testing.T) {
	base := Config{SyncEvery: 8, Engine: overlap.Config{Spec: "none", Timeout: 10 * time.Second}}
	for _, tc := range []struct {
		name   string
		change func(*Config, *[]int)
		want   string
	}{
		{"H", func(c *Config, _ *[]int) { c.SyncEvery = 9 }, "ranks disagree on SyncEvery: rank 1 has 9, rank 0 has 8"},
		{"F", func(c *Config, _ *[]int) { c.Fragments = 2 }, "ranks disagree on Fragments: rank 1 has 2, rank 0 has 1"},
		{"τ", func(c *Config, _ *[]int) { c.Delay = 1 }, "ranks disagree on Delay: rank 1 has 1, rank 0 has 0"},
		{"α", func(c *Config, _ *[]int) { c.Alpha = 0.25 }, "ranks disagree on Alpha: rank 1 has 0.25, rank 0 has 0"},
		{"optimizer", func(c *Config, _ *[]int) { c.Optimizer = Optimizer{Kind: SGD, LR: 0.5} },
			"ranks disagree on Optimizer: rank 1 has sgd lr=0.5, rank 0 has nesterov lr=0.7 momentum=0.9"},
		{"policy", func(c *Config, _ *[]int) { c.OnNonFinite = FailNonFinite }, "ranks disagree on OnNonFinite: rank 1 has fail, rank 0 has skip"},
		{"fragments", func(c *Config, _ *[]int) { c.FragmentOf = []int{0, 0, 1} }, "ranks disagree on tensor 1 fragment: rank 1 has 0, rank 0 has 1"},
		{"tensors", func(_ *Config, s *[]int) { *s = []int{4, 7, 6} }, "ranks disagree on tensor 1 elements: rank 1 has 7, rank 0 has 5"},
		{"codec", func(c *Config, _ *[]int) { c.Engine.Spec = "int8" }, "ranks disagree on spec: rank 1 has int8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
				cfg, sizes := base, []int{4, 5, 6}
				if tc.name == "fragments" {
					cfg.FragmentOf = []int{0, 1, 1}
				}
				if r == 1 {
					tc.change(&cfg, &sizes)
				}
				l, err := New(context.Background(), c, zeros(sizes), cfg)
				if err == nil {
					l.Close()
				}
				return err
			})
			for r, err := range errs {
				var mine *ConfigMismatchError
				var engine *overlap.ConfigMismatchError
				if !errors.As(err, &mine) && !errors.As(err, &engine) || !strings.Contains(fmt.Sprint(err), tc.want) {
					t.Errorf("rank %d: %v, want a mismatch saying %q", r, err, tc.want)
				}
			}
		})
	}
}

// TestDeadPeer: a peer that dies before a sync, or stalls in the middle
// of an exchange that overlaps inner steps, fails that sync on every rank
// within the engine's Timeout, with the local weights, the global weights
// and the momentum as they were before the Step; later calls say the Loop
// is broken.
func TestDeadPeer(t *testing.T) {
	q := quad{sizes: []int{6, 6}}
	const ranks = 3
	engine := overlap.Config{Spec: "none", Timeout: 500 * time.Millisecond}
	for _, tc := range []struct {
		name  string
		cfg   Config
		quiet int // the inner step (k) before whose Step rank 2 dies or stalls
		fails int // the inner step whose Step fails
		stall bool
	}{
		// The sync at s = 2 (k = 1); rank 2 never calls that Step.
		{"dies", Config{SyncEvery: 2, Engine: engine}, 1, 1, false},
		// F = 2, H = 4, τ = 1: fragment 0 starts at s = 2 and finishes at
		// s = 3; rank 2's collectives stall on the wire in between.
		{"stalls", Config{SyncEvery: 4, Fragments: 2, Delay: 1, Engine: engine}, 1, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, ranks)
			gate := &gated{Comm: comms[2], arrived: make(chan struct{}, 16)}
			comms[2] = gate
			params := [][][]float32{q.init(0), q.init(1), q.init(2)}
			loops := newLoops(t, comms, params, tc.cfg)
			var others sync.WaitGroup // ranks 0 and 1, until their failure
			others.Add(2)
			errs := onRanks(comms, func(r int, _ comm.Comm) error {
				l, ctx := loops[r], context.Background()
				for k := 0; ; k++ {
					if r == 2 && k == tc.quiet {
						if !tc.stall {
							others.Wait() // dead until the others have failed
						} else {
							gate.close()
						}
					}
					sgd(params[r], q.grad(r, k, params[r]), innerLR)
					local, global, momentum := clone(params[r]), clone(l.Global()), clone(l.momentum)
					_, err := l.Step(ctx)
					if err == nil {
						if k >= tc.fails+1 {
							return fmt.Errorf("step %d succeeded, after the failure was due", k+1)
						}
						continue
					}
					if r < 2 {
						others.Done()
					}
					if r < 2 && k != tc.fails {
						return fmt.Errorf("step %d failed (%v), want step %d to", k+1, err, tc.fails+1)
					}
					if ti, i := identical(params[r], local); ti >= 0 {
						return fmt.Errorf("local tensor %d[%d] changed to %v: %v", ti, i, params[r][ti][i], err)
					}
					if ti, i := identical(l.Global(), global); ti >= 0 {
						return fmt.Errorf("global tensor %d[%d] changed: %v", ti, i, err)
					}
					if ti, i := identical(l.momentum, momentum); ti >= 0 {
						return fmt.Errorf("momentum tensor %d[%d] changed: %v", ti, i, err)
					}
					var be *BrokenError
					if _, again := l.Step(ctx); !errors.As(again, &be) {
						return fmt.Errorf("after the failure (%v), Step: %v, want a *BrokenError", err, again)
					}
					return nil
				}
			})
			mustNoErrors(t, "ranks", errs)
		})
	}
}

// TestNonFinite: a NaN in one rank's pseudo-gradient skips that sync on
// every rank — global weights, momentum and local weights as they were,
// the Report naming it — or, with FailNonFinite, fails it on every rank;
// either way the Loop goes on.
func TestNonFinite(t *testing.T) {
	q := quad{sizes: []int{5, 7}}
	const ranks = 3
	for _, policy := range []NonFinitePolicy{SkipNonFinite, FailNonFinite} {
		t.Run(policy.String(), func(t *testing.T) {
			loops, params := setup(t, q, ranks, Config{SyncEvery: 2, OnNonFinite: policy,
				Engine: overlap.Config{Spec: "topk:0.5", ErrorFeedback: true, Decision: overlap.DecideCompressed}})
			train(t, q, loops, params, 0, 2, nil) // a first sync, applied
			errs := onRanks(commsOf(loops), func(r int, _ comm.Comm) error {
				l, ctx := loops[r], context.Background()
				sgd(params[r], q.grad(r, 2, params[r]), innerLR)
				if _, err := l.Step(ctx); err != nil {
					return err
				}
				sgd(params[r], q.grad(r, 3, params[r]), innerLR)
				saved := params[r][1][4]
				if r == 1 {
					params[r][1][4] = float32(math.NaN())
				}
				local, global, momentum := clone(params[r]), clone(l.Global()), clone(l.momentum)
				rep, err := l.Step(ctx)
				var nf *NonFiniteSyncError
				switch {
				case len(rep.Finished) != 1 || rep.Finished[0].Skipped == nil:
					return fmt.Errorf("step 4: finished %+v, want the sync skipped", rep.Finished)
				case policy == SkipNonFinite && err != nil:
					return fmt.Errorf("step 4: %v, want the sync skipped without an error", err)
				case policy == FailNonFinite && (!errors.As(err, &nf) || nf != rep.Finished[0].Skipped):
					return fmt.Errorf("step 4: %v, want the Report's *NonFiniteSyncError", err)
				}
				skip := rep.Finished[0].Skipped
				if skip.Fragment != 0 || skip.Started != 4 || len(skip.Err.Buckets) != 1 || !strings.Contains(skip.Error(), "rank 1") {
					return fmt.Errorf("step 4: skipped %v, want fragment 0's sync of step 4, naming rank 1", skip)
				}
				if ti, i := identical(l.Global(), global); ti >= 0 {
					return fmt.Errorf("global tensor %d[%d] changed", ti, i)
				}
				if ti, i := identical(l.momentum, momentum); ti >= 0 {
					return fmt.Errorf("momentum tensor %d[%d] changed", ti, i)
				}
				for ti := range local { // NaN ≠ NaN: compare bits
					for i := range local[ti] {
						if math.Float32bits(params[r][ti][i]) != math.Float32bits(local[ti][i]) {
							return fmt.Errorf("local tensor %d[%d] changed", ti, i)
						}
					}
				}
				params[r][1][4] = saved
				for k := 4; k < 6; k++ {
					sgd(params[r], q.grad(r, k, params[r]), innerLR)
					rep, err := l.Step(ctx)
					if err != nil {
						return fmt.Errorf("step %d after the skip: %v", k+1, err)
					}
					if k == 5 && (len(rep.Finished) != 1 || rep.Finished[0].Skipped != nil) {
						return fmt.Errorf("step 6: finished %+v, want the sync applied", rep.Finished)
					}
				}
				return nil
			})
			mustNoErrors(t, "ranks", errs)
		})
	}
}
