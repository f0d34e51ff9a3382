package overlap

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

func TestFitLine(t *testing.T) {
	for _, tc := range []struct {
		xs, ys []float64
		a, b   float64
	}{
		{[]float64{0, 1, 2}, []float64{1, 3, 5}, 1, 2},
		{[]float64{1, 2, 3}, []float64{3, 2, 1}, 2, 0},         // falling: mean, flat
		{[]float64{1, 2, 4}, []float64{0.5, 2.5, 6.5}, 0, 1.5}, // negative intercept: through the origin
		{[]float64{0, 0}, []float64{2, 4}, 3, 0},               // one x: mean
	} {
		a, b := fitLine(tc.xs, tc.ys)
		if math.Abs(a-tc.a) > 1e-9 || math.Abs(b-tc.b) > 1e-9 {
			t.Errorf("fitLine(%v, %v) = %v, %v; want %v, %v", tc.xs, tc.ys, a, b, tc.a, tc.b)
		}
	}
}

func newEnginesOn(t *testing.T, comms []comm.Comm, sizes []int, cfg Config) []*Engine {
	t.Helper()
	engines := make([]*Engine, len(comms))
	mustNoErrors(t, "New", onRanks(comms, func(r int, c comm.Comm) error {
		var err error
		engines[r], err = New(context.Background(), c, sizes, cfg)
		return err
	}))
	t.Cleanup(func() {
		for _, e := range engines {
			e.Close()
		}
	})
	return engines
}

// TestCostModelSlowLink: on an emulated 20 MB/s link the model measures
// about that bandwidth and sends top-k compressed; every rank agrees.
func TestCostModelSlowLink(t *testing.T) {
	if testing.Short() {
		t.Skip("probes an emulated slow link (about a second)")
	}
	const bw = 20e6
	sizes := []int{1 << 18, 1 << 16}
	engines := newEnginesOn(t, slowGroup(group(t, 2), 200*time.Microsecond, bw), sizes, Config{Spec: "topk:0.01", ErrorFeedback: true})
	m := engines[0].model
	if got := 1 / m.perByte; got < bw/2 || got > bw*2 {
		t.Errorf("measured %.3g B/s, want about %.3g", got, bw)
	}
	for r, e := range engines {
		if !slices.Equal(e.Compressed(), []bool{true, true}) {
			t.Errorf("rank %d: decisions %v, want compressed", r, e.Compressed())
		}
		for _, b := range e.buckets {
			if b.predComp >= b.predDense || !strings.HasPrefix(b.reason, "cost model: ") {
				t.Errorf("rank %d, bucket %d: %v vs %v: %s", r, b.idx, b.predComp, b.predDense, b.reason)
			}
		}
	}
	stats, errs := runStep(engines, stepGrads(2, 0, sizes), inOrder(2))
	mustNoErrors(t, "step", errs)
	t.Log(stats[0].Buckets[0].Reason)
}

// TestCostModelAgrees: on the in-process link every rank holds the same
// model and decisions, and the stats carry them.
func TestCostModelAgrees(t *testing.T) {
	sizes := []int{1 << 12, 1 << 8, 1 << 14}
	for _, spec := range []string{"int8", "topk:0.01", "randomk:0.01", "fp16"} {
		t.Run(spec, func(t *testing.T) {
			engines := newEngines(t, 3, sizes, Config{Spec: spec, ErrorFeedback: true})
			for r, e := range engines {
				if *e.model != *engines[0].model || !slices.Equal(e.Compressed(), engines[0].Compressed()) {
					t.Errorf("rank %d: model %+v decisions %v; rank 0: %+v %v", r, *e.model, e.Compressed(), *engines[0].model, engines[0].Compressed())
				}
			}
			stats, errs := runStep(engines, stepGrads(3, 0, sizes), inOrder(3))
			mustNoErrors(t, "step", errs)
			for i, bs := range stats[0].Buckets {
				if bs.PredictedDense <= 0 || bs.PredictedCompressed <= 0 || !strings.HasPrefix(bs.Reason, "cost model: ") || bs.Compressed != engines[0].Compressed()[i] {
					t.Errorf("bucket %d: %+v", i, bs)
				}
			}
			t.Log(stats[0].Buckets[2].Reason)
		})
	}
}

