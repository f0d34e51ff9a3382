package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
)

// nodeGroup returns the ranks of nodes × local in-process ranks, rank r on
// node r/local.
func nodeGroup(t testing.TB, nodes, local int) []comm.Comm {
	t.Helper()
	nodeOf := make([]int, nodes*local)
	for r := range nodeOf {
		nodeOf[r] = r / local
	}
	comms, err := inproc.NewNodeGroup(nodeOf)
	if err != nil {
		t.Fatal(err)
	}
	return comms
}

// exactAverage is the float64 average over ranks of grads[.][b].
func exactAverage(grads [][][]float32, b int) []float64 {
	avg := make([]float64, len(grads[0][b]))
	for r := range grads {
		for i, v := range grads[r][b] {
			avg[i] += float64(v)
		}
	}
	for i := range avg {
		avg[i] /= float64(len(grads))
	}
	return avg
}

// hierSizes have lengths that divide by 2 and 4 and ones that do not.
var hierSizes = []int{4096, 1001, 7, 1}

// TestHierDense: with codec none, hierarchical dense gives every rank the
// same average, equal to the exact one within float32 rounding, at 2×2,
// 2×4, 4×1 and 1×3 (one node), buckets whose lengths do not divide by the
// node size included.
func TestHierDense(t *testing.T) {
	for _, l := range [][2]int{{2, 2}, {2, 4}, {4, 1}, {1, 3}} {
		t.Run(fmt.Sprintf("%dx%d", l[0], l[1]), func(t *testing.T) {
			engines := newEnginesOn(t, nodeGroup(t, l[0], l[1]), hierSizes, Config{Spec: "none", Strategy: StrategyHier})
			for step := range 2 {
				grads := stepGrads(len(engines), step, hierSizes)
				want := clone3(grads)
				_, errs := runStep(engines, grads, reversedOnOdd(len(hierSizes)))
				mustNoErrors(t, "step", errs)
				for b := range hierSizes {
					avg := exactAverage(want, b)
					for r := range engines {
						if i := sameFloats(grads[r][b], grads[0][b]); i >= 0 {
							t.Fatalf("step %d bucket %d: rank %d differs from rank 0 at %d", step, b, r, i)
						}
					}
					for i, v := range grads[0][b] {
						if d := math.Abs(float64(v) - avg[i]); d > 1e-5*(1+math.Abs(avg[i])) {
							t.Fatalf("step %d bucket %d element %d: %v, exact average %v", step, b, i, v, avg[i])
						}
					}
				}
			}
		})
	}
}

// TestHierCompressed: each codec's hierarchical exchange gives every rank
// the same result, the average within the codec's error, and error
// feedback carries what a step held back: the sum of the results over
// steps approaches the sum of the averages.
func TestHierCompressed(t *testing.T) {
	for _, spec := range []string{"int8", "int4", "topk:0.1", "randomk:0.25", "fp16", "sign"} {
		t.Run(spec, func(t *testing.T) {
			engines := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, Config{Spec: spec, Strategy: StrategyHier, ErrorFeedback: true, Decision: DecideCompressed})
			const steps = 24
			got := make([][]float64, len(hierSizes))
			sum := make([][]float64, len(hierSizes))
			for b, n := range hierSizes {
				got[b], sum[b] = make([]float64, n), make([]float64, n)
			}
			for step := range steps {
				grads := stepGrads(len(engines), 0, hierSizes) // the same gradient every step
				want := clone3(grads)
				stats, errs := runStep(engines, grads, inOrder(len(hierSizes)))
				mustNoErrors(t, "step", errs)
				for b := range hierSizes {
					if bs := stats[0].Buckets[b]; !bs.Compressed || bs.Strategy != StrategyHier || bs.Origin != OriginPinned {
						t.Fatalf("step %d bucket %d: %+v, want compressed by hier", step, b, stats[0].Buckets[b])
					}
					for r := range engines {
						if i := sameFloats(grads[r][b], grads[0][b]); i >= 0 {
							t.Fatalf("step %d bucket %d: rank %d differs from rank 0 at element %d", step, b, r, i)
						}
					}
					for i, v := range exactAverage(want, b) {
						got[b][i] += float64(grads[0][b][i])
						sum[b][i] += v
					}
				}
			}
			// Error feedback: Σ results = Σ averages − what the memories
			// hold, a bounded amount, so the mean over steps converges.
			// Not for sign, whose second stage has no memory (memories).
			for b := range hierSizes {
				if spec == "sign" {
					break
				}
				var num, den float64
				for i := range sum[b] {
					num += (got[b][i] - sum[b][i]) * (got[b][i] - sum[b][i])
					den += sum[b][i] * sum[b][i]
				}
				if rel := math.Sqrt(num / den); rel > 0.35 {
					t.Errorf("bucket %d: after %d steps the results' sum is %.3g off the averages' (relative)", b, steps, rel)
				}
			}
		})
	}
}

