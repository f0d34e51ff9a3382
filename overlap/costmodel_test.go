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
	"github.com/gradcomp/gradcomp/compress/compresstest"
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

// TestCostModelFit: from injected probe and compute times (a 20 MB/s
// link), New fits exactly that link and those lines, predicts each bucket
// by the package doc's formulas, sends top-k compressed on every rank, and
// the stats carry the predictions; on a free link with the same compute
// it goes dense.
func TestCostModelFit(t *testing.T) {
	const ranks = 2
	sizes := []int{1 << 18, 1 << 16}
	tm := &fixedTiming{alpha: 200e-6, perByte: 1 / 20e6, enc: line{1e-5, 2e-9}, dec: line{2e-5, 1e-9}, avg: line{1e-6, 1e-10}}
	cfg := Config{Spec: "topk:0.01", ErrorFeedback: true}
	engines := newTimedEngines(t, group(t, ranks), sizes, cfg, tm)
	close := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*max(1, math.Abs(want)) }
	m := engines[0].model
	if !close(m.alpha, tm.alpha) || !close(m.perByte*1e9, tm.perByte*1e9) || !close(m.enc.a, tm.enc.a) || !close(m.enc.b*1e9, tm.enc.b*1e9) ||
		!close(m.dec.b*1e9, tm.dec.b*1e9) || !close(m.avg.b*1e9, tm.avg.b*1e9) || m.mid.a != 0 || m.mid.b != 0 {
		t.Errorf("fitted %+v from %+v", *m, *tm)
	}
	c := compresstest.MustParse(t, cfg.Spec)
	for r, e := range engines {
		if !slices.Equal(e.Compressed(), []bool{true, true}) {
			t.Errorf("rank %d: decisions %v, want compressed", r, e.Compressed())
		}
		for _, b := range e.buckets {
			n := float64(b.n)
			A := tm.alpha + float64(allReduceVolume(ranks, 4*b.n))*tm.perByte
			X := tm.alpha + float64(allGatherVolume(ranks, slotHead(false)+c.MaxEncodedLen(b.n)))*tm.perByte
			E, D, M := tm.enc.a+tm.enc.b*n, tm.dec.a+tm.dec.b*n, tm.avg.a+tm.avg.b*n
			dense, comp := A+max(0, M-A), X+max(0, E-X)+max(0, D-X)
			if d := b.predDense - seconds(dense); d < -time.Microsecond/10 || d > time.Microsecond/10 {
				t.Errorf("rank %d, bucket %d: predicted dense %v, want %v", r, b.idx, b.predDense, seconds(dense))
			}
			if d := b.predComp - seconds(comp); d < -time.Microsecond/10 || d > time.Microsecond/10 {
				t.Errorf("rank %d, bucket %d: predicted compressed %v, want %v", r, b.idx, b.predComp, seconds(comp))
			}
			if !strings.HasPrefix(b.reason, "cost model: ") {
				t.Errorf("rank %d, bucket %d: reason %s", r, b.idx, b.reason)
			}
		}
	}
	stats, errs := runStep(engines, stepGrads(ranks, 0, sizes), inOrder(2))
	mustNoErrors(t, "step", errs)
	if bs := stats[0].Buckets[0]; bs.PredictedDense != engines[0].buckets[0].predDense || !bs.Compressed {
		t.Errorf("stats %+v", bs)
	}

	free := *tm
	free.alpha, free.perByte = 0, 0
	for r, e := range newTimedEngines(t, group(t, ranks), sizes, cfg, &free) {
		if !slices.Equal(e.Compressed(), []bool{false, false}) {
			t.Errorf("free link, rank %d: decisions %v, want dense", r, e.Compressed())
		}
	}
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

// fixedCalibration calibrates Predict from given compute lines instead of
// the clock.
func fixedCalibration(tm *fixedTiming) func(compress.Compressor, Strategy, int) (calibration, error) {
	return func(c compress.Compressor, s Strategy, world int) (calibration, error) {
		return calibrate(c, s, world, tm)
	}
}

// predictCompute is the compute Predict's tests inject: encode and decode
// of 1 ns per element, the dense average 0.1 ns per element.
var predictCompute = &fixedTiming{enc: line{0, 1e-9}, dec: line{0, 1e-9}, avg: line{0, 1e-10}}

// nearly reports whether two durations from seconds() differ by at most
// its rounding.
func nearly(a, b time.Duration) bool { return a-b <= time.Microsecond/10 && b-a <= time.Microsecond/10 }

