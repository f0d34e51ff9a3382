package overlap

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// core is the engine, whatever runs its stages: the step protocol (Step,
// Ready, Done, Wait, Close), the buckets' decisions (pinned, the cost
// model's, verification's), warm-up, the handshake, the statistics, and
// the checkpoint format (state.go). Engine and DeviceEngine are a core and
// a backend: where the buffers live and how a stage runs (goroutine
// streams on the host, CUDA streams and NCCL on a device).
type core struct {
	be         backend
	host       comm.Comm // the handshake's, the cost model's and verification's collectives
	cfg        Config
	rank, size int
	spec       string              // the canonical spec
	caution    Caution             // a warning about the configuration (RandomKMinRatio), or CautionNone
	advice     string              // caution's text, for Reason ("" for CautionNone)
	note       string              // how the buckets are exchanged, where Reason would not say (a two-level StrategyHier, chooseShape's choice), or ""
	trials     bool                // StrategyAuto over a comm that knows its nodes: New chooses flat or hierarchical by trial (shape.go)
	comp       compress.Compressor // the active phase's (Spec's without a Schedule); nil for codec none; fp32 for powersgd
	lowRank    *compress.Spec      // spec powersgd's (StrategyLowRank), else nil
	checking   bool                // a core of CheckState's: no engine, only a state to check
	phases     []phase             // Schedule's phases then Spec's; nil without a Schedule
	sched      string              // StrategyHier: the Schedule with canonical specs (its engine across nodes runs it)
	layout     comm.Topology       // StrategyHier: this rank's place; zero otherwise
	active     int                 // the phase comp, mem1 and mem2 are of
	strategy   Strategy
	// mech is the mechanism that strategy runs (mechanism): strategy
	// itself, but SRA for StrategyDense with fp16 or bf16, and for
	// StrategyHier: StrategyHier for the sharded exchange (hier.go), or
	// the codec's flat strategy over the two-level comm for top-k and
	// random-k (twolevel.go).
	mech Strategy
	// The compressors whose error-feedback memories the state holds: stage
	// 1 and SRA's stage 2 (nil: no such memory).
	mem1, mem2 compress.Compressor
	buckets    []*bucket
	model      *costModel // nil unless Decision is DecideAuto and the backend has a cost model
	verify     *verifier  // non-nil with DecideAuto: checks the decisions against measured times
	timing     timing     // the clock, or a test's times
	// timesOnStreams: the backend times a bucket by events on its own
	// streams (the device's), which a delegated bucket never reaches, so
	// none is delegable in a step verification measures.
	timesOnStreams bool

	mu     sync.Mutex
	cur    *step
	next   uint64 // the number of the next step
	closed bool
	broken error // the failure that broke the engine
}

// backend runs a core's stages. The core calls prepare, encode (through
// ready's caller), launch and launched with its mutex held, in the step's
// order; wait, conclude and settle once per step from finish; memory and
// install with no step in flight; teardown once, from Close.
type backend interface {
	// prepare readies bucket b for the compressed path (its buffers), the
	// first time b takes it.
	prepare(b *bucket) error
	// launch enqueues run r's exchange and decode, after its encode; the
	// core calls it in bucket order, the same on every rank.
	launch(st *step, r *run) error
	// launched is called once every bucket of st is launched.
	launched(st *step) error
	// wait blocks until st's work has ended, st failed or ctx ended, and
	// returns st's fatal failure; nothing of st runs after it returns.
	wait(ctx context.Context, st *step) error
	// conclude completes the runs' outcomes and statistics after a step
	// without a fatal failure; its error is fatal.
	conclude(st *step) error
	// settle ends the step's error-feedback (and momentum) updates: a
	// step delivered installs what its compressed buckets held back, a
	// skipped one leaves everything as it was before the step, a failed
	// one keeps the memory as the backend's doc says.
	settle(st *step, how stepEnd)
	// memory returns the error-feedback memories the state holds (copies
	// of device memory), or why they cannot be read.
	memory(call string) (gradEF, partEF *compress.ErrorFeedback, err error)
	// install replaces the memories with ones Load validated.
	install(gradEF, partEF *compress.ErrorFeedback) error
	// velocity returns bucket i's momentum-correction velocity u (nil:
	// none yet, or no momentum correction; a copy of device memory), or
	// why it cannot be read; setVelocity replaces every bucket's with
	// ones Load validated (nil: zero).
	velocity(i int) ([]float32, error)
	setVelocity(us [][]float32) error
	// usePhase moves to the schedule phase the core just made active
	// (comp, mem1, mem2): the compressed path's compressors and buffers
	// change, error-feedback memory carries over.
	usePhase()
	// teardown releases the backend's resources.
	teardown() error
}

