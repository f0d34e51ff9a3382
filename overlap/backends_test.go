package overlap

import (
	"bytes"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// backends are the engine's two backends, as the tests that run one
// reference on both name them: the host Engine on an in-process group,
// and the DeviceEngine on fake devices (devRig).
var backends = []string{"host", "device"}

// backendRig is one engine per rank on one backend, driven alike.
type backendRig struct {
	sizes []int
	host  []*Engine // backend "host"
	dev   *devRig   // backend "device"
}

// newBackendRig builds ranks engines of cfg on backend, failing the test
// on any error.
func newBackendRig(t *testing.T, backend string, ranks int, sizes []int, cfg Config) *backendRig {
	t.Helper()
	if backend == "host" {
		return &backendRig{sizes: sizes, host: newEngines(t, ranks, sizes, cfg)}
	}
	return &backendRig{sizes: sizes, dev: mustDevRig(t, ranks, sizes, cfg)}
}

// core returns rank r's engine core.
func (g *backendRig) core(r int) *core {
	if g.host != nil {
		return g.host[r].core
	}
	return g.dev.engines[r].core
}

// refStrategy is the strategy whose reference (strategies_test.go) gives
// the rig's results: its own, but shared-index for random-k on the device
// (its gather under the shared key).
func (g *backendRig) refStrategy() Strategy {
	c := g.core(0)
	if g.dev != nil && c.comp != nil && c.comp.Codec() == compress.CodecRandomK {
		return StrategySharedIndex
	}
	return c.Strategy()
}

// step runs one step of every rank on grads (buckets ready in order) and
// returns each rank's averages and rank 0's statistics; an error fails the
// test.
func (g *backendRig) step(t *testing.T, grads [][][]float32) ([][][]float32, StepStats) {
	t.Helper()
	out, stats := g.steps(t, grads)
	return out, stats[0]
}

// steps is step with every rank's statistics.
func (g *backendRig) steps(t *testing.T, grads [][][]float32) ([][][]float32, []StepStats) {
	t.Helper()
	out, stats, errs := g.try(grads)
	mustNoErrors(t, "step", errs)
	return out, stats
}

// try runs one step of every rank on grads (buckets ready in order) and
// returns each rank's averages, statistics and error.
func (g *backendRig) try(grads [][][]float32) ([][][]float32, []StepStats, []error) {
	if g.host != nil {
		out := clone3(grads)
		stats, errs := runStep(g.host, out, inOrder(len(g.sizes)))
		return out, stats, errs
	}
	return g.dev.step(grads, inOrder(len(g.sizes)))
}

// velocity returns rank r's momentum velocity of bucket i.
func (g *backendRig) velocity(t *testing.T, r, i int) []float32 {
	t.Helper()
	u, err := g.core(r).be.velocity(i)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// save returns every rank's saved state.
func (g *backendRig) save(t *testing.T) [][]byte {
	t.Helper()
	var states [][]byte
	for r := range g.ranks() {
		var buf bytes.Buffer
		if err := g.core(r).Save(&buf); err != nil {
			t.Fatalf("rank %d: Save: %v", r, err)
		}
		states = append(states, buf.Bytes())
	}
	return states
}

// load loads states[r] into rank r.
func (g *backendRig) load(t *testing.T, states [][]byte) {
	t.Helper()
	for r, s := range states {
		if err := g.core(r).Load(bytes.NewReader(s)); err != nil {
			t.Fatalf("rank %d: Load: %v", r, err)
		}
	}
}

func (g *backendRig) ranks() int {
	if g.host != nil {
		return len(g.host)
	}
	return len(g.dev.engines)
}
