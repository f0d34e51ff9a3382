package overlap

import (
	"context"
	"fmt"
	"strings"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/kernels"
)

// devLowRank is PowerSGD on the device (Engine's lowRankExchanger,
// compress/lowrank's round on the bucket's lowrank.Layout):
// kernels.LowRankEncode on the encode stream (M = e + g, P = M·Q, the
// ranks' statuses); a first round, the all-reduce of the statuses, P's and
// uncompressed tensors, then kernels.LowRankReduce on the decode stream
// (orthogonalization, this rank's Q's); a second, the all-reduce of the
// Q's, then kernels.LowRankDecode (the average, the residual, the next
// warm start Q̄, the status). launch holds the second round until the
// next bucket's first.
type devLowRank struct{ e *DeviceEngine }

// buffers lays the bucket out (see devBuffers: send and recv are the two
// all-reduces' buffers), its memories zeroed.
func (x devLowRank) buffers(bk *bucket, nb *devBuffers) []devAlloc {
	e := x.e
	l := planLowRank(e.cfg.Shapes[bk.idx], *e.lowRank)
	ef, warm := e.cfg.ErrorFeedback, e.mem2 != nil
	q := 4 * max(l.QLen, 4) // a bucket without matrices still has (unused) Q buffers
	nb.layout = l
	return []devAlloc{
		devBuf(&nb.send, 4*(e.size+l.PLen+l.FlatLen), true),
		devBuf(&nb.recv, q, true),
		devBuf(&nb.qOwn, q, true),
		devBuf(&nb.q, q, true),
		devBuf(&nb.work, kernels.LowRankWorkspaceLen(l), true),
		devMem(&nb.resid, bk.n, ef),
		devBuf(&nb.m, 4*bk.n, !ef),
		devMem(&nb.resid2, l.QLen, warm),
	}
}

// lowRankArgs returns run r's kernels.LowRankArgs: bucket buffers as
// settle last swapped them.
func (e *DeviceEngine) lowRankArgs(r *run) kernels.LowRankArgs {
	b := e.bufs[r.b.idx]
	a := kernels.LowRankArgs{Layout: b.layout, Ranks: e.size, Rank: e.rank, Grad: r.dgrad, M: b.m,
		Vals1: b.send, Vals2: b.recv, QOwn: b.qOwn, Q: b.q, Warm: b.resid2.Ptr(), QNext: b.resid2.Out(), Work: b.work,
		Seed: e.lowRank.Seed, Key: r.key, Out: e.statuses + gpu.Ptr(kernels.StatusLen*r.b.idx)}
	if e.cfg.ErrorFeedback {
		a.Resid, a.M = b.resid.Ptr(), b.resid.Out()
	}
	return a
}

func (x devLowRank) encode(_ *step, r *run) error {
	return x.e.dev.LowRankEncode(x.e.enc, x.e.lowRankArgs(r))
}

// exchange enqueues run r's first round — the all-reduce of the statuses,
// P's and uncompressed elements, then on the decode stream the
// orthogonalization and this rank's Q's (kernels.LowRankReduce) — and
// returns the function that enqueues its second: the all-reduce of the
// Q's, then the average, residual and status (kernels.LowRankDecode).
func (x devLowRank) exchange(ctx context.Context, _ *step, r *run) (func() error, error) {
	e, b := x.e, x.e.bufs[r.b.idx]
	a, l := e.lowRankArgs(r), b.layout
	err := inSequence(
		func() error { return e.dc.AllReduce(ctx, a.Vals1, e.size+l.PLen+l.FlatLen, e.wire) },
		func() error { return e.handOver(b.xMid, e.wire, e.dec) },
		func() error { return e.dev.LowRankReduce(e.dec, a) },
		func() error { return e.dev.Record(b.midEnd, e.dec) },
	)
	if err != nil {
		return nil, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
		defer cancel()
		return inSequence(
			func() error { return e.dev.WaitEvent(e.wire, b.midEnd) },
			func() error { return e.dc.AllReduce(ctx, a.Vals2, l.QLen, e.wire) },
			func() error { return e.toDecode(b) },
			func() error { return e.dev.LowRankDecode(e.dec, a) },
			func() error { return e.decay(e.dec, r) }, // the residual M − P̂·Qᵀ, with error feedback
			func() error { return e.dev.Record(b.decEnd, e.dec) },
		)
	}, nil
}

func (x devLowRank) failures(r *run) (string, error) {
	// The ranks' statuses lead the first all-reduce's buffer.
	st := make([]float32, x.e.size)
	if err := x.e.dev.CopyOut(x.e.dec, f32.Bytes(st), x.e.bufs[r.b.idx].send); err != nil {
		return "", err
	}
	var bad []string
	for q, v := range st {
		if v != 0 {
			bad = append(bad, fmt.Sprintf("rank %d", q))
		}
	}
	return "gradient set to NaN on every rank: a gradient (with its error feedback) holds NaN or Inf on " + strings.Join(bad, ", "), nil
}

// volumes are the two all-reduces': the statuses, P's and uncompressed
// tensors, then the Q's.
func (x devLowRank) volumes(b *bucket) []int64 {
	e := x.e
	l := planLowRank(e.cfg.Shapes[b.idx], *e.lowRank)
	return []int64{allReduceVolume(e.size, 4*(e.size+l.PLen+l.FlatLen)), allReduceVolume(e.size, 4*l.QLen)}
}
