package overlap

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/compress"
)

// costModel holds what New measured, identical on every rank: the link as
// t(V) = α + V/β for V bytes sent per rank, and the compressed path's
// compute, per stage, as linear functions of the element count.
type costModel struct {
	alpha   float64 // seconds
	perByte float64 // seconds per byte sent (1/β); 0 when unmeasurable (one rank)
	enc     line    // stage-1 encode
	// mid is the work between collectives (SRA's sum and re-encode),
	// counted with the exchange. The host engine runs it off the wire
	// while the next bucket's first round is on it, so there the model
	// over-predicts by up to that much.
	mid line
	dec line // decode and average
	avg line // the dense path's average
}

// line is a + b·n seconds for n elements.
type line struct{ a, b float64 }

func (l line) at(n int) float64 { return l.a + l.b*float64(n) }

// stageCosts are a bucket's predicted stage times on the compressed path:
// encode on the compute stream, exchange on the wire stream (collectives,
// and SRA's sum and re-encode between them), decode on the decode stream.
type stageCosts struct{ encode, exchange, decode float64 }

// total is the time the bucket adds to a pipelined step: the exchange,
// plus the part of encode and decode that the neighbouring buckets'
// exchanges cannot hide. Bucket i's encode runs while bucket i−1 is on the
// wire and its decode while bucket i+1 is; with neighbours of about the
// same size, up to one exchange time of each hides.
func (c stageCosts) total() float64 {
	return c.exchange + max(0, c.encode-c.exchange) + max(0, c.decode-c.exchange)
}

func (m *costModel) link(bytes int64) float64 { return m.alpha + float64(bytes)*m.perByte }

// costs predicts bucket b's stages on the compressed path of x.
func (m *costModel) costs(x linker, b *bucket) stageCosts {
	return stageCosts{encode: m.enc.at(b.n), exchange: x.linkCost(m, b) + m.mid.at(b.n), decode: m.dec.at(b.n)}
}

// The measurement's size.
const (
	probeReps     = 5                     // timed all-reduces per probe size, after one untimed
	measureWindow = 20 * time.Millisecond // timing the compressed path per size: at least this long
	measureReps   = 2                     // and at least this many runs, after one untimed
	// margin is how much faster the compressed path must be predicted to be
	// chosen: the model's error on a loaded host is of that order, and
	// where the two are that close compression gains little.
	margin = 0.2
)

// prober is a backend as the cost model measures and predicts it; the
// host and the device engine are both one, so DecideAuto means the same
// on both.
type prober interface {
	// probeAllReduce runs one link probe: an all-reduce of floats float32s on
	// the backend's data path, returning once it ended.
	probeAllReduce(ctx context.Context, floats int) error
	// timePaths returns, per stage (encode, between collectives, decode,
	// dense average), the time in seconds of the backend's own paths for
	// a bucket of each size in ns, its collectives free (timePath).
	timePaths(ns []int) ([4][]float64, error)
	linker
}

// linker predicts the time of a compressed bucket's collectives.
type linker interface {
	// linkCost is the time of the collectives of compressed bucket b
	// (b.n elements; low-rank: the shapes of bucket b.idx) on the link m
	// models.
	linkCost(m *costModel, b *bucket) float64
}

