package overlap

import (
	"context"
	"fmt"
	"strings"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// devPath is one way a bucket goes through the device engine's streams in
// a step: the dense all-reduce (devDense) or the strategy's compressed
// path (devExchanger). encode runs on the encode stream between the
// bucket's encode events; exchange once the wire stream waits for the
// encode's end and recorded the exchange's start (launch).
type devPath interface {
	// encode enqueues run r's work on the encode stream after momentum
	// correction: its compression (dense: a flush's, if any).
	encode(st *step, r *run) error
	// exchange enqueues run r's collectives on the wire stream and its
	// decode and average on the decode stream, up to the bucket's
	// decode-end event, ctx bounding the launches. A path whose last round
	// waits for the next bucket's launch (low-rank's) returns the function
	// that enqueues it, else nil.
	exchange(ctx context.Context, st *step, r *run) (second func() error, err error)
	// volumes returns the bytes this rank sends in each of bucket b's
	// collectives on this path (the package doc's formulas with the
	// device's slots).
	volumes(b *bucket) []int64
}

// devExchanger is a strategy's compressed path on the device, as
// exchanger is Engine's: chosen once for the engine (newExchanger), it is
// a devPath, the buffers it needs, and how it finds the ranks whose
// statuses failed.
type devExchanger interface {
	devPath
	// buffers sets nb's sizes (slots, low-rank's layout) for bucket bk in
	// the active schedule phase and returns the buffers prepare
	// allocates into nb.
	buffers(bk *bucket, nb *devBuffers) []devAlloc
	// failures says which ranks made run r's exchange fail (its
	// average's status reports a failed slot), reading their statuses.
	failures(r *run) (string, error)
}

// newExchanger returns the compressed path of the engine's strategy
// (mechanism), nil for codec none.
func (e *DeviceEngine) newExchanger() devExchanger {
	switch {
	case e.comp == nil:
		return nil
	case e.lowRank != nil:
		return devLowRank{e}
	case e.mech == StrategyQuantSRA:
		return devSRA{e}
	case e.mech == StrategySharedIndex:
		return devShared{e}
	}
	return devGather{e}
}

// path returns run r's path this step: the compressed one, or the dense
// all-reduce.
func (e *DeviceEngine) path(r *run) devPath {
	if r.compressed {
		return e.x
	}
	return devDense{e}
}

// deviceStrategy resolves s as Engine does (resolve) and refuses, by name,
// what the device cannot run: StrategyHier's two-level shape, and SRA for
// random-k.
func deviceStrategy(s Strategy, c compress.Codec, size int) (Strategy, error) {
	r, err := resolve(s, c, size)
	switch {
	case err != nil:
		return 0, err
	case r == StrategyHier && mechanism(r, c, size) != StrategyHier:
		return 0, fmt.Errorf("strategy hier with %s is not available on the device: it exchanges over two-level collectives, which the device does not have (use the flat strategy)", c)
	case r == StrategyQuantSRA && c == compress.CodecRandomK:
		return 0, fmt.Errorf("strategy sra with random-k is not available on the device (its parts' indices differ by rank; use shared-index)")
	}
	return r, nil
}

// newCodecs makes the device codec of every schedule phase (of Spec
// without a Schedule) and makes the first phase's active.
func (e *DeviceEngine) newCodecs() error {
	comps := []compress.Compressor{e.comp}
	if e.phases != nil {
		comps = comps[:0]
		for _, ph := range e.phases {
			comps = append(comps, ph.comp)
		}
	}
	for _, c := range comps {
		k, err := kernels.NewCodec(c.Spec())
		if err != nil {
			return err
		}
		e.codecs = append(e.codecs, k)
	}
	e.codec = e.codecs[0]
	return nil
}

// usePhase makes the core's active schedule phase's codec the one the
// kernels run; each bucket's slots and workspaces follow when it next
// takes the compressed path (prepare), its memories carry over.
func (e *DeviceEngine) usePhase() { e.codec = e.codecs[e.active] }

// inSequence runs ops, launches on the device's streams, in order, and
// returns the first failure, after which it runs none.
func inSequence(ops ...func() error) error {
	for _, f := range ops {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// handOver records ev on stream from and makes stream to wait for it.
func (e *DeviceEngine) handOver(ev gpu.Event, from, to gpu.Stream) error {
	if err := e.dev.Record(ev, from); err != nil {
		return err
	}
	return e.dev.WaitEvent(to, ev)
}

// toDecode ends bucket b's exchange on the wire stream (its xEnd event)
// and starts its decode on the decode stream after it (decBeg).
func (e *DeviceEngine) toDecode(b *devBuffers) error {
	if err := e.handOver(b.xEnd, e.wire, e.dec); err != nil {
		return err
	}
	return e.dev.Record(b.decBeg, e.dec)
}

// average enqueues on the decode stream the end of run r's decode: the
// division of its gradient by ranks (kernels.Average), which checks the
// statuses of e.size gathered slots stride bytes apart from slots (0:
// none, the dense all-reduce) and writes the bucket's status; the decode's
// end event; and, on the compressed path of a sparse codec with
// MomentumMasking and error feedback, the velocity's masking.
func (e *DeviceEngine) average(st *step, r *run, ranks int, slots gpu.Ptr, stride int) error {
	i, n, b := r.b.idx, r.b.n, e.bufs[r.b.idx]
	avg := kernels.AverageArgs{Dst: r.dgrad, N: n, Ranks: ranks, Out: e.statuses + gpu.Ptr(kernels.StatusLen*i)}
	if slots != 0 {
		avg.Slots, avg.Stride, avg.Count = slots, stride, e.size
	}
	if err := e.dev.Average(e.dec, avg); err != nil {
		return err
	}
	if err := e.dev.Record(b.decEnd, e.dec); err != nil {
		return err
	}
	if !r.compressed || !e.cfg.MomentumMasking || !e.cfg.ErrorFeedback || !e.sparse() {
		return nil
	}
	// Momentum factor masking, on the velocity settle installs, where
	// the error-feedback memory's Commit applies (Average's status
	// clean): as Engine's Pending.CommitMasked.
	return e.dev.Mask(e.codec, e.dec, kernels.MaskArgs{U: b.next, N: n, Body: b.send + gpu.Ptr(e.slotHead()),
		Key: e.key(st.num, i, e.rank, 0), Gate: avg.Out})
}

// encodeSlots enqueues run r's stage-1 compression on the encode stream:
// count parts of the bucket (SRA's, one per rank; else the whole bucket),
// each into its slot of the send buffer under its own key, error
// feedback fused; with Config.Guard, ρ of the whole bucket in every
// part's slot (as Engine); with Config.FeedbackDecay, then, the decay of
// the residual settle installs (decay).
func (e *DeviceEngine) encodeSlots(st *step, r *run, count int) error {
	i, n := r.b.idx, r.b.n
	b := e.bufs[i]
	for j := range count {
		lo, hi := 0, n
		if count > 1 {
			lo, hi = e.part.bounds(n, j)
		}
		slot := b.send + gpu.Ptr(j*b.slot)
		off := gpu.Ptr(4 * lo)
		a := kernels.EncodeArgs{Body: slot + gpu.Ptr(e.slotHead()), Grad: r.dgrad + off, Work: b.work,
			Status: slot, N: hi - lo, Key: e.key(st.num, i, e.rank, j)}
		if e.cfg.ErrorFeedback {
			a.Resid, a.ResidOut = b.resid.Ptr()+off, b.resid.Out()+off
		}
		if err := e.dev.Encode(e.codec, e.enc, a); err != nil {
			return err
		}
	}
	if e.cfg.Guard > 0 {
		a := kernels.GuardArgs{Resid: b.resid.Out(), Grad: r.dgrad, N: n, Dst: b.send + kernels.StatusLen, Stride: b.slot, Count: count}
		if err := e.dev.Guard(e.enc, a); err != nil {
			return err
		}
	}
	return e.decay(e.enc, r)
}

// decay enqueues on stream s, with Config.FeedbackDecay, the product of
// the residual run r's compression wrote (its stage-1 memory's Out, which
// settle installs after a step delivered compressed, and which is
// dropped otherwise) by float32(β) (kernels.Scale: Engine's
// compress.Pending.Scale, bit for bit). SRA's second memory is not
// decayed (Config.FeedbackDecay).
func (e *DeviceEngine) decay(s gpu.Stream, r *run) error {
	c, ok := e.cfg.decaying()
	b := e.bufs[r.b.idx]
	if !ok || b.resid == nil {
		return nil
	}
	return e.dev.Scale(s, kernels.ScaleArgs{X: b.resid.Out(), N: r.b.n, C: c})
}

// slotBuffers sets nb's slot for stage-1 payloads of unit elements and
// returns bucket bk's stage-1 buffers: sends slots to send, e.size blocks
// of recvStride bytes to receive (0: a slot each), the Encode workspace,
// and with error feedback the memory (zeroed, with the buffer Encode
// writes the new residual to).
func (e *DeviceEngine) slotBuffers(bk *bucket, nb *devBuffers, unit, sends, recvStride int) []devAlloc {
	nb.slot = e.slotLen(unit)
	if recvStride == 0 {
		recvStride = nb.slot
	}
	ws, ef := e.codec.WorkspaceLen(unit), e.cfg.ErrorFeedback
	return []devAlloc{
		devBuf(&nb.send, sends*nb.slot, true),
		devBuf(&nb.recv, e.size*recvStride, true),
		devBuf(&nb.work, ws, ws > 0),
		devMem(&nb.resid, bk.n, ef),
	}
}

// bodies returns the bodies of e.size slots, slot bytes apart from base.
func (e *DeviceEngine) bodies(base gpu.Ptr, slot int) []gpu.Ptr {
	out := make([]gpu.Ptr, e.size)
	for q := range out {
		out[q] = base + gpu.Ptr(q*slot+e.slotHead())
	}
	return out
}

// slotFailures reads the statuses of e.size gathered slots, stride bytes
// apart from base, and names the failed ones (what formats one from the
// rank and its status's error).
func (e *DeviceEngine) slotFailures(base gpu.Ptr, stride int, what string) (string, error) {
	var bad []string
	for q := range e.size {
		slot := make([]byte, kernels.StatusLen)
		if err := e.dev.CopyOut(e.dec, slot, base+gpu.Ptr(q*stride)); err != nil {
			return "", err
		}
		if err := kernels.StatusError(slot); err != nil {
			bad = append(bad, fmt.Sprintf(what, q, err))
		}
	}
	return "gradient set to NaN on every rank: " + strings.Join(bad, ", "), nil
}

// key returns the compress.Key of rank q's stage-1 payload of part j of
// bucket i (j = 0 for the gather strategies): Engine's keys (tag 1 +
// q·N + j), or tag 0 on every rank for shared-index, whose random-k
// indices must agree.
func (e *DeviceEngine) key(step uint64, i, q, j int) compress.Key {
	tag := uint64(1 + q*e.size + j)
	if e.mech == StrategySharedIndex {
		tag = 0
	}
	return compress.Key{Bucket: tag<<32 | uint64(i), Step: step}
}

// key2 returns the key of this rank's SRA stage-2 payload of bucket i
// (tag 1 + N² + rank, as Engine).
func (e *DeviceEngine) key2(step uint64, i int) compress.Key {
	return compress.Key{Bucket: uint64(1+e.size*e.size+e.rank)<<32 | uint64(i), Step: step}
}

// slotHead returns the bytes of a payload slot before its body: the
// Encode status, and with Config.Guard the guard block.
func (e *DeviceEngine) slotHead() int {
	if e.cfg.Guard > 0 {
		return kernels.StatusLen + kernels.GuardLen
	}
	return kernels.StatusLen
}

// guardMax enqueues on the decode stream, with Config.Guard, the largest
// ρ of the guard blocks of e.size gathered slots (slot bytes apart from
// slots) into the guard block dst.
func (e *DeviceEngine) guardMax(slots gpu.Ptr, slot int, dst gpu.Ptr) error {
	if e.cfg.Guard == 0 {
		return nil
	}
	return e.dev.GuardMax(e.dec, kernels.GuardMaxArgs{Src: slots + kernels.StatusLen, Stride: slot, Count: e.size, Dst: dst})
}

// sparse reports whether the active codec sends an index set (top-k,
// random-k).
func (e *DeviceEngine) sparse() bool {
	c := e.comp.Codec()
	return c == compress.CodecTopK || c == compress.CodecRandomK
}

// guardAt returns bucket i's block of the guards: the largest ρ over the
// ranks.
func (e *DeviceEngine) guardAt(i int) gpu.Ptr { return e.guards + gpu.Ptr(kernels.GuardLen*i) }
