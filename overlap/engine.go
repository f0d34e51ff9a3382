package overlap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/twolevel"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/kernels"
)

// Engine exchanges gradient buckets between the ranks of a comm.Comm: a
// training loop calls Step, then Ready for each bucket as backward
// produces it, then Wait before the optimizer step. See the package doc
// for the pipeline, the strategies and the failure semantics.
//
// Step, Ready, Wait, Save, Load and Close may be called from different
// goroutines (Ready from backward hooks, for instance), but one step's calls
// must happen in that order. The engine makes every collective of its Comm,
// in bucket order, on one goroutine: nothing else may use that Comm while
// the engine is open.
type Engine struct {
	*core
	c comm.Comm
	// data makes the bucket collectives and the cost model's link probe:
	// c's view without per-call argument checks where c has one
	// (comm.Unchecker), since every rank derives those calls' lengths
	// from the configuration the handshake compared; else c.
	data      comm.Comm
	exchanger exchanger // the compressed path; nil for codec none
	// gradEF is the error-feedback memory of this rank's gradient (the
	// first compression of every strategy); partEF that of the reduced
	// part this rank owns under SRA (its second compression), else nil.
	gradEF, partEF *compress.ErrorFeedback
	// compute encodes, wire runs the collectives, between runs the work
	// between a two-round strategy's collectives (SRA's reduce), decode
	// decodes and averages.
	compute, wire, between, decode *stream
	// hier runs a sharded StrategyHier engine (the core's backend then):
	// the node stages and the engine across nodes; nil otherwise.
	hier *hierBackend
	// twoLevel is data for a two-level StrategyHier engine (top-k,
	// random-k), which it closes; nil otherwise.
	twoLevel *twolevel.Comm
	probe    []float32 // the cost model's link probes
	// starter is data as a comm.Starter the wire leaves collectives in
	// flight on (inflight.go), nil where it makes them one at a time (a
	// comm that is not one, the engine across nodes of a sharded hier
	// engine).
	starter comm.Starter
	// inFlight are the tails the wire started and has not waited for;
	// the wire's alone.
	inFlight []*tail
}

// hostBuffers are a bucket's buffers on the host backend, allocated by the
// exchanger's setup the first time the bucket takes the compressed path.
type hostBuffers struct {
	prepared   bool   // the exchanger's setup made them
	slot       int    // slot length of the strategy's exchanges
	send, recv []byte // stage-1 slots
	send2      []byte // SRA stage-2 slot
	recv2      []byte
	mid        []float32 // SRA: this rank's part, summed
	vals       []float32 // shared-index: statuses then values
	picks      []uint32  // shared-index: the indices
	mom, next  []float32 // momentum correction: u, and the step's m·u + g until settle installs it
	lowRank    *lowRankBuffers
}

// hostRun is the host backend's part of a run.
type hostRun struct {
	grad    []float32
	encoded *event
	// second is set when the first round of a two-round exchanger ended
	// with every status ok: reduce and the second round follow; reduced
	// fires after reduce.
	second  bool
	reduced *event

	begun        bool   // encode ran
	local        status // this rank's stage-1 status
	pend1, pend2 *compress.Pending
	seed         uint64 // shared-index: the payload's seed
	momentum     bool   // next holds this step's finite u, for settle to install
	tail         *tail  // the bucket's last collective, in flight (inflight.go)
	lowRank      lowRankRun
}

// New builds an engine over c for buckets of the given element counts
// (bucket i has sizes[i] float32s) and runs the handshake: every rank sends
// its protocol version, canonical spec, strategy, error-feedback flag,
// decision mode, FailOnNonFinite, warm-up steps, the accuracy options
// (momentum, schedule, guard, feedback decay; handshake.go lists every
// field) and bucket layout, and a difference is a *ConfigMismatchError on
// every rank naming the field and both values; a rank whose configuration
// is invalid sends only why, and every rank gets a *ConfigError naming it
// (its own wraps its error; see also Refuse). Buckets whose host buffers would need more
// memory than the machine can give make a configuration invalid too (its
// *ConfigError wraps a *MemoryError), checked before anything is
// allocated. With DecideAuto and a
// compressed path it then probes the link and measures the compressor
// (see the package doc) to decide each bucket, identically on every rank.
// New's collectives are bounded by ctx and Config.Timeout each.
func New(ctx context.Context, c comm.Comm, sizes []int, cfg Config) (*Engine, error) {
	return newEngine(ctx, c, sizes, cfg, clockTiming{})
}