// bucket is one bucket's decision and, on the host backend, its buffers.
type bucket struct {
	idx, n     int
	compressed bool   // the compressed path, unless a step falls back (DecideAuto: changed by verification between steps)
	reason     string // why (the decision and its inputs)
	predicted  string // the cost model's prediction and inputs (DecideAuto)
	predDense  time.Duration
	predComp   time.Duration
	measDense  time.Duration // verification's latest measurements (DecideAuto), 0 until then
	measComp   time.Duration
	// guard is why the accuracy guard flushes the bucket's next
	// compressed step ("": it does not); part of the engine's state.
	guard string
	// origin is who made the decision: OriginPinned, OriginCostModel or
	// OriginVerification; OriginCodec (the zero value) for codec none and
	// for StrategyHier's outer buckets, whose engine across nodes decides.
	origin Origin
	hostBuffers
}

// Outcomes of a bucket in a step.
const (
	pathNone = iota // not exchanged (the step failed first)
	pathCompressed
	pathDense
	pathSkipped // not exchanged: non-finite with FailOnNonFinite
)

// stepEnd is how a step ended, for settle.
type stepEnd int

const (
	stepDelivered stepEnd = iota // every bucket's average was delivered
	// stepSkipped: a *NonFiniteStepError on every rank (FailOnNonFinite);
	// the caller skips the step, and so does every memory, on every rank
	// alike.
	stepSkipped
	stepFailed // a fatal failure: the engine is broken
)

// run is one bucket in one step.
type run struct {
	b          *bucket
	compressed bool    // the path this step takes (b's decision, dense in warm-up, the other in a verification trial)
	flush      bool    // dense with the residual: the accuracy guard tripped (Config.Guard)
	heldBack   float64 // the largest ρ of the ranks' compressed payloads (Config.Guard), from their statuses
	key        compress.Key

	outcome   int
	fallback  string // why this step went dense or was skipped
	nonFinite bool
	stats     BucketStats

	readyAt, doneAt time.Time // Ready's call, the end of decode (verification's measure); Delegate's and DelegateDone's
	delegated       bool      // the caller exchanges it (Delegate)
	handedBack      *event    // Delegate: fires at DelegateDone (the host backend waits for it)
	decoded         *event    // host backend: fires after the decode (set when it is enqueued)
	hostRun                   // the host backend's part
	deviceRun                 // the device backend's part
}

// step is one step in flight.
type step struct {
	num     uint64
	ready   []bool
	cursor  int  // buckets below it are launched
	waiting bool // set by the first Wait or Close; Ready is refused after

	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time
	runs   []*run
	warmup bool   // a warm-up step (Config.Warmup): every bucket dense
	done   *event // host backend: fires after the last bucket's decode; nil until launched
	held   *run   // host backend: the launched bucket whose second round waits for the next launch
	// StrategyHier: the step of the engine across nodes (set at the first
	// launch) and, once its Wait returned, its statistics.
	nested       *step
	nestedResult StepStats

	errMu  sync.Mutex
	err    error         // the first fatal failure
	failed chan struct{} // closed with err

	finish   sync.Once
	result   StepStats
	finalErr error
}

func (st *step) fail(err error) {
	st.errMu.Lock()
	defer st.errMu.Unlock()
	if st.err == nil {
		st.err = err
		close(st.failed)
		st.cancel()
	}
}

func (st *step) failure() error {
	st.errMu.Lock()
	defer st.errMu.Unlock()
	return st.err
}