// TestHierBytes: the bytes of each shape of StrategyHier on K nodes of L
// ranks (docs/DESIGN.md, "Hierarchical exchange"). Sharded (none, int8,
// int4): across nodes (BytesSent − BytesInNode) what a flat engine of the
// same codec sends on K ranks for shards of ⌈n/L⌉ elements, in the node
// 2(L−1)·4⌈n/L⌉. Two-level (top-k, random-k): the flat strategy's slot of
// s bytes crosses to the K−1 other nodes, and the node all-gathers the K
// slots, (L−1)·K·s; random-k's all-reduce of N statuses and k values
// reduce-scatters and all-gathers chunks of ⌈v/L⌉ in the node and
// all-reduces them across nodes.
func TestHierBytes(t *testing.T) {
	for _, l := range [][2]int{{2, 2}, {2, 4}} {
		for _, spec := range []string{"none", "int8", "int4", "topk:0.01", "randomk:0.25"} {
			t.Run(fmt.Sprintf("%dx%d/%s", l[0], l[1], spec), func(t *testing.T) {
				k, local := l[0], l[1]
				n := k * local
				sizes := []int{1 << 16, 1001}
				cfg := Config{Spec: spec, ErrorFeedback: spec != "none", Decision: DecideCompressed}
				shards := []int{shardLen(sizes[0], local), shardLen(sizes[1], local)}
				want := make([][2]int64, len(sizes)) // across, in the node
				switch spec {
				case "topk:0.01":
					flat := newEngines(t, n, sizes, cfg)
					fstats, errs := runStep(flat, stepGrads(n, 0, sizes), inOrder(2))
					mustNoErrors(t, "flat step", errs)
					for b, s := range fstats[0].Buckets {
						slot := s.BytesSent / int64(n-1)
						want[b] = [2]int64{int64(k-1) * slot, int64((local-1)*k) * slot}
					}
				case "randomk:0.25":
					for b, size := range sizes {
						v := twoLevelReduceVolume(k, local, n+int(math.Round(0.25*float64(size))))
						want[b] = [2]int64{v[0] - v[1], v[1]}
					}
				default:
					flat := newEngines(t, k, shards, cfg)
					fstats, errs := runStep(flat, stepGrads(k, 0, shards), inOrder(2))
					mustNoErrors(t, "flat step", errs)
					for b, s := range fstats[0].Buckets {
						want[b] = [2]int64{s.BytesSent, int64(2 * (local - 1) * 4 * shards[b])}
					}
				}
				cfg.Strategy = StrategyHier
				hier := newEnginesOn(t, nodeGroup(t, k, local), sizes, cfg)
				hstats, errs := runStep(hier, stepGrads(n, 0, sizes), inOrder(2))
				mustNoErrors(t, "hier step", errs)
				for r := range hier {
					for b, s := range hstats[r].Buckets {
						if got := [2]int64{s.BytesSent - s.BytesInNode, s.BytesInNode}; got != want[b] {
							t.Errorf("rank %d bucket %d: %d bytes across nodes and %d in the node, want %d and %d", r, b, got[0], got[1], want[b][0], want[b][1])
						}
					}
				}
			})
		}
	}
}

