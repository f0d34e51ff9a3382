package overlap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/kernels"
)

// Device is what the device engine needs of a GPU: memory, streams,
// events, and the kernels of package kernels enqueued on a stream. CUDA
// gives the one over a kernels.Context; tests use a fake. Every method but
// EventQuery, CopyIn and CopyOut only enqueues work (or creates or
// destroys a handle) and never waits for the device; their contracts are
// kernels.Context's of the same names, and Encode, Decode, Average,
// Momentum, Mask, Guard, GuardMax and Flush are kernels.Codec.Encode,
// kernels.Codec.Decode, kernels.Average, kernels.Momentum,
// kernels.Codec.Mask, kernels.Guard, kernels.GuardMax and kernels.Flush;
// LowRankEncode, LowRankReduce and LowRankDecode are kernels'.
type Device interface {
	Alloc(bytes int) (gpu.Ptr, error)
	Free(p gpu.Ptr) error
	CopyIn(s gpu.Stream, dst gpu.Ptr, src []byte) error
	CopyOut(s gpu.Stream, dst []byte, src gpu.Ptr) error
	NewStream() (gpu.Stream, error)
	DestroyStream(s gpu.Stream) error
	NewEvent(timing bool) (gpu.Event, error)
	DestroyEvent(e gpu.Event) error
	Record(e gpu.Event, s gpu.Stream) error
	WaitEvent(s gpu.Stream, e gpu.Event) error
	EventQuery(e gpu.Event) (bool, error)
	Elapsed(start, end gpu.Event) (time.Duration, error)
	Copy(s gpu.Stream, dst, src gpu.Ptr, bytes int) error
	Encode(c *kernels.Codec, s gpu.Stream, a kernels.EncodeArgs) error
	Decode(c *kernels.Codec, s gpu.Stream, a kernels.DecodeArgs) error
	Average(s gpu.Stream, a kernels.AverageArgs) error
	Momentum(s gpu.Stream, a kernels.MomentumArgs) error
	Mask(c *kernels.Codec, s gpu.Stream, a kernels.MaskArgs) error
	Guard(s gpu.Stream, a kernels.GuardArgs) error
	GuardMax(s gpu.Stream, a kernels.GuardMaxArgs) error
	Flush(s gpu.Stream, a kernels.FlushArgs) error
	LowRankEncode(s gpu.Stream, a kernels.LowRankArgs) error
	LowRankReduce(s gpu.Stream, a kernels.LowRankArgs) error
	LowRankDecode(s gpu.Stream, a kernels.LowRankArgs) error
}

// CUDA returns the Device of a kernels.Context (its primary context, so
// PyTorch's pointers and streams are valid in it). In a build without the
// cuda tag no Context can be opened.
func CUDA(ctx *kernels.Context) Device { return cudaDevice{ctx} }

type cudaDevice struct{ *kernels.Context }

func (d cudaDevice) Encode(c *kernels.Codec, s gpu.Stream, a kernels.EncodeArgs) error {
	return c.Encode(d.Context, s, a)
}

func (d cudaDevice) Decode(c *kernels.Codec, s gpu.Stream, a kernels.DecodeArgs) error {
	return c.Decode(d.Context, s, a)
}

func (d cudaDevice) Average(s gpu.Stream, a kernels.AverageArgs) error {
	return kernels.Average(d.Context, s, a)
}

func (d cudaDevice) Momentum(s gpu.Stream, a kernels.MomentumArgs) error {
	return kernels.Momentum(d.Context, s, a)
}

func (d cudaDevice) Mask(c *kernels.Codec, s gpu.Stream, a kernels.MaskArgs) error {
	return c.Mask(d.Context, s, a)
}

func (d cudaDevice) Guard(s gpu.Stream, a kernels.GuardArgs) error {
	return kernels.Guard(d.Context, s, a)
}

func (d cudaDevice) GuardMax(s gpu.Stream, a kernels.GuardMaxArgs) error {
	return kernels.GuardMax(d.Context, s, a)
}

func (d cudaDevice) Flush(s gpu.Stream, a kernels.FlushArgs) error {
	return kernels.Flush(d.Context, s, a)
}

func (d cudaDevice) LowRankEncode(s gpu.Stream, a kernels.LowRankArgs) error {
	return kernels.LowRankEncode(d.Context, s, a)
}

func (d cudaDevice) LowRankReduce(s gpu.Stream, a kernels.LowRankArgs) error {
	return kernels.LowRankReduce(d.Context, s, a)
}

func (d cudaDevice) LowRankDecode(s gpu.Stream, a kernels.LowRankArgs) error {
	return kernels.LowRankDecode(d.Context, s, a)
}

// ErrBadPointer is a *UsageError's Err for a null or misaligned device
// pointer.
var ErrBadPointer = errors.New("device pointer is null or not 4-byte aligned")