// TestPredictKnownLink: the link terms are the formulas of the package
// doc, exactly; all-gather's exchange has no compute between collectives.
func TestPredictKnownLink(t *testing.T) {
	const n, world, bw, lat = 1 << 16, 4, 1e6, time.Millisecond
	c := mustParse(t, "topk:0.01")
	p, err := Predict(c, StrategyQuantAllGather, n, world, Link{Bandwidth: bw, Latency: lat})
	if err != nil {
		t.Fatal(err)
	}
	wantAR := seconds(lat.Seconds() + float64(2*(world-1)*4*n/world)/bw)
	wantX := seconds(lat.Seconds() + float64((world-1)*(slotHeaderLen+c.MaxEncodedLen(n)))/bw)
	if p.AllReduce != wantAR || p.Exchange != wantX || p.Strategy != StrategyQuantAllGather {
		t.Errorf("all-reduce %v, exchange %v, strategy %v; want %v, %v, allgather", p.AllReduce, p.Exchange, p.Strategy, wantAR, wantX)
	}
	if want := p.AllReduce + max(0, p.Average-p.AllReduce); p.Dense != want {
		t.Errorf("dense %v, want %v", p.Dense, want)
	}
	if !p.Compress || p.Compressed >= p.Dense {
		t.Errorf("top-k 1%% on 1 MB/s: %+v, want compressed", p)
	}
	again, err := Predict(c, StrategyQuantAllGather, n, world, Link{Bandwidth: bw, Latency: lat})
	if err != nil || again != p {
		t.Errorf("second call (cached calibration): %+v, %v; first %+v", again, err, p)
	}
}

// TestPredictEveryCodec: all-gather carries every codec; on a link whose
// transfers cost nothing, no codec is predicted to pay; codec none is
// dense.
func TestPredictEveryCodec(t *testing.T) {
	free := Link{Bandwidth: math.Inf(1)}
	specs := []string{"fp16", "bf16", "topk:0.01", "randomk:0.01", "int8", "int4", "int2", "sign"}
	if testing.Short() {
		specs = specs[2:4]
	}
	var wg sync.WaitGroup
	for _, spec := range specs {
		wg.Go(func() { // concurrently: Predict is safe for concurrent use
			p, err := Predict(mustParse(t, spec), StrategyQuantAllGather, 1<<18, 4, free)
			switch {
			case err != nil:
				t.Errorf("%s: %v", spec, err)
			case p.Compress || p.Strategy != StrategyQuantAllGather || p.Encode <= 0 || p.Decode <= 0:
				t.Errorf("%s on a free link: %+v, want dense, with encode and decode times", spec, p)
			}
		})
	}
	wg.Wait()
	p, err := Predict(mustParse(t, "none"), StrategyAuto, 1<<10, 2, free)
	if err != nil || p.Compress || p.Compressed != p.Dense || p.Strategy != StrategyDense || p.Encode != 0 {
		t.Errorf("codec none: %+v, %v", p, err)
	}
}

func TestPredictErrors(t *testing.T) {
	c := mustParse(t, "int8")
	ok := Link{Bandwidth: 1e9, Latency: time.Microsecond}
	for _, tc := range []struct {
		c     compress.Compressor
		s     Strategy
		n, w  int
		link  Link
		error string
	}{
		{nil, StrategyAuto, 10, 2, ok, "nil compressor"},
		{c, StrategyAuto, 0, 2, ok, "0 elements"},
		{c, StrategyAuto, 10, 0, ok, "world size 0"},
		{c, StrategyAuto, 10, MaxPredictWorld + 1, ok, "world size 1025"},
		{c, StrategyAuto, 10, 2, Link{}, "bandwidth 0"},
		{c, StrategyAuto, 10, 2, Link{Bandwidth: math.NaN()}, "bandwidth NaN"},
		{c, StrategyAuto, 10, 2, Link{Bandwidth: 1, Latency: -1}, "latency -1ns is negative"},
		{c, StrategySharedIndex, 10, 2, ok, "shared-index needs"},
		{c, Strategy(42), 10, 2, ok, "unknown strategy"},
	} {
		if _, err := Predict(tc.c, tc.s, tc.n, tc.w, tc.link); err == nil || !strings.Contains(err.Error(), tc.error) {
			t.Errorf("Predict(%v, %v, %d, %d, %+v) = %v, want an error with %q", tc.c, tc.s, tc.n, tc.w, tc.link, err, tc.error)
		}
	}
}