// liar is a rank that reports another topology than its comm's.
type liar struct {
	comm.Comm
	topo comm.Topology
}

func (l liar) Topology() comm.Topology { return l.topo }
func (l liar) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	return l.Comm.(comm.Splitter).Split(ctx)
}

// bare hides its comm's topology.
type bare struct{ comm.Comm }

// TestHierBadTopology: ranks that disagree on the topology, nodes of
// unequal sizes, or a comm that cannot tell its nodes: every rank's New
// fails at once with the same clear error.
func TestHierBadTopology(t *testing.T) {
	cases := []struct {
		name string
		wrap func(r int, c comm.Comm) comm.Comm
		want string
	}{
		{"two ranks claim one place", func(r int, c comm.Comm) comm.Comm {
			if r == 1 {
				return liar{c, comm.Topology{Node: 0, Nodes: 2, LocalRank: 0, LocalSize: 2}}
			}
			return c
		}, "ranks 0 and 1 both say node 0, local rank 0"},
		{"another rank on a taken place", func(r int, c comm.Comm) comm.Comm {
			if r == 1 {
				return liar{c, comm.Topology{Node: 1, Nodes: 2, LocalRank: 0, LocalSize: 2}}
			}
			return c
		}, "ranks 1 and 2 both say node 1, local rank 0"},
		{"layout", func(r int, c comm.Comm) comm.Comm {
			if r == 3 {
				return liar{c, comm.Topology{Node: 3, Nodes: 4, LocalRank: 0, LocalSize: 1}}
			}
			return c
		}, "ranks disagree on layout: rank 3 has 4 nodes × 1 ranks, rank 0 has 2 nodes × 2 ranks"},
		{"no topology", func(r int, c comm.Comm) comm.Comm {
			if r == 2 {
				return bare{c}
			}
			return c
		}, "rank 2 has an invalid configuration: strategy hier needs a comm that knows its nodes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := nodeGroup(t, 2, 2)
			errs := onRanks(comms, func(r int, c comm.Comm) error {
				e, err := New(context.Background(), tc.wrap(r, c), []int{64}, Config{Spec: "int8", Strategy: StrategyHier, Timeout: 10e9})
				if err == nil {
					e.Close()
				}
				return err
			})
			for r, err := range errs {
				if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
					t.Errorf("rank %d: %v, want an error containing %q", r, err, tc.want)
				}
			}
		})
	}
}