// DeviceEngine is the engine on the CUDA backend: the engine core of
// Engine (the step protocol Step, Ready per bucket, Wait; the handshake;
// pinned decisions and warm-up; the statistics; the state format), with
// gradients in device memory and every stage enqueued on the engine's own
// streams, so neither the caller's stream nor the host waits for
// gradcomp's work unless asked.
//
// # Pipeline
//
// Ready(i, grad, s) records an event on the caller's stream s (the
// gradient is complete once s reaches it) and returns. The engine's encode
// stream waits for that event, applies momentum correction
// (Config.Momentum: kernels.Momentum turns grad into m·u + g and keeps
// that in a second buffer, installed as u by a swap when the step
// succeeded and it is finite) and compresses the bucket (error feedback
// fused: the kernel reads the memory e and writes the new residual to a
// second buffer, installed by a swap only when the step succeeds; with
// MomentumMasking the decode stream zeroes the new u where a top-k or
// random-k payload sent, kernels.Codec.Mask, when the residual is). The
// wire stream, in bucket order on every rank (bucket i once buckets 0..i
// are ready, as Engine), waits for the encode and enqueues the bucket's
// collective on the comm.DeviceComm; the decode stream waits for it,
// decodes and adds every rank's payload in rank order into grad and
// averages (kernels.Average). After the last bucket the decode stream
// records the step's done event. Done(s) makes the caller's stream wait
// for it (before the optimizer) without blocking the host; Wait blocks the
// host until it, bounded by ctx and the DeviceComm's timeout (which aborts
// the communicator), then settles error-feedback memory and returns the
// statistics (stage times measured with device events).
//
// # Strategies
//
// Codec none: a float32 all-reduce in place (StrategyDense). Every other
// codec exchanges fixed-size slots (a 16-byte Encode status, with
// Config.Guard a 16-byte guard block, then the body, padded to 16 bytes).
// The strategies are Engine's, resolved alike (StrategyAuto included), and
// each runs Engine's mechanism (see mechanism):
//
//	sparse-gather,  all-gather of the slots, decode and add in rank order
//	allgather       (random-k: each rank's body under its own key), divide
//	                by N
//	shared-index    random-k under tag 0 on every rank: an all-gather of
//	                the status (and guard) blocks, an all-reduce of the k
//	                values in place, their scatter to the shared indices,
//	                the division
//	sra, and dense  each part encoded under its own key, an all-to-all of
//	for fp16/bf16   the part slots, on each part's owner the decode-and-add,
//	                the division and the stage-2 encode (its own memory),
//	                an all-gather of the stage-2 slots, their decode
//
//	low-rank        PowerSGD (powersgd): kernels.LowRankEncode on the
//	                encode stream (M = e + g, P = M·Q, the ranks'
//	                statuses), an all-reduce of the statuses, P's and
//	                uncompressed tensors, kernels.LowRankReduce on the
//	                decode stream (orthogonalization, this rank's Q's),
//	                an all-reduce of the Q's, kernels.LowRankDecode (the
//	                average, the residual, the next warm start Q̄, the
//	                status): compress/lowrank's round (lowrank.Layout).
//	                The Q's all-reduce is enqueued after the next
//	                bucket's first one (launch), so a bucket's
//	                Exchange time spans that one too
//
// Each gives bit for bit the result and error-feedback memory of Engine
// with the same strategy (the package doc's definitions), with the same
// payload keys; shared-index sends its statuses in a collective of their
// own, where Engine's put them in front of the values. StrategyHier's
// sharded shape runs on the device too (devicehier.go: node stages on a
// stream of their own, a DeviceEngine across nodes, over a DeviceComm
// that splits, comm.DeviceSplitter); the device refuses its two-level
// shape (top-k, random-k, powersgd) and SRA for random-k by name.
//
// # Accuracy guard
//
// With Config.Guard, after the stage-1 encode kernels.Guard computes the
// bucket's ρ = ‖e'‖/‖g‖ (e' the residual Encode wrote, g the gradient
// after momentum correction; float64, kernels.GuardRatio's fixed order)
// into the guard block of each of its slots; the decode stream takes the
// largest of the gathered blocks (kernels.GuardMax; under SRA each owner
// first forwards the largest stage-1 ρ it received in its stage-2 slot),
// which Wait reads as BucketStats.HeldBack, the same on every rank, so
// the core's decision is too. A flush (the bucket's next compressed step
// after ρ passed Guard) is the dense all-reduce of e + g (kernels.Flush,
// which also writes a zeroed residual); when its average is finite the
// zeroed residual is installed, otherwise, and on a failed or skipped
// step, e stays and the flush stays pending. Engine's ρ sums in index
// order (for sparse codecs ‖s‖² less the kept squares), so the two
// backends' ρ agree within rounding, not bit for bit (see Config.Guard).
// SRA for random-k is not on the device (ConfigError). DecideAuto runs
// Engine's cost model (devicecost.go: the link probed with all-reduces on
// the DeviceComm, the device's own kernels timed by its events, the
// device slots' collectives), then the online verification Engine runs,
// timed by the events between a bucket's encode start and its decode
// end; DecideDense pins the dense all-reduce. Warm-up steps
// (Config.Warmup) are dense, as on Engine. A compression warm-up (Config.Schedule) changes the codec at
// each phase's first step (every phase's kernels.Codec is made by
// NewDevice); a bucket's slots and workspaces are made again for it when
// the bucket next takes the compressed path, and its error-feedback
// memories carry over. Stage times: Compress is stage-1 encoding,
// Exchange runs from the first collective's start to the last one's end
// (SRA: the owner's work between them included), Decompress the final
// decode and average.
//
// # Failures
//
// A NaN or ±Inf (or a value the codec cannot represent) on any rank is
// seen on the device by kernels.Average through the gathered statuses
// (low-rank: by kernels.LowRankDecode through the summed ones): the
// bucket's gradient becomes NaN on every rank (Engine instead re-exchanges
// it dense; the device engine does not keep g), so a NaN-checking
// optimizer (AMP) skips the step; its error-feedback memory keeps e. Wait
// reports it in BucketStats (NonFinite, Reason), or returns a
// *NonFiniteStepError with Config.FailOnNonFinite: then the caller skips the
// step, and so does every bucket's memory and momentum velocity (as on
// Engine); the engine stays usable. Under SRA a bad part reaches the other ranks
// through its owner's stage-2 status. A dense bucket whose average is
// non-finite is reported the same way. A
// collective that does not finish ends Wait with a *StepError within the
// DeviceComm's timeout (or ctx); a launch that fails ends the step at
// once (Ready returns the *StepError). Such a step breaks the engine
// (*BrokenError afterwards) and leaves every error-feedback memory holding
// e, and every momentum velocity u: unlike Engine, the step's gradients
// are lost, since the device no longer holds them separately.
type DeviceEngine struct {
	*core
	dev   Device
	dc    comm.DeviceComm
	codec *kernels.Codec // the active schedule phase's (Spec's without a Schedule); nil for codec none
	// codecs are every phase's codecs, by the core's phase index (Spec's
	// alone without a Schedule).
	codecs []*kernels.Codec

	enc, wire, dec gpu.Stream
	statuses       gpu.Ptr      // kernels.StatusLen per bucket: the averages' Out blocks
	midStatuses    gpu.Ptr      // the same for SRA's averages of this rank's parts
	momStatuses    gpu.Ptr      // Config.Momentum: the same for each bucket's kernels.Momentum
	guards         gpu.Ptr      // Config.Guard: kernels.GuardLen per bucket, the largest ρ over the ranks
	part           parts        // SRA's partition of a bucket (count: the world size)
	done           gpu.Event    // the step's end, on the decode stream
	mark           gpu.Event    // the cost model's waits (sync)
	timed          [2]gpu.Event // the cost model's stage timing
	probe          gpu.Ptr      // the cost model's link probes: probeLen float32s
	probeLen       int
	drained        [2]gpu.Event // encode and wire stream ends, for a step that did not launch every bucket
	mem            []gpu.Ptr
	events         []gpu.Event
	bufs           []*devBuffers // per bucket
	released       bool          // teardown ran: the device state is gone
	hier           *devHier      // a sharded StrategyHier engine's node stages and engine across nodes (the core's backend then); nil otherwise
	// tail enqueues the second round of the low-rank bucket launched last,
	// held until the next bucket's launch (or launched); nil when none.
	tail func() error
}

