package overlap

import (
	"context"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// devGather is sparse-gather and quantized all-gather on the device
// (Engine's gatherExchanger): every rank's slot of the whole bucket is
// all-gathered, and every rank decodes and adds the payloads in rank order
// (random-k: each rank's body under its own key), then divides by N.
type devGather struct{ e *DeviceEngine }

func (g devGather) buffers(bk *bucket, nb *devBuffers) []devAlloc {
	return g.e.slotBuffers(bk, nb, bk.n, 1, 0)
}

func (g devGather) encode(st *step, r *run) error { return g.e.encodeSlots(st, r, 1) }

func (g devGather) exchange(ctx context.Context, st *step, r *run) (func() error, error) {
	e, b := g.e, g.e.bufs[r.b.idx]
	return nil, inSequence(
		func() error { return e.dc.AllGather(ctx, b.recv, b.send, b.slot, e.wire) },
		func() error { return e.toDecode(b) },
		func() error { return g.decode(st, r) },
		func() error { return e.guardMax(b.recv, b.slot, e.guardAt(r.b.idx)) },
		func() error { return e.average(st, r, e.size, b.recv, b.slot) },
	)
}

// decode enqueues on the decode stream the sum of every rank's payload
// into the gradient, in rank order.
func (g devGather) decode(st *step, r *run) error {
	e, b := g.e, g.e.bufs[r.b.idx]
	bodies := e.bodies(b.recv, b.slot)
	if e.comp.Codec() != compress.CodecRandomK {
		return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: r.dgrad, N: r.b.n, Bodies: bodies})
	}
	// Each rank drew its random-k indices under its own key.
	for q, body := range bodies {
		a := kernels.DecodeArgs{Dst: r.dgrad, N: r.b.n, Add: q > 0, Bodies: []gpu.Ptr{body}, Key: e.key(st.num, r.b.idx, q, 0)}
		if err := e.dev.Decode(e.codec, e.dec, a); err != nil {
			return err
		}
	}
	return nil
}

func (g devGather) failures(r *run) (string, error) {
	b := g.e.bufs[r.b.idx]
	return g.e.slotFailures(b.recv, b.slot, "rank %d has %v")
}

func (g devGather) volumes(b *bucket) []int64 {
	return []int64{allGatherVolume(g.e.size, g.e.slotLen(b.n))}
}