// TestHierState: a sharded hierarchical engine's state restores
// bit-exactly into a new engine of the same layout, loads after a change of
// the number of nodes into the ranks of the same local rank, and is
// refused by one of another node size or local rank, or of a flat
// strategy, naming the setting.
func TestHierState(t *testing.T) {
	sizes := []int{300, 33}
	cfg := Config{Spec: "int4", Strategy: StrategyHier, ErrorFeedback: true, Decision: DecideCompressed, Momentum: 0.9}
	a := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, cfg)
	for step := range 3 {
		_, errs := runStep(a, stepGrads(4, step, sizes), inOrder(2))
		mustNoErrors(t, "step", errs)
	}
	states := make([][]byte, len(a))
	for r, e := range a {
		var buf bytes.Buffer
		if err := e.Save(&buf); err != nil {
			t.Fatalf("rank %d: Save: %v", r, err)
		}
		states[r] = buf.Bytes()
		if err := CheckState(states[r], cfg, sizes, 4, comm.Topology{}); err != nil {
			t.Fatalf("rank %d: CheckState: %v", r, err)
		}
	}
	b := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, cfg)
	for r, e := range b {
		if err := e.Load(bytes.NewReader(states[r])); err != nil {
			t.Fatalf("rank %d: Load: %v", r, err)
		}
	}
	ga, gb := stepGrads(4, 3, sizes), stepGrads(4, 3, sizes)
	_, errs := runStep(a, ga, inOrder(2))
	mustNoErrors(t, "step a", errs)
	_, errs = runStep(b, gb, inOrder(2))
	mustNoErrors(t, "step b", errs)
	for r := range ga {
		for i := range sizes {
			if j := sameFloats(gb[r][i], ga[r][i]); j >= 0 {
				t.Fatalf("rank %d bucket %d: the restored engine differs at element %d", r, i, j)
			}
		}
	}

	var se *StateError
	// 3 nodes of 2: each rank takes the state of the rank with its local
	// rank (the same shard), whatever its node.
	more := newEnginesOn(t, nodeGroup(t, 3, 2), sizes, cfg)
	for r, e := range more {
		if err := e.Load(bytes.NewReader(states[r%2])); err != nil {
			t.Fatalf("3×2 rank %d loading 2×2 rank %d's state: %v", r, r%2, err)
		}
	}
	_, errs = runStep(more, stepGrads(6, 4, sizes), inOrder(2))
	mustNoErrors(t, "a step after the change of layout", errs)

	if err := CheckState(states[1], cfg, sizes, 6, comm.Topology{Node: 2, Nodes: 3, LocalRank: 1, LocalSize: 2}); err != nil {
		t.Errorf("CheckState of 2×2 rank 1's state for 3×2 rank 5: %v", err)
	}
	if err := CheckState(states[1], cfg, sizes, 4, comm.Topology{Node: 0, Nodes: 1, LocalRank: 1, LocalSize: 4}); !errors.As(err, &se) || se.Setting != "layout" {
		t.Errorf("CheckState of a 2×2 state for 1×4: %v, want a *StateError on the layout", err)
	}

	other := newEnginesOn(t, nodeGroup(t, 1, 4), sizes, cfg)
	if err := other[0].Load(bytes.NewReader(states[0])); !errors.As(err, &se) || se.Setting != "layout" {
		t.Errorf("1×4 engine loading a 2×2 state: %v, want a *StateError on the layout", err)
	}
	flatCfg := cfg
	flatCfg.Strategy = StrategyAuto
	flat := newEngines(t, 4, sizes, flatCfg)
	if err := flat[0].Load(bytes.NewReader(states[0])); !errors.As(err, &se) || se.Setting != "strategy" {
		t.Errorf("flat engine loading a hier state: %v, want a *StateError on the strategy", err)
	}
	if err := b[1].Load(bytes.NewReader(states[0])); !errors.As(err, &se) || se.Setting != "layout" {
		t.Errorf("rank 1 loading rank 0's state: %v, want a *StateError on the layout (rank 0's place)", err)
	}
	corrupt := append([]byte(nil), states[0]...)
	corrupt[len(corrupt)/2] ^= 1
	if err := b[0].Load(bytes.NewReader(corrupt)); !errors.As(err, &se) {
		t.Errorf("corrupt state: %v, want a *StateError", err)
	}
}

// TestHierNonFinite: with FailOnNonFinite, a NaN in one rank's bucket
// makes every rank's Wait return the same *NonFiniteStepError, and every
// memory stays as it was; without it, the NaN shows in the average where
// plain all-reduce puts it, on every rank.
func TestHierNonFinite(t *testing.T) {
	sizes := []int{64, 32}
	cfg := Config{Spec: "int8", Strategy: StrategyHier, ErrorFeedback: true, Decision: DecideCompressed, FailOnNonFinite: true}
	engines := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, cfg)
	_, errs := runStep(engines, stepGrads(4, 0, sizes), inOrder(2))
	mustNoErrors(t, "step 0", errs)
	before := saveAll(t, engines)
	grads := stepGrads(4, 1, sizes)
	grads[3][1][5] = float32(math.NaN()) // rank 3 (node 1, local rank 1), first shard
	_, errs = runStep(engines, grads, inOrder(2))
	for r, err := range errs {
		var nf *NonFiniteStepError
		if !errors.As(err, &nf) || len(nf.Buckets) != 1 || nf.Buckets[0] != 1 {
			t.Fatalf("rank %d: %v, want a *NonFiniteStepError for bucket 1", r, err)
		}
	}
	after := saveAll(t, engines)
	checkSameMemories(t, before, after)

	cfg.FailOnNonFinite = false
	open := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, cfg)
	grads = stepGrads(4, 0, sizes)
	grads[3][1][5] = float32(math.NaN())
	_, errs = runStep(open, grads, inOrder(2))
	mustNoErrors(t, "step with NaN", errs)
	for r := range open {
		for i, v := range grads[r][1] {
			if math.IsNaN(float64(v)) != (i == 5) {
				t.Fatalf("rank %d: element %d of the average is %v; want NaN exactly at 5", r, i, v)
			}
		}
	}
}

