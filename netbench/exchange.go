package netbench

import (
	"context"
	"encoding/binary"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/overlap"
)

// exchange averages a gradient over the ranks of a group.
type exchange interface {
	// run replaces grad, on every rank, with the rank average of the
	// ranks' grads (as the exchange defines it: exact for the dense
	// all-reduce, of the decompressed payloads otherwise).
	run(ctx context.Context, grad []float32) (sample, error)
	// warmups is how many untimed runs come before the timed ones.
	warmups() int
	close() error
}

// sample is what one run of an exchange reports about itself.
type sample struct {
	strategy   string // as Result.Strategy
	buckets    int
	compressed int // buckets that crossed compressed
	reason     string
	bytesSent  int64 // bytes this rank put on the wire
	// Time in each stage, summed over buckets.
	compress, exchange, decompress time.Duration
}

// numbers returns the run's time took and the sample's numbers, in the
// order measurer.time keeps them.
func (s sample) numbers(took time.Duration) []float64 {
	return []float64{took.Seconds(), float64(s.bytesSent), s.compress.Seconds(), s.exchange.Seconds(), s.decompress.Seconds()}
}

// newExchange builds the exchange of case cs on c.
func newExchange(ctx context.Context, c comm.Comm, cs Case, cfg Config) (exchange, error) {
	if cs.Decision == Baseline {
		return &denseAllReduce{c: c, timeout: cfg.Timeout}, nil
	}
	return newEngineExchange(ctx, c, cs, cfg)
}

// denseAllReduce is the baseline: one all-reduce of the whole gradient, then
// the division by the rank count.
type denseAllReduce struct {
	c       comm.Comm
	timeout time.Duration
}

func (d *denseAllReduce) run(ctx context.Context, grad []float32) (sample, error) {
	start := time.Now()
	if err := withTimeout(ctx, d.timeout, func(ctx context.Context) error { return d.c.AllReduce(ctx, grad) }); err != nil {
		return sample{}, err
	}
	reduced := time.Now()
	n := d.c.Size()
	scale(grad, n)
	// A ring all-reduce sends 2(n−1)/n of the buffer from every rank.
	sent := 2 * int64(n-1) * 4 * int64(len(grad)) / int64(n)
	return sample{strategy: "dense", buckets: 1, bytesSent: sent, exchange: reduced.Sub(start), decompress: time.Since(reduced)}, nil
}

func (d *denseAllReduce) warmups() int { return 1 }

func (d *denseAllReduce) close() error { return nil }

// scale divides every element of x by n.
func scale(x []float32, n int) {
	s := 1 / float32(n)
	for i := range x {
		x[i] *= s
	}
}

// weightCols is the width of weightShapes' matrices.
const weightCols = 1024

// weightShapes views each bucket as the weights of layers with 1024
// inputs: a (n/1024)×1024 matrix, then the rest as one row (a bias). Only
// low-rank (powersgd) uses them.
func weightShapes(sizes []int) [][]overlap.Shape {
	out := make([][]overlap.Shape, len(sizes))
	for i, n := range sizes {
		if q := n / weightCols; q > 0 {
			out[i] = append(out[i], overlap.Shape{Rows: q, Cols: weightCols})
		}
		if r := n % weightCols; r > 0 {
			out[i] = append(out[i], overlap.Shape{Rows: 1, Cols: r})
		}
	}
	return out
}

// engineExchange runs the gradient through the overlap engine, cut into
// buckets of at most Config.BucketElems elements, all made ready at once in
// bucket order (as if backward had finished): the engine overlaps bucket
// i's exchange with bucket i+1's compression and bucket i−1's decoding.
type engineExchange struct {
	e     *overlap.Engine
	sizes []int
	auto  bool // the cost model decides, verified online in the first steps
	// chose: strategy auto on several nodes of several ranks, where New
	// chose between flat and hierarchical by trial; its rows say
	// "auto:" and the strategy it kept.
	chose bool
}