// newEngine is New with the cost model's and verification's times from t.
func newEngine(ctx context.Context, c comm.Comm, sizes []int, cfg Config, t timing) (*Engine, error) {
	if c == nil {
		return nil, fmt.Errorf("overlap: New: nil comm.Comm")
	}
	core, local := newCore(c, cfg, sizes, t, resolve)
	e := &Engine{core: core, c: c}
	core.be = e
	if local == nil && e.comp != nil {
		e.exchanger = e.newExchanger()
	}
	hier := local == nil && e.strategy == StrategyHier
	if hier {
		core.layout, local = hierLayout(c)
	}
	core.trials = shapeTrials(c, cfg)
	if local == nil {
		need, what := e.memoryNeed(), "host"
		if e.sharded() {
			in, _ := nodeCodec(cfg.NodeSpec) // checkConfig validated it
			need, what = hierNeed(sizes, core.layout.LocalSize, in), "node"
		}
		local = fits(fmt.Sprintf("the %s buffers of %d buckets on rank %d", what, len(sizes), e.rank), need)
	}
	if err := handshake(ctx, core, sizes, local); err != nil {
		return nil, err
	}
	e.data = c
	if u, ok := c.(comm.Unchecker); ok {
		e.data = u.Unchecked()
	}
	switch {
	case hier && e.sharded():
		h, err := newHier(ctx, e, sizes, t)
		if err != nil {
			return nil, err
		}
		e.hier, core.be = h, h
		return e, nil
	case hier:
		tl, err := newTwoLevel(ctx, e)
		if err != nil {
			return nil, err
		}
		e.data, e.twoLevel = tl, tl
	}
	if s, ok := e.data.(comm.Starter); ok && s.InFlight() >= 2 {
		e.starter = s
	}
	if err := e.decide(ctx, e.costModel); err != nil {
		return nil, err
	}
	e.compute, e.wire, e.between, e.decode = newStream(), newStream(), newStream(), newStream()
	if core.trials {
		return chooseShape(ctx, e, sizes, t)
	}
	return e, nil
}

// efBytesPerElement is the host memory error feedback takes per element
// of a bucket: the residual, and Begin's sum and decoded payload
// (compress.ErrorFeedback).
const efBytesPerElement = 12

// memoryNeed is the host memory e's buckets may come to hold (fits checks
// it before New allocates any of it): each one's bucketNeed and, with
// DecideAuto, the largest one's again for the cost model's scratch engine.
func (e *Engine) memoryNeed() uint64 {
	var need bytesNeed
	largest := 0
	for _, b := range e.buckets {
		need.add(e.bucketNeed(b.n))
		largest = max(largest, b.n)
	}
	if e.cfg.Decision == DecideAuto {
		need.add(e.bucketNeed(largest))
	}
	return uint64(need)
}

// bucketNeed is the host memory a bucket of n elements may come to hold:
// its buffers for the compressed path (unless Decision pins dense; they
// are allocated when it first takes it), error feedback's (both memories)
// and momentum correction's u and m·u + g.
func (e *Engine) bucketNeed(n int) uint64 {
	var need bytesNeed
	if e.exchanger != nil && e.cfg.Decision != DecideDense {
		need.add(e.exchanger.bufferBytes(n))
	}
	if e.mem1 != nil {
		need.addTimes(efBytesPerElement, uint64(n))
	}
	if e.mem2 != nil {
		need.addTimes(efBytesPerElement, uint64(n/e.size+1))
	}
	if e.cfg.Momentum != 0 {
		need.addTimes(8, uint64(n))
	}
	return uint64(need)
}

// stageParts returns the compressors of a strategy's stages on rank of
// size ranks: stage 1 (every strategy) and SRA's stage 2 (nil otherwise);
// guard: their slot heads carry ρ (Config.Guard).
func stageParts(comp compress.Compressor, strategy Strategy, rank, size int, guard bool) (s1, s2 *parts) {
	s1 = &parts{inner: comp, count: 1, stage: 1, rank: rank, ranks: size, guard: guard}
	switch strategy {
	case StrategySharedIndex:
		s1.shared = true
	case StrategyQuantSRA:
		s1.count = size
		s2 = &parts{inner: comp, count: 1, stage: 2, rank: rank, ranks: size, guard: guard}
	}
	return s1, s2
}