// newCore checks cfg and sizes and sets up what every backend shares: the
// compressor, the strategy (strategyFor resolves StrategyAuto and refuses
// what the backend lacks), the memories and the buckets. The error is
// this rank's invalid configuration, which the handshake reports to every
// rank; the core is usable for the handshake either way.
func newCore(host comm.Comm, cfg Config, sizes []int, t timing, strategyFor func(Strategy, compress.Codec, int) (Strategy, error)) (*core, error) {
	c := &core{host: host, cfg: withDefaults(cfg), rank: host.Rank(), size: host.Size(), timing: t}
	return c, c.configure(sizes, strategyFor)
}

// checkMasking refuses Config.MomentumMasking with a top-k spec whose
// kept values are quantized (bits=): its payload is not its input at the
// indices it sends (not a compress.SparseCompressor), so the memory's
// CommitMasked would mask nothing.
func checkMasking(cfg Config, s compress.Spec) error {
	if cfg.MomentumMasking && s.Bits != 0 {
		return fmt.Errorf("MomentumMasking with spec %s: masking needs a payload that is its input at the indices it sends (top-k without bits=, random-k), and bits=%d quantizes them", s, s.Bits)
	}
	return nil
}

func (c *core) configure(sizes []int, strategyFor func(Strategy, compress.Codec, int) (Strategy, error)) error {
	cfg := c.cfg
	if err := checkConfig(cfg, sizes, c.size); err != nil {
		return err
	}
	comp, err := c.parseSpec(cfg.Spec)
	if err != nil {
		return err
	}
	if comp.Spec().Lossless != compress.LosslessNone {
		return fmt.Errorf("spec %s: a lossless stage makes payload lengths vary, and every strategy exchanges fixed-size slots", comp.Spec())
	}
	if err := checkMasking(cfg, comp.Spec()); err != nil {
		return err
	}
	c.spec = comp.Spec().String()
	codec := comp.Codec()
	if c.lowRank != nil {
		c.spec, codec = c.lowRank.String(), compress.CodecPowerSGD
		if err := c.checkLowRank(); err != nil {
			return err
		}
	}
	if c.strategy, err = strategyFor(cfg.Strategy, codec, c.size); err != nil {
		return err
	}
	if err := fits(fmt.Sprintf("the bookkeeping of %d buckets on %d ranks", len(sizes), c.size), bookkeeping(len(sizes), c.size)); err != nil {
		return err
	}
	c.buckets = make([]*bucket, len(sizes))
	for i, n := range sizes {
		c.buckets[i] = &bucket{idx: i, n: n}
	}
	if c.mech = mechanism(c.strategy, codec, c.size); c.mech == StrategyHier {
		// The engine across nodes compresses (hier.go): this core keeps
		// no compressor, memory or decision of its own.
		return c.configureHier()
	}
	if comp.Codec() == compress.CodecNone && c.lowRank == nil {
		if len(cfg.Schedule) > 0 {
			return fmt.Errorf("a Schedule leads to a compressing Spec, not %s", comp.Spec())
		}
		for _, b := range c.buckets {
			b.reason = "codec none: dense all-reduce"
		}
		return nil
	}
	if err := c.configurePhases(comp, strategyFor); err != nil {
		return err
	}
	c.comp = comp
	if s := comp.Spec(); s.Codec == compress.CodecRandomK && s.Ratio < RandomKMinRatio {
		c.caution = CautionRandomKRatio
		c.advice = fmt.Sprintf("caution: random-k %v keeps fewer than %v of each bucket, unscaled; "+
			"accuracy at the same step budget suffers (see RandomKMinRatio)", s.Ratio, RandomKMinRatio)
	}
	c.mem1, c.mem2 = c.memories(comp)
	if c.phases != nil {
		c.comp, c.mem1, c.mem2 = c.phases[0].comp, c.phases[0].mem1, c.phases[0].mem2
	}
	return nil
}

