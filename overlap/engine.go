package overlap

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// Config configures an Engine. Spec, Strategy, ErrorFeedback, Decision,
// FailOnNonFinite and Warmup must be equal on every rank (the handshake
// checks them); Timeout and Workers are local.
type Config struct {
	Spec            string        // compressor spec (compress.Parse), e.g. "topk:0.01"; no lossless stage
	Strategy        Strategy      // default StrategyAuto
	ErrorFeedback   bool          // error-feedback memory on the compressed path (and SRA's second memory)
	Decision        Decision      // default DecideAuto: the cost model chooses per bucket
	Timeout         time.Duration // per collective; default 60s. A dead peer ends the step with an error within it
	FailOnNonFinite bool          // false: a bucket with NaN/Inf on any rank is exchanged dense that step; true: the step fails on every rank
	Warmup          int           // steps numbered below it exchange every bucket dense (error feedback untouched); verification starts after them
	Workers         int           // goroutines per compressor call (compress.WithWorkers); default GOMAXPROCS
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 60 * time.Second

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
	c          comm.Comm
	cfg        Config
	rank, size int
	spec       string              // the canonical spec
	comp       compress.Compressor // nil for codec none
	strategy   Strategy
	x          exchanger // the compressed path; nil for codec none
	buckets    []*bucket
	model      *costModel // nil unless Decision is DecideAuto with a compressed path
	verify     *verifier  // non-nil with model: checks its decisions against measured times
	ef1, ef2   *compress.ErrorFeedback
	timing     timing // the clock, or a test's times

	compute, wire, decode *stream // encode; collectives; decode and average

	mu   sync.Mutex
	cur  *step
	next uint64 // the number of the next step
	life        // closed or broken, under mu
}

// bucket is one bucket's fixed state: its decision and buffers.
type bucket struct {
	idx, n     int
	compressed bool   // the compressed path, unless a step falls back (DecideAuto: changed by verification between steps)
	reason     string // why (the decision and its inputs)
	predicted  string // the cost model's prediction and inputs (DecideAuto)
	predDense  time.Duration
	predComp   time.Duration
	measDense  time.Duration // verification's latest measurements (DecideAuto), 0 until then
	measComp   time.Duration

	slot       int    // slot length of the strategy's exchanges
	send, recv []byte // stage-1 slots
	send2      []byte // SRA stage-2 slot
	recv2      []byte
	mid        []float32 // SRA: this rank's part, summed
	vals       []float32 // shared-index: statuses then values
	picks      []uint32  // shared-index: the indices
}

// Outcomes of a bucket in a step.
const (
	pathNone = iota // not exchanged (the step failed first)
	pathCompressed
	pathDense
	pathSkipped // not exchanged: non-finite with FailOnNonFinite
)

// run is one bucket in one step.
type run struct {
	b          *bucket
	compressed bool // the path this step takes (b's decision, or the other in a verification trial)
	grad       []float32
	key        compress.Key
	encoded    *event

	begun        bool   // encode ran
	local        status // this rank's stage-1 status
	pend1, pend2 *compress.Pending
	seed         uint64 // shared-index: the payload's seed

	outcome   int
	fallback  string // why this step went dense or was skipped
	nonFinite bool
	stats     BucketStats

	readyAt, doneAt time.Time // Ready's call, the end of decode (verification's measure)
}