func saveAll(t *testing.T, engines []*Engine) [][]byte {
	t.Helper()
	out := make([][]byte, len(engines))
	for r, e := range engines {
		var buf bytes.Buffer
		if err := e.Save(&buf); err != nil {
			t.Fatalf("rank %d: Save: %v", r, err)
		}
		out[r] = buf.Bytes()
	}
	return out
}

// checkSameMemories compares two sets of states byte for byte but for the
// step numbers and checksums (outer and across nodes).
func checkSameMemories(t *testing.T, a, b [][]byte) {
	t.Helper()
	for r := range a {
		ia, _ := InspectState(a[r])
		ib, _ := InspectState(b[r])
		if ib.NextStep != ia.NextStep+1 {
			t.Errorf("rank %d: next step %d after the skipped step, %d before", r, ib.NextStep, ia.NextStep)
		}
		diff := 0
		for i := range a[r] {
			if a[r][i] != b[r][i] {
				diff++
			}
		}
		// Two step numbers (8 bytes each, the low byte changes) and two
		// checksums (4 bytes each) at most.
		if diff > 2*8+2*4 {
			t.Errorf("rank %d: %d bytes of the state changed across a skipped step; the memories must not", r, diff)
		}
	}
}

// TestHierTwoLevelIsFlat: top-k and random-k under StrategyHier exchange
// the flat strategy's payloads over two-level collectives, so every rank
// ends with the flat engine's result (top-k: bit for bit; random-k, whose
// all-reduce adds in node order: within float32 rounding), and its state
// restores.
func TestHierTwoLevelIsFlat(t *testing.T) {
	for spec, tolerance := range map[string]float64{"topk:0.05": 0, "topk:0.05:chunk=64:bits=2": 0, "randomk:0.25": 1e-6} {
		t.Run(spec, func(t *testing.T) {
			cfg := Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed}
			flat := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, cfg)
			cfg.Strategy = StrategyHier
			hier := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, cfg)
			for step := range 3 {
				gf, gh := stepGrads(4, step, hierSizes), stepGrads(4, step, hierSizes)
				_, errs := runStep(flat, gf, inOrder(len(hierSizes)))
				mustNoErrors(t, "flat", errs)
				stats, errs := runStep(hier, gh, reversedOnOdd(len(hierSizes)))
				mustNoErrors(t, "hier", errs)
				for r := range gh {
					for b := range hierSizes {
						for i := range gh[r][b] {
							// Random-k's all-reduce adds in another order: the last bits may differ.
							if d := math.Abs(float64(gh[r][b][i] - gf[r][b][i])); d > tolerance*(1+math.Abs(float64(gf[r][b][i]))) {
								t.Fatalf("step %d rank %d bucket %d element %d: hier %v, flat %v", step, r, b, i, gh[r][b][i], gf[r][b][i])
							}
						}
						if s := stats[r].Buckets[b]; s.Strategy != StrategyHier || !s.Compressed || !strings.Contains(s.Reason, "two-level") {
							t.Fatalf("step %d rank %d bucket %d: %+v", step, r, b, s)
						}
					}
				}
			}
			states := saveAll(t, hier)
			again := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, cfg)
			for r, e := range again {
				if err := e.Load(bytes.NewReader(states[r])); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			if reloaded := saveAll(t, again); !bytes.Equal(reloaded[1], states[1]) {
				t.Error("the restored engine saves another state")
			}
		})
	}
}