// newExchanger builds the compressed path of e.strategy, with its
// error-feedback memories.
func (e *Engine) newExchanger() exchanger {
	stage1, stage2 := stageParts(e.comp, e.mech, e.rank, e.size, e.cfg.Guard > 0)
	c1 := coder{p: stage1}
	if e.cfg.ErrorFeedback {
		e.gradEF = compress.NewErrorFeedback(stage1.forMemory())
		c1.ef = e.gradEF
	}
	switch e.mech {
	case StrategySharedIndex:
		return &sharedExchanger{e: e, c: c1}
	case StrategyQuantSRA:
		c2 := coder{p: stage2}
		if e.mem2 != nil {
			e.partEF = compress.NewErrorFeedback(e.mem2)
			c2.ef = e.partEF
		}
		return &sraExchanger{e: e, c1: c1, c2: c2}
	case StrategyLowRank:
		if e.mem2 != nil {
			e.partEF = compress.NewErrorFeedback(e.mem2)
		}
		x := &lowRankExchanger{e: e, spec: *e.lowRank, c: c1}
		x.useMemory(e.gradEF, e.partEF)
		return x
	}
	return &gatherExchanger{e: e, c: c1}
}

// costModel is DecideAuto's decision: the cost model measures, decides
// every bucket and returns itself.
func (e *Engine) costModel(ctx context.Context) (*costModel, error) {
	m, err := measure(ctx, e.core, e)
	if err != nil {
		return nil, err
	}
	if err := m.decide(ctx, e.core, e.exchanger); err != nil {
		return nil, err
	}
	return m, nil
}

// probeAllReduce is the cost model's link probe on the host: an all-reduce of
// floats float32s over the bucket collectives' comm.
func (e *Engine) probeAllReduce(ctx context.Context, floats int) error {
	if len(e.probe) < floats {
		e.probe = make([]float32, floats)
	}
	return e.data.AllReduce(ctx, e.probe[:floats])
}

// timePaths times the host's paths (timePath).
func (e *Engine) timePaths(ns []int) ([4][]float64, error) { return timePath(e, ns) }

// linkCost is the compressed path's (exchanger.linkCost).
func (e *Engine) linkCost(m *costModel, b *bucket) float64 { return e.exchanger.linkCost(m, b) }

// prepare allocates b's buffers the first time it takes the compressed
// path.
func (e *Engine) prepare(b *bucket) error {
	if !b.prepared {
		e.exchanger.setup(b)
		b.prepared = true
	}
	return nil
}

// Ready hands bucket i's gradient to the engine and returns at once; it
// never blocks on the exchange. The engine owns grad until Wait returns,
// and Wait leaves the rank-average in it. Without a step, for an unknown
// or already ready bucket, after Wait began, or for a grad whose length is
// not the bucket's, it returns a *UsageError and takes nothing.
func (e *Engine) Ready(i int, grad []float32) error {
	return e.ready(fmt.Sprintf("Ready(%d)", i), i, func(b *bucket) error {
		if len(grad) != b.n {
			return &UsageError{Call: fmt.Sprintf("Ready(%d)", i), Err: ErrLength, Detail: fmt.Sprintf("gradient of %d elements, bucket %d has %d", len(grad), i, b.n)}
		}
		return nil
	}, func(st *step, r *run) error {
		r.grad = grad
		if e.hier != nil {
			return nil // the node stage takes it at launch
		}
		if e.cfg.Momentum != 0 {
			e.compute.enqueue(func() { e.momentumTask(r) })
		}
		e.compute.enqueue(func() { e.encodeTask(st, r) })
		r.encoded = e.compute.record()
		return nil
	})
}