// measure probes the link with all-reduces of a few sizes and times the
// backend's own compressed path (encode, the work between collectives,
// decode and average) on up to three bucket sizes (the smallest, the
// median, the largest, each rounded down to a multiple of N), on a
// synthetic gradient, its collectives free. Every rank measures; the
// probes' minimum and the compute times' maximum over ranks (an
// all-gather) is what every rank fits, so all of them hold the same model.
func measure(ctx context.Context, e *core, p prober) (*costModel, error) {
	m := &costModel{}
	probeLen := []int{1 << 8, 1 << 14, 1 << 18} // float32s
	sizes := make([]int, len(e.buckets))
	for i, b := range e.buckets {
		sizes[i] = b.n
	}
	slices.Sort(sizes)
	if sizes[len(sizes)-1] >= 1<<19 {
		probeLen = append(probeLen, 1<<20)
	}
	var ns []int
	for _, n := range []int{sizes[0], sizes[len(sizes)/2], sizes[len(sizes)-1]} {
		if e.lowRank == nil { // low-rank times real buckets (timePath)
			n = max(n-n%e.size, e.size)
		}
		ns = append(ns, n)
	}
	ns = slices.Compact(ns)

	var v []float64
	for _, l := range probeLen {
		var ts []float64
		for rep := range probeReps + 1 {
			tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
			d, err := e.timing.probe(tctx, p, e.size, l)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("overlap: cost model: link probe on rank %d: %w", e.rank, err)
			}
			if rep > 0 {
				ts = append(ts, d)
			}
		}
		// The fastest run: scheduling noise only ever adds time, and a link
		// that looks slower than it is would make compression look better
		// than it is (the model errs toward dense, never toward slower).
		v = append(v, slices.Min(ts))
	}
	times, err := e.timing.paths(p, ns)
	if err != nil {
		return nil, fmt.Errorf("overlap: cost model: timing %s on rank %d: %w", e.spec, e.rank, err)
	}
	for _, t := range times {
		v = append(v, t...)
	}

	// Over ranks: the fastest probe (a rank that arrived early also timed
	// its wait for the others; the last to arrive timed the collective),
	// the slowest compute (the slowest rank sets the pace).
	mine := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(mine[8*i:], math.Float64bits(x))
	}
	all := make([]byte, e.size*len(mine))
	tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.host.AllGather(tctx, all, mine); err != nil {
		return nil, fmt.Errorf("overlap: cost model: sharing measurements on rank %d: %w", e.rank, err)
	}
	for r := range e.size {
		for i := range v {
			x := math.Float64frombits(binary.LittleEndian.Uint64(all[r*len(mine)+8*i:]))
			if i < len(probeLen) {
				v[i] = min(v[i], x)
			} else {
				v[i] = max(v[i], x)
			}
		}
	}

	xs := make([]float64, len(probeLen))
	for i, l := range probeLen {
		xs[i] = float64(allReduceVolume(e.size, 4*l))
	}
	m.alpha, m.perByte = fitLine(xs, v[:len(probeLen)])
	m.fitCompute(ns, v[len(probeLen):])
	return m, nil
}

// fitCompute fits the compute lines (encode, between collectives, decode,
// dense average) to v, timePath's times flattened stage by stage, for the
// sizes ns.
func (m *costModel) fitCompute(ns []int, v []float64) {
	fns := make([]float64, len(ns))
	for i, n := range ns {
		fns[i] = float64(n)
	}
	for _, l := range []*line{&m.enc, &m.mid, &m.dec, &m.avg} {
		l.a, l.b = fitLine(fns, v[:len(ns)])
		v = v[len(ns):]
	}
}