func newEngineExchange(ctx context.Context, c comm.Comm, cs Case, cfg Config) (*engineExchange, error) {
	decision := overlap.DecideCompressed
	if cs.Decision == CostModel {
		decision = overlap.DecideAuto
	}
	strategy := overlap.StrategyAuto
	if cs.Strategy != "" {
		var err error
		if strategy, err = overlap.ParseStrategy(cs.Strategy); err != nil {
			return nil, err
		}
	}
	sizes := bucketSizes(cfg.Size, cfg.BucketElems)
	e, err := overlap.New(ctx, c, sizes, overlap.Config{
		Spec: cs.Codec, Strategy: strategy, ErrorFeedback: cfg.ErrorFeedback, Decision: decision,
		Timeout: cfg.Timeout, Workers: cfg.Workers, NodeSpec: nodeSpecFor(strategy, cfg.NodeSpec),
		Shapes: weightShapes(sizes),
	})
	if err != nil {
		return nil, err
	}
	x := &engineExchange{e: e, sizes: sizes, auto: decision == overlap.DecideAuto}
	if t, ok := c.(comm.Topologist); ok && strategy == overlap.StrategyAuto {
		x.chose = t.Topology().Nodes > 1 && t.Topology().LocalSize > 1
	}
	return x, nil
}

// nodeSpecFor is cfg's NodeSpec for an engine of strategy s: the node
// stages' codec where there are node stages (hier, auto), else none.
func nodeSpecFor(s overlap.Strategy, spec string) string {
	if s == overlap.StrategyHier || s == overlap.StrategyAuto {
		return spec
	}
	return ""
}

func (x *engineExchange) run(ctx context.Context, grad []float32) (sample, error) {
	if err := x.e.Step(); err != nil {
		return sample{}, err
	}
	off := 0
	for i, n := range x.sizes {
		if err := x.e.Ready(i, grad[off:off+n]); err != nil {
			return sample{}, err
		}
		off += n
	}
	st, err := x.e.Wait(ctx)
	if err != nil {
		return sample{}, err
	}
	s := sample{strategy: x.e.Strategy().String(), bytesSent: st.BytesSent, buckets: len(st.Buckets)}
	if x.chose {
		s.strategy = "auto:" + s.strategy
	}
	for _, b := range st.Buckets {
		if b.Compressed {
			s.compressed++
		}
		s.compress += b.Compress
		s.exchange += b.Exchange
		s.decompress += b.Decompress
	}
	if len(st.Buckets) > 0 {
		s.reason = st.Buckets[0].Reason
	}
	return s, nil
}

// warmups is one run, and with the cost model the verification window
// too: the timed runs see the path the engine settled on.
func (x *engineExchange) warmups() int {
	if x.auto {
		return 1 + overlap.VerifyWindow
	}
	return 1
}

func (x *engineExchange) close() error { return x.e.Close() }

// bucketSizes cuts n elements into buckets of at most max elements, the
// last one holding the rest.
func bucketSizes(n, max int) []int {
	var sizes []int
	for ; n > max; n -= max {
		sizes = append(sizes, max)
	}
	return append(sizes, n)
}

// gatherFloats all-gathers xs (the same length on every rank) and returns
// every rank's values in rank order.
func gatherFloats(ctx context.Context, c comm.Comm, timeout time.Duration, xs []float64) ([]float64, error) {
	src := make([]byte, 8*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint64(src[8*i:], math.Float64bits(x))
	}
	dst := make([]byte, c.Size()*len(src))
	if err := withTimeout(ctx, timeout, func(ctx context.Context) error { return c.AllGather(ctx, dst, src) }); err != nil {
		return nil, err
	}
	all := make([]float64, len(dst)/8)
	for i := range all {
		all[i] = math.Float64frombits(binary.LittleEndian.Uint64(dst[8*i:]))
	}
	return all, nil
}

// barrier waits for every rank of c, for at most timeout.
func barrier(ctx context.Context, c comm.Comm, timeout time.Duration) error {
	return withTimeout(ctx, timeout, c.Barrier)
}

// withTimeout calls f with ctx bounded by timeout.
func withTimeout(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx)
}