// step is one step in flight.
type step struct {
	progress
	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time
	runs   []*run
	done   *event // fires after the last bucket's decode; nil until launched
	warmup bool   // a warm-up step (Config.Warmup): every bucket dense

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

// New builds an engine over c for buckets of the given element counts
// (bucket i has sizes[i] float32s) and runs the handshake: every rank sends
// its protocol version, canonical spec, strategy, error-feedback flag,
// decision mode, FailOnNonFinite and bucket layout, and a difference is a
// *ConfigMismatchError on every rank naming the field and both values; a
// rank whose configuration is invalid gets its own error and the others a
// *ConfigError naming it. With DecideAuto and a compressed path it then
// probes the link and measures the compressor (see the package doc) to
// decide each bucket, identically on every rank. New's collectives are
// bounded by ctx and Config.Timeout each.
func New(ctx context.Context, c comm.Comm, sizes []int, cfg Config) (*Engine, error) {
	return newEngine(ctx, c, sizes, cfg, clockTiming{})
}

// newEngine is New with the cost model's and verification's times from t.
func newEngine(ctx context.Context, c comm.Comm, sizes []int, cfg Config, t timing) (*Engine, error) {
	if c == nil {
		return nil, fmt.Errorf("overlap: New: nil comm.Comm")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	e := &Engine{c: c, cfg: cfg, rank: c.Rank(), size: c.Size(), timing: t}
	local := e.configure(sizes)
	if err := handshake(ctx, e, sizes, local); err != nil {
		return nil, err
	}
	if err := e.decide(ctx); err != nil {
		return nil, err
	}
	e.compute, e.wire, e.decode = newStream(), newStream(), newStream()
	return e, nil
}

// configure checks cfg and sizes and sets up the compressor, the strategy
// and the buckets. Its error goes through the handshake.
func (e *Engine) configure(sizes []int) error {
	cfg := e.cfg
	if err := checkConfig(cfg, sizes, e.size); err != nil {
		return err
	}
	comp, err := compress.Parse(cfg.Spec, compress.WithWorkers(cfg.Workers))
	if err != nil {
		return err
	}
	for _, opt := range strings.Split(comp.Spec(), ":")[1:] {
		if strings.HasPrefix(opt, "lossless=") {
			return fmt.Errorf("spec %s: a lossless stage makes payload lengths vary, and every strategy exchanges fixed-size slots", comp.Spec())
		}
	}
	e.spec = comp.Spec()
	if e.strategy, err = resolve(cfg.Strategy, comp.Codec(), e.size); err != nil {
		return err
	}
	e.buckets = make([]*bucket, len(sizes))
	for i, n := range sizes {
		e.buckets[i] = &bucket{idx: i, n: n}
	}
	if comp.Codec() == compress.CodecNone {
		for _, b := range e.buckets {
			b.reason = "codec none: dense all-reduce"
		}
		return nil
	}
	e.comp = comp
	e.x = e.newExchanger()
	return nil
}

// newExchanger builds the compressed path of e.strategy, with its
// error-feedback memories.
func (e *Engine) newExchanger() exchanger {
	stage1 := &parts{inner: e.comp, count: 1, stage: 1, rank: e.rank, ranks: e.size}
	switch e.strategy {
	case StrategySharedIndex:
		stage1.shared = true
	case StrategyDense, StrategyQuantSRA:
		stage1.count = e.size
	}
	c1 := coder{p: stage1}
	if e.cfg.ErrorFeedback {
		e.ef1 = compress.NewErrorFeedback(stage1.forMemory())
		c1.ef = e.ef1
	}
	switch e.strategy {
	case StrategySharedIndex:
		return &sharedX{e: e, c: c1}
	case StrategyDense, StrategyQuantSRA:
		stage2 := &parts{inner: e.comp, count: 1, stage: 2, rank: e.rank, ranks: e.size}
		c2 := coder{p: stage2}
		if e.cfg.ErrorFeedback {
			e.ef2 = compress.NewErrorFeedback(stage2.forMemory())
			c2.ef = e.ef2
		}
		return &sraX{e: e, c1: c1, c2: c2}
	}
	return &gatherX{e: e, c: c1}
}

// decide sets every bucket's path, pinned or from the cost model, and
// allocates the compressed buckets' buffers.
func (e *Engine) decide(ctx context.Context) error {
	if e.x == nil {
		return nil
	}
	switch e.cfg.Decision {
	case DecideCompressed:
		for _, b := range e.buckets {
			b.compressed, b.reason = true, "pinned: compressed"
		}
	case DecideDense:
		for _, b := range e.buckets {
			b.reason = "pinned: dense"
		}
	default:
		m, err := measure(ctx, e)
		if err != nil {
			return err
		}
		e.model = m
		if err := m.decide(ctx, e); err != nil {
			return err
		}
		e.verify = newVerifier(len(e.buckets))
	}
	for _, b := range e.buckets {
		if b.compressed {
			e.x.setup(b)
		}
	}
	return nil
}

// Strategy returns the strategy in use (StrategyAuto resolved).
func (e *Engine) Strategy() Strategy { return e.strategy }

// Compressed reports, per bucket, whether the pinned Decision, or with
// DecideAuto the cost model and then its verification, chose the
// compressed path for the steps to come (a step may still fall back to
// dense, and a verification trial takes the other path: see BucketStats).
func (e *Engine) Compressed() []bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]bool, len(e.buckets))
	for i, b := range e.buckets {
		out[i] = b.compressed
	}
	return out
}

