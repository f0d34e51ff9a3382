package overlap

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// TestDeviceLowRank: the device engine's low-rank strategy gives, every
// step, bit for bit the host Engine's average on every rank (2 and 3
// ranks; warm start and cold; with error feedback and without; with
// momentum correction and masking (which low-rank leaves alone); buckets made ready in different orders), the
// statistics' accounting (the two all-reduces' bytes), and a state that
// a host Engine and a new device engine continue bit for bit.
func TestDeviceLowRank(t *testing.T) {
	for _, tc := range []struct {
		spec     string
		ranks    int
		ef       bool
		momentum float64
	}{
		{"powersgd:2", 2, true, 0}, {"powersgd:2", 3, true, 0}, {"powersgd:3:warm=off:seed=5", 3, true, 0},
		{"powersgd:1", 2, false, 0}, {"powersgd:4:min_compression=1", 3, false, 0}, {"powersgd:2", 2, true, 0.9},
	} {
		t.Run(fmt.Sprintf("%s/%d/ef=%v/momentum=%v", tc.spec, tc.ranks, tc.ef, tc.momentum), func(t *testing.T) {
			cfg := lowRankConfig(tc.spec)
			cfg.ErrorFeedback, cfg.Momentum, cfg.MomentumMasking = tc.ef, tc.momentum, tc.momentum != 0
			g := mustDevRig(t, tc.ranks, lowRankSizes, cfg)
			if s := g.engines[0].Strategy(); s != StrategyLowRank {
				t.Fatalf("strategy %v, want low-rank", s)
			}
			cpu := cpuTwins(t, g.engines[0], tc.ranks, lowRankSizes)
			order := func(r int) []int { return [][]int{{0, 1}, {1, 0}, {1, 0}}[r] }
			for num := range 3 {
				stats := g.stepBoth(t, cpu, stepGrads(tc.ranks, num, lowRankSizes), order, fmt.Sprintf("step %d", num))
				for r := range tc.ranks {
					for i := range lowRankSizes {
						bs := stats[r].Buckets[i]
						l := planLowRank(lowRankShapes[i], *g.engines[0].lowRank)
						bytes := allReduceVolume(tc.ranks, 4*(tc.ranks+l.PLen+l.FlatLen)) + allReduceVolume(tc.ranks, 4*l.QLen)
						if !bs.Compressed || bs.NonFinite || bs.Strategy != StrategyLowRank || bs.BytesSent != bytes {
							t.Errorf("step %d rank %d bucket %d stats %+v, want compressed, low-rank, %d bytes", num, r, i, bs, bytes)
						}
					}
				}
			}
			// The device state continues on the host and on a new device
			// engine, bit for bit.
			fresh := mustDevRig(t, tc.ranks, lowRankSizes, cfg)
			for r, e := range g.engines {
				var buf bytes.Buffer
				if err := e.Save(&buf); err != nil {
					t.Fatal(err)
				}
				if err := cpu[r].Load(bytes.NewReader(buf.Bytes())); err != nil {
					t.Fatalf("rank %d: the host Engine loads the device state: %v", r, err)
				}
				if err := fresh.engines[r].Load(&buf); err != nil {
					t.Fatalf("rank %d: a new device engine loads the device state: %v", r, err)
				}
			}
			fresh.stepBoth(t, cpu, stepGrads(tc.ranks, 3, lowRankSizes), order, "after Load")
		})
	}
}