// devBuffers are one bucket's device buffers and events. The events exist
// for every bucket; the buffers once the bucket first takes the
// compressed path (prepare).
type devBuffers struct {
	// Slots: a 16-byte Encode status, with Config.Guard a 16-byte guard
	// block (kernels.GuardLen: ρ), then the body, padded to 16 bytes
	// (slotHead). Gather strategies: send is this rank's slot, recv every rank's. SRA:
	// send holds this rank's N part slots (slot bytes each), recv every
	// rank's slot of this rank's part; send2 and recv2 (slot2 bytes per
	// rank) carry the stage-2 payloads of the averaged parts.
	slot, slot2  int
	send, recv   gpu.Ptr
	send2, recv2 gpu.Ptr
	resid, out   gpu.Ptr // error feedback: e, and the residual Encode writes
	resid2, out2 gpu.Ptr // SRA: this rank's part's second memory
	mid          gpu.Ptr // SRA: this rank's part, summed and averaged
	work, work2  gpu.Ptr // Encode workspaces: stage 1 (encode stream), stage 2 (decode stream)
	phase        int     // the schedule phase the slots and workspaces are sized for
	// StrategyLowRank: the bucket's layout; send and recv are the two
	// all-reduces' buffers (kernels.LowRankArgs' Vals1 and Vals2), work
	// the round's workspace, resid and out the residual memory and M (m
	// without error feedback), resid2 and out2 the warm start's Q̄ and
	// the next one.
	layout     *lowrank.Layout
	qOwn, q, m gpu.Ptr
	// Momentum correction (every bucket): u, and the step's m·u + g
	// until settle installs it; velocity: u was written (by a step or
	// Load), so the state holds it.
	mom, next gpu.Ptr
	velocity  bool
	// Events: the caller's gradient ready; each stage's start and end on
	// its stream (timing events).
	ready                                      gpu.Event
	encBeg, encEnd, xBeg, xEnd, decBeg, decEnd gpu.Event
	xMid, midEnd                               gpu.Event // SRA: the all-to-all's end; the owner's work's end
}

// deviceRun is the device backend's part of a run.
type deviceRun struct {
	dgrad     gpu.Ptr // the caller's gradient
	momFinite bool    // the step's m·u + g is finite: settle installs it
}

// NewDevice builds a device engine for buckets of the given element counts
// over dc (the device transport, e.g. comm/ncclcomm) on dev, after a handshake
// over host, a comm.Comm of the same ranks (the one that bootstrapped dc;
// it is used only here): Engine's handshake, so a difference is a
// *ConfigMismatchError on every rank. cfg is Engine's; Workers is ignored
// and Strategy must be one the device has (see the type's doc). It makes
// three streams and the events, and allocates the buffers (slots, error
// feedback memory, zeroed; workspaces) of every bucket whose decision is
// compressed.
func NewDevice(ctx context.Context, dev Device, dc comm.DeviceComm, host comm.Comm, sizes []int, cfg Config) (*DeviceEngine, error) {
	return newDevice(ctx, dev, dc, host, sizes, cfg, clockTiming{})
}