// launch enqueues r's collectives on the wire stream, after its encode,
// and its decode on the decode stream, after them. A two-round
// exchanger's bucket goes through its first round, then reduce on the
// between stream, and its second round waits on the wire until the next
// bucket's first round is enqueued (or the step's last launch), so that
// the link carries that round while this rank reduces. The wire's order
// depends only on the bucket order, the same on every rank.
func (e *Engine) launch(st *step, r *run) error {
	if r.delegated {
		if held := st.held; held != nil {
			st.held = nil
			e.enqueueSecond(st, held)
		}
		return nil
	}
	e.wire.waitEvent(r.encoded)
	e.wire.enqueue(func() { e.exchangeTask(st, r) })
	held := st.held
	st.held = nil
	if x, ok := e.exchanger.(twoRounds); ok && r.compressed {
		e.between.waitEvent(e.wire.record())
		e.between.enqueue(func() { e.reduceTask(st, r, x) })
		r.reduced = e.between.record()
		st.held = r
	} else {
		e.enqueueDecode(st, r)
	}
	if held != nil {
		e.enqueueSecond(st, held)
	}
	return nil
}

func (e *Engine) launched(st *step) error {
	if st.held != nil {
		e.enqueueSecond(st, st.held)
		st.held = nil
	}
	e.wire.enqueue(func() { e.settleTails(st) })
	e.decode.waitEvent(e.wire.record()) // the step ends when the wire's work does too
	e.decode.enqueue(func() { e.awaitDelegated(st) })
	st.done = e.decode.record()
	return nil
}

// enqueueSecond enqueues r's second round on the wire, after its reduce,
// then its decode.
func (e *Engine) enqueueSecond(st *step, r *run) {
	x := e.exchanger.(twoRounds)
	e.wire.waitEvent(r.reduced)
	e.wire.enqueue(func() { e.secondTask(st, r, x) })
	e.enqueueDecode(st, r)
}

// enqueueDecode enqueues r's decode on the decode stream, after what the
// wire has so far.
func (e *Engine) enqueueDecode(st *step, r *run) {
	e.decode.waitEvent(e.wire.record())
	e.decode.enqueue(func() { e.decodeTask(st, r) })
	r.decoded = e.decode.record()
}

// Wait blocks until every bucket of the step is exchanged and averaged, or
// the step fails, or ctx ends, and returns the step's statistics (partial
// on error). Without a step it returns a *UsageError (ErrNoStep). If a
// bucket was never made ready, it fails at once with ErrNotReady.
//
// Failures: a *NonFiniteStepError (FailOnNonFinite) leaves the engine
// usable and skips the step: on every rank, every bucket's error-feedback
// memory and momentum velocity are as before it (the caller skips the
// optimizer step, and the step's gradients are dropped as they would be
// without compression). Any other error (a *StepError: a collective
// failed or timed out, a payload did not decode, ctx ended; or
// ErrNotReady) breaks it, since the ranks may be out of step. After such a
// failed step every compressed bucket's error-feedback memory holds e + g:
// nothing of the step is lost (a non-finite gradient never enters it),
// and the gradients' contents are unspecified.
func (e *Engine) Wait(ctx context.Context) (StepStats, error) { return e.core.Wait(ctx) }

// Close ends the engine: a step in flight is abandoned (its Wait, if any,
// returns an error; its buckets' memory holds e + g), and the stream
// goroutines stop. It does not close the Comm. Save still works after
// Close; other calls return a *UsageError (ErrEngineClosed). Closing twice
// returns nil.
func (e *Engine) Close() error { return e.close() }

func (e *Engine) teardown() error {
	e.compute.close()
	e.wire.close()
	e.between.close()
	e.decode.close()
	if e.twoLevel != nil {
		return e.twoLevel.Close()
	}
	return nil
}

// wait waits for the step's last decode, a failure or ctx; after a
// failure it drains the streams.
func (e *Engine) wait(ctx context.Context, st *step) error {
	fatal := awaitDone(ctx, st)
	if fatal != nil {
		e.drain()
	}
	return fatal
}

// awaitDone waits until st.done fires (a host stream's last work), st
// fails or ctx ends, which fails st unless it finished meanwhile; it
// returns st's failure.
func awaitDone(ctx context.Context, st *step) error {
	var done <-chan struct{}
	if st.done != nil {
		done = st.done.fired()
	}
	select {
	case <-done:
	case <-st.failed:
	case <-ctx.Done():
		select {
		case <-done: // finished as ctx ended: keep the result
		default:
			st.fail(&StepError{Step: st.num, Bucket: -1, Stage: "Wait", Err: ctx.Err()})
		}
	}
	return st.failure()
}

// conclude has nothing to add: the tasks set the outcomes as they ran.
func (e *Engine) conclude(*step) error { return nil }

