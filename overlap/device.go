package overlap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/kernels"
)

// Device is what the device engine needs of a GPU: memory, streams,
// events, and the kernels of package kernels enqueued on a stream. CUDA
// gives the one over a kernels.Context; tests use a fake. Every method but
// EventQuery, CopyIn and CopyOut only enqueues work (or creates or
// destroys a handle) and never waits for the device; their contracts are
// kernels.Context's of the same names, and Encode, Decode and Average are
// kernels.Codec.Encode, kernels.Codec.Decode and kernels.Average.
type Device interface {
	Alloc(bytes int) (kernels.DevicePtr, error)
	Free(p kernels.DevicePtr) error
	CopyIn(s kernels.Stream, dst kernels.DevicePtr, src []byte) error
	CopyOut(s kernels.Stream, dst []byte, src kernels.DevicePtr) error
	NewStream() (kernels.Stream, error)
	DestroyStream(s kernels.Stream) error
	NewEvent(timing bool) (kernels.Event, error)
	DestroyEvent(e kernels.Event) error
	Record(e kernels.Event, s kernels.Stream) error
	WaitEvent(s kernels.Stream, e kernels.Event) error
	EventQuery(e kernels.Event) (bool, error)
	Elapsed(start, end kernels.Event) (time.Duration, error)
	Encode(c *kernels.Codec, s kernels.Stream, a kernels.EncodeArgs) error
	Decode(c *kernels.Codec, s kernels.Stream, a kernels.DecodeArgs) error
	Average(s kernels.Stream, a kernels.AverageArgs) error
}

// CUDA returns the Device of a kernels.Context (its primary context, so
// PyTorch's pointers and streams are valid in it). In a build without the
// cuda tag no Context can be opened.
func CUDA(ctx *kernels.Context) Device { return cudaDevice{ctx} }

type cudaDevice struct{ *kernels.Context }

func (d cudaDevice) Encode(c *kernels.Codec, s kernels.Stream, a kernels.EncodeArgs) error {
	return c.Encode(d.Context, s, a)
}

func (d cudaDevice) Decode(c *kernels.Codec, s kernels.Stream, a kernels.DecodeArgs) error {
	return c.Decode(d.Context, s, a)
}

func (d cudaDevice) Average(s kernels.Stream, a kernels.AverageArgs) error {
	return kernels.Average(d.Context, s, a)
}

// ErrBadPointer is a *UsageError's Err for a null or misaligned device
// pointer.
var ErrBadPointer = errors.New("device pointer is null or not 4-byte aligned")

// DeviceEngine is the engine on CUDA streams: the same step protocol as
// Engine (Step, Ready per bucket, Wait), with gradients in device memory
// and every stage enqueued on the engine's own streams, so neither the
// caller's stream nor the host waits for gradcomp's work unless asked.
//
// # Pipeline
//
// Ready(i, grad, s) records an event on the caller's stream s (the
// gradient is complete once s reaches it) and returns. The engine's encode
// stream waits for that event and compresses the bucket (error feedback
// fused: the kernel reads the memory e and writes the new residual to a
// second buffer, installed by a swap only when the step succeeds). The
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
// codec exchanges fixed-size slots (a 16-byte Encode status, then the
// body, padded to 16 bytes). StrategyAuto picks as Engine does, except
// that random-k and fp16/bf16 use the gather or SRA mechanism:
//
//	sparse-gather  top-k: all-gather of the slots, decode and add in rank
//	               order, divide by N
//	allgather      the same for the quantizers, sign, fp16, bf16 on ≤ 2
//	               ranks, and random-k (under shared-index's key, tag 0 on
//	               every rank, so one decode serves every slot)
//	sra            the quantizers, sign, fp16, bf16 on > 2 ranks: each part
//	               encoded under its own key, an all-to-all of the part
//	               slots, on each part's owner the decode-and-add, the
//	               division and the stage-2 encode (its own memory), an
//	               all-gather of the stage-2 slots, their decode
//
// Each gives bit for bit the result and error-feedback memory of Engine
// with the same strategy (shared-index for random-k; the package doc's
// definitions), with the same payload keys. Shared-index's smaller
// all-reduce is not on the device, nor SRA for random-k (ConfigError),
// nor the cost model: DecideAuto means compressed here, DecideDense pins
// the dense all-reduce. Stage times: Compress is stage-1 encoding,
// Exchange runs from the first collective's start to the last one's end
// (SRA: the owner's work between them included), Decompress the final
// decode and average.
//
// # Failures
//
// A NaN or ±Inf (or a value the codec cannot represent) on any rank is
// seen on the device by kernels.Average through the gathered statuses: the
// bucket's gradient becomes NaN on every rank (Engine instead re-exchanges
// it dense; the device engine does not keep g), so a NaN-checking
// optimizer (AMP) skips the step; its error-feedback memory keeps e. Wait
// reports it in BucketStats (NonFinite, Reason), or returns a
// *NonFiniteError with Config.FailOnNonFinite: then the caller skips the
// step, and so does every bucket's memory (Engine instead keeps e + g);
// the engine stays usable. Under SRA a bad part reaches the other ranks
// through its owner's stage-2 status. A dense bucket whose average is
// non-finite is reported the same way. A
// collective that does not finish ends Wait with a *StepError within the
// DeviceComm's timeout (or ctx); a launch that fails ends the step at
// once (Ready returns the *StepError). Such a step breaks the engine
// (*BrokenError afterwards) and leaves every error-feedback memory holding
// e: unlike Engine, the step's gradients are lost, since the device no
// longer holds them separately.
type DeviceEngine struct {
	dev      Device
	dc       comm.DeviceComm
	cfg      Config
	spec     string
	codec    *kernels.Codec // nil for codec none
	strategy Strategy
	rank     int
	size     int
	buckets  []*devBucket

	enc, wire, dec kernels.Stream
	statuses       kernels.DevicePtr // kernels.StatusLen per bucket: the averages' Out blocks
	midStatuses    kernels.DevicePtr // the same for SRA's averages of this rank's parts
	part           parts             // SRA's partition of a bucket (count: the world size)
	done           kernels.Event     // the step's end, on the decode stream
	drained        [2]kernels.Event  // encode and wire stream ends, for a step that did not launch every bucket
	mem            []kernels.DevicePtr
	events         []kernels.Event

	// busy is held while the host reads or releases the engine's device
	// state (Wait's settle, Save, Load, Close), so Close never frees what
	// another call is using.
	busy  sync.Mutex
	mu    sync.Mutex
	cur   *devStep
	next  uint64
	life  // closed or broken, under mu
	sizes []int
}