// life is an engine's state beyond its steps, shared by Engine and
// DeviceEngine: closed by Close, or broken by a failed step.
type life struct {
	broken error // the failure that broke the engine
	closed bool
}

// usable returns why call cannot run: the engine is closed or broken.
// The engine's mutex is held.
func (l *life) usable(call string) error {
	switch {
	case l.closed:
		return &UsageError{Call: call, Err: ErrClosed}
	case l.broken != nil:
		return &BrokenError{Cause: l.broken}
	}
	return nil
}

// Step starts a step. Step numbers count from 0 (or from the number Load
// restored) and, with the bucket index, key random-k indices and stochastic
// rounding, so every rank must call Step the same number of times. A step
// in flight (no Wait yet) is a *UsageError (ErrStepInFlight).
func (e *Engine) Step() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable("Step"); err != nil {
		return err
	}
	if e.cur != nil {
		return &UsageError{Call: "Step", Err: ErrStepInFlight, Detail: fmt.Sprintf("step %d has not been waited for", e.cur.num)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &step{progress: progress{num: e.next, ready: make([]bool, len(e.buckets))}, ctx: ctx, cancel: cancel,
		start: time.Now(), failed: make(chan struct{}), runs: make([]*run, len(e.buckets))}
	st.warmup = st.num < uint64(e.cfg.Warmup)
	trial := !st.warmup && e.verify != nil && e.verify.trial()
	trialPath := trial && e.trialPath()
	for i, b := range e.buckets {
		path := b.compressed && !st.warmup
		if trial {
			path = trialPath
		}
		if path && b.send == nil {
			e.x.setup(b) // first time on the compressed path
		}
		st.runs[i] = &run{b: b, compressed: path, key: compress.Key{Bucket: uint64(i), Step: st.num},
			stats: BucketStats{Bucket: i, Elements: b.n, Strategy: e.strategy, Reason: b.reason, Trial: trial,
				PredictedDense: b.predDense, PredictedCompressed: b.predComp, MeasuredDense: b.measDense, MeasuredCompressed: b.measComp}}
		switch {
		case trial:
			st.runs[i].stats.Reason += "; verification trial: " + pathName(path)
		case st.warmup && b.compressed:
			st.runs[i].stats.Reason += fmt.Sprintf("; warm-up: dense before step %d", e.cfg.Warmup)
		}
	}
	e.next++
	e.cur = st
	return nil
}

// Ready hands bucket i's gradient to the engine and returns at once; it
// never blocks on the exchange. The engine owns grad until Wait returns,
// and Wait leaves the rank-average in it. Without a step, for an unknown
// or already ready bucket, after Wait began, or for a grad whose length is
// not the bucket's, it returns a *UsageError and takes nothing.
func (e *Engine) Ready(i int, grad []float32) error {
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
	if len(grad) != e.buckets[i].n {
		return &UsageError{Call: call, Err: ErrLength, Detail: fmt.Sprintf("gradient of %d elements, bucket %d has %d", len(grad), i, e.buckets[i].n)}
	}
	st.ready[i] = true
	r := st.runs[i]
	r.readyAt = time.Now()
	r.grad = grad
	e.compute.enqueue(func() { e.encodeTask(st, r) })
	r.encoded = e.compute.record()
	// Launch, in bucket order, every bucket whose predecessors are launched:
	// all ranks make the same collectives in the same order.
	for st.cursor < len(st.runs) && st.ready[st.cursor] {
		r := st.runs[st.cursor]
		e.wire.waitEvent(r.encoded)
		e.wire.enqueue(func() { e.exchangeTask(st, r) })
		e.decode.waitEvent(e.wire.record())
		e.decode.enqueue(func() { e.decodeTask(st, r) })
		st.cursor++
	}
	if st.cursor == len(st.runs) && st.done == nil {
		st.done = e.decode.record()
	}
	return nil
}

// Wait blocks until every bucket of the step is exchanged and averaged, or
// the step fails, or ctx ends, and returns the step's statistics (partial
// on error). Without a step it returns a *UsageError (ErrNoStep). If a
// bucket was never made ready, it fails at once with ErrNotReady.
//
// Failures: a *NonFiniteError (FailOnNonFinite) leaves the engine usable;
// any other error (a *StepError: a collective failed or timed out, a
// payload did not decode, ctx ended; or ErrNotReady) breaks it, since the
// ranks may be out of step. After a failed step every compressed bucket's
// error-feedback memory holds e + g: nothing of the step is lost (a
// non-finite gradient never enters it), and the gradients' contents are
// unspecified.
func (e *Engine) Wait(ctx context.Context) (StepStats, error) {
	e.mu.Lock()
	if err := e.usable("Wait"); err != nil {
		e.mu.Unlock()
		return StepStats{}, err
	}
	st := e.cur
	if st == nil {
		e.mu.Unlock()
		return StepStats{}, &UsageError{Call: "Wait", Err: ErrNoStep, Detail: "call Step first"}
	}
	if st.waiting {
		e.mu.Unlock()
		return StepStats{}, &UsageError{Call: "Wait", Err: ErrWaiting, Detail: fmt.Sprintf("another Wait is waiting for step %d", st.num)}
	}
	st.waiting = true
	var missing []int
	for i, ok := range st.ready {
		if !ok {
			missing = append(missing, i)
		}
	}
	e.mu.Unlock()
	if len(missing) > 0 {
		st.fail(&UsageError{Call: "Wait", Err: ErrNotReady, Detail: fmt.Sprintf("step %d: Ready was not called for buckets %v", st.num, missing)})
	}
	e.finish(st, ctx)
	return st.result, st.finalErr
}

// Close ends the engine: a step in flight is abandoned (its Wait, if any,
// returns an error; its buckets' memory holds e + g), and the stream
// goroutines stop. It does not close the Comm. Save still works after
// Close; other calls return a *UsageError (ErrClosed). Closing twice
// returns nil.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	st := e.cur
	if st != nil {
		st.waiting = true
	}
	e.mu.Unlock()
	if st != nil {
		st.fail(&UsageError{Call: "Close", Err: ErrClosed, Detail: fmt.Sprintf("step %d abandoned", st.num)})
		e.finish(st, context.Background())
	}
	e.compute.close()
	e.wire.close()
	e.decode.close()
	return nil
}