// drain waits until the streams have run everything enqueued so far.
// Tasks of a failed step return at once (collectives see the step's
// context cancelled), so this is bounded.
func (e *Engine) drain() {
	for _, s := range []*stream{e.compute, e.wire, e.between, e.decode} {
		<-s.record().fired()
	}
}

// settle ends every error-feedback Begin of st. A delivered step commits
// what was delivered compressed, and the flushes of the accuracy guard
// (their memory went dense with the gradient), and discards the rest
// (delivered dense); a skipped one discards everything, momentum
// included; a failed one retains e + g, folding in the gradients that
// were never compressed, and discards the second memory's.
func (e *Engine) settle(st *step, how stepEnd) {
	for _, r := range st.runs {
		if r.momentum {
			if how != stepSkipped {
				// u ← m·u + g (a failed step keeps e + u in error
				// feedback: nothing was sent).
				r.b.mom, r.b.next = r.b.next, r.b.mom
			}
			r.momentum = false
		}
		switch {
		case how == stepDelivered && r.outcome == pathCompressed:
			if r.pend1 != nil && r.b.mom != nil && e.cfg.MomentumMasking {
				r.pend1.CommitMasked(r.b.mom)
			}
			commit(r.pend1)
			commit(r.pend2)
			continue
		case how == stepDelivered && r.flush && !r.nonFinite:
			commit(r.pend1) // the memory went with the gradient: e ← 0
			continue
		case how != stepFailed:
		case r.pend1 != nil:
			r.pend1.Retain()
		case r.grad != nil && (r.compressed || r.flush) && !r.begun && e.gradEF != nil:
			// Never compressed: fold g in now. A non-finite g stays out.
			if _, p, err := e.exchanger.first().begin(r.b.send[:0], r.grad, r.key); err == nil {
				p.Retain()
			}
		}
		discard(r.pend1)
		discard(r.pend2)
	}
}

// momentumTask runs on the compute stream before the encode: the gradient
// becomes u' = m·u + g, kept in next for settle (when finite).
func (e *Engine) momentumTask(r *run) {
	b := r.b
	if b.mom == nil {
		b.mom, b.next = make([]float32, b.n), make([]float32, b.n)
	}
	r.momentum = kernels.MomentumStep(r.grad[:b.n], b.mom, b.next, float32(e.cfg.Momentum)) < 0
}

// usePhase rebuilds the compressed path for the core's active phase: the
// exchanger and its memories (the residuals carried over, which do not
// depend on the codec), and the buffers of every prepared bucket.
func (e *Engine) usePhase() {
	gradEF, partEF := e.gradEF, e.partEF
	e.exchanger = e.newExchanger()
	carry(gradEF, e.gradEF)
	carry(partEF, e.partEF)
	for _, b := range e.buckets {
		if b.prepared {
			e.exchanger.setup(b)
		}
	}
}

// carry copies every residual of from into to (either may be nil).
func carry(from, to *compress.ErrorFeedback) {
	if from == nil || to == nil {
		return
	}
	for _, id := range from.Buckets() {
		to.SetResidual(id, from.Residual(id)) // finite and in range: from holds it
	}
}

func (e *Engine) velocity(i int) ([]float32, error) { return e.buckets[i].mom, nil }

func (e *Engine) setVelocity(us [][]float32) error {
	for i, b := range e.buckets {
		b.mom, b.next = us[i], nil
		if us[i] != nil {
			b.next = make([]float32, b.n)
		}
	}
	return nil
}

func commit(p *compress.Pending) {
	if p != nil {
		p.Commit()
	}
}

func discard(p *compress.Pending) {
	if p != nil {
		p.Discard()
	}
}

// encodeTask runs on the compute stream: stage-1 compression.
func (e *Engine) encodeTask(st *step, r *run) {
	if st.failure() != nil {
		return
	}
	if r.flush {
		e.flushTask(st, r)
		return
	}
	if !r.compressed {
		return
	}
	t := time.Now()
	r.begun = true
	err := e.exchanger.encode(r)
	r.stats.Compress += time.Since(t)
	if err != nil {
		st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: "encode", Err: err})
	}
}