// timePath runs the engine's compressed path for buckets of each size in
// ns on a scratch engine (the same strategy and codec, its own empty
// error-feedback memory, a loopback comm), and the dense path's average,
// and returns per stage (encode, between collectives, decode, dense
// average) the median time per size over at least measureReps runs and
// measureWindow. Ranks measure at the same time and a window spans several
// scheduling quanta, so cores the ranks share show in the times, as they
// will in a step; the median keeps one run that lost its core for a
// scheduling quantum from moving the model.
func timePath(e *Engine, ns []int) ([4][]float64, error) {
	var times [4][]float64
	s := &Engine{core: &core{cfg: e.cfg, rank: e.rank, size: e.size, spec: e.spec, comp: e.comp, lowRank: e.lowRank, strategy: e.strategy, mech: e.mech},
		c: &loopback{rank: e.rank, size: e.size}}
	s.data = s.c
	if s.comp != nil {
		s.exchanger = s.newExchanger()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	grad := make([]float32, ns[len(ns)-1])
	for i := range grad {
		grad[i] = float32(rng.NormFloat64())
	}
	st := &step{ctx: context.Background()}
	for i, n := range ns {
		b := &bucket{idx: i, n: n, compressed: true}
		if e.lowRank != nil {
			// Low-rank's path depends on the tensors' shapes: time the
			// first bucket of n elements (its compute, fitted against n,
			// stands for the others').
			b.idx = slices.IndexFunc(e.buckets, func(r *bucket) bool { return r.n == n })
		}
		if s.exchanger != nil {
			s.exchanger.setup(b)
		}
		r := &run{b: b, hostRun: hostRun{grad: make([]float32, n)}}
		var runs [4][]float64 // per stage, one time per timed run
		for reps, start := 0, time.Now(); reps <= measureReps || time.Since(start) < measureWindow; reps++ {
			if reps == 1 {
				start = time.Now()
			}
			var sum [4]float64
			copy(r.grad, grad)
			r.key = compress.Key{Bucket: uint64(i), Step: uint64(reps)}
			if s.exchanger != nil {
				if err := timeCompressed(s, st, r, &sum); err != nil {
					return times, err
				}
			}
			t := time.Now()
			compress.Average(r.grad, e.size)
			sum[3] += time.Since(t).Seconds()
			if reps == 0 {
				continue // untimed: first touch of the buffers
			}
			for k := range runs {
				runs[k] = append(runs[k], sum[k])
			}
		}
		for k := range times {
			slices.Sort(runs[k])
			times[k] = append(times[k], runs[k][len(runs[k])/2])
		}
	}
	return times, nil
}

// timeCompressed runs r through e's compressed path once, adding each
// stage's time (encode, between collectives, decode and the memory's
// decay) to sum.
func timeCompressed(e *Engine, st *step, r *run, sum *[4]float64) error {
	x := e.exchanger
	r.stats = BucketStats{}
	t := time.Now()
	err := x.encode(r)
	sum[0] += time.Since(t).Seconds()
	var sts []status
	if err == nil {
		sts, err = x.exchange(st, r)
	}
	if x2, ok := x.(twoRounds); ok && err == nil && allOK(sts) {
		if err = x2.reduce(st, r); err == nil {
			_, err = x2.exchange2(st, r)
		}
	}
	sum[1] += (r.stats.Compress + r.stats.Decompress).Seconds()
	t = time.Now()
	if err == nil {
		_, err = x.decode(r)
		e.decay(r)
	}
	sum[2] += time.Since(t).Seconds()
	discard(r.pend1)
	discard(r.pend2)
	return err
}

// fitLine fits y = a + b·x by least squares, with a, b ≥ 0: a negative
// intercept is refitted through the origin, a negative slope (noise on a
// link too fast to resolve) becomes 0 with a = mean(y).
func fitLine(xs, ys []float64) (a, b float64) {
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(xs))
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx > 0 {
		b = sxy / sxx
	}
	a = my - b*mx
	switch {
	case b <= 0:
		return my, 0
	case a < 0:
		var sxy, sxx float64
		for i := range xs {
			sxy += xs[i] * ys[i]
			sxx += xs[i] * xs[i]
		}
		return 0, sxy / sxx
	}
	return a, b
}

// decide predicts every bucket's dense and compressed times and chooses the
// faster. Rank 0's choices are broadcast, so every rank takes the same path
// whatever its floating point does.
func (m *costModel) decide(ctx context.Context, e *core, x linker) error {
	choice := make([]byte, len(e.buckets))
	bw := "unresolved"
	if m.perByte > 0 {
		bw = fmt.Sprintf("%.3g GB/s", 1e-9/m.perByte)
	}
	for i, b := range e.buckets {
		p := m.predict(x, e.size, b)
		b.predDense, b.predComp = p.Dense, p.Compressed
		if p.Compress {
			choice[i] = 1
		}
		b.predicted = fmt.Sprintf("cost model: compressed %v (encode %v, exchange %v, decode %v) vs dense %v (all-reduce %v, average %v); link α=%v β=%s",
			p.Compressed, p.Encode, p.Exchange, p.Decode, p.Dense, p.AllReduce, p.Average, seconds(m.alpha), bw)
	}
	tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.host.Broadcast(tctx, choice, 0); err != nil {
		return fmt.Errorf("overlap: cost model: broadcasting the decisions on rank %d: %w", e.rank, err)
	}
	for i, b := range e.buckets {
		b.compressed = choice[i] == 1
		b.reason, b.origin = b.predicted, OriginCostModel
	}
	return nil
}