// newDevice is NewDevice with verification's times from t.
func newDevice(ctx context.Context, dev Device, dc comm.DeviceComm, host comm.Comm, sizes []int, cfg Config, t timing) (*DeviceEngine, error) {
	switch {
	case dev == nil || dc == nil || host == nil:
		return nil, fmt.Errorf("overlap: NewDevice: nil Device, DeviceComm or host Comm")
	case dc.Rank() != host.Rank() || dc.Size() != host.Size():
		return nil, fmt.Errorf("overlap: NewDevice: the DeviceComm is rank %d of %d, the host Comm rank %d of %d", dc.Rank(), dc.Size(), host.Rank(), host.Size())
	}
	cfg.Workers = 1 // the host's compressor serves the state format only
	core, local := newCore(host, cfg, sizes, t, deviceStrategy)
	e := &DeviceEngine{core: core, dev: dev, dc: dc, part: parts{count: host.Size()}}
	core.be = e
	if local == nil && e.comp != nil {
		local = e.newCodecs()
	}
	if local == nil && cfg.NodeSpec != "" {
		local = fmt.Errorf("NodeSpec %q: the device's node stages are float32 only", cfg.NodeSpec)
	}
	hier := local == nil && e.sharded()
	if hier {
		if core.layout, local = hierLayout(host); local == nil {
			local = deviceHierCheck(dc, host)
		}
	}
	if err := handshake(ctx, core, sizes, local); err != nil {
		return nil, err
	}
	if err := e.allocate(); err != nil {
		e.release()
		return nil, fmt.Errorf("overlap: NewDevice on rank %d: %w", e.rank, err)
	}
	if hier {
		h, err := newDevHier(ctx, e, sizes, t)
		if err != nil {
			e.release()
			return nil, err
		}
		e.hier, core.be = h, h
		return e, nil
	}
	if err := e.decide(ctx, e.costModel); err != nil {
		e.release()
		return nil, err
	}
	return e, nil
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

func (e *DeviceEngine) event(timing bool) (gpu.Event, error) {
	ev, err := e.dev.NewEvent(timing)
	if err == nil {
		e.events = append(e.events, ev)
	}
	return ev, err
}

func (e *DeviceEngine) alloc(bytes int) (gpu.Ptr, error) {
	p, err := e.dev.Alloc(bytes)
	if err == nil {
		e.mem = append(e.mem, p)
	}
	return p, err
}

// allocate makes the streams, the events and the status blocks.
func (e *DeviceEngine) allocate() error {
	var err error
	for _, s := range []*gpu.Stream{&e.enc, &e.wire, &e.dec} {
		if *s, err = e.dev.NewStream(); err != nil {
			return err
		}
	}
	for _, p := range []*gpu.Event{&e.done, &e.drained[0], &e.drained[1], &e.mark, &e.timed[0], &e.timed[1]} {
		if *p, err = e.event(p == &e.timed[0] || p == &e.timed[1]); err != nil {
			return err
		}
	}
	if e.statuses, err = e.alloc(kernels.StatusLen * len(e.buckets)); err != nil {
		return err
	}
	if e.mech == StrategyQuantSRA {
		if e.midStatuses, err = e.alloc(kernels.StatusLen * len(e.buckets)); err != nil {
			return err
		}
	}
	if e.cfg.Guard > 0 {
		if e.guards, err = e.alloc(kernels.GuardLen * len(e.buckets)); err != nil {
			return err
		}
	}
	e.bufs = make([]*devBuffers, len(e.buckets))
	for i := range e.buckets {
		b := &devBuffers{}
		e.bufs[i] = b
		if b.ready, err = e.event(false); err != nil {
			return err
		}
		for k, p := range []*gpu.Event{&b.encBeg, &b.encEnd, &b.xBeg, &b.xEnd, &b.decBeg, &b.decEnd, &b.xMid, &b.midEnd} {
			if *p, err = e.event(k < 6); err != nil { // the stage bounds are timed
				return err
			}
		}
	}
	if e.cfg.Momentum == 0 || e.sharded() {
		return nil // a sharded StrategyHier's engine across nodes keeps the velocities
	}
	if e.momStatuses, err = e.alloc(kernels.StatusLen * len(e.buckets)); err != nil {
		return err
	}
	for i, bk := range e.buckets {
		b := e.bufs[i]
		for _, p := range []*gpu.Ptr{&b.mom, &b.next} {
			if *p, err = e.alloc(4 * bk.n); err != nil {
				return err
			}
		}
		if err := e.dev.CopyIn(e.enc, b.mom, make([]byte, 4*bk.n)); err != nil {
			return err
		}
	}
	return nil
}

// prepare allocates bucket bk's slots, workspaces and (zeroed) memories
// the first time it takes the compressed path, and again, for the active
// schedule phase's codec, the first time it takes it in another phase:
// then the slots and workspaces are replaced, and the memories (floats
// per element, whatever the codec) carry over.
func (e *DeviceEngine) prepare(bk *bucket) error {
	b := e.bufs[bk.idx]
	if b.send != 0 && b.phase == e.active {
		return nil
	}
	if e.lowRank != nil {
		return e.prepareLowRank(bk)
	}
	unit, sends := e.unit(bk.n)
	lo, hi := e.part.bounds(bk.n, e.rank)
	mine := hi - lo
	sra, ef := e.mech == StrategyQuantSRA, e.cfg.ErrorFeedback
	ws := e.codec.WorkspaceLen(unit)
	nb := *b
	nb.phase, nb.send, nb.recv, nb.work, nb.send2, nb.recv2, nb.work2 = e.active, 0, 0, 0, 0, 0, 0
	nb.slot, nb.slot2 = e.slotLen(unit), 0
	recvStride := nb.slot
	if e.mech == StrategySharedIndex {
		recvStride = e.slotHead() // every rank's status (and guard) block; the values are summed in send
	}
	if sra {
		nb.slot2 = e.slotLen(unit)
	}
	if err := e.allocAll([]devAlloc{
		{&nb.send, sends * nb.slot, true, false},
		{&nb.recv, e.size * recvStride, true, false},
		{&nb.work, ws, ws > 0, false},
		{&nb.resid, 4 * bk.n, ef, true},
		{&nb.out, 4 * bk.n, ef, false},
		{&nb.mid, 4 * max(mine, 1), sra, false},
		{&nb.send2, nb.slot2, sra, false},
		{&nb.recv2, e.size * nb.slot2, sra, false},
		{&nb.work2, ws, sra && ws > 0, false},
		{&nb.resid2, 4 * max(mine, 1), sra && e.mem2 != nil, true},
		{&nb.out2, 4 * max(mine, 1), sra && e.mem2 != nil, false},
	}); err != nil {
		return err
	}
	// Another phase's slots and workspaces: the last step that used them
	// has ended (Wait).
	for _, p := range []gpu.Ptr{b.send, b.recv, b.work, b.send2, b.recv2, b.work2} {
		if err := e.free(p); err != nil {
			return err
		}
	}
	*b = nb
	return nil
}

// devAlloc is one buffer allocAll allocates: into p, when needed and p
// is 0 (not kept from another schedule phase).
type devAlloc struct {
	p     *gpu.Ptr
	bytes int
	need  bool
	zero  bool // a memory: zeroed when allocated
}

// allocAll allocates the buffers of bufs (those needed and not yet held).
func (e *DeviceEngine) allocAll(bufs []devAlloc) error {
	for _, x := range bufs {
		if !x.need || *x.p != 0 {
			continue
		}
		var err error
		if *x.p, err = e.alloc(x.bytes); err != nil {
			return err
		}
		if x.zero {
			if err := e.dev.CopyIn(e.enc, *x.p, make([]byte, x.bytes)); err != nil {
				return err
			}
		}
	}
	return nil
}

// prepareLowRank allocates bucket bk's buffers for StrategyLowRank (see
// devBuffers), its memories zeroed; on a failure the bucket holds none
// of them.
func (e *DeviceEngine) prepareLowRank(bk *bucket) error {
	l := planLowRank(e.cfg.Shapes[bk.idx], *e.lowRank)
	ef, warm := e.cfg.ErrorFeedback, e.mem2 != nil
	q := 4 * max(l.QLen, 4) // a bucket without matrices still has (unused) Q buffers
	nb := *e.bufs[bk.idx]
	if err := e.allocAll([]devAlloc{
		{&nb.send, 4 * (e.size + l.PLen + l.FlatLen), true, false},
		{&nb.recv, q, true, false},
		{&nb.qOwn, q, true, false},
		{&nb.q, q, true, false},
		{&nb.work, kernels.LowRankWorkspaceLen(l), true, false},
		{&nb.resid, 4 * bk.n, ef, true},
		{&nb.out, 4 * bk.n, ef, false},
		{&nb.m, 4 * bk.n, !ef, false},
		{&nb.resid2, q, warm, true},
		{&nb.out2, q, warm, false},
	}); err != nil {
		return err
	}
	nb.layout = l
	*e.bufs[bk.idx] = nb
	return nil
}

// lowRankArgs returns run r's kernels.LowRankArgs: bucket buffers as
// settle last swapped them.
func (e *DeviceEngine) lowRankArgs(r *run) kernels.LowRankArgs {
	b := e.bufs[r.b.idx]
	a := kernels.LowRankArgs{Layout: b.layout, Ranks: e.size, Rank: e.rank, Grad: r.dgrad, M: b.m,
		Vals1: b.send, Vals2: b.recv, QOwn: b.qOwn, Q: b.q, Warm: b.resid2, QNext: b.out2, Work: b.work,
		Seed: e.lowRank.Seed, Key: r.key, Out: e.statuses + gpu.Ptr(kernels.StatusLen*r.b.idx)}
	if e.cfg.ErrorFeedback {
		a.Resid, a.M = b.resid, b.out
	}
	return a
}

// free releases p, an allocation of alloc (0: nothing).
func (e *DeviceEngine) free(p gpu.Ptr) error {
	if p == 0 {
		return nil
	}
	for i, q := range e.mem {
		if q == p {
			e.mem = append(e.mem[:i], e.mem[i+1:]...)
			break
		}
	}
	return e.dev.Free(p)
}

// release destroys the events and streams and frees the buffers, and
// returns the first failure.
func (e *DeviceEngine) release() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, ev := range e.events {
		keep(e.dev.DestroyEvent(ev))
	}
	for _, s := range []gpu.Stream{e.enc, e.wire, e.dec} {
		if s != 0 {
			keep(e.dev.DestroyStream(s))
		}
	}
	for _, p := range e.mem {
		keep(e.dev.Free(p))
	}
	e.events, e.mem, e.bufs = nil, nil, nil
	e.released = true
	return first
}