// devBucket is one bucket's fixed state on the device.
type devBucket struct {
	idx, n     int
	compressed bool
	reason     string
	// Slots: a 16-byte Encode status, then the body, padded to 16 bytes.
	// Gather strategies: send is this rank's slot, recv every rank's. SRA:
	// send holds this rank's N part slots (slot bytes each), recv every
	// rank's slot of this rank's part; send2 and recv2 (slot2 bytes per
	// rank) carry the stage-2 payloads of the averaged parts.
	slot, slot2  int
	send, recv   kernels.DevicePtr
	send2, recv2 kernels.DevicePtr
	resid, out   kernels.DevicePtr // error feedback: e, and the residual Encode writes
	resid2, out2 kernels.DevicePtr // SRA: this rank's part's second memory
	mid          kernels.DevicePtr // SRA: this rank's part, summed and averaged
	work, work2  kernels.DevicePtr // Encode workspaces: stage 1 (encode stream), stage 2 (decode stream)
	// Events: the caller's gradient ready; each stage's start and end on
	// its stream (timing events).
	ready                                      kernels.Event
	encBeg, encEnd, xBeg, xEnd, decBeg, decEnd kernels.Event
	xMid, midEnd                               kernels.Event // SRA: the all-to-all's end; the owner's work's end
}

// devStep is one step in flight.
type devStep struct {
	progress
	start time.Time
	grads []kernels.DevicePtr
	err   error // the first failure (a launch), fatal
}