// TestHierDeadRank: a rank that stops calling makes every other rank's
// Wait fail with a *StepError (its node's reduce-scatter, or the exchange
// across nodes, times out), the engines are broken afterwards, and Close
// returns; for both shapes.
func TestHierDeadRank(t *testing.T) {
	sizes := []int{300, 200}
	const timeout = 200 * time.Millisecond
	for _, spec := range []string{"int8", "topk:0.05"} {
		t.Run(spec, func(t *testing.T) {
			engines := newEnginesOn(t, nodeGroup(t, 2, 2), sizes, Config{Spec: spec, Strategy: StrategyHier, ErrorFeedback: true, Decision: DecideCompressed, Timeout: timeout})
			_, errs := runStep(engines, stepGrads(4, 0, sizes), inOrder(2))
			mustNoErrors(t, "step 0", errs)
			grads := stepGrads(4, 1, sizes)
			errs = onRanks(make([]comm.Comm, 4), func(r int, _ comm.Comm) error {
				e := engines[r]
				if err := e.Step(); err != nil {
					return err
				}
				if r == 3 {
					return nil // dies: never readies, never waits
				}
				for i := range sizes {
					if err := e.Ready(i, grads[r][i]); err != nil {
						return err
					}
				}
				_, err := e.Wait(context.Background())
				return err
			})
			for r := range 3 {
				var se *StepError
				if !errors.As(errs[r], &se) || se.Step != 1 {
					t.Errorf("rank %d: got %v, want a *StepError in step 1", r, errs[r])
				}
				var be *BrokenError
				if err := engines[r].Step(); !errors.As(err, &be) {
					t.Errorf("rank %d: Step after the failure: %v, want a *BrokenError", r, err)
				}
			}
			done := make(chan struct{})
			go func() {
				for _, e := range engines {
					e.Close()
				}
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not return within 30 s")
			}
		})
	}
}

// TestHierNodeSpec: with Config.NodeSpec the node stages carry bf16 or
// int8 (one quantization per stage, no memory): every rank of every node
// ends with the same values, within the codecs' error of the exact
// average, the node link carries the coded stages' bytes (an all-to-all
// of L part slots, an all-gather of one), and a NaN on one rank reaches
// every rank (FailOnNonFinite: the same *NonFiniteStepError everywhere).
func TestHierNodeSpec(t *testing.T) {
	for _, tc := range []struct {
		spec, node string
		tol        float64 // relative L2 error against the exact average
	}{{"none", "bf16", 1e-2}, {"none", "int8", 6e-2}, {"int8", "int8", 8e-2}, {"none", "fp16", 1e-3}} {
		t.Run(tc.spec+"/"+tc.node, func(t *testing.T) {
			cfg := Config{Spec: tc.spec, Strategy: StrategyHier, NodeSpec: tc.node, ErrorFeedback: tc.spec != "none", Decision: DecideCompressed}
			engines := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, cfg)
			grads := stepGrads(4, 0, hierSizes)
			want := clone3(grads)
			stats, errs := runStep(engines, grads, reversedOnOdd(len(hierSizes)))
			mustNoErrors(t, "step", errs)
			in, _ := nodeCodec(tc.node)
			for b, n := range hierSizes {
				avg := exactAverage(want, b)
				var num, den float64
				for i, v := range grads[0][b] {
					num += (float64(v) - avg[i]) * (float64(v) - avg[i])
					den += avg[i] * avg[i]
				}
				if rel := math.Sqrt(num / den); rel > tc.tol || math.IsNaN(rel) {
					t.Errorf("bucket %d: relative error %.3g, want ≤ %g", b, rel, tc.tol)
				}
				m := shardLen(n, 2)
				rs, ag := nodeParts(in, 0, 2)
				inNode := allToAllVolume(2, 2*rs.slotLen(2*m)) + allGatherVolume(2, ag.slotLen(m))
				for r := range engines {
					if i := sameFloats(grads[r][b], grads[0][b]); i >= 0 {
						t.Fatalf("bucket %d: rank %d differs from rank 0 at element %d", b, r, i)
					}
					if got := stats[r].Buckets[b].BytesInNode; got != inNode {
						t.Errorf("rank %d bucket %d: %d bytes in the node, want %d", r, b, got, inNode)
					}
				}
			}
		})
	}
	t.Run("non-finite", func(t *testing.T) {
		cfg := Config{Spec: "int8", Strategy: StrategyHier, NodeSpec: "int8", ErrorFeedback: true, Decision: DecideCompressed, FailOnNonFinite: true}
		engines := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, cfg)
		grads := stepGrads(4, 0, hierSizes)
		grads[2][0][7] = float32(math.Inf(1))
		_, errs := runStep(engines, grads, inOrder(len(hierSizes)))
		for r, err := range errs {
			var nf *NonFiniteStepError
			if !errors.As(err, &nf) {
				t.Errorf("rank %d: %v, want a *NonFiniteStepError", r, err)
			}
		}
	})
}

