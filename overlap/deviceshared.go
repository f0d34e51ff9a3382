package overlap

import (
	"context"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// devShared is shared-index on the device (Engine's sharedExchanger):
// random-k under tag 0 on every rank, so the k indices agree. An
// all-gather of every rank's status (and guard) block, then the sum of
// the k values in place in send (an all-reduce), which every rank
// scatters to the indices and divides by N. Engine puts the statuses in
// front of the values, in one collective.
type devShared struct{ e *DeviceEngine }

func (s devShared) buffers(bk *bucket, nb *devBuffers) []devAlloc {
	// recv holds every rank's status (and guard) block; the values are
	// summed in send.
	return s.e.slotBuffers(bk, nb, bk.n, 1, s.e.slotHead())
}

func (s devShared) encode(st *step, r *run) error { return s.e.encodeSlots(st, r, 1) }

func (s devShared) exchange(ctx context.Context, st *step, r *run) (func() error, error) {
	e, i, n := s.e, r.b.idx, r.b.n
	b := e.bufs[i]
	head, vals := e.slotHead(), b.send+gpu.Ptr(e.slotHead())
	return nil, inSequence(
		func() error { return e.dc.AllGather(ctx, b.recv, b.send, head, e.wire) },
		func() error { return e.dc.AllReduce(ctx, vals, e.codec.BodyLen(n)/4, e.wire) },
		func() error { return e.toDecode(b) },
		func() error {
			return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: r.dgrad, N: n, Bodies: []gpu.Ptr{vals}, Key: e.key(st.num, i, e.rank, 0)})
		},
		func() error { return e.guardMax(b.recv, head, e.guardAt(i)) },
		func() error { return e.average(st, r, e.size, b.recv, head) },
	)
}

func (s devShared) failures(r *run) (string, error) {
	return s.e.slotFailures(s.e.bufs[r.b.idx].recv, s.e.slotHead(), "rank %d has %v")
}

func (s devShared) volumes(b *bucket) []int64 {
	return []int64{allGatherVolume(s.e.size, s.e.slotHead()), allReduceVolume(s.e.size, s.e.codec.BodyLen(b.n))}
}