// finish waits for st to end, settles error-feedback memory and builds the
// statistics; it runs once per step, and a second caller waits for the
// first.
func (e *Engine) finish(st *step, ctx context.Context) {
	st.finish.Do(func() {
		t0 := time.Now()
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
		fatal := st.failure()
		if fatal != nil {
			e.drain()
		}
		exposed := time.Since(t0)
		st.cancel()

		var nf *NonFiniteError
		for _, r := range st.runs {
			if r.outcome == pathSkipped {
				if nf == nil {
					nf = &NonFiniteError{Step: st.num}
				}
				nf.Buckets = append(nf.Buckets, r.b.idx)
				nf.Details = append(nf.Details, r.fallback)
			}
		}
		e.settle(st, fatal != nil || nf != nil)
		if fatal == nil && e.verify != nil && !st.warmup {
			if err := e.verifyStep(ctx, st); err != nil {
				fatal = err
			}
		}

		res := StepStats{Step: st.num, Buckets: make([]BucketStats, len(st.runs)), Exposed: exposed}
		for i, r := range st.runs {
			s := r.stats
			s.Compressed = r.outcome == pathCompressed
			s.NonFinite = r.nonFinite
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
		e.mu.Lock()
		e.cur = nil
		if fatal != nil && e.broken == nil {
			e.broken = fatal
		}
		e.mu.Unlock()
	})
}

// drain waits until the three streams have run everything enqueued so far.
// Tasks of a failed step return at once (collectives see the step's
// context cancelled), so this is bounded.
func (e *Engine) drain() {
	for _, s := range []*stream{e.compute, e.wire, e.decode} {
		<-s.record().fired()
	}
}

// settle ends every error-feedback Begin of st. A successful step commits
// what was delivered compressed and discards the rest (delivered dense); a
// failed one retains e + g, folding in the gradients that were never
// compressed, and discards the second memory's.
func (e *Engine) settle(st *step, failed bool) {
	for _, r := range st.runs {
		switch {
		case !failed && r.outcome == pathCompressed:
			commit(r.pend1)
			commit(r.pend2)
			continue
		case !failed:
		case r.pend1 != nil:
			r.pend1.Retain()
		case r.grad != nil && r.compressed && !r.begun && e.ef1 != nil:
			// Never compressed: fold g in now. A non-finite g stays out.
			if _, p, err := e.x.first().begin(r.b.send[:0], r.grad, r.key); err == nil {
				p.Retain()
			}
		}
		discard(r.pend1)
		discard(r.pend2)
	}
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
	if st.failure() != nil || !r.compressed {
		return
	}
	t := time.Now()
	r.begun = true
	err := e.x.encode(r)
	r.stats.Compress += time.Since(t)
	if err != nil {
		st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: "encode", Err: err})
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
		if err := e.allReduce(st, r, "dense AllReduce", r.grad); err != nil {
			st.fail(err)
		}
		return
	}
	sts, err := e.x.exchange(st, r)
	if err != nil {
		st.fail(err)
		return
	}
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
	if st.failure() != nil || r.outcome == pathSkipped {
		return
	}
	t := time.Now()
	bad := -1
	if r.outcome == pathDense {
		bad = average(r.grad, e.size)
	} else {
		var err error
		if bad, err = e.x.decode(r); err != nil {
			st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: "decode", Err: err})
			return
		}
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

