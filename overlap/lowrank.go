package overlap

import (
	"fmt"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
)

// StrategyLowRank: PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019,
// Algorithm 2 with error feedback) over the bucket's tensors
// (Config.Shapes). Per tensor M of rows×cols (error feedback added: M =
// e + g), with r = min(R, rows, cols):
//
//	P = M·Q                   encode (compute stream)
//	P ← Σ_ranks P             first all-reduce, with the bucket's other tensors
//	P̂ = orthogonalize(P)      between the rounds (lowrank.Orthogonalize:
//	Q = Mᵀ·P̂                  float64 Gram-Schmidt, the same bits on every rank)
//	Q̄ ← Σ_ranks Q / N         second all-reduce
//	average = P̂·Q̄ᵀ            decode, in one pass with the residual
//	e ← M − P̂·Qᵀ              (this rank's Q: what its own M lost)
//
// A tensor is compressed when it saves at least MinCompression:
// rows·cols ≥ MinCompression·(rows+cols)·r; the others (biases, small
// layers) go uncompressed in the first all-reduce, averaged exactly,
// their residual zero. Q starts from the counter RNG, uniform in [−1, 1)
// from (seed, bucket, tensor, step), the same on every rank; with warm
// start (the default) each step starts from the previous step's Q̄, kept
// as the bucket's second memory (state: stage 2), and a column of a kept
// Q that is all zero (the first step; a zero gradient; a column the
// orthogonalization zeroed) is drawn again.
//
// The cost model predicts each bucket from its own plan's volumes
// (linkCost) and compute lines timed on real buckets (timePath).
//
// The first all-reduce begins with one float per rank, rank q's at q: 1
// when its M holds NaN or ±Inf, so every rank sees the same statuses and
// such a step goes dense (nothing non-finite reaches P, Q or the memory).
// An orthogonalization that meets a rank-deficient P zeroes those columns
// (lowrank.Orthogonalize): the approximation loses them, the residual
// keeps them.
type lowRankExchanger struct {
	e    *Engine
	spec compress.Spec
	c    coder // the fp32 stand-in: settle's fold of a gradient never compressed
	// ef is the residual memory (nil without error feedback), warm the
	// warm start's Q (nil with warm=off).
	ef, warm *compress.ErrorFeedback
}

// planLowRank lays out a bucket of shapes for spec.
func planLowRank(shapes []Shape, spec compress.Spec) *lowrank.Layout {
	dims := make([][2]int, len(shapes))
	for j, sh := range shapes {
		dims[j] = [2]int{sh.Rows, sh.Cols}
	}
	return lowrank.NewLayout(dims, spec.Rank, spec.MinCompressionFactor())
}

// lowRankBuffers are a bucket's buffers for StrategyLowRank.
type lowRankBuffers struct {
	plan  *lowrank.Layout
	vals1 []float32 // the first all-reduce: N statuses, the P's, the uncompressed elements
	vals2 []float32 // the second: the Q's
	qOwn  []float32 // this rank's Q's (vals2 is summed in place)
	m     []float32 // without error feedback: the step's M, a copy of the gradient
	zero  []float32 // the zero "gradient" of the warm start's Q memory (QLen)
	cold  []float32 // without that memory: this step's Q's
}

// lowRankRun is a run's views for StrategyLowRank, from encode to decode.
type lowRankRun struct {
	m, res []float32 // M, and the residual to fill (M itself without error feedback)
	q      []float32 // the Q's P was computed with
	qNext  []float32 // with warm start: where decode writes Q̄ for the next step
}

func (x *lowRankExchanger) first() coder { return x.c }

func (x *lowRankExchanger) useMemory(gradEF, partEF *compress.ErrorFeedback) {
	x.c.ef, x.ef, x.warm = gradEF, gradEF, partEF
}

func (x *lowRankExchanger) setup(b *bucket) {
	pl := planLowRank(x.e.cfg.Shapes[b.idx], x.spec)
	lb := &lowRankBuffers{plan: pl, vals1: make([]float32, x.e.size+pl.PLen+pl.FlatLen),
		vals2: make([]float32, pl.QLen), qOwn: make([]float32, pl.QLen)}
	if !x.e.cfg.ErrorFeedback {
		lb.m = make([]float32, b.n)
	}
	// Both, small: an engine without the warm start's memory (warm=off,
	// or the cost model's scratch engine) draws Q into cold.
	lb.cold, lb.zero = make([]float32, pl.QLen), make([]float32, pl.QLen)
	b.lowRank = lb
}