// parseSpec is the compressor of spec: compress.Parse's, or for powersgd
// (which has no payload of its own) the fp32 compressor that stands in
// for its memories, with c.lowRank set to the spec.
func (c *core) parseSpec(spec string) (compress.Compressor, error) {
	s, err := compress.ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	if s.Codec == compress.CodecPowerSGD {
		lr := s
		c.lowRank = &lr
		s = compress.Spec{Codec: compress.CodecNone}
	}
	return compress.New(s, compress.WithWorkers(c.cfg.Workers))
}

// checkLowRank refuses what StrategyLowRank does not do (yet).
func (c *core) checkLowRank() error {
	switch cfg := c.cfg; {
	case cfg.Shapes == nil && !c.checking:
		return fmt.Errorf("spec %s needs Config.Shapes: the shapes of each bucket's tensors", c.spec)
	case len(cfg.Schedule) > 0:
		return fmt.Errorf("spec %s takes no Schedule", c.spec)
	case cfg.Guard > 0:
		return fmt.Errorf("spec %s has no accuracy guard (Guard) yet", c.spec)
	}
	return nil
}

// memories returns the compressors of comp's error-feedback memories
// (nil without error feedback). SRA's second stage has one, but for sign:
// feeding back the error of the sign of the averaged signs cost the
// digits CNN 12 points (scripts/digits-momentum.py --model cnn, seeds
// 1–3: 0.862 mean with it, 0.965 without, dense 0.982), for half a point
// on the digits MLP (0.970 with it, 0.966 without, dense 0.971).
func (c *core) memories(comp compress.Compressor) (mem1, mem2 compress.Compressor) {
	if c.lowRank != nil {
		// Low-rank's residual (with error feedback) and its warm start's
		// Q (lowrank.go), vectors it computes itself.
		if c.cfg.ErrorFeedback {
			mem1 = comp
		}
		if !c.lowRank.Cold {
			mem2 = comp
		}
		return mem1, mem2
	}
	if !c.cfg.ErrorFeedback {
		return nil, nil
	}
	s1, s2 := stageParts(comp, c.mech, c.rank, c.size, c.cfg.Guard > 0)
	mem1 = s1.forMemory()
	if s2 != nil && comp.Codec() != compress.CodecSign {
		mem2 = s2.forMemory()
	}
	return mem1, mem2
}

// verifying reports whether verification measures st: with DecideAuto,
// after the warm-up steps and the schedule's phases before Spec's (their
// codecs are not the one the cost model decided for).
func (c *core) verifying(st *step) bool {
	if c.verify == nil || st.warmup {
		return false
	}
	return c.phases == nil || st.num >= c.phases[len(c.phases)-2].end
}

// decide sets every bucket's path, pinned or, with DecideAuto, by auto
// (the backend's cost model, verified online afterwards), and prepares
// the compressed buckets.
func (c *core) decide(ctx context.Context, auto func(context.Context) (*costModel, error)) error {
	if c.comp == nil {
		return nil
	}
	switch c.cfg.Decision {
	case DecideCompressed:
		for _, b := range c.buckets {
			b.compressed, b.reason, b.origin = true, "pinned: compressed", OriginPinned
		}
	case DecideDense:
		for _, b := range c.buckets {
			b.reason, b.origin = "pinned: dense", OriginPinned
		}
	default:
		if c.phases != nil {
			// The model decides for Spec; Step moves to the schedule's
			// first phase.
			c.activate(len(c.phases) - 1)
		}
		m, err := auto(ctx)
		if err != nil {
			return err
		}
		c.model = m
		c.verify = newVerifier(len(c.buckets))
	}
	for _, b := range c.buckets {
		if b.compressed {
			if err := c.be.prepare(b); err != nil {
				return fmt.Errorf("overlap: preparing bucket %d on rank %d: %w", b.idx, c.rank, err)
			}
		}
	}
	return nil
}

// Strategy returns the strategy in use (StrategyAuto resolved).
func (c *core) Strategy() Strategy { return c.strategy }

// Compressed reports, per bucket, whether the pinned Decision, or with
// DecideAuto the cost model and then its verification, chose the
// compressed path for the steps to come (a step may still fall back to
// dense, warm-up steps are dense, and a verification trial takes the
// other path: see BucketStats).
func (c *core) Compressed() []bool {
	if n, ok := c.be.(nester); ok {
		return n.nestedCore().Compressed()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]bool, len(c.buckets))
	for i, b := range c.buckets {
		out[i] = b.compressed
	}
	return out
}