// TestDeviceLowRankNonFinite: a NaN in one rank's gradient makes that
// bucket's average NaN on every rank (the device keeps no copy of g to
// send dense), reported with the rank, its memories (residual and warm
// Q) untouched; the other bucket is exchanged; with FailOnNonFinite the
// step is a *NonFiniteStepError and nothing changes. The steps after go
// on as the host Engine's, which skipped the same memories' update.
func TestDeviceLowRankNonFinite(t *testing.T) {
	const ranks = 3
	for _, fail := range []bool{false, true} {
		cfg := lowRankConfig("powersgd:2")
		cfg.FailOnNonFinite = fail
		g := mustDevRig(t, ranks, lowRankSizes, cfg)
		twins := func() []*Engine { return cpuTwins(t, g.engines[0], ranks, lowRankSizes) }
		if _, _, errs := g.step(stepGrads(ranks, 0, lowRankSizes), inOrder(2)); errs[0] != nil {
			t.Fatal(errs)
		}
		before := saveResiduals(t, g, twins())
		grads := stepGrads(ranks, 1, lowRankSizes)
		grads[1][0][7] = float32(math.Inf(-1))
		out, stats, errs := g.step(grads, inOrder(2))
		after := saveResiduals(t, g, twins())
		for r := range ranks {
			var nf *NonFiniteStepError
			switch {
			case fail && (!errors.As(errs[r], &nf) || len(nf.Buckets) != 1 || nf.Buckets[0] != 0):
				t.Fatalf("FailOnNonFinite, rank %d: %v, want a *NonFiniteStepError for bucket 0", r, errs[r])
			case !fail && errs[r] != nil:
				t.Fatalf("rank %d: %v", r, errs[r])
			}
			for j, v := range out[r][0] {
				if !math.IsNaN(float64(v)) {
					t.Fatalf("rank %d bucket 0 element %d: %v, want NaN", r, j, v)
				}
			}
			b := stats[r].Buckets[0]
			if !b.NonFinite || !strings.Contains(b.Reason, "rank 1") {
				t.Errorf("rank %d bucket 0: NonFinite %v, Reason %q, want rank 1 named", r, b.NonFinite, b.Reason)
			}
			for i := range lowRankSizes {
				changed := sameBits(before[r][i], after[r][i]) >= 0 || len(before[r][i]) != len(after[r][i])
				if changed != (i == 1 && !fail) {
					t.Errorf("FailOnNonFinite %v, rank %d bucket %d: memory changed %v", fail, r, i, changed)
				}
			}
		}
		// Continue from the memories the device holds now, on the host too.
		cpu := twins()
		saveResiduals(t, g, cpu)
		g.stepBoth(t, cpu, stepGrads(ranks, 2, lowRankSizes), inOrder(2), "the step after the Inf")
	}
}

// TestDeviceLowRankAuto: DecideAuto on the device times low-rank's
// kernels on each bucket's layout and decides every bucket the same on
// every rank.
func TestDeviceLowRankAuto(t *testing.T) {
	const ranks = 2
	cfg := lowRankConfig("powersgd:2")
	cfg.Decision = DecideAuto
	g := mustDevRig(t, ranks, lowRankSizes, cfg)
	out, stats, errs := g.step(stepGrads(ranks, 0, lowRankSizes), inOrder(2))
	for r := range ranks {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		for i := range lowRankSizes {
			a, b := stats[r].Buckets[i], stats[0].Buckets[i]
			if a.Compressed != b.Compressed || a.Reason == "" {
				t.Errorf("rank %d bucket %d: compressed %v (%q), rank 0 %v", r, i, a.Compressed, a.Reason, b.Compressed)
			}
			if j := sameBits(out[r][i], out[0][i]); j >= 0 {
				t.Errorf("rank %d bucket %d differs from rank 0 at %d", r, i, j)
			}
		}
	}
}

// TestDeviceLowRankOrder: each bucket's second all-reduce (the Q's) goes
// on the wire after the next bucket's first (its P's), the last one's at
// the step's end, on every rank: bucket i's orthogonalization runs while
// bucket i+1's P's cross, as on Engine.
func TestDeviceLowRankOrder(t *testing.T) {
	const ranks = 2
	g := mustDevRig(t, ranks, lowRankSizes, lowRankConfig("powersgd:2"))
	var first, second []int
	for i := range lowRankSizes {
		l := planLowRank(lowRankShapes[i], *g.engines[0].lowRank)
		first, second = append(first, ranks+l.PLen+l.FlatLen), append(second, l.QLen)
	}
	want := []int{first[0], first[1], second[0], second[1]}
	for r := range ranks {
		g.dcs[r].mu.Lock()
		g.dcs[r].reduced = nil
		g.dcs[r].mu.Unlock()
	}
	if _, _, errs := g.step(stepGrads(ranks, 0, lowRankSizes), func(r int) []int { return [][]int{{0, 1}, {1, 0}}[r] }); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	for r := range ranks {
		if got := g.dcs[r].reduced; !slices.Equal(got, want) {
			t.Errorf("rank %d: all-reduces of %v elements, want %v (P₀, P₁, Q₀, Q₁)", r, got, want)
		}
	}
}