// seconds converts s to a Duration rounded to 0.1 µs, saturating at the
// largest Duration.
func seconds(s float64) time.Duration {
	if s*1e9 >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(s * 1e9).Round(time.Microsecond / 10)
}

// predict predicts bucket b on size ranks: the dense path, and the
// compressed path whose collectives x gives (nil: codec none, no
// compressed path).
func (m *costModel) predict(x linker, size int, b *bucket) Prediction {
	n := b.n
	dense := stageCosts{exchange: m.link(allReduceVolume(size, 4*n)), decode: m.avg.at(n)}
	p := Prediction{Dense: seconds(dense.total()), AllReduce: seconds(dense.exchange), Average: seconds(dense.decode)}
	if x == nil {
		p.Compressed = p.Dense
		return p
	}
	c := m.costs(x, b)
	p.Compressed, p.Encode, p.Exchange, p.Decode = seconds(c.total()), seconds(c.encode), seconds(c.exchange), seconds(c.decode)
	p.Compress = c.total() < dense.total()/(1+margin)
	return p
}

// Link is a network link as Predict models it: a collective in which one
// rank sends V bytes takes Latency + V/Bandwidth.
type Link struct {
	Bandwidth float64       // bytes per second, > 0; +Inf for a link whose transfer time is negligible
	Latency   time.Duration // per collective, ≥ 0
}

// Prediction is the cost model's prediction for one bucket, as the engine
// makes it at New (see the package doc for the formulas).
type Prediction struct {
	Strategy Strategy // the strategy predicted (StrategyAuto resolved)
	// Dense is the dense fp32 all-reduce and average:
	// AllReduce + max(0, Average − AllReduce).
	Dense, AllReduce, Average time.Duration
	// Compressed is the compressed path, what overlap with the neighbouring
	// buckets does not hide: Exchange + max(0, Encode − Exchange) +
	// max(0, Decode − Exchange). For codec none it equals Dense, and
	// Encode, Exchange and Decode are zero.
	Compressed, Encode, Exchange, Decode time.Duration
	// Compress is true when Compressed is predicted at least 20% faster
	// than Dense: the engine's choice.
	Compress bool
}

// MaxPredictWorld is the largest world size Predict accepts: the
// calibration runs the whole exchange of that many ranks on one core.
const MaxPredictWorld = 1024

// Predict is the engine's cost model for one bucket of n elements
// exchanged among world ranks with strategy s (StrategyAuto picks it as
// Config.Strategy would; StrategyQuantAllGather works with every codec but
// none) over link, without an engine or a transport. The compressed path's
// compute is the engine's own (with error feedback), timed on this host
// on first use for each (spec, strategy, world) and kept for the life of
// the process: the first call for a combination takes up to a few hundred
// milliseconds, later ones microseconds. It returns an error for a nil
// compressor, n outside 1 to compress.MaxElements, world outside 1 to
// MaxPredictWorld, a bandwidth that is not positive, a negative latency, or
// a strategy that cannot carry c's codec. Safe for concurrent use.
func Predict(c compress.Compressor, s Strategy, n, world int, link Link) (Prediction, error) {
	switch {
	case c == nil:
		return Prediction{}, fmt.Errorf("overlap: Predict: nil compressor")
	case n < 1 || int64(n) > compress.MaxElements:
		return Prediction{}, fmt.Errorf("overlap: Predict: %d elements, want 1 to %d", n, uint64(compress.MaxElements))
	case world < 1 || world > MaxPredictWorld:
		return Prediction{}, fmt.Errorf("overlap: Predict: world size %d, want 1 to %d", world, MaxPredictWorld)
	case !(link.Bandwidth > 0):
		return Prediction{}, fmt.Errorf("overlap: Predict: link bandwidth %v bytes/s, want > 0", link.Bandwidth)
	case link.Latency < 0:
		return Prediction{}, fmt.Errorf("overlap: Predict: link latency %v is negative", link.Latency)
	}
	return predictWith(c, s, n, world, link, calibrated)
}