// usable returns why call cannot run: the engine is closed or broken.
// c.mu is held.
func (c *core) usable(call string) error {
	switch {
	case c.closed:
		return &UsageError{Call: call, Err: ErrEngineClosed}
	case c.broken != nil:
		return &BrokenError{Cause: c.broken}
	}
	return nil
}

// Step starts a step. Step numbers count from 0 (or from the number Load
// restored) and, with the bucket index, key random-k indices and stochastic
// rounding, so every rank must call Step the same number of times. A step
// in flight (no Wait yet) is a *UsageError (ErrStepInFlight).
func (c *core) Step() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable("Step"); err != nil {
		return err
	}
	if c.cur != nil {
		return &UsageError{Call: "Step", Err: ErrStepInFlight, Detail: fmt.Sprintf("step %d has not been waited for", c.cur.num)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &step{num: c.next, ready: make([]bool, len(c.buckets)), ctx: ctx, cancel: cancel,
		start: time.Now(), failed: make(chan struct{}), runs: make([]*run, len(c.buckets))}
	st.warmup = st.num < uint64(c.cfg.Warmup)
	if p := c.phaseAt(st.num); c.phases != nil && p != c.active {
		c.activate(p)
	}
	trial := c.verifying(st) && c.verify.trial()
	trialPath := trial && c.trialPath()
	for i, b := range c.buckets {
		path := b.compressed && !st.warmup
		if trial {
			path = trialPath
		}
		flush := path && b.guard != ""
		origin := b.origin
		switch {
		case flush:
			origin = OriginGuard
		case trial:
			origin = OriginTrial
		case st.warmup && b.compressed:
			origin = OriginWarmup
		}
		if path {
			if err := c.be.prepare(b); err != nil {
				cancel()
				return &StepError{Step: st.num, Bucket: i, Stage: "prepare", Err: err}
			}
		}
		st.runs[i] = &run{b: b, compressed: path && !flush, flush: flush, key: compress.Key{Bucket: uint64(i), Step: st.num},
			stats: BucketStats{Bucket: i, Elements: b.n, Strategy: c.strategy, Reason: b.reason, Trial: trial, Guarded: flush,
				GuardThreshold: c.cfg.Guard, Origin: origin, Caution: c.caution,
				PredictedDense: b.predDense, PredictedCompressed: b.predComp, MeasuredDense: b.measDense, MeasuredCompressed: b.measComp}}
		if flush {
			st.runs[i].stats.Reason += "; accuracy guard: dense with the residual (" + b.guard + ")"
		}
		if c.note != "" {
			st.runs[i].stats.Reason += "; " + c.note
		}
		if c.advice != "" {
			st.runs[i].stats.Reason += "; " + c.advice
		}
		if c.phases != nil && !st.warmup {
			st.runs[i].stats.Reason += fmt.Sprintf("; schedule phase %d of %d: %s", c.active+1, len(c.phases), c.phases[c.active].spec)
		}
		switch {
		case trial:
			st.runs[i].stats.Reason += "; verification trial: " + pathName(path)
		case st.warmup && b.compressed:
			st.runs[i].stats.Reason += fmt.Sprintf("; warm-up: dense before step %d", c.cfg.Warmup)
		}
	}
	c.next++
	c.cur = st
	return nil
}

// ready is Ready's protocol for bucket i: check refuses a gradient the
// bucket cannot take (a *UsageError, nothing taken); encode takes it and
// enqueues its compression; then every bucket whose predecessors are
// launched is launched, in bucket order, so that all ranks make the same
// collectives in the same order. A launch that fails ends the step: the
// *StepError is returned here and by Wait.
func (c *core) ready(call string, i int, check func(b *bucket) error, encode func(st *step, r *run) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(call); err != nil {
		return err
	}
	st := c.cur
	if st == nil {
		return &UsageError{Call: call, Err: ErrNoStep, Detail: "call Step first"}
	}
	switch {
	case i < 0 || i >= len(st.ready):
		return &UsageError{Call: call, Err: ErrUnknownBucket, Detail: fmt.Sprintf("the engine has buckets 0 to %d", len(st.ready)-1)}
	case st.waiting:
		return &UsageError{Call: call, Err: ErrWaiting, Detail: fmt.Sprintf("step %d", st.num)}
	case st.ready[i]:
		return &UsageError{Call: call, Err: ErrAlreadyReady, Detail: fmt.Sprintf("in step %d", st.num)}
	}
	if err := check(c.buckets[i]); err != nil {
		return err
	}
	st.ready[i] = true
	r := st.runs[i]
	r.readyAt = time.Now()
	if err := encode(st, r); err != nil {
		if f := st.failure(); f == err {
			return f // the step had failed already
		}
		err = &StepError{Step: st.num, Bucket: i, Stage: "encode launch", Err: err}
		st.fail(err)
		return err
	}
	for st.cursor < len(st.runs) && st.ready[st.cursor] {
		if err := c.be.launch(st, st.runs[st.cursor]); err != nil {
			err = &StepError{Step: st.num, Bucket: st.cursor, Stage: "exchange launch", Err: err}
			st.fail(err)
			return err
		}
		st.cursor++
		if st.cursor == len(st.runs) {
			if err := c.be.launched(st); err != nil {
				err = &StepError{Step: st.num, Bucket: -1, Stage: "done event", Err: err}
				st.fail(err)
				return err
			}
		}
	}
	return nil
}

// Wait blocks until every bucket of the step is exchanged and averaged, or
// the step fails, or ctx ends, and returns the step's statistics (partial
// on error). Without a step it returns a *UsageError (ErrNoStep). If a
// bucket was never made ready, it fails at once with ErrNotReady.
//
// Failures: a *NonFiniteStepError (FailOnNonFinite) leaves the engine
// usable and skips the step: every rank's error-feedback memory and
// momentum velocity are as before it. Any other error (a *StepError: a
// collective failed or timed out, a payload did not decode, ctx ended; or
// ErrNotReady) breaks it, since the ranks may be out of step. What a
// failed step leaves in error-feedback memory is the backend's (Engine:
// e + g; DeviceEngine: e).
func (c *core) Wait(ctx context.Context) (StepStats, error) {
	c.mu.Lock()
	if err := c.usable("Wait"); err != nil {
		c.mu.Unlock()
		return StepStats{}, err
	}
	st := c.cur
	if st == nil {
		c.mu.Unlock()
		return StepStats{}, &UsageError{Call: "Wait", Err: ErrNoStep, Detail: "call Step first"}
	}
	if st.waiting {
		c.mu.Unlock()
		return StepStats{}, &UsageError{Call: "Wait", Err: ErrWaiting, Detail: fmt.Sprintf("another Wait is waiting for step %d", st.num)}
	}
	st.waiting = true
	var missing []int
	for i, ok := range st.ready {
		if !ok {
			missing = append(missing, i)
		}
	}
	c.mu.Unlock()
	if len(missing) > 0 {
		st.fail(&UsageError{Call: "Wait", Err: ErrNotReady, Detail: fmt.Sprintf("step %d: Ready was not called for buckets %v", st.num, missing)})
	}
	c.finish(ctx, st)
	return st.result, st.finalErr
}

// close is Close: a step in flight is abandoned (its Wait, if any,
// returns an error), then the backend is torn down. Closing twice returns
// nil.
func (c *core) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	st := c.cur
	if st != nil {
		st.waiting = true
	}
	c.mu.Unlock()
	if st != nil {
		st.fail(&UsageError{Call: "Close", Err: ErrEngineClosed, Detail: fmt.Sprintf("step %d abandoned", st.num)})
		c.finish(context.Background(), st)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.be.teardown()
}

// finish waits for st to end, settles error-feedback memory, runs
// verification and builds the statistics; it runs once per step, and a
// second caller waits for the first.
func (c *core) finish(ctx context.Context, st *step) {
	st.finish.Do(func() {
		t0 := time.Now()
		fatal := c.be.wait(ctx, st)
		exposed := time.Since(t0)
		st.cancel()
		if fatal == nil {
			if err := c.be.conclude(st); err != nil {
				st.fail(err)
				fatal = err
			}
		}
		var nf *NonFiniteStepError
		for _, r := range st.runs {
			if r.outcome == pathSkipped {
				if nf == nil {
					nf = &NonFiniteStepError{Step: st.num}
				}
				nf.Buckets = append(nf.Buckets, r.b.idx)
				nf.Details = append(nf.Details, r.fallback)
			}
		}
		switch {
		case fatal != nil:
			c.be.settle(st, stepFailed)
		case nf != nil:
			c.be.settle(st, stepSkipped)
		default:
			c.be.settle(st, stepDelivered)
		}
		c.guardStep(st, fatal == nil && nf == nil)
		if fatal == nil && c.verifying(st) {
			if err := c.verifyStep(ctx, st); err != nil {
				fatal = err
			}
		}

		res := StepStats{Step: st.num, Buckets: make([]BucketStats, len(st.runs)), Exposed: exposed}
		for i, r := range st.runs {
			s := r.stats
			s.Compressed = r.outcome == pathCompressed
			s.HeldBack = r.heldBack
			s.NonFinite = r.nonFinite
			if r.outcome == pathSkipped || r.outcome == pathDense && r.compressed {
				s.Origin = OriginFallback
			}
			if r.fallback != "" {
				s.Reason += "; " + r.fallback
			}
			res.Buckets[i] = s
			res.BytesSent += s.BytesSent
			res.ExchangeTotal += s.Exchange
		}
		res.Total = time.Since(st.start)
		st.result = res
		switch {
		case fatal != nil:
			st.finalErr = fatal
		case nf != nil:
			st.finalErr = nf
		}
		c.mu.Lock()
		c.cur = nil
		if fatal != nil && c.broken == nil {
			c.broken = fatal
		}
		c.mu.Unlock()
	})
}

// guardStep updates the accuracy guard after step st and sets each
// bucket's BucketStats.Guard. After a step delivered, a bucket flushed is
// done with it, and a compressed one whose ρ passed Config.Guard on some
// rank flushes next time; after another, nothing changes. Every rank sees
// the same outcomes and ρ, so they decide alike. StrategyHier's engine
// across nodes guards the shards: its states are the buckets' (conclude).
func (c *core) guardStep(st *step, delivered bool) {
	if _, nested := c.be.(nester); nested {
		return
	}
	for _, r := range st.runs {
		r.stats.Guard = c.guardAfter(st, r, delivered)
	}
}

// guardAfter updates run r's bucket's pending flush after step st (see
// guardStep) and returns its state.
func (c *core) guardAfter(st *step, r *run, delivered bool) GuardState {
	b := r.b
	switch {
	case c.cfg.Guard == 0:
		return GuardOff
	case !delivered:
	case r.flush && r.outcome == pathDense && !r.nonFinite:
		b.guard = ""
	case r.outcome == pathCompressed && r.heldBack > c.cfg.Guard:
		b.guard = fmt.Sprintf("step %d held back ‖e‖ = %.3g·‖g‖ > %g", st.num, r.heldBack, c.cfg.Guard)
		r.stats.Reason += "; accuracy guard: " + b.guard + ", the next compressed step flushes"
		return GuardTripped
	}
	if b.guard != "" {
		return GuardPending
	}
	return GuardClear
}

// The bytes one rank sends in each collective, by the usual ring and
// pairwise algorithms (NCCL's accounting): an all-reduce of S bytes
// 2(N−1)/N·S, an all-gather of s bytes per rank (N−1)·s, an all-to-all of
// S bytes per rank (N−1)/N·S.
func allReduceVolume(n, bytes int) int64 { return int64(2 * (n - 1) * bytes / n) }
func allGatherVolume(n, bytes int) int64 { return int64((n - 1) * bytes) }
func allToAllVolume(n, bytes int) int64  { return int64((n - 1) * bytes / n) }
