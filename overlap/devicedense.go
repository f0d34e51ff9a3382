package overlap

import (
	"context"

	"github.com/gradcomp/gradcomp/kernels"
)

// devDense is the dense path on the device: a float32 all-reduce of the
// gradient in place, then the division by N (kernels.Average, which finds
// a non-finite average). A flush (the accuracy guard's) takes it with e + g,
// which its encode writes into the gradient (kernels.Flush, which also
// writes a zeroed residual for settle to install).
type devDense struct{ e *DeviceEngine }

func (d devDense) encode(_ *step, r *run) error {
	if !r.flush {
		return nil
	}
	e, b := d.e, d.e.bufs[r.b.idx]
	return e.dev.Flush(e.enc, kernels.FlushArgs{Grad: r.dgrad, Resid: b.resid.Ptr(), ResidOut: b.resid.Out(), N: r.b.n})
}

func (d devDense) exchange(ctx context.Context, st *step, r *run) (func() error, error) {
	e, b := d.e, d.e.bufs[r.b.idx]
	return nil, inSequence(
		func() error { return e.dc.AllReduce(ctx, r.dgrad, r.b.n, e.wire) },
		func() error { return e.toDecode(b) },
		func() error { return e.average(st, r, e.size, 0, 0) },
	)
}

func (d devDense) volumes(b *bucket) []int64 { return []int64{allReduceVolume(d.e.size, 4*b.n)} }