// TestHierNodeSpecConfig: a NodeSpec that is not bf16, fp16 or int8, one
// with a flat strategy, one the device would run, and ranks that differ
// are refused on every rank, naming it.
func TestHierNodeSpecConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Spec: "int8", Strategy: StrategyHier, NodeSpec: "topk:0.1"}, "NodeSpec \"topk:0.1\": want bf16, fp16 or int8"},
		{Config{Spec: "int8", Strategy: StrategyHier, NodeSpec: "int9"}, "NodeSpec"},
		{Config{Spec: "int8", Strategy: StrategyQuantSRA, NodeSpec: "bf16"}, "not of strategy sra"},
	} {
		engines := make([]*Engine, 4)
		errs := onRanks(nodeGroup(t, 2, 2), func(r int, c comm.Comm) (err error) {
			engines[r], err = New(context.Background(), c, []int{64}, tc.cfg)
			return err
		})
		for r, err := range errs {
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v rank %d: %v, want a *ConfigError saying %q", tc.cfg, r, err, tc.want)
			}
		}
	}
	errs := onRanks(nodeGroup(t, 2, 2), func(r int, c comm.Comm) error {
		cfg := Config{Spec: "int8", Strategy: StrategyHier, NodeSpec: []string{"bf16", "int8"}[r%2]}
		e, err := New(context.Background(), c, []int{64}, cfg)
		if err == nil {
			e.Close()
		}
		return err
	})
	for r, err := range errs {
		var me *ConfigMismatchError
		if !errors.As(err, &me) || me.Field != "node spec" {
			t.Errorf("rank %d: %v, want a *ConfigMismatchError on node spec", r, err)
		}
	}
}

// swapped is a rank whose Split hands back its groups the other way round,
// as a host that maps the group ids to the wrong groups would.
type swapped struct{ comm.Comm }

func (s swapped) Topology() comm.Topology { return s.Comm.(comm.Topologist).Topology() }
func (s swapped) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	node, cross, err = s.Comm.(comm.Splitter).Split(ctx)
	return cross, node, err
}

// TestHierWrongGroups: groups that are not the ones the layout says
// (here every rank's node and cross-node groups swapped, which on 2 × 2
// still make collectives that complete) fail every rank's New with a
// *TopologyError naming the ranks found and the ranks the layout wants,
// for both shapes; nothing hangs.
func TestHierWrongGroups(t *testing.T) {
	for _, spec := range []string{"int8", "topk:0.1"} {
		comms := nodeGroup(t, 2, 2)
		errs := onRanks(comms, func(r int, c comm.Comm) error {
			e, err := New(context.Background(), swapped{c}, []int{64}, Config{Spec: spec, Strategy: StrategyHier, Timeout: 10e9})
			if err == nil {
				e.Close()
			}
			return err
		})
		for r, err := range errs {
			var te *TopologyError
			if !errors.As(err, &te) || !strings.Contains(err.Error(), "node group holds ranks") {
				t.Errorf("%s rank %d: %v, want a *TopologyError on the node group", spec, r, err)
			}
		}
	}
}