// Ready hands bucket i's gradient (grad: its float32s in device memory,
// 4-byte aligned) to the engine: the gradient is complete once stream s
// (the caller's; 0 is the legacy default stream) passes this call. Ready
// only enqueues (an event on s, the bucket's compression, and the
// exchanges now launchable) and never waits for the device; the engine
// owns grad until the done event (Done, Wait), after which grad holds the
// rank average. Misuse (no step, an unknown or already ready bucket,
// after Wait began, a null or misaligned grad) is a *UsageError that
// changes nothing. A launch that fails is a *StepError: the step has
// failed (Wait returns it too).
func (e *DeviceEngine) Ready(i int, grad gpu.Ptr, s gpu.Stream) error {
	call := fmt.Sprintf("Ready(%d)", i)
	return e.ready(call, i, func(*bucket) error {
		if grad == 0 || grad%4 != 0 {
			return &UsageError{Call: call, Err: ErrBadPointer, Detail: fmt.Sprintf("gradient at %#x", grad)}
		}
		return nil
	}, func(st *step, r *run) error {
		r.dgrad = grad
		if err := st.failure(); err != nil {
			return err
		}
		if e.hier != nil {
			return e.hier.take(r, s)
		}
		return e.encode(st, r, s)
	})
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

// encode enqueues run r's compression: the encode stream waits for the
// caller's stream s.
func (e *DeviceEngine) encode(st *step, r *run, s gpu.Stream) error {
	i, n := r.b.idx, r.b.n
	b := e.bufs[i]
	if err := e.dev.Record(b.ready, s); err != nil {
		return err
	}
	if err := e.dev.WaitEvent(e.enc, b.ready); err != nil {
		return err
	}
	if e.cfg.Momentum != 0 {
		a := kernels.MomentumArgs{Grad: r.dgrad, U: b.mom, Next: b.next, N: n, M: float32(e.cfg.Momentum),
			Status: e.momStatuses + gpu.Ptr(kernels.StatusLen*i)}
		if err := e.dev.Momentum(e.enc, a); err != nil {
			return err
		}
		b.velocity = true
	}
	if err := e.dev.Record(b.encBeg, e.enc); err != nil {
		return err
	}
	if r.compressed && e.lowRank != nil {
		if err := e.dev.LowRankEncode(e.enc, e.lowRankArgs(r)); err != nil {
			return err
		}
	} else if r.compressed {
		count := 1
		if e.mech == StrategyQuantSRA {
			count = e.size
		}
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
				a.Resid, a.ResidOut = b.resid+off, b.out+off
			}
			if err := e.dev.Encode(e.codec, e.enc, a); err != nil {
				return err
			}
		}
		if e.cfg.Guard > 0 {
			// ρ of the whole bucket, in every part's slot (as Engine).
			a := kernels.GuardArgs{Resid: b.out, Grad: r.dgrad, N: n, Dst: b.send + kernels.StatusLen, Stride: b.slot, Count: count}
			if err := e.dev.Guard(e.enc, a); err != nil {
				return err
			}
		}
	} else if r.flush {
		if err := e.dev.Flush(e.enc, kernels.FlushArgs{Grad: r.dgrad, Resid: b.resid, ResidOut: b.out, N: n}); err != nil {
			return err
		}
	}
	return e.dev.Record(b.encEnd, e.enc)
}

// launch enqueues run r's exchange (enqueue; low-rank: its first round,
// lowRankRounds), then the second round of the low-rank bucket launched
// before it, if any: so on the wire stream bucket i's P's go out before
// bucket i−1's Q's, and bucket i−1's orthogonalization (on the decode
// stream, between its rounds) runs while bucket i's first all-reduce is
// on the wire, as Engine keeps a bucket's last collective in flight.
// Every rank launches the same buckets in the same order, so the
// collectives match.
func (e *DeviceEngine) launch(st *step, r *run) error {
	prev := e.tail
	e.tail = nil
	var err error
	if r.compressed && e.lowRank != nil {
		e.tail, err = e.lowRankRounds(r)
	} else {
		err = e.enqueue(st, r)
	}
	if err == nil && prev != nil {
		err = prev()
	}
	return err
}