// flushTask runs on the compute stream, for a bucket the accuracy guard
// flushes (Config.Guard): the gradient becomes e + g, to go dense. A
// non-finite sum leaves the gradient and the memory as they were; the
// dense path reports it.
func (e *Engine) flushTask(st *step, r *run) {
	r.begun = true
	p, err := e.gradEF.Flush(r.grad, r.key)
	var nf *compress.NonFiniteError
	switch {
	case err == nil:
		r.pend1 = p
	case !errors.As(err, &nf):
		st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: "guard flush", Err: err})
	}
}

// exchangeTask runs on the wire stream: the bucket's collectives, and the
// agreement on its path.
func (e *Engine) exchangeTask(st *step, r *run) {
	if st.failure() != nil {
		return
	}
	if !r.compressed {
		r.outcome = pathDense
		if err := e.allReduceLast(st, r, "dense AllReduce", r.grad, nil); err != nil {
			st.fail(err)
		}
		return
	}
	sts, err := e.exchanger.exchange(st, r)
	switch {
	case err != nil:
		st.fail(err)
		return
	case r.tail != nil:
		return // decode and settleTails take it from here
	}
	if _, ok := e.exchanger.(twoRounds); ok && allOK(sts) {
		r.second = true
		return
	}
	e.takePath(st, r, sts)
}

// reduceTask runs on the between stream: a two-round exchanger's work
// between its rounds.
func (e *Engine) reduceTask(st *step, r *run, x twoRounds) {
	if st.failure() != nil || !r.second {
		return
	}
	if err := x.reduce(st, r); err != nil {
		st.fail(err)
	}
}

// secondTask runs on the wire stream: a two-round exchanger's second
// round, and the agreement on the bucket's path.
func (e *Engine) secondTask(st *step, r *run, x twoRounds) {
	if st.failure() != nil || !r.second {
		return
	}
	sts, err := x.exchange2(st, r)
	if err != nil {
		st.fail(err)
		return
	}
	if r.tail == nil {
		e.takePath(st, r, sts)
	}
}

// takePath settles r's path from the statuses of its last collective,
// the same on every rank: compressed when all are ok, else skipped
// (non-finite with FailOnNonFinite) or dense, by an all-reduce made here.
func (e *Engine) takePath(st *step, r *run, sts []status) {
	var bad []string
	nonFinite := false
	for q, s := range sts {
		if s.code != statusOK {
			bad = append(bad, fmt.Sprintf("rank %d has %v", q, s))
			nonFinite = nonFinite || s.code == statusNonFinite
		}
	}
	if bad == nil {
		r.outcome = pathCompressed
		r.heldBack = maxHeldBack(sts)
		return
	}
	r.nonFinite = nonFinite
	if nonFinite && e.cfg.FailOnNonFinite {
		r.outcome = pathSkipped
		r.fallback = strings.Join(bad, ", ")
		return
	}
	r.outcome = pathDense
	r.fallback = "exchanged dense: " + strings.Join(bad, ", ")
	if err := e.allReduce(st, r, "dense AllReduce (fallback)", r.grad); err != nil {
		st.fail(err)
	}
}

// decodeTask runs on the decode stream: decode and average into the
// gradient.
func (e *Engine) decodeTask(st *step, r *run) {
	if r.tail != nil && !e.waitTail(st, r) {
		return
	}
	if st.failure() != nil || r.outcome == pathSkipped {
		return
	}
	t := time.Now()
	bad := -1
	if r.outcome == pathDense {
		bad = compress.Average(r.grad, e.size)
	} else {
		var err error
		if bad, err = e.exchanger.decode(r); err != nil {
			st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: "decode", Err: err})
			return
		}
		e.decay(r)
	}
	r.stats.Decompress += time.Since(t)
	r.doneAt = time.Now()
	if bad < 0 {
		return
	}
	r.nonFinite = true
	if r.fallback == "" {
		r.fallback = fmt.Sprintf("the average holds %v at element %d (a rank's gradient held NaN or Inf, or the sum overflowed)", r.grad[bad], bad)
	}
	if e.cfg.FailOnNonFinite {
		r.outcome = pathSkipped
	}
}

// decay multiplies the residual that compressed run r's settle commits
// by Config.FeedbackDecay (compress.Pending.Scale, on the decode stream
// so that settle stays a swap per bucket); a step that is skipped or
// fails afterwards discards it (settle's Discard and Retain do not read
// it). SRA's second memory is not decayed (Config.FeedbackDecay).
func (e *Engine) decay(r *run) {
	if c, ok := e.cfg.decaying(); ok && r.pend1 != nil {
		r.pend1.Scale(c)
	}
}

