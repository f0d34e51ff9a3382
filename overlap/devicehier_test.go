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
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/fakegpu"
)

// mustDevHierRig is a device rig of 2 nodes × 2 ranks: host comms and
// fake DeviceComms over node groups (the fake's Split splits by node).
func mustDevHierRig(t *testing.T, sizes []int, cfg Config) *devRig {
	t.Helper()
	cfgs := []Config{cfg, cfg, cfg, cfg}
	g, errs := newDevRigOn(t, nodeGroup(t, 2, 2), nodeGroup(t, 2, 2), sizes, cfgs, 5*time.Second)
	mustNoErrors(t, "NewDevice", errs)
	return g
}

// TestDeviceHier: the device's sharded StrategyHier (node stages on their
// stream, a DeviceEngine across nodes) gives, on 2 nodes × 2 ranks with
// buckets whose lengths do and do not divide by the node size, every rank
// exactly Engine's StrategyHier result, step after step (error feedback
// carrying over, the warm-up's dense step first), and a state Engine's
// hierarchical engine loads, after which both continue alike.
func TestDeviceHier(t *testing.T) {
	for _, spec := range []string{"none", "int8", "int4:round=nearest", "fp16", "sign:bucket=64"} {
		t.Run(spec, func(t *testing.T) {
			cfg := Config{Spec: spec, Strategy: StrategyHier, ErrorFeedback: spec != "none", Decision: DecideCompressed, Warmup: 1}
			g := mustDevHierRig(t, hierSizes, cfg)
			cpu := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, cfg)
			for r, e := range g.engines {
				if e.Strategy() != StrategyHier || e.hier == nil {
					t.Fatalf("rank %d: strategy %v, want the sharded hier", r, e.Strategy())
				}
			}
			check := func(step int) {
				t.Helper()
				grads := stepGrads(4, step, hierSizes)
				want := clone3(grads)
				out, stats, errs := g.step(grads, func(r int) []int { return reversedOnOdd(len(hierSizes))(r) })
				mustNoErrors(t, fmt.Sprintf("device step %d", step), errs)
				_, errs = runStep(cpu, want, inOrder(len(hierSizes)))
				mustNoErrors(t, fmt.Sprintf("CPU step %d", step), errs)
				for r := range 4 {
					for i := range hierSizes {
						if j := sameBits(out[r][i], want[r][i]); j >= 0 {
							t.Fatalf("step %d rank %d bucket %d element %d: %v, Engine's hier gives %v", step, r, i, j, out[r][i][j], want[r][i][j])
						}
						b := stats[r].Buckets[i]
						origin := OriginPinned // the engine across nodes' decision
						switch {
						case spec == "none":
							origin = OriginCodec
						case step == 0:
							origin = OriginWarmup
						}
						if b.Strategy != StrategyHier || !strings.Contains(b.Reason, "hierarchical (2 nodes × 2 ranks") || b.BytesInNode <= 0 || b.BytesSent <= b.BytesInNode || b.Origin != origin {
							t.Errorf("step %d rank %d bucket %d: %+v", step, r, i, b)
						}
					}
				}
			}
			for step := range 3 {
				check(step)
			}
			// The device's state loads into Engine's hierarchical engines,
			// and both go on alike.
			for r, e := range g.engines {
				var b bytes.Buffer
				if err := e.Save(&b); err != nil {
					t.Fatal(err)
				}
				if err := cpu[r].Load(&b); err != nil {
					t.Fatalf("rank %d: Engine's Load of the device's state: %v", r, err)
				}
			}
			check(3)
		})
	}
}

// TestDeviceHierRefusals: top-k's hierarchical exchange (two-level
// collectives) is not on the device, and a DeviceComm that cannot split
// is refused on every rank, both by name.
func TestDeviceHierRefusals(t *testing.T) {
	cfgs := []Config{{Spec: "topk:0.1", Strategy: StrategyHier}, {Spec: "topk:0.1", Strategy: StrategyHier},
		{Spec: "topk:0.1", Strategy: StrategyHier}, {Spec: "topk:0.1", Strategy: StrategyHier}}
	_, errs := newDevRigOn(t, nodeGroup(t, 2, 2), nodeGroup(t, 2, 2), []int{64}, cfgs, time.Second)
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "two-level collectives") {
			t.Errorf("rank %d: %v, want the two-level refusal", r, err)
		}
	}
	for i := range cfgs {
		cfgs[i].Spec = "int8"
	}
	host, wire := nodeGroup(t, 2, 2), group(t, 4)
	plat := fakegpu.New(4)
	defer plat.Close()
	errs = onRanks(host, func(r int, c comm.Comm) error {
		dc := unsplittable{fakegpu.NewComm(wire[r], plat.Device(r), time.Second)}
		e, err := NewDevice(context.Background(), plat.Device(r), dc, c, []int{64}, cfgs[r])
		if err == nil {
			e.Close()
		}
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "comm.DeviceSplitter") {
			t.Errorf("rank %d: %v, want the DeviceSplitter refusal", r, err)
		}
	}
}

// unsplittable hides its DeviceComm's Split.
type unsplittable struct{ comm.DeviceComm }