// average divides dst by n in float32 (dst[i] = dst[i] / float32(n)) and
// returns the index of its first non-finite element, or -1. For n a power
// of two it multiplies by 1/n instead, which rounds the same real number
// once and so gives the same bits, faster.
func average(dst []float32, n int) int {
	// One pass: the largest magnitude bits seen tell whether a second
	// pass must look for the first non-finite element.
	var top uint32
	d := float32(n)
	switch {
	case n == 1:
		top = nonFiniteBits
	case n&(n-1) == 0:
		inv := 1 / d
		for i, v := range dst {
			v *= inv
			dst[i] = v
			top = max(top, math.Float32bits(v)&0x7fffffff)
		}
	default:
		for i, v := range dst {
			v /= d
			dst[i] = v
			top = max(top, math.Float32bits(v)&0x7fffffff)
		}
	}
	if top >= nonFiniteBits {
		for i, v := range dst {
			if math.Float32bits(v)&nonFiniteBits == nonFiniteBits {
				return i
			}
		}
	}
	return -1
}

// nonFiniteBits is the float32 exponent field: all ones in Inf and NaN.
const nonFiniteBits = 0x7f800000

// collective runs one collective of bucket r under the step's context and
// Config.Timeout, adding its time and volume (bytes this rank sends, see
// the package doc) to r's stats.
func (e *Engine) collective(st *step, r *run, stage string, volume int64, call func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(st.ctx, e.cfg.Timeout)
	defer cancel()
	t := time.Now()
	err := call(ctx)
	r.stats.Exchange += time.Since(t)
	r.stats.BytesSent += volume
	if err != nil {
		return &StepError{Step: st.num, Bucket: r.b.idx, Stage: stage, Err: err}
	}
	return nil
}