// collective runs one collective of bucket r under the step's context and
// Config.Timeout, adding its time and volume to r's stats: volume[0] the
// bytes this rank sends (see the package doc), volume[1] the part of them
// that stays in the node.
func (e *core) collective(st *step, r *run, stage string, volume [2]int64, call func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(st.ctx, e.cfg.Timeout)
	defer cancel()
	t := time.Now()
	err := call(ctx)
	r.stats.Exchange += time.Since(t)
	r.stats.BytesSent += volume[0]
	r.stats.BytesInNode += volume[1]
	if err != nil {
		return &StepError{Step: st.num, Bucket: r.b.idx, Stage: stage, Err: err}
	}
	return nil
}

// wireCall is a blocking collective of the wire: over a comm.Starter it
// first makes room for it among the tails in flight.
func (e *Engine) wireCall(st *step, r *run, stage string, volume [2]int64, call func(ctx context.Context) error) error {
	if e.starter != nil {
		e.makeRoom()
	}
	return e.collective(st, r, stage, volume, call)
}

// reduceVolume and gatherVolume are the bytes this rank sends (and keeps
// in the node) in a bucket all-reduce of n floats and an all-gather of a
// src of n bytes: a flat ring's, or over two levels each level's.
func (e *Engine) reduceVolume(n int) [2]int64 {
	if l := e.layout; e.twoLevel != nil {
		return twoLevelReduceVolume(l.Nodes, l.LocalSize, n)
	}
	return [2]int64{allReduceVolume(e.size, 4*n), 0}
}

func (e *Engine) gatherVolume(n int) [2]int64 {
	if l := e.layout; e.twoLevel != nil {
		return twoLevelGatherVolume(l.Nodes, l.LocalSize, n)
	}
	return [2]int64{allGatherVolume(e.size, n), 0}
}

func (e *Engine) allReduce(st *step, r *run, stage string, buf []float32) error {
	return e.wireCall(st, r, stage, e.reduceVolume(len(buf)), func(ctx context.Context) error {
		return e.data.AllReduce(ctx, buf)
	})
}

// allReduceLast is allReduce as the bucket's last collective: a tail over
// a comm.Starter, whose statuses (nil: none) decide the bucket's path.
func (e *Engine) allReduceLast(st *step, r *run, stage string, buf []float32, statuses func() ([]status, error)) error {
	started, err := e.startTail(st, r, stage, e.reduceVolume(len(buf)), statuses,
		func(ctx context.Context, s comm.Starter) (comm.Request, error) { return s.StartAllReduce(ctx, buf) })
	if started {
		return err
	}
	return e.allReduce(st, r, stage, buf)
}

func (e *Engine) allGather(st *step, r *run, stage string, dst, src []byte) error {
	return e.wireCall(st, r, stage, e.gatherVolume(len(src)), func(ctx context.Context) error {
		return e.data.AllGather(ctx, dst, src)
	})
}

// allGatherLast is allGather as the bucket's last collective (see
// allReduceLast).
func (e *Engine) allGatherLast(st *step, r *run, stage string, dst, src []byte, statuses func() ([]status, error)) error {
	started, err := e.startTail(st, r, stage, e.gatherVolume(len(src)), statuses,
		func(ctx context.Context, s comm.Starter) (comm.Request, error) {
			return s.StartAllGather(ctx, dst, src)
		})
	if started {
		return err
	}
	return e.allGather(st, r, stage, dst, src)
}

func (e *Engine) allToAll(st *step, r *run, stage string, dst, src []byte) error {
	return e.wireCall(st, r, stage, [2]int64{allToAllVolume(e.size, len(src)), 0}, func(ctx context.Context) error {
		return e.data.AllToAll(ctx, dst, src)
	})
}

// memory returns the live memories: Save runs with no step in flight.
func (e *Engine) memory(string) (gradEF, partEF *compress.ErrorFeedback, err error) {
	return e.gradEF, e.partEF, nil
}

func (e *Engine) install(gradEF, partEF *compress.ErrorFeedback) error {
	e.gradEF, e.partEF = gradEF, partEF
	if e.exchanger != nil {
		e.exchanger.useMemory(gradEF, partEF)
	}
	return nil
}