// lowRankRounds enqueues low-rank run r's first round — the all-reduce of
// the statuses, P's and uncompressed elements, then on the decode stream
// the orthogonalization and this rank's Q's (kernels.LowRankReduce) —
// and returns the function that enqueues its second: the all-reduce of
// the Q's, then the average, residual and status (kernels.LowRankDecode).
func (e *DeviceEngine) lowRankRounds(r *run) (second func() error, err error) {
	b := e.bufs[r.b.idx]
	a, l := e.lowRankArgs(r), b.layout
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	for _, f := range []func() error{
		func() error { return e.dev.WaitEvent(e.wire, b.encEnd) },
		func() error { return e.dev.Record(b.xBeg, e.wire) },
		func() error { return e.dc.AllReduce(ctx, a.Vals1, e.size+l.PLen+l.FlatLen, e.wire) },
		func() error { return e.dev.Record(b.xMid, e.wire) },
		func() error { return e.dev.WaitEvent(e.dec, b.xMid) },
		func() error { return e.dev.LowRankReduce(e.dec, a) },
		func() error { return e.dev.Record(b.midEnd, e.dec) },
	} {
		if err := f(); err != nil {
			return nil, err
		}
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
		defer cancel()
		for _, f := range []func() error{
			func() error { return e.dev.WaitEvent(e.wire, b.midEnd) },
			func() error { return e.dc.AllReduce(ctx, a.Vals2, l.QLen, e.wire) },
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
			func() error { return e.dev.LowRankDecode(e.dec, a) },
			func() error { return e.dev.Record(b.decEnd, e.dec) },
		} {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// enqueue enqueues run r's exchange on the wire stream and its decode and
// average on the decode stream (SRA: the owner's sum, average and
// re-encode on the decode stream between its two collectives).
func (e *DeviceEngine) enqueue(st *step, r *run) error {
	i, n, grad := r.b.idx, r.b.n, r.dgrad
	b := e.bufs[i]
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	avg := kernels.AverageArgs{Dst: grad, N: n, Ranks: e.size, Out: e.statuses + gpu.Ptr(kernels.StatusLen*i)}
	var ops []func() error
	switch {
	case !r.compressed:
		ops = []func() error{
			func() error { return e.dc.AllReduce(ctx, grad, n, e.wire) },
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
		}
	case e.mech == StrategyQuantSRA:
		lo, hi := e.part.bounds(n, e.rank)
		bodies := func(base gpu.Ptr, slot int) []gpu.Ptr {
			out := make([]gpu.Ptr, e.size)
			for r := range out {
				out[r] = base + gpu.Ptr(r*slot+e.slotHead())
			}
			return out
		}
		ops = []func() error{
			func() error {
				return e.dc.AllToAll(ctx, b.recv, b.send, e.size*b.slot, e.wire)
			},
			func() error { return e.dev.Record(b.xMid, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xMid) },
			func() error {
				return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: b.mid, N: hi - lo, Bodies: bodies(b.recv, b.slot)})
			},
			func() error {
				return e.dev.Average(e.dec, kernels.AverageArgs{Dst: b.mid, N: hi - lo, Ranks: e.size, Slots: b.recv,
					Stride: b.slot, Count: e.size, Out: e.midStatuses + gpu.Ptr(kernels.StatusLen*i)})
			},
			func() error {
				// Every rank's stage-1 ρ, forwarded in the stage-2 slot.
				return e.guardMax(b.recv, b.slot, b.send2+kernels.StatusLen)
			},
			func() error {
				a := kernels.EncodeArgs{Body: b.send2 + gpu.Ptr(e.slotHead()), Grad: b.mid, Work: b.work2, Status: b.send2,
					N: hi - lo, Key: e.key2(st.num, i)}
				if e.mem2 != nil {
					a.Resid, a.ResidOut = b.resid2, b.out2
				}
				return e.dev.Encode(e.codec, e.dec, a)
			},
			func() error { return e.dev.Record(b.midEnd, e.dec) },
			func() error { return e.dev.WaitEvent(e.wire, b.midEnd) },
			func() error {
				return e.dc.AllGather(ctx, b.recv2, b.send2, b.slot2, e.wire)
			},
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
		}
		for j, body := range bodies(b.recv2, b.slot2) {
			lo, hi := e.part.bounds(n, j)
			ops = append(ops, func() error {
				return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: grad + gpu.Ptr(4*lo), N: hi - lo, Bodies: []gpu.Ptr{body}})
			})
		}
		ops = append(ops, func() error { return e.guardMax(b.recv2, b.slot2, e.guards+gpu.Ptr(kernels.GuardLen*i)) })
		avg.Ranks, avg.Slots, avg.Stride, avg.Count = 1, b.recv2, b.slot2, e.size
	case e.mech == StrategySharedIndex:
		// Every rank's status (and guard) block, then the sum of the k
		// values, whose indices every rank drew under the same key, in
		// place in send; the sum is scattered to the indices.
		head, vals := e.slotHead(), b.send+gpu.Ptr(e.slotHead())
		ops = []func() error{
			func() error { return e.dc.AllGather(ctx, b.recv, b.send, head, e.wire) },
			func() error { return e.dc.AllReduce(ctx, vals, e.codec.BodyLen(n)/4, e.wire) },
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
			func() error {
				return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: grad, N: n, Bodies: []gpu.Ptr{vals}, Key: e.key(st.num, i, e.rank, 0)})
			},
			func() error { return e.guardMax(b.recv, head, e.guards+gpu.Ptr(kernels.GuardLen*i)) },
		}
		avg.Slots, avg.Stride, avg.Count = b.recv, head, e.size
	default:
		ops = []func() error{
			func() error {
				return e.dc.AllGather(ctx, b.recv, b.send, b.slot, e.wire)
			},
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
			func() error {
				bodies := make([]gpu.Ptr, e.size)
				for r := range bodies {
					bodies[r] = b.recv + gpu.Ptr(r*b.slot+e.slotHead())
				}
				if e.comp.Codec() != compress.CodecRandomK {
					return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: grad, N: n, Bodies: bodies})
				}
				// Each rank drew its random-k indices under its own key.
				for q, body := range bodies {
					a := kernels.DecodeArgs{Dst: grad, N: n, Add: q > 0, Bodies: []gpu.Ptr{body}, Key: e.key(st.num, i, q, 0)}
					if err := e.dev.Decode(e.codec, e.dec, a); err != nil {
						return err
					}
				}
				return nil
			},
			func() error { return e.guardMax(b.recv, b.slot, e.guards+gpu.Ptr(kernels.GuardLen*i)) },
		}
		avg.Slots, avg.Stride, avg.Count = b.recv, b.slot, e.size
	}
	ops = append([]func() error{
		func() error { return e.dev.WaitEvent(e.wire, b.encEnd) },
		func() error { return e.dev.Record(b.xBeg, e.wire) },
	}, ops...)
	ops = append(ops,
		func() error { return e.dev.Average(e.dec, avg) },
		func() error { return e.dev.Record(b.decEnd, e.dec) })
	if r.compressed && e.cfg.MomentumMasking && e.cfg.ErrorFeedback && e.sparse() {
		// Momentum factor masking, on the velocity settle installs, where
		// the error-feedback memory's Commit applies (Average's status
		// clean): as Engine's Pending.CommitMasked.
		ops = append(ops, func() error {
			return e.dev.Mask(e.codec, e.dec, kernels.MaskArgs{U: b.next, N: n, Body: b.send + gpu.Ptr(e.slotHead()),
				Key: e.key(st.num, i, e.rank, 0), Gate: avg.Out})
		})
	}
	for _, f := range ops {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
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

// launched enqueues the last low-rank bucket's second round, if it is
// still held (launch), and records the step's done event after the last
// decode.
func (e *DeviceEngine) launched(*step) error {
	if tail := e.tail; tail != nil {
		e.tail = nil
		if err := tail(); err != nil {
			return err
		}
	}
	return e.dev.Record(e.done, e.dec)
}

// Done makes stream s (the caller's, before its optimizer step) wait for
// the end of the step's last bucket, without blocking the host. It needs
// every bucket ready (else a *UsageError, ErrNotReady). Wait must still be
// called to settle the step.
func (e *DeviceEngine) Done(s gpu.Stream) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable("Done"); err != nil {
		return err
	}
	st := e.cur
	if st == nil {
		return &UsageError{Call: "Done", Err: ErrNoStep, Detail: "call Step first"}
	}
	if err := st.failure(); err != nil {
		return err
	}
	if st.cursor < len(st.runs) {
		return &UsageError{Call: "Done", Err: ErrNotReady, Detail: fmt.Sprintf("step %d: bucket %d is not ready", st.num, st.cursor)}
	}
	return e.dev.WaitEvent(s, e.done)
}