// predictWith is Predict, after its checks, with the calibration cal gives.
func predictWith(c compress.Compressor, s Strategy, n, world int, link Link, cal func(compress.Compressor, Strategy, int) (calibration, error)) (Prediction, error) {
	strategy, err := resolve(s, c.Codec(), world)
	if err != nil {
		return Prediction{}, err
	}
	calib, err := cal(c, strategy, world)
	if err != nil {
		return Prediction{}, err
	}
	m := calib.model
	m.alpha, m.perByte = link.Latency.Seconds(), 1/link.Bandwidth
	var x linker
	if calib.exchanger != nil {
		x = calib.exchanger
	}
	p := m.predict(x, world, &bucket{n: n})
	p.Strategy = strategy
	return p, nil
}

// calibration is what Predict keeps per (spec, strategy, world): the
// fitted compute lines, and the compressed path (nil for codec none),
// whose memory-free exchanger gives the collectives' volumes.
type calibration struct {
	model     costModel // compute lines only
	exchanger exchanger
}

type calibrationKey struct {
	spec     compress.Spec
	strategy Strategy
	world    int
}

type calibrationEntry struct {
	once sync.Once
	cal  calibration
	err  error
}

var calibrations struct {
	sync.Mutex
	m map[calibrationKey]*calibrationEntry
}

// calibrationBytes bounds the receive buffers of a calibration run (an
// all-gather receives world payloads): sizes above it are not timed.
const calibrationBytes = 128 << 20

// calibrated returns the calibration of (c's spec, strategy, world),
// timing it on first use: timePath on a scratch engine of rank 0 for
// buckets of 4 Ki, 32 Ki and 256 Ki elements (rounded down to a multiple
// of world, at least world; those whose world payloads exceed
// calibrationBytes left out, the smallest always kept).
func calibrated(c compress.Compressor, strategy Strategy, world int) (calibration, error) {
	key := calibrationKey{c.Spec(), strategy, world}
	calibrations.Lock()
	if calibrations.m == nil {
		calibrations.m = make(map[calibrationKey]*calibrationEntry)
	}
	ent := calibrations.m[key]
	if ent == nil {
		ent = &calibrationEntry{}
		calibrations.m[key] = ent
	}
	calibrations.Unlock()
	ent.once.Do(func() { ent.cal, ent.err = calibrate(c, strategy, world, clockTiming{}) })
	return ent.cal, ent.err
}

// calibrate times (spec, strategy, world) with t, as calibrated describes.
func calibrate(c compress.Compressor, strategy Strategy, world int, t timing) (calibration, error) {
	e := &Engine{core: &core{cfg: Config{ErrorFeedback: true, Timeout: DefaultTimeout}, size: world, spec: c.Spec().String(),
		strategy: strategy, mech: mechanism(strategy, c.Codec(), world)}}
	if c.Codec() != compress.CodecNone {
		e.comp = c
		e.exchanger = e.newExchanger()
		e.exchanger.useMemory(nil, nil)
	}
	var ns []int
	for _, n := range []int{1 << 12, 1 << 15, 1 << 18} {
		n = max(n-n%world, world)
		if len(ns) == 0 || int64(world)*int64(c.MaxEncodedLen(n)) <= calibrationBytes {
			ns = append(ns, n)
		}
	}
	ns = slices.Compact(ns)
	times, err := t.paths(e, ns)
	if err != nil {
		return calibration{}, fmt.Errorf("overlap: Predict: timing %s (%v, %d ranks): %w", c.Spec(), strategy, world, err)
	}
	var v []float64
	for _, t := range times {
		v = append(v, t...)
	}
	var cal calibration
	cal.model.fitCompute(ns, v)
	cal.exchanger = e.exchanger
	return cal, nil
}

// linkCost is the time of the bucket's collectives on the link.
func (g *gatherExchanger) linkCost(m *costModel, b *bucket) float64 {
	return m.link(allGatherVolume(g.e.size, g.c.p.slotLen(b.n)))
}

func (s *sraExchanger) linkCost(m *costModel, b *bucket) float64 {
	N, slot := s.e.size, s.c1.p.slotLen(b.n)
	return m.link(allToAllVolume(N, N*slot)) + m.link(allGatherVolume(N, slot))
}

func (s *sharedExchanger) linkCost(m *costModel, b *bucket) float64 {
	return m.link(allReduceVolume(s.e.size, 4*(s.e.size+s.k(b.n))))
}