// bufferBytes bounds what setup allocates for a bucket of n elements,
// with the warm start's memory: the P's, Q's and uncompressed elements
// hold at most n each (a tensor is compressed only when its factors are
// smaller than it), M's copy n.
func (x *lowRankExchanger) bufferBytes(n int) uint64 {
	return 4*uint64(x.e.size) + 4*6*uint64(n) + efBytesPerElement*uint64(n)
}

// linkCost is the time of bucket b's two all-reduces: the statuses, P's
// and uncompressed tensors, then the Q's.
func (x *lowRankExchanger) linkCost(m *costModel, b *bucket) float64 {
	pl, N := planLowRank(x.e.cfg.Shapes[b.idx], x.spec), x.e.size
	return m.link(allReduceVolume(N, 4*(N+pl.PLen+pl.FlatLen))) + m.link(allReduceVolume(N, 4*pl.QLen))
}

func (x *lowRankExchanger) encode(r *run) error {
	e, lb := x.e, r.b.lowRank
	lr := lowRankRun{m: lb.m}
	if x.ef != nil {
		s, res, p, err := x.ef.BeginResidual(r.grad, r.key)
		if err != nil {
			return err
		}
		r.pend1, lr.m, lr.res = p, s, res
	} else {
		copy(lb.m, r.grad)
		lr.res = lb.m
	}
	if x.warm != nil {
		q, next, p, err := x.warm.BeginResidual(lb.zero, r.key)
		if err != nil {
			return err
		}
		r.pend2, lr.q, lr.qNext = p, q, next
	} else {
		lr.q = lb.cold
	}
	r.lowRank = lr
	lb.plan.Encode(lb.vals1, lr.m, lr.q, x.warm == nil, e.size, e.rank, x.spec.Seed, r.key)
	return nil
}

func (x *lowRankExchanger) exchange(st *step, r *run) ([]status, error) {
	e, lb := x.e, r.b.lowRank
	if err := e.allReduce(st, r, "low-rank AllReduce (P)", lb.vals1); err != nil {
		return nil, err
	}
	sts := make([]status, e.size)
	for q, v := range lb.vals1[:e.size] {
		switch v {
		case 0:
		case 1:
			sts[q] = status{code: statusNonFinite, index: noIndex, value: float32(math.NaN())}
		default:
			return nil, &StepError{Step: st.num, Bucket: r.b.idx, Stage: "low-rank AllReduce (P)", Err: fmt.Errorf("rank %d's status is %v", q, v)}
		}
	}
	return sts, nil
}

// reduce orthogonalizes the summed P's and computes this rank's Q's.
func (x *lowRankExchanger) reduce(st *step, r *run) error {
	lb, lr := r.b.lowRank, r.lowRank
	t := time.Now()
	lb.plan.Reduce(lb.vals1, lr.m, lb.qOwn, lb.vals2, x.e.size)
	r.stats.Compress += time.Since(t)
	return nil
}

func (x *lowRankExchanger) exchange2(st *step, r *run) ([]status, error) {
	// No statuses: every rank's M was finite (or the first round's would
	// have sent the bucket dense) and P̂ is orthonormal, so the Q's are
	// finite; a sum that overflows shows in decode.
	none := func() ([]status, error) { return nil, nil }
	if err := x.e.allReduceLast(st, r, "low-rank AllReduce (Q)", r.b.lowRank.vals2, none); err != nil || r.tail != nil {
		return nil, err
	}
	return none()
}

// decode writes the average and the residual, and Q̄ for the next step.
func (x *lowRankExchanger) decode(r *run) (int, error) {
	lb, lr := r.b.lowRank, r.lowRank
	var qNext []float32
	if x.warm != nil {
		qNext = lr.qNext
	}
	return lb.plan.Decode(r.grad, lr.res, lr.m, lb.vals1, lb.vals2, lb.qOwn, qNext, x.e.size), nil
}