// TestPredictKnownLink: the link terms are the formulas of the package
// doc, exactly; all-gather's exchange has no compute between collectives;
// the compute is the calibration's.
func TestPredictKnownLink(t *testing.T) {
	const n, world, bw, lat = 1 << 16, 4, 1e6, time.Millisecond
	c := compresstest.MustParse(t, "topk:0.01")
	link := Link{Bandwidth: bw, Latency: lat}
	p, err := predictWith(c, StrategyQuantAllGather, n, world, link, fixedCalibration(predictCompute))
	if err != nil {
		t.Fatal(err)
	}
	wantAR := seconds(lat.Seconds() + float64(2*(world-1)*4*n/world)/bw)
	wantX := seconds(lat.Seconds() + float64((world-1)*(slotHead(false)+c.MaxEncodedLen(n)))/bw)
	if !nearly(p.AllReduce, wantAR) || !nearly(p.Exchange, wantX) || p.Strategy != StrategyQuantAllGather {
		t.Errorf("all-reduce %v, exchange %v, strategy %v; want %v, %v, allgather", p.AllReduce, p.Exchange, p.Strategy, wantAR, wantX)
	}
	if !nearly(p.Encode, seconds(1e-9*n)) || !nearly(p.Decode, seconds(1e-9*n)) || !nearly(p.Average, seconds(1e-10*n)) {
		t.Errorf("compute %+v, want the calibration's", p)
	}
	if want := p.AllReduce + max(0, p.Average-p.AllReduce); p.Dense != want {
		t.Errorf("dense %v, want %v", p.Dense, want)
	}
	if !p.Compress || p.Compressed >= p.Dense {
		t.Errorf("top-k 1%% on 1 MB/s: %+v, want compressed", p)
	}
}

// TestPredictMechanism: Predict's exchange is the collectives of the
// strategy's own mechanism: SRA's all-to-all and all-gather of N-part
// slots (also for fp16's dense), shared-index's all-reduce of the values
// and statuses.
func TestPredictMechanism(t *testing.T) {
	const n, world, bw, lat = 1 << 16, 4, 1e6, time.Millisecond
	link := Link{Bandwidth: bw, Latency: lat}
	at := func(bytes int64) time.Duration { return seconds(lat.Seconds() + float64(bytes)/bw) }
	for _, tc := range []struct {
		spec string
		s    Strategy
	}{
		{"int8", StrategyAuto}, {"fp16", StrategyAuto}, {"randomk:0.01", StrategyAuto}, {"int8", StrategyQuantSRA},
	} {
		c := compresstest.MustParse(t, tc.spec)
		slot := int64(slotHead(false) + c.MaxEncodedLen(n/world))
		want := at(allToAllVolume(world, int(world*slot))) + at(allGatherVolume(world, int(slot)))
		if c.Codec() == compress.CodecRandomK {
			k := (c.MaxEncodedLen(n) - c.MaxEncodedLen(0)) / 4
			want = at(allReduceVolume(world, 4*(world+k)))
		}
		p, err := predictWith(c, tc.s, n, world, link, fixedCalibration(predictCompute))
		if err != nil {
			t.Fatal(err)
		}
		if d := p.Exchange - want; d < -time.Microsecond/5 || d > time.Microsecond/5 {
			t.Errorf("%s (%v): exchange %v, want %v", tc.spec, p.Strategy, p.Exchange, want)
		}
	}
}

// TestPredictCached: Predict calibrates once per (spec, strategy, world)
// and answers the same afterwards.
func TestPredictCached(t *testing.T) {
	c := compresstest.MustParse(t, "topk:0.01")
	link := Link{Bandwidth: 1e6, Latency: time.Millisecond}
	p, err := Predict(c, StrategyQuantAllGather, 1<<16, 4, link)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Predict(c, StrategyQuantAllGather, 1<<16, 4, link)
	if err != nil || again != p {
		t.Errorf("second call (cached calibration): %+v, %v; first %+v", again, err, p)
	}
	if p.Encode <= 0 || p.Decode <= 0 {
		t.Errorf("%+v: want encode and decode times", p)
	}
}

// TestPredictEveryCodec: all-gather carries every codec; on a link whose
// transfers cost nothing, with encode and decode costing more than the
// average, no codec is predicted to pay; codec none is dense.
func TestPredictEveryCodec(t *testing.T) {
	free := Link{Bandwidth: math.Inf(1)}
	specs := []string{"fp16", "bf16", "topk:0.01", "randomk:0.01", "int8", "int4", "int2", "sign"}
	const n = 1 << 18
	for _, spec := range specs {
		p, err := predictWith(compresstest.MustParse(t, spec), StrategyQuantAllGather, n, 4, free, fixedCalibration(predictCompute))
		switch {
		case err != nil:
			t.Errorf("%s: %v", spec, err)
		case p.Compress || p.Strategy != StrategyQuantAllGather || !nearly(p.Encode, seconds(1e-9*n)) || !nearly(p.Decode, seconds(1e-9*n)):
			t.Errorf("%s on a free link: %+v, want dense, with the calibration's encode and decode times", spec, p)
		}
	}
	p, err := predictWith(compresstest.MustParse(t, "none"), StrategyAuto, 1<<10, 2, free, fixedCalibration(predictCompute))
	if err != nil || p.Compress || p.Compressed != p.Dense || p.Strategy != StrategyDense || p.Encode != 0 {
		t.Errorf("codec none: %+v, %v", p, err)
	}
}

// TestPredictConcurrent: Predict is safe for concurrent use.
func TestPredictConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for _, spec := range []string{"topk:0.01", "randomk:0.01"} {
		wg.Go(func() {
			if _, err := Predict(compresstest.MustParse(t, spec), StrategyQuantAllGather, 1<<12, 2, Link{Bandwidth: 1e9}); err != nil {
				t.Errorf("%s: %v", spec, err)
			}
		})
	}
	wg.Wait()
}

func TestPredictErrors(t *testing.T) {
	c := compresstest.MustParse(t, "int8")
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
