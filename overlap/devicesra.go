package overlap

import (
	"context"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// devSRA is scatter-reduce-allgather on the device (Engine's
// sraExchanger; also dense for fp16/bf16): each of the N parts of the
// bucket encoded under its own key, an all-to-all of the part slots, on
// each part's owner the decode-and-add, the division and the stage-2
// encode (its own memory) on the decode stream, an all-gather of the
// stage-2 slots, their decode.
type devSRA struct{ e *DeviceEngine }

func (s devSRA) buffers(bk *bucket, nb *devBuffers) []devAlloc {
	e := s.e
	unit, sends := e.unit(bk.n)
	lo, hi := e.part.bounds(bk.n, e.rank)
	mine, ws, mem2 := 4*max(hi-lo, 1), e.codec.WorkspaceLen(unit), e.mem2 != nil
	nb.slot2 = e.slotLen(unit)
	return append(e.slotBuffers(bk, nb, unit, sends, 0),
		devBuf(&nb.mid, mine, true),
		devBuf(&nb.send2, nb.slot2, true),
		devBuf(&nb.recv2, e.size*nb.slot2, true),
		devBuf(&nb.work2, ws, ws > 0),
		devMem(&nb.resid2, hi-lo, mem2),
	)
}

func (s devSRA) encode(st *step, r *run) error { return s.e.encodeSlots(st, r, s.e.size) }

func (s devSRA) exchange(ctx context.Context, st *step, r *run) (func() error, error) {
	e, i, n := s.e, r.b.idx, r.b.n
	b := e.bufs[i]
	ops := []func() error{
		func() error { return e.dc.AllToAll(ctx, b.recv, b.send, e.size*b.slot, e.wire) },
		func() error { return e.handOver(b.xMid, e.wire, e.dec) },
		func() error { return s.reduce(st, r) },
		func() error { return e.handOver(b.midEnd, e.dec, e.wire) },
		func() error { return e.dc.AllGather(ctx, b.recv2, b.send2, b.slot2, e.wire) },
		func() error { return e.toDecode(b) },
	}
	for j, body := range e.bodies(b.recv2, b.slot2) {
		lo, hi := e.part.bounds(n, j)
		ops = append(ops, func() error {
			return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: r.dgrad + gpu.Ptr(4*lo), N: hi - lo, Bodies: []gpu.Ptr{body}})
		})
	}
	ops = append(ops,
		func() error { return e.guardMax(b.recv2, b.slot2, e.guardAt(i)) },
		func() error { return e.average(st, r, 1, b.recv2, b.slot2) })
	return nil, inSequence(ops...)
}

// reduce enqueues the owner's work on the decode stream, between the
// collectives: this rank's part decoded from every rank's slot and added,
// averaged (its own status), every rank's stage-1 ρ forwarded in the
// stage-2 slot, and the part encoded again (its own memory) into send2.
func (s devSRA) reduce(st *step, r *run) error {
	e, i := s.e, r.b.idx
	b := e.bufs[i]
	lo, hi := e.part.bounds(r.b.n, e.rank)
	enc := kernels.EncodeArgs{Body: b.send2 + gpu.Ptr(e.slotHead()), Grad: b.mid, Work: b.work2, Status: b.send2,
		N: hi - lo, Key: e.key2(st.num, i)}
	if e.mem2 != nil {
		enc.Resid, enc.ResidOut = b.resid2.Ptr(), b.resid2.Out()
	}
	return inSequence(
		func() error {
			return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: b.mid, N: hi - lo, Bodies: e.bodies(b.recv, b.slot)})
		},
		func() error {
			return e.dev.Average(e.dec, kernels.AverageArgs{Dst: b.mid, N: hi - lo, Ranks: e.size, Slots: b.recv,
				Stride: b.slot, Count: e.size, Out: e.midStatuses + gpu.Ptr(kernels.StatusLen*i)})
		},
		func() error { return e.guardMax(b.recv, b.slot, b.send2+kernels.StatusLen) },
		func() error { return e.dev.Encode(e.codec, e.dec, enc) },
	)
}

func (s devSRA) failures(r *run) (string, error) {
	b := s.e.bufs[r.b.idx]
	return s.e.slotFailures(b.recv2, b.slot2, "rank %d's part of the sum has %v")
}

func (s devSRA) volumes(b *bucket) []int64 {
	unit, _ := s.e.unit(b.n)
	slot := s.e.slotLen(unit)
	return []int64{allToAllVolume(s.e.size, s.e.size*slot), allGatherVolume(s.e.size, slot)}
}