// Wait blocks the host until the step's work on the device has finished,
// or the DeviceComm's timeout or ctx ends it (the communicator is then
// aborted), then settles error-feedback memory and returns the step's
// statistics (partial on error). Without a step it returns a *UsageError
// (ErrNoStep); a bucket never made ready fails the step (ErrNotReady).
// Errors: a *NonFiniteStepError (FailOnNonFinite) leaves the engine usable;
// any other breaks it (see the type's doc).
func (e *DeviceEngine) Wait(ctx context.Context) (StepStats, error) { return e.core.Wait(ctx) }

// wait waits for the done event, bounded by ctx and the DeviceComm's
// timeout; a step that failed or did not launch every bucket is sealed
// first, so that the event covers everything enqueued.
func (e *DeviceEngine) wait(ctx context.Context, st *step) error {
	e.tail = nil // a step that did not launch every bucket: its held round is never enqueued
	if st.failure() != nil || st.cursor < len(st.runs) {
		if err := e.recordEnd(); err != nil {
			st.fail(&StepError{Step: st.num, Bucket: -1, Stage: "Wait", Err: err})
		}
	}
	if err := e.dc.Wait(ctx, func() (bool, error) { return e.dev.EventQuery(e.done) }); err != nil {
		st.fail(&StepError{Step: st.num, Bucket: -1, Stage: "Wait", Err: err})
	}
	return st.failure()
}

// conclude reads the averages' statuses into the runs' outcomes, and the
// stage times from the events.
func (e *DeviceEngine) conclude(st *step) error {
	statuses := make([]byte, kernels.StatusLen*len(st.runs))
	if err := e.dev.CopyOut(e.dec, statuses, e.statuses); err != nil {
		return &StepError{Step: st.num, Bucket: -1, Stage: "reading statuses", Err: err}
	}
	var guards []byte
	if e.cfg.Guard > 0 {
		guards = make([]byte, kernels.GuardLen*len(st.runs))
		if err := e.dev.CopyOut(e.dec, guards, e.guards); err != nil {
			return &StepError{Step: st.num, Bucket: -1, Stage: "reading the accuracy guard's measures", Err: err}
		}
	}
	var momentum []byte
	if e.cfg.Momentum != 0 {
		momentum = make([]byte, kernels.StatusLen*len(st.runs))
		if err := e.dev.CopyOut(e.enc, momentum, e.momStatuses); err != nil {
			return &StepError{Step: st.num, Bucket: -1, Stage: "reading momentum statuses", Err: err}
		}
	}
	for i, r := range st.runs {
		b, s := e.bufs[i], &r.stats
		if momentum != nil {
			r.momFinite = kernels.StatusError(momentum[kernels.StatusLen*i:kernels.StatusLen*(i+1)]) == nil
		}
		fallback, err := e.nonFinite(r, statuses[kernels.StatusLen*i:kernels.StatusLen*(i+1)])
		if err != nil {
			return &StepError{Step: st.num, Bucket: i, Stage: "reading statuses", Err: err}
		}
		r.outcome = pathDense
		if r.compressed {
			r.outcome = pathCompressed
		}
		if fallback != "" {
			r.nonFinite, r.fallback = true, fallback
			if e.cfg.FailOnNonFinite {
				r.outcome = pathSkipped
			}
		} else if guards != nil && r.compressed {
			r.heldBack = math.Float64frombits(binary.LittleEndian.Uint64(guards[kernels.GuardLen*i:]))
		}
		for _, t := range []struct {
			d          *time.Duration
			start, end gpu.Event
		}{{&s.Compress, b.encBeg, b.encEnd}, {&s.Exchange, b.xBeg, b.xEnd}, {&s.Decompress, b.decBeg, b.decEnd}} {
			if *t.d, err = e.dev.Elapsed(t.start, t.end); err != nil {
				return &StepError{Step: st.num, Bucket: i, Stage: "timing events", Err: err}
			}
		}
		if e.verify != nil {
			// Verification's times, from the first bucket's encode start.
			from, err := e.dev.Elapsed(e.bufs[0].encBeg, b.encBeg)
			if err == nil {
				var to time.Duration
				to, err = e.dev.Elapsed(e.bufs[0].encBeg, b.decEnd)
				r.readyAt, r.doneAt = st.start.Add(from), st.start.Add(to)
			}
			if err != nil {
				return &StepError{Step: st.num, Bucket: i, Stage: "timing events", Err: err}
			}
		}
		s.BytesSent = allReduceVolume(e.size, 4*r.b.n)
		if r.compressed {
			s.BytesSent = 0
			for _, v := range e.volumes(r.b) {
				s.BytesSent += v
			}
		}
	}
	return nil
}

// settle installs, after a step delivered, the residuals Encode
// wrote for its compressed, finite buckets (and low-rank's next warm
// start Q̄), the zeroed stage-1 residuals
// of its finite flushes (the accuracy guard's, written by kernels.Flush)
// and the momentum velocities m·u + g that are finite (swaps); a step
// that failed or was skipped leaves every memory and velocity as it was.
func (e *DeviceEngine) settle(st *step, how stepEnd) {
	if how != stepDelivered {
		return
	}
	for _, r := range st.runs {
		b := e.bufs[r.b.idx]
		if r.momFinite {
			b.mom, b.next = b.next, b.mom
		}
		switch {
		case (e.cfg.ErrorFeedback || e.lowRank != nil) && r.outcome == pathCompressed && !r.nonFinite:
			// Low-rank's warm start Q̄ moves on without error feedback too.
			b.resid, b.out = b.out, b.resid
			b.resid2, b.out2 = b.out2, b.resid2
		case r.flush && r.outcome == pathDense && !r.nonFinite:
			b.resid, b.out = b.out, b.resid
		}
	}
}

// memory copies the error-feedback memories from the device (which waits
// for the engine's streams).
func (e *DeviceEngine) memory(call string) (gradEF, partEF *compress.ErrorFeedback, err error) {
	if e.released {
		return nil, nil, &UsageError{Call: call, Err: ErrEngineClosed}
	}
	if e.mem1 != nil {
		gradEF = compress.NewErrorFeedback(e.mem1)
	}
	if e.mem2 != nil {
		partEF = compress.NewErrorFeedback(e.mem2)
	}
	for i, bk := range e.buckets {
		b := e.bufs[i]
		if b.send == 0 {
			continue // never compressed: no memory
		}
		for _, m := range e.memories(bk, gradEF, partEF) {
			res := make([]float32, m.n)
			if err := e.dev.CopyOut(e.enc, f32.Bytes(res), m.p); err != nil {
				return nil, nil, fmt.Errorf("overlap: %s on rank %d: reading bucket %d's %s memory from the device: %w", call, e.rank, i, m.tag, err)
			}
			if err := m.f.SetResidual(uint64(i), res); err != nil {
				return nil, nil, fmt.Errorf("overlap: %s on rank %d: bucket %d's %s memory: %w", call, e.rank, i, m.tag, err)
			}
		}
	}
	return gradEF, partEF, nil
}