// NewDevice builds a device engine for buckets of the given element counts
// over dc (the device transport, e.g. comm/nccl) on dev, after a handshake
// over host, a comm.Comm of the same ranks (the one that bootstrapped dc;
// it is used only here): the fields Engine's handshake compares, so a
// difference is a *ConfigMismatchError on every rank. cfg is Engine's;
// Workers is ignored and Strategy must be one the device has (see the
// type's doc). It allocates every buffer the steps need (slots, error
// feedback memory, zeroed; workspaces), three streams and the events.
func NewDevice(ctx context.Context, dev Device, dc comm.DeviceComm, host comm.Comm, sizes []int, cfg Config) (*DeviceEngine, error) {
	switch {
	case dev == nil || dc == nil || host == nil:
		return nil, fmt.Errorf("overlap: NewDevice: nil Device, DeviceComm or host Comm")
	case dc.Rank() != host.Rank() || dc.Size() != host.Size():
		return nil, fmt.Errorf("overlap: NewDevice: the DeviceComm is rank %d of %d, the host Comm rank %d of %d", dc.Rank(), dc.Size(), host.Rank(), host.Size())
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	e := &DeviceEngine{dev: dev, dc: dc, cfg: cfg, rank: dc.Rank(), size: dc.Size(), sizes: append([]int(nil), sizes...)}
	local := e.configure(sizes)
	hs := &Engine{c: host, cfg: cfg, rank: e.rank, size: e.size, spec: e.spec, strategy: e.strategy}
	if err := handshake(ctx, hs, sizes, local); err != nil {
		return nil, err
	}
	if err := e.allocate(); err != nil {
		e.release()
		return nil, fmt.Errorf("overlap: NewDevice on rank %d: %w", e.rank, err)
	}
	return e, nil
}

// configure checks cfg and sizes and sets the codec, strategy and
// decisions. Its error goes through the handshake.
func (e *DeviceEngine) configure(sizes []int) error {
	cfg := e.cfg
	if err := checkConfig(cfg, sizes, e.size); err != nil {
		return err
	}
	if cfg.Warmup > 0 {
		return fmt.Errorf("Warmup %d: the device engine has no warm-up yet", cfg.Warmup)
	}
	codec, err := kernels.NewCodec(cfg.Spec)
	if err != nil {
		return err
	}
	e.spec = codec.Spec()
	if strings.Contains(e.spec, ":lossless=") {
		return fmt.Errorf("spec %s: the device has no lossless stage", e.spec)
	}
	c := codec.Reference().Codec()
	if e.strategy, err = resolve(cfg.Strategy, c, e.size); err != nil {
		return err
	}
	switch {
	case c == compress.CodecNone:
	case cfg.Strategy == StrategyAuto && c == compress.CodecTopK:
		e.strategy = StrategySparseGather
	case cfg.Strategy == StrategyAuto && (c == compress.CodecRandomK || e.size <= 2):
		e.strategy = StrategyQuantAllGather
	case cfg.Strategy == StrategyAuto:
		e.strategy = StrategyQuantSRA
	case e.strategy == StrategyQuantSRA && c == compress.CodecRandomK:
		return fmt.Errorf("strategy sra with random-k is not available on the device (its parts' indices differ by rank; use allgather)")
	case e.strategy != StrategySparseGather && e.strategy != StrategyQuantAllGather && e.strategy != StrategyQuantSRA:
		return fmt.Errorf("strategy %v is not available on the device (sparse-gather, allgather and sra are)", e.strategy)
	}
	e.part = parts{count: e.size}
	e.buckets = make([]*devBucket, len(sizes))
	for i, n := range sizes {
		b := &devBucket{idx: i, n: n}
		switch {
		case c == compress.CodecNone:
			b.reason = "codec none: dense all-reduce"
		case cfg.Decision == DecideDense:
			b.reason = "pinned: dense"
		case cfg.Decision == DecideCompressed:
			b.compressed, b.reason = true, "pinned: compressed"
		default:
			b.compressed, b.reason = true, "auto: the device engine has no cost model yet: compressed"
		}
		e.buckets[i] = b
	}
	if c != compress.CodecNone {
		e.codec = codec
	}
	return nil
}

// allocate makes the streams, events and device buffers.
func (e *DeviceEngine) allocate() error {
	var err error
	for _, s := range []*kernels.Stream{&e.enc, &e.wire, &e.dec} {
		if *s, err = e.dev.NewStream(); err != nil {
			return err
		}
	}
	event := func(timing bool) (kernels.Event, error) {
		ev, err := e.dev.NewEvent(timing)
		if err == nil {
			e.events = append(e.events, ev)
		}
		return ev, err
	}
	alloc := func(bytes int) (kernels.DevicePtr, error) {
		p, err := e.dev.Alloc(bytes)
		if err == nil {
			e.mem = append(e.mem, p)
		}
		return p, err
	}
	for _, p := range []*kernels.Event{&e.done, &e.drained[0], &e.drained[1]} {
		if *p, err = event(false); err != nil {
			return err
		}
	}
	if e.statuses, err = alloc(kernels.StatusLen * len(e.buckets)); err != nil {
		return err
	}
	if e.strategy == StrategyQuantSRA {
		if e.midStatuses, err = alloc(kernels.StatusLen * len(e.buckets)); err != nil {
			return err
		}
	}
	for _, b := range e.buckets {
		if b.ready, err = event(false); err != nil {
			return err
		}
		for k, p := range []*kernels.Event{&b.encBeg, &b.encEnd, &b.xBeg, &b.xEnd, &b.decBeg, &b.decEnd, &b.xMid, &b.midEnd} {
			if *p, err = event(k < 6); err != nil { // the stage bounds are timed
				return err
			}
		}
		if e.codec == nil || !b.compressed {
			continue
		}
		slot := func(n int) int { return kernels.StatusLen + (e.codec.BodyLen(n)+15)&^15 }
		// What one encode covers: the bucket, or (SRA) its largest part.
		unit, sends := b.n, 1
		if e.strategy == StrategyQuantSRA {
			unit, sends = (b.n+e.size-1)/e.size, e.size
		}
		lo, hi := e.part.bounds(b.n, e.rank)
		mine := hi - lo
		type buffer struct {
			p     *kernels.DevicePtr
			bytes int
			need  bool
		}
		b.slot = slot(unit)
		sra, ef := e.strategy == StrategyQuantSRA, e.cfg.ErrorFeedback
		for _, x := range []buffer{
			{&b.send, sends * b.slot, true},
			{&b.recv, e.size * b.slot, true},
			{&b.work, e.codec.WorkspaceLen(unit), e.codec.WorkspaceLen(unit) > 0},
			{&b.resid, 4 * b.n, ef},
			{&b.out, 4 * b.n, ef},
			{&b.mid, 4 * max(mine, 1), sra},
			{&b.send2, slot(unit), sra},
			{&b.recv2, e.size * slot(unit), sra},
			{&b.work2, e.codec.WorkspaceLen(unit), sra && e.codec.WorkspaceLen(unit) > 0},
			{&b.resid2, 4 * max(mine, 1), sra && ef},
			{&b.out2, 4 * max(mine, 1), sra && ef},
		} {
			if !x.need {
				continue
			}
			if *x.p, err = alloc(x.bytes); err != nil {
				return err
			}
		}
		if sra {
			b.slot2 = slot(unit)
		}
		for _, m := range []struct {
			p kernels.DevicePtr
			n int
		}{{b.resid, b.n}, {b.resid2, mine}} {
			if m.p != 0 && m.n > 0 {
				if err := e.dev.CopyIn(e.enc, m.p, make([]byte, 4*m.n)); err != nil {
					return err
				}
			}
		}
	}
	return nil
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
	for _, s := range []kernels.Stream{e.enc, e.wire, e.dec} {
		if s != 0 {
			keep(e.dev.DestroyStream(s))
		}
	}
	for _, p := range e.mem {
		keep(e.dev.Free(p))
	}
	e.events, e.mem = nil, nil
	return first
}

// Strategy returns the strategy in use (StrategyAuto resolved).
func (e *DeviceEngine) Strategy() Strategy { return e.strategy }

// Compressed reports, per bucket, whether it takes the compressed path.
func (e *DeviceEngine) Compressed() []bool {
	out := make([]bool, len(e.buckets))
	for i, b := range e.buckets {
		out[i] = b.compressed
	}
	return out
}

// Step starts a step; as Engine.Step (the step number keys stochastic
// rounding and random-k, so every rank calls Step equally often). A step
// in flight is a *UsageError (ErrStepInFlight).
func (e *DeviceEngine) Step() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable("Step"); err != nil {
		return err
	}
	if e.cur != nil {
		return &UsageError{Call: "Step", Err: ErrStepInFlight, Detail: fmt.Sprintf("step %d has not been waited for", e.cur.num)}
	}
	e.cur = &devStep{progress: progress{num: e.next, ready: make([]bool, len(e.buckets))}, start: time.Now(), grads: make([]kernels.DevicePtr, len(e.buckets))}
	e.next++
	return nil
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
func (e *DeviceEngine) Ready(i int, grad kernels.DevicePtr, s kernels.Stream) error {
	call := fmt.Sprintf("Ready(%d)", i)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable(call); err != nil {
		return err
	}
	st := e.cur
	if st == nil {
		return &UsageError{Call: call, Err: ErrNoStep, Detail: "call Step first"}
	}
	if err := st.refuse(call, i); err != nil {
		return err
	}
	if grad == 0 || grad%4 != 0 {
		return &UsageError{Call: call, Err: ErrBadPointer, Detail: fmt.Sprintf("gradient at %#x", grad)}
	}
	st.ready[i] = true
	st.grads[i] = grad
	if st.err != nil {
		return st.err
	}
	if err := e.encode(st, i, s); err != nil {
		st.err = &StepError{Step: st.num, Bucket: i, Stage: "encode launch", Err: err}
		return st.err
	}
	for st.cursor < len(e.buckets) && st.ready[st.cursor] {
		if err := e.launch(st, st.cursor); err != nil {
			st.err = &StepError{Step: st.num, Bucket: st.cursor, Stage: "exchange launch", Err: err}
			return st.err
		}
		st.cursor++
	}
	if st.cursor == len(e.buckets) {
		if err := e.dev.Record(e.done, e.dec); err != nil {
			st.err = &StepError{Step: st.num, Bucket: -1, Stage: "done event", Err: err}
			return st.err
		}
	}
	return nil
}

// key returns the compress.Key of this rank's stage-1 payload of part j
// of bucket i (j = 0 for the gather strategies): Engine's keys (tag 1 +
// rank·N + j), or tag 0 on every rank for random-k, whose indices must
// then agree (shared-index's key).
func (e *DeviceEngine) key(step uint64, i, j int) compress.Key {
	tag := uint64(1 + e.rank*e.size + j)
	if e.codec.Reference().Codec() == compress.CodecRandomK {
		tag = 0
	}
	return compress.Key{Bucket: tag<<32 | uint64(i), Step: step}
}

// key2 returns the key of this rank's SRA stage-2 payload of bucket i
// (tag 1 + N² + rank, as Engine).
func (e *DeviceEngine) key2(step uint64, i int) compress.Key {
	return compress.Key{Bucket: uint64(1+e.size*e.size+e.rank)<<32 | uint64(i), Step: step}
}

// encode enqueues bucket i's compression: the encode stream waits for the
// caller's stream s.
func (e *DeviceEngine) encode(st *devStep, i int, s kernels.Stream) error {
	b := e.buckets[i]
	if err := e.dev.Record(b.ready, s); err != nil {
		return err
	}
	if err := e.dev.WaitEvent(e.enc, b.ready); err != nil {
		return err
	}
	if err := e.dev.Record(b.encBeg, e.enc); err != nil {
		return err
	}
	if b.compressed {
		count := 1
		if e.strategy == StrategyQuantSRA {
			count = e.size
		}
		for j := range count {
			lo, hi := 0, b.n
			if count > 1 {
				lo, hi = e.part.bounds(b.n, j)
			}
			slot := b.send + kernels.DevicePtr(j*b.slot)
			off := kernels.DevicePtr(4 * lo)
			a := kernels.EncodeArgs{Body: slot + kernels.StatusLen, Grad: st.grads[i] + off, Work: b.work,
				Status: slot, N: hi - lo, Key: e.key(st.num, i, j)}
			if e.cfg.ErrorFeedback {
				a.Resid, a.ResidOut = b.resid+off, b.out+off
			}
			if err := e.dev.Encode(e.codec, e.enc, a); err != nil {
				return err
			}
		}
	}
	return e.dev.Record(b.encEnd, e.enc)
}

// launch enqueues bucket i's exchange on the wire stream and its decode
// and average on the decode stream (SRA: the owner's sum, average and
// re-encode on the decode stream between its two collectives).
func (e *DeviceEngine) launch(st *devStep, i int) error {
	b, grad := e.buckets[i], st.grads[i]
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	avg := kernels.AverageArgs{Dst: grad, N: b.n, Ranks: e.size, Out: e.statuses + kernels.DevicePtr(kernels.StatusLen*i)}
	var ops []func() error
	switch {
	case !b.compressed:
		ops = []func() error{
			func() error { return e.dc.AllReduce(ctx, comm.DevicePtr(grad), b.n, comm.Stream(e.wire)) },
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
		}
	case e.strategy == StrategyQuantSRA:
		lo, hi := e.part.bounds(b.n, e.rank)
		bodies := func(base kernels.DevicePtr, slot int) []kernels.DevicePtr {
			out := make([]kernels.DevicePtr, e.size)
			for r := range out {
				out[r] = base + kernels.DevicePtr(r*slot+kernels.StatusLen)
			}
			return out
		}
		ops = []func() error{
			func() error {
				return e.dc.AllToAll(ctx, comm.DevicePtr(b.recv), comm.DevicePtr(b.send), e.size*b.slot, comm.Stream(e.wire))
			},
			func() error { return e.dev.Record(b.xMid, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xMid) },
			func() error {
				return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: b.mid, N: hi - lo, Bodies: bodies(b.recv, b.slot)})
			},
			func() error {
				return e.dev.Average(e.dec, kernels.AverageArgs{Dst: b.mid, N: hi - lo, Ranks: e.size, Slots: b.recv,
					Stride: b.slot, Count: e.size, Out: e.midStatuses + kernels.DevicePtr(kernels.StatusLen*i)})
			},
			func() error {
				a := kernels.EncodeArgs{Body: b.send2 + kernels.StatusLen, Grad: b.mid, Work: b.work2, Status: b.send2,
					N: hi - lo, Key: e.key2(st.num, i)}
				if e.cfg.ErrorFeedback {
					a.Resid, a.ResidOut = b.resid2, b.out2
				}
				return e.dev.Encode(e.codec, e.dec, a)
			},
			func() error { return e.dev.Record(b.midEnd, e.dec) },
			func() error { return e.dev.WaitEvent(e.wire, b.midEnd) },
			func() error {
				return e.dc.AllGather(ctx, comm.DevicePtr(b.recv2), comm.DevicePtr(b.send2), b.slot2, comm.Stream(e.wire))
			},
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
		}
		for j, body := range bodies(b.recv2, b.slot2) {
			lo, hi := e.part.bounds(b.n, j)
			ops = append(ops, func() error {
				return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: grad + kernels.DevicePtr(4*lo), N: hi - lo, Bodies: []kernels.DevicePtr{body}})
			})
		}
		avg.Ranks, avg.Slots, avg.Stride, avg.Count = 1, b.recv2, b.slot2, e.size
	default:
		ops = []func() error{
			func() error {
				return e.dc.AllGather(ctx, comm.DevicePtr(b.recv), comm.DevicePtr(b.send), b.slot, comm.Stream(e.wire))
			},
			func() error { return e.dev.Record(b.xEnd, e.wire) },
			func() error { return e.dev.WaitEvent(e.dec, b.xEnd) },
			func() error { return e.dev.Record(b.decBeg, e.dec) },
			func() error {
				bodies := make([]kernels.DevicePtr, e.size)
				for r := range bodies {
					bodies[r] = b.recv + kernels.DevicePtr(r*b.slot+kernels.StatusLen)
				}
				return e.dev.Decode(e.codec, e.dec, kernels.DecodeArgs{Dst: grad, N: b.n, Bodies: bodies, Key: e.key(st.num, i, 0)})
			},
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
	for _, f := range ops {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// Done makes stream s (the caller's, before its optimizer step) wait for
// the end of the step's last bucket, without blocking the host. It needs
// every bucket ready (else a *UsageError, ErrNotReady). Wait must still be
// called to settle the step.
func (e *DeviceEngine) Done(s kernels.Stream) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable("Done"); err != nil {
		return err
	}
	st := e.cur
	switch {
	case st == nil:
		return &UsageError{Call: "Done", Err: ErrNoStep, Detail: "call Step first"}
	case st.err != nil:
		return st.err
	case st.cursor < len(e.buckets):
		return &UsageError{Call: "Done", Err: ErrNotReady, Detail: fmt.Sprintf("step %d: bucket %d is not ready", st.num, st.cursor)}
	}
	return e.dev.WaitEvent(s, e.done)
}

// Wait blocks the host until the step's work on the device has finished,
// or the DeviceComm's timeout or ctx ends it (the communicator is then
// aborted), then settles error-feedback memory and returns the step's
// statistics (partial on error). Without a step it returns a *UsageError
// (ErrNoStep); a bucket never made ready fails the step (ErrNotReady).
// Errors: a *NonFiniteError (FailOnNonFinite) leaves the engine usable;
// any other breaks it (see the type's doc).
func (e *DeviceEngine) Wait(ctx context.Context) (StepStats, error) {
	e.mu.Lock()
	if err := e.usable("Wait"); err != nil {
		e.mu.Unlock()
		return StepStats{}, err
	}
	st := e.cur
	switch {
	case st == nil:
		e.mu.Unlock()
		return StepStats{}, &UsageError{Call: "Wait", Err: ErrNoStep, Detail: "call Step first"}
	case st.waiting:
		e.mu.Unlock()
		return StepStats{}, &UsageError{Call: "Wait", Err: ErrWaiting, Detail: fmt.Sprintf("another Wait is waiting for step %d", st.num)}
	}
	st.waiting = true
	e.busy.Lock()
	e.mu.Unlock()
	res, err := e.finish(ctx, st)
	e.busy.Unlock()
	e.mu.Lock()
	e.cur = nil
	var nf *NonFiniteError
	if err != nil && !errors.As(err, &nf) && e.broken == nil {
		e.broken = err
	}
	e.mu.Unlock()
	return res, err
}

// finish waits for st's work, settles and builds the statistics.
func (e *DeviceEngine) finish(ctx context.Context, st *devStep) (StepStats, error) {
	fatal := st.err
	if fatal == nil && st.cursor < len(e.buckets) {
		var missing []int
		for i, ok := range st.ready {
			if !ok {
				missing = append(missing, i)
			}
		}
		fatal = &UsageError{Call: "Wait", Err: ErrNotReady, Detail: fmt.Sprintf("step %d: Ready was not called for buckets %v", st.num, missing)}
	}
	t0 := time.Now()
	if fatal != nil || st.cursor < len(e.buckets) {
		if err := e.seal(); err != nil && fatal == nil {
			fatal = &StepError{Step: st.num, Bucket: -1, Stage: "Wait", Err: err}
		}
	}
	if err := e.dc.Wait(ctx, func() (bool, error) { return e.dev.EventQuery(e.done) }); err != nil && fatal == nil {
		fatal = &StepError{Step: st.num, Bucket: -1, Stage: "Wait", Err: err}
	}
	res := StepStats{Step: st.num, Buckets: make([]BucketStats, len(e.buckets)), Exposed: time.Since(t0)}
	for i, b := range e.buckets {
		res.Buckets[i] = BucketStats{Bucket: i, Elements: b.n, Strategy: e.strategy, Reason: b.reason}
	}
	if fatal != nil {
		res.Total = time.Since(st.start)
		return res, fatal
	}
	statuses := make([]byte, kernels.StatusLen*len(e.buckets))
	if err := e.dev.CopyOut(e.dec, statuses, e.statuses); err != nil {
		return res, &StepError{Step: st.num, Bucket: -1, Stage: "reading statuses", Err: err}
	}
	var nf *NonFiniteError
	var commit []*devBucket
	for i, b := range e.buckets {
		s := &res.Buckets[i]
		fallback, err := e.outcome(b, statuses[kernels.StatusLen*i:kernels.StatusLen*(i+1)], s)
		if err != nil {
			return res, &StepError{Step: st.num, Bucket: i, Stage: "reading statuses", Err: err}
		}
		if fallback != "" {
			s.Reason += "; " + fallback
			if e.cfg.FailOnNonFinite {
				if nf == nil {
					nf = &NonFiniteError{Step: st.num}
				}
				nf.Buckets = append(nf.Buckets, i)
				nf.Details = append(nf.Details, fallback)
			}
		}
		if s.Compressed && e.cfg.ErrorFeedback && !s.NonFinite {
			commit = append(commit, b)
		}
		for _, t := range []struct {
			d          *time.Duration
			start, end kernels.Event
		}{{&s.Compress, b.encBeg, b.encEnd}, {&s.Exchange, b.xBeg, b.xEnd}, {&s.Decompress, b.decBeg, b.decEnd}} {
			if *t.d, err = e.dev.Elapsed(t.start, t.end); err != nil {
				return res, &StepError{Step: st.num, Bucket: i, Stage: "timing events", Err: err}
			}
		}
		switch {
		case b.compressed && e.strategy == StrategyQuantSRA:
			s.BytesSent = allToAllVolume(e.size, e.size*b.slot) + allGatherVolume(e.size, b.slot2)
		case b.compressed:
			s.BytesSent = allGatherVolume(e.size, b.slot)
		default:
			s.BytesSent = allReduceVolume(e.size, 4*b.n)
		}
		res.BytesSent += s.BytesSent
		res.ExchangeTotal += s.Exchange
	}
	res.Total = time.Since(st.start)
	if nf != nil {
		return res, nf // the step is skipped whole: no memory changes
	}
	for _, b := range commit { // install the residuals Encode wrote
		b.resid, b.out = b.out, b.resid
		b.resid2, b.out2 = b.out2, b.resid2
	}
	return res, nil
}

// outcome fills s from bucket b's average status (kernels.Average's Out)
// and returns what went wrong this step, or "".
func (e *DeviceEngine) outcome(b *devBucket, status []byte, s *BucketStats) (string, error) {
	s.Compressed = b.compressed
	if r := binary.LittleEndian.Uint64(status[8:]); r != math.MaxUint64 {
		s.NonFinite = true
		var bad []string
		base, stride, what := b.recv, b.slot, "rank %d has %v"
		if e.strategy == StrategyQuantSRA {
			base, stride, what = b.recv2, b.slot2, "rank %d's part of the sum has %v"
		}
		for q := range e.size {
			slot := make([]byte, kernels.StatusLen)
			if err := e.dev.CopyOut(e.dec, slot, base+kernels.DevicePtr(q*stride)); err != nil {
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
		s.NonFinite = true
		var nfe *compress.NonFiniteError
		if errors.As(err, &nfe) {
			return fmt.Sprintf("the average holds %v at element %d (a rank's gradient held NaN or Inf, or the sum overflowed)", nfe.Value, nfe.Index), nil
		}
		return err.Error(), nil
	}
	return "", nil
}

// seal records the ends of the encode and wire streams and makes the
// decode stream wait for them before the done event, so that the done
// event covers everything enqueued, launched or not.
func (e *DeviceEngine) seal() error {
	for k, s := range []kernels.Stream{e.enc, e.wire} {
		if err := e.dev.Record(e.drained[k], s); err != nil {
			return err
		}
		if err := e.dev.WaitEvent(e.dec, e.drained[k]); err != nil {
			return err
		}
	}
	return e.dev.Record(e.done, e.dec)
}

// Close ends the engine: a step in flight is abandoned (its device work
// is waited for, bounded by the DeviceComm's timeout), then the events and
// streams are destroyed and the device memory freed. It closes neither
// the DeviceComm nor the Device. Later calls return a *UsageError
// (ErrClosed); closing twice returns nil.
func (e *DeviceEngine) Close() error {
	e.busy.Lock()
	defer e.busy.Unlock()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	st := e.cur
	e.cur = nil
	e.mu.Unlock()
	var first error
	if st != nil {
		if err := e.seal(); err != nil {
			first = err
		}
		if err := e.dc.Wait(context.Background(), func() (bool, error) { return e.dev.EventQuery(e.done) }); err != nil && first == nil {
			first = err
		}
	}
	if err := e.release(); err != nil && first == nil {
		first = err
	}
	if first != nil {
		return fmt.Errorf("overlap: DeviceEngine.Close on rank %d: %w", e.rank, first)
	}
	return nil
}

// hostTwin returns a CPU Engine (no Comm, no streams) with this engine's
// spec, strategy, error-feedback flag, buckets and step number: the
// keeper of the state format of Engine.Save and Engine.Load, which the
// device engine shares, so a checkpoint moves between the CPU and the GPU.
// It is for call (Save, Load), with e.busy held, and fails as idle does
// when the engine is closed or a step is in flight.
func (e *DeviceEngine) hostTwin(call string) (*Engine, error) {
	e.mu.Lock()
	err := e.idle(call)
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	cfg := e.cfg
	cfg.Strategy, cfg.Workers = e.strategy, 1
	t := &Engine{cfg: cfg, rank: e.rank, size: e.size, next: e.next}
	if err := t.configure(e.sizes); err != nil {
		return nil, fmt.Errorf("overlap: the device engine's host twin: %w", err)
	}
	return t, nil
}

// idle returns why call cannot touch the device state now: the engine is
// closed or a step is in flight. e.mu is held.
func (e *DeviceEngine) idle(call string) error {
	switch {
	case e.closed:
		return &UsageError{Call: call, Err: ErrClosed}
	case e.cur != nil:
		return &UsageError{Call: call, Err: ErrStepInFlight, Detail: fmt.Sprintf("step %d: call Wait first", e.cur.num)}
	}
	return nil
}

// Save writes the engine's error-feedback memory (copied from the device,
// which waits for the engine's streams) and next step number to w, in
// Engine.Save's format: Engine.Load and DeviceEngine.Load read either's.
// It fails with a *UsageError while a step is in flight or after Close;
// it works after a failed step (the memory then holds e, see the type's
// doc).
func (e *DeviceEngine) Save(w io.Writer) error {
	e.busy.Lock()
	defer e.busy.Unlock()
	t, err := e.hostTwin("Save")
	if err != nil {
		return err
	}
	for i, b := range e.buckets {
		if !b.compressed {
			continue
		}
		lo, hi := e.part.bounds(b.n, e.rank)
		for _, m := range []struct {
			f   *compress.ErrorFeedback
			p   kernels.DevicePtr
			n   int
			tag string
		}{{t.ef1, b.resid, b.n, "stage 1"}, {t.ef2, b.resid2, hi - lo, "stage 2"}} {
			if m.f == nil || m.p == 0 {
				continue
			}
			res := make([]float32, m.n)
			if err := e.dev.CopyOut(e.enc, unsafeBytes(res), m.p); err != nil {
				return fmt.Errorf("overlap: saving device engine state: bucket %d %s: %w", i, m.tag, err)
			}
			if err := m.f.SetResidual(uint64(i), res); err != nil {
				return fmt.Errorf("overlap: saving device engine state: bucket %d %s: %w", i, m.tag, err)
			}
		}
	}
	return t.Save(w)
}

// Load replaces the engine's error-feedback memory and step number with a
// state Engine.Save or DeviceEngine.Save wrote, under Engine.Load's rules
// (same spec, error-feedback flag and bucket layout, else a *StateError;
// validated whole first, so on error nothing changes; any world size). A
// bucket the state holds no memory for starts from zero. The copies to the
// device are ordered before the next step's compression. It fails with a
// *UsageError while a step is in flight or after Close.
func (e *DeviceEngine) Load(r io.Reader) error {
	e.busy.Lock()
	defer e.busy.Unlock()
	t, err := e.hostTwin("Load")
	if err != nil {
		return err
	}
	if err := t.Load(r); err != nil {
		return err
	}
	for i, b := range e.buckets {
		lo, hi := e.part.bounds(b.n, e.rank)
		for _, m := range []struct {
			f *compress.ErrorFeedback
			p kernels.DevicePtr
			n int
		}{{t.ef1, b.resid, b.n}, {t.ef2, b.resid2, hi - lo}} {
			if m.f == nil || m.p == 0 || m.n == 0 {
				continue
			}
			res := m.f.Residual(uint64(i))
			if res == nil {
				res = make([]float32, m.n)
			}
			if err := e.dev.CopyIn(e.enc, m.p, unsafeBytes(res)); err != nil {
				return fmt.Errorf("overlap: loading device engine state: bucket %d: %w", i, err)
			}
		}
	}
	e.mu.Lock()
	e.next = t.next
	e.mu.Unlock()
	return nil
}

// unsafeBytes returns the memory of x as bytes.
func unsafeBytes(x []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}