// TestDeviceHierNonFinite: a NaN in one rank's bucket reaches every rank
// as the flat device engine's rule has it (the bucket NaN on every rank,
// reported in every rank's statistics; with FailOnNonFinite every rank's
// Wait returns the *NonFiniteStepError), through the node stage's check,
// while the other buckets are exchanged as usual.
func TestDeviceHierNonFinite(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOnNonFinite=%v", fail), func(t *testing.T) {
			cfg := Config{Spec: "int8", Strategy: StrategyHier, ErrorFeedback: true, Decision: DecideCompressed, FailOnNonFinite: fail}
			g := mustDevHierRig(t, hierSizes, cfg)
			grads := stepGrads(4, 0, hierSizes)
			grads[3][1][500] = float32(math.NaN()) // rank 3: node 1, local rank 1
			out, stats, errs := g.step(grads, inOrder(len(hierSizes)))
			for r := range 4 {
				var nf *NonFiniteStepError
				if fail != errors.As(errs[r], &nf) || !fail && errs[r] != nil {
					t.Fatalf("rank %d: %v (FailOnNonFinite %v)", r, errs[r], fail)
				}
				if fail {
					continue
				}
				for i := range hierSizes {
					nan := 0
					for _, v := range out[r][i] {
						if math.IsNaN(float64(v)) {
							nan++
						}
					}
					if want := map[bool]int{true: hierSizes[i], false: 0}[i == 1]; nan != want || stats[r].Buckets[i].NonFinite != (i == 1) {
						t.Errorf("rank %d bucket %d: %d NaN of %d, NonFinite %v", r, i, nan, hierSizes[i], stats[r].Buckets[i].NonFinite)
					}
				}
			}
			// The engine stays usable.
			_, _, errs = g.step(stepGrads(4, 1, hierSizes), inOrder(len(hierSizes)))
			mustNoErrors(t, "next step", errs)
		})
	}
}

// deviceHosting is a host comm whose groups carry device collectives
// (comm.DeviceHost), as comm/hosted's do: its Split's comms are too.
type deviceHosting struct {
	comm.Comm
	dev *fakegpu.Device
}

func (d deviceHosting) Device() comm.DeviceComm {
	return fakegpu.NewComm(d.Comm, d.dev, 5*time.Second)
}
func (d deviceHosting) Topology() comm.Topology { return d.Comm.(comm.Topologist).Topology() }
func (d deviceHosting) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	node, cross, err = d.Comm.(comm.Splitter).Split(ctx)
	if err != nil {
		return nil, nil, err
	}
	return deviceHosting{node, d.dev}, deviceHosting{cross, d.dev}, nil
}

// TestDeviceHierHostedGroups: over a DeviceComm that does not split, the
// host comm's groups' device faces (comm.DeviceHost) carry the node
// stages and the engine across nodes, with Engine's results.
func TestDeviceHierHostedGroups(t *testing.T) {
	cfg := Config{Spec: "int8", Strategy: StrategyHier, ErrorFeedback: true, Decision: DecideCompressed}
	host, wire := nodeGroup(t, 2, 2), nodeGroup(t, 2, 2)
	hosts := make([]comm.Comm, 4)
	g := &devRig{sizes: hierSizes, devs: make([]*fakegpu.Device, 4), dcs: make([]*loggedComm, 4),
		engines: make([]*DeviceEngine, 4), caller: make([]gpu.Stream, 4), grads: make([][]gpu.Ptr, 4)}
	plat := fakegpu.New(4)
	t.Cleanup(plat.Close)
	for r := range 4 {
		g.devs[r] = plat.Device(r)
		hosts[r] = deviceHosting{host[r], g.devs[r]}
		g.caller[r], _ = g.devs[r].NewStream()
		for _, n := range hierSizes {
			p, _ := g.devs[r].Alloc(4 * n)
			g.grads[r] = append(g.grads[r], p)
		}
	}
	mustNoErrors(t, "NewDevice", onRanks(hosts, func(r int, c comm.Comm) error {
		var err error
		dc := unsplittable{fakegpu.NewComm(wire[r], g.devs[r], 5*time.Second)}
		g.engines[r], err = NewDevice(context.Background(), g.devs[r], dc, c, hierSizes, cfg)
		return err
	}))
	t.Cleanup(func() {
		for _, e := range g.engines {
			e.Close()
		}
	})
	cpu := newEnginesOn(t, nodeGroup(t, 2, 2), hierSizes, cfg)
	for step := range 2 {
		grads := stepGrads(4, step, hierSizes)
		want := clone3(grads)
		out, _, errs := g.step(grads, inOrder(len(hierSizes)))
		mustNoErrors(t, "device step", errs)
		_, errs = runStep(cpu, want, inOrder(len(hierSizes)))
		mustNoErrors(t, "CPU step", errs)
		for r := range 4 {
			for i := range hierSizes {
				if j := sameBits(out[r][i], want[r][i]); j >= 0 {
					t.Fatalf("step %d rank %d bucket %d element %d: %v, Engine's hier gives %v", step, r, i, j, out[r][i][j], want[r][i][j])
				}
			}
		}
	}
}