// devMemory is one of a bucket's memories on the device.
type devMemory struct {
	f   *compress.ErrorFeedback
	p   gpu.Ptr
	n   int
	tag string
}

// memories returns bucket bk's memories on the device, paired with gradEF
// and partEF; ones that do not exist or are empty are left out.
func (e *DeviceEngine) memories(bk *bucket, gradEF, partEF *compress.ErrorFeedback) []devMemory {
	b := e.bufs[bk.idx]
	lo, hi := e.part.bounds(bk.n, e.rank)
	n2, tag2 := hi-lo, "stage-2"
	if b.layout != nil {
		n2, tag2 = b.layout.QLen, "warm start's"
	}
	var out []devMemory
	for _, m := range []devMemory{{gradEF, b.resid, bk.n, "stage-1"}, {partEF, b.resid2, n2, tag2}} {
		if m.f != nil && m.p != 0 && m.n > 0 {
			out = append(out, m)
		}
	}
	return out
}

// install copies memories Load validated to the device (zeros where they
// hold none for a bucket), ordered before the next step's compression. A
// bucket never compressed gets its buffers now if the state holds memory
// for it, so that nothing loaded is lost.
func (e *DeviceEngine) install(gradEF, partEF *compress.ErrorFeedback) error {
	for i, bk := range e.buckets {
		holds := func(f *compress.ErrorFeedback) bool { return f != nil && f.Residual(uint64(i)) != nil }
		if e.bufs[i].send == 0 {
			if !holds(gradEF) && !holds(partEF) {
				continue
			}
			if err := e.prepare(bk); err != nil {
				return fmt.Errorf("overlap: Load on rank %d: preparing bucket %d: %w", e.rank, i, err)
			}
		}
		for _, m := range e.memories(bk, gradEF, partEF) {
			res := m.f.Residual(uint64(i))
			if res == nil {
				res = make([]float32, m.n)
			}
			if err := e.dev.CopyIn(e.enc, m.p, f32.Bytes(res)); err != nil {
				return fmt.Errorf("overlap: Load on rank %d: writing bucket %d's %s memory to the device: %w", e.rank, i, m.tag, err)
			}
		}
	}
	return nil
}

// Close ends the engine: a step in flight is abandoned (its device work
// is waited for, bounded by the DeviceComm's timeout), then the events and
// streams are destroyed and the device memory freed. It closes neither
// the DeviceComm nor the Device. Later calls return a *UsageError
// (ErrEngineClosed); closing twice returns nil.
func (e *DeviceEngine) Close() error { return e.close() }

func (e *DeviceEngine) teardown() error {
	if err := e.release(); err != nil {
		return fmt.Errorf("overlap: DeviceEngine.Close on rank %d: %w", e.rank, err)
	}
	return nil
}

// nonFinite reads run r's average status (kernels.Average's Out) and
// returns what went wrong this step, or "".
func (e *DeviceEngine) nonFinite(r *run, status []byte) (string, error) {
	b := e.bufs[r.b.idx]
	failed := binary.LittleEndian.Uint64(status[8:]) != math.MaxUint64
	if failed && e.lowRank != nil && r.compressed {
		// The ranks' statuses lead the first all-reduce's buffer.
		st := make([]float32, e.size)
		if err := e.dev.CopyOut(e.dec, f32.Bytes(st), b.send); err != nil {
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
	if failed {
		var bad []string
		base, stride, what := b.recv, b.slot, "rank %d has %v"
		switch e.mech {
		case StrategyQuantSRA:
			base, stride, what = b.recv2, b.slot2, "rank %d's part of the sum has %v"
		case StrategySharedIndex:
			stride = e.slotHead()
		}
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
	clean := make([]byte, kernels.StatusLen)
	for i := range clean {
		clean[i] = 0xff
	}
	copy(clean, status[:8])
	if err := kernels.StatusError(clean); err != nil {
		var nfe *compress.NonFiniteError
		if errors.As(err, &nfe) {
			return fmt.Sprintf("the average holds %v at element %d (a rank's gradient held NaN or Inf, or the sum overflowed)", nfe.Value, nfe.Index), nil
		}
		return err.Error(), nil
	}
	return "", nil
}

// velocity copies bucket i's momentum velocity from the device (which
// waits for the encode stream).
func (e *DeviceEngine) velocity(i int) ([]float32, error) {
	b := e.bufs[i]
	if !b.velocity {
		return nil, nil
	}
	u := make([]float32, e.buckets[i].n)
	if err := e.dev.CopyOut(e.enc, f32.Bytes(u), b.mom); err != nil {
		return nil, fmt.Errorf("reading it from the device: %w", err)
	}
	return u, nil
}

// setVelocity copies velocities Load validated to the device (zeros for
// nil), ordered before the next step's momentum correction. Without
// momentum correction there are none (Load checked the momentum).
func (e *DeviceEngine) setVelocity(us [][]float32) error {
	if e.cfg.Momentum == 0 {
		return nil
	}
	for i, u := range us {
		b := e.bufs[i]
		raw := make([]byte, 4*e.buckets[i].n)
		if u != nil {
			raw = f32.Bytes(u)
		}
		if err := e.dev.CopyIn(e.enc, b.mom, raw); err != nil {
			return fmt.Errorf("overlap: Load on rank %d: writing bucket %d's momentum velocity to the device: %w", e.rank, i, err)
		}
		b.velocity = u != nil
	}
	return nil
}

// usePhase makes the core's active schedule phase's codec the one the
// kernels run; each bucket's slots and workspaces follow when it next
// takes the compressed path (prepare), its memories carry over.
func (e *DeviceEngine) usePhase() { e.codec = e.codecs[e.active] }

// recordEnd records the ends of the encode and wire streams and makes the
// decode stream wait for them before the done event, so that the done
// event covers everything enqueued, launched or not.
func (e *DeviceEngine) recordEnd() error {
	for k, s := range []gpu.Stream{e.enc, e.wire} {
		if err := e.dev.Record(e.drained[k], s); err != nil {
			return err
		}
		if err := e.dev.WaitEvent(e.dec, e.drained[k]); err != nil {
			return err
		}
	}
	return e.dev.Record(e.done, e.dec)
}