func (e *Engine) allReduce(st *step, r *run, stage string, buf []float32) error {
	return e.collective(st, r, stage, allReduceVolume(e.size, 4*len(buf)), func(ctx context.Context) error {
		return e.c.AllReduce(ctx, buf)
	})
}

func (e *Engine) allGather(st *step, r *run, stage string, dst, src []byte) error {
	return e.collective(st, r, stage, allGatherVolume(e.size, len(src)), func(ctx context.Context) error {
		return e.c.AllGather(ctx, dst, src)
	})
}

func (e *Engine) allToAll(st *step, r *run, stage string, dst, src []byte) error {
	return e.collective(st, r, stage, allToAllVolume(e.size, len(src)), func(ctx context.Context) error {
		return e.c.AllToAll(ctx, dst, src)
	})
}

// The bytes one rank sends in each collective, by the usual ring and
// pairwise algorithms (NCCL's accounting): an all-reduce of S bytes
// 2(N−1)/N·S, an all-gather of s bytes per rank (N−1)·s, an all-to-all of
// S bytes per rank (N−1)/N·S.
func allReduceVolume(n, bytes int) int64 { return int64(2 * (n - 1) * bytes / n) }
func allGatherVolume(n, bytes int) int64 { return int64((n - 1) * bytes) }
func allToAllVolume(n, bytes int) int64  { return int64((n - 1) * bytes / n) }

// checkConfig checks what Engine and DeviceEngine alike require of cfg and
// of the bucket sizes on ranks ranks.
func checkConfig(cfg Config, sizes []int, ranks int) error {
	switch {
	case cfg.Timeout < 0:
		return fmt.Errorf("Timeout %v is negative", cfg.Timeout)
	case cfg.Workers < 0:
		return fmt.Errorf("Workers %d is negative", cfg.Workers)
	case cfg.Warmup < 0:
		return fmt.Errorf("Warmup %d is negative", cfg.Warmup)
	case cfg.Decision < DecideAuto || cfg.Decision > DecideDense:
		return fmt.Errorf("unknown Decision %v", cfg.Decision)
	case len(sizes) == 0:
		return fmt.Errorf("no buckets")
	case len(sizes) > math.MaxUint32 || ranks > math.MaxUint16:
		return fmt.Errorf("%d buckets on %d ranks: at most %d buckets and %d ranks", len(sizes), ranks, uint64(math.MaxUint32), math.MaxUint16)
	}
	for i, n := range sizes {
		if n < 1 || n > compress.MaxElements {
			return fmt.Errorf("bucket %d has %d elements, want 1 to %d", i, n, compress.MaxElements)
		}
	}
	return nil
}

// progress is what the steps of Engine and DeviceEngine share: the step's
// number, which buckets are ready, how far launching went, and whether
// Wait began.
type progress struct {
	num     uint64
	ready   []bool
	cursor  int  // buckets below it are launched on the wire and decode streams
	waiting bool // set by the first Wait or Close; Ready is refused after
}

// refuse returns the *UsageError of a Ready(i) the step cannot take: an
// unknown bucket, Wait begun, or a bucket already ready; nil otherwise.
func (p *progress) refuse(call string, i int) error {
	switch {
	case i < 0 || i >= len(p.ready):
		return &UsageError{Call: call, Err: ErrUnknownBucket, Detail: fmt.Sprintf("the engine has buckets 0 to %d", len(p.ready)-1)}
	case p.waiting:
		return &UsageError{Call: call, Err: ErrWaiting, Detail: fmt.Sprintf("step %d", p.num)}
	case p.ready[i]:
		return &UsageError{Call: call, Err: ErrAlreadyReady, Detail: fmt.Sprintf("in step %d", p.num)}
	}
	return nil
}
