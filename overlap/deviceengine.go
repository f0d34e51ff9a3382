package overlap

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/devresid"
	"github.com/gradcomp/gradcomp/kernels"
)

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
// Config.FeedbackDecay kernels.Scale then multiplies that buffer by β on
// the encode stream (on the decode stream for low-rank, whose residual
// decode writes); with
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
// statistics (stage times measured with device events). A bucket the
// caller all-reduces itself (Delegate, in place of Ready) takes none of
// this: the engine enqueues nothing for it, and the wire stream goes on
// to the next bucket (devicedelegate.go).
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
	x      devExchanger // the strategy's compressed path (newExchanger); nil for codec none

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
	resids         []*devresid.Residual // the memories allocAll made, freed by release
	events         []gpu.Event
	bufs           []*devBuffers // per bucket
	released       bool          // teardown ran: the device state is gone
	hier           *devHier      // a sharded StrategyHier engine's node stages and engine across nodes (the core's backend then); nil otherwise
	// tail enqueues the second round of the low-rank bucket launched last,
	// held until the next bucket's launch (or launched); nil when none.
	tail func() error
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
	core.be, core.timesOnStreams = e, true
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
	e.x = e.newExchanger()
	if err := e.decide(ctx, e.costModel); err != nil {
		e.release()
		return nil, err
	}
	return e, nil
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

// encode enqueues run r's compression: the encode stream waits for the
// caller's stream s, applies momentum correction, then the run's path
// (devPath.encode) between the bucket's encode events.
func (e *DeviceEngine) encode(st *step, r *run, s gpu.Stream) error {
	i, n := r.b.idx, r.b.n
	b := e.bufs[i]
	if err := e.handOver(b.ready, s, e.enc); err != nil {
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
	if err := e.path(r).encode(st, r); err != nil {
		return err
	}
	return e.dev.Record(b.encEnd, e.enc)
}

// launch enqueues run r's exchange on its path (enqueueExchange; none for a
// delegated bucket, which the caller all-reduces), then the second round
// of the low-rank bucket launched before it, if any: so on the wire
// stream bucket i's P's go out before bucket i−1's Q's, and bucket i−1's
// orthogonalization (on the decode stream, between its rounds) runs while
// bucket i's first all-reduce is on the wire, as Engine keeps a bucket's
// last collective in flight. Every rank launches the same buckets in the
// same order, so the collectives match.
func (e *DeviceEngine) launch(st *step, r *run) error {
	prev := e.tail
	e.tail = nil
	if !r.delegated {
		if err := e.enqueueExchange(st, r); err != nil {
			return err
		}
	}
	if prev != nil {
		return prev()
	}
	return nil
}

// enqueueExchange enqueues run r's exchange on its path (devPath.exchange;
// low-rank: its first round, its second held in e.tail) after the wire
// stream waits for its encode.
func (e *DeviceEngine) enqueueExchange(st *step, r *run) error {
	b := e.bufs[r.b.idx]
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	if err := e.dev.WaitEvent(e.wire, b.encEnd); err != nil {
		return err
	}
	if err := e.dev.Record(b.xBeg, e.wire); err != nil {
		return err
	}
	var err error
	e.tail, err = e.path(r).exchange(ctx, st, r)
	return err
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

// Close ends the engine: a step in flight is abandoned (its device work
// is waited for, bounded by the DeviceComm's timeout), then the events and
// streams are destroyed and the device memory freed. It closes neither
// the DeviceComm nor the Device. Later calls return a *UsageError
// (ErrEngineClosed); closing twice returns nil.
func (e *DeviceEngine) Close() error { return e.close() }

// teardown releases the engine's device state (release).
func (e *DeviceEngine) teardown() error {
	if err := e.release(); err != nil {
		return fmt.Errorf("overlap: DeviceEngine.Close on rank %d: %w", e.rank, err)
	}
	return nil
}

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
