package overlap

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// Config configures an Engine or a DeviceEngine. Every field but Timeout
// and Workers must be equal on every rank (the handshake checks them);
// those two are local.
type Config struct {
	Spec            string        // compressor spec (compress.Parse), e.g. "topk:0.01"; no lossless stage
	Strategy        Strategy      // default StrategyAuto
	ErrorFeedback   bool          // error-feedback memory on the compressed path (and SRA's second memory)
	Decision        Decision      // default DecideAuto: the cost model chooses per bucket
	Timeout         time.Duration // per collective; default 60s. A dead peer ends the step with an error within it
	FailOnNonFinite bool          // false: a bucket with NaN/Inf on any rank is exchanged dense that step; true: the step fails on every rank
	Warmup          int           // steps numbered below it exchange every bucket dense (error feedback untouched); verification starts after them
	Workers         int           // goroutines per compressor call (compress.WithWorkers); default GOMAXPROCS
	// Momentum is the optimizer's momentum m in [0, 1) for momentum
	// correction (DGC, Lin et al. 2018), 0 for none. Every step, every
	// bucket's gradient g becomes u ← m·u + g before its exchange, so the
	// average the engine returns already carries the momentum (run the
	// optimizer without its own), and error feedback accumulates u: its
	// residual is DGC's v. u is part of the engine's state; a gradient
	// with NaN or Inf leaves it unchanged, and so does a step skipped
	// (FailOnNonFinite) and, on a DeviceEngine, a step that fails.
	Momentum float64
	// MomentumMasking is DGC's momentum factor masking (needs Momentum):
	// after a compressed payload of a sparse codec (top-k, random-k) was
	// delivered, u is zeroed at the coordinates it sent. Off by default:
	// on scripts/digits-momentum.py's MLP (4 ranks, 10 epochs, seeds 1–3)
	// top-k 1 % with momentum correction and a compression warm-up ended
	// 1.67 points below dense with masking and 0.09 above without; see
	// the README's accuracy section.
	MomentumMasking bool
	// Schedule is a compression warm-up: after the Warmup steps, phase 0
	// compresses its Steps steps with its Spec, then phase 1, and so on;
	// Spec is used from the step after the last phase. Every phase keeps
	// the strategy Spec takes (e.g. top-k ratios 0.25 → 0.0625 → 0.016
	// before Spec topk:0.004, or int8 → int4 before int2), and error
	// feedback carries its memory across phases. With DecideAuto the cost
	// model decides each bucket's path for Spec, the phases change only
	// the codec of the buckets it compresses, and verification starts
	// after the last phase. ParseSchedule reads it from a string; Ramp
	// makes DGC's.
	Schedule []Phase
	// Guard is the accuracy guard's threshold, 0 for none; it needs
	// ErrorFeedback; both backends. Every rank measures, for each bucket
	// it compresses, ρ = ‖e‖/‖g‖: what error feedback holds back after the
	// step against the step's gradient (after momentum correction), and
	// sends ρ in the status its payload carries anyway (its slots grow by
	// a 16-byte guard block holding ρ as a float64; a DeviceEngine's ρ is
	// kernels.GuardRatio's, within about n·2⁻⁵² relative of Engine's for a
	// bucket of n elements, more where Engine's sparse ‖s‖² − ‖kept‖²
	// cancels; shared-index on the host carries it as a float32; ρ is only
	// compared with Guard). When the largest
	// ρ of a bucket over the ranks exceeds Guard, the bucket's next
	// compressed step goes dense with everything its memory holds (e + g:
	// a flush, which empties the memory), on every rank alike.
	// BucketStats.HeldBack and Guarded report it and Reason says why.
	// Each codec's ρ settles at a level of its own (the README's accuracy
	// section gives measured ones): set Guard above that level, to catch
	// a memory that keeps growing.
	Guard float64
	// NodeSpec is the codec of StrategyHier's node stages (the sharded
	// shape's reduce-scatter and all-gather in the node): "" for float32
	// (the default), or "bf16", "fp16" or "int8" (SDP4Bit's 8-bit inside
	// a node), each part quantized once per stage without error feedback:
	// the node link carries half or a quarter of the bytes, for each
	// stage's rounding error. Engine only (a DeviceEngine refuses it), and
	// only with StrategyHier or StrategyAuto (whose trial's hierarchical
	// engine then uses it).
	NodeSpec string
	// Shapes gives, per bucket, its tensors as matrices in the order they
	// lie in it: tensor j starts where tensor j−1 ends, and their
	// elements add up to the bucket's. A 1-D tensor is 1×n; a convolution
	// weight out×(in·kh·kw), as torch's PowerSGD views it. StrategyLowRank
	// (spec powersgd) needs it; the other strategies ignore it, but it is
	// checked when given. Every rank must give the same (the handshake
	// compares it).
	Shapes [][]Shape
}

// Shape is one tensor of a bucket viewed as a Rows×Cols row-major matrix
// (Config.Shapes).
type Shape struct{ Rows, Cols int }

// maxTensors bounds the tensors Config.Shapes may give, over every bucket.
const maxTensors = 1 << 24

// Phase is one stage of a Config.Schedule: Steps steps compressed with
// Spec.
type Phase struct {
	Steps int
	Spec  string
}

// ParseSchedule reads a schedule written STEPS@SPEC[,STEPS@SPEC...], e.g.
// "100@topk:0.25,100@topk:0.0625"; "" is no schedule.
func ParseSchedule(s string) ([]Phase, error) {
	if s == "" {
		return nil, nil
	}
	var out []Phase
	for i, item := range strings.Split(s, ",") {
		steps, spec, ok := strings.Cut(item, "@")
		n, err := strconv.Atoi(steps)
		if !ok || err != nil || n < 1 || spec == "" {
			return nil, fmt.Errorf("overlap: schedule %q: phase %d (%q) is not STEPS@SPEC with STEPS ≥ 1", s, i, item)
		}
		out = append(out, Phase{Steps: n, Spec: spec})
	}
	return out, nil
}

// FormatSchedule writes phases as ParseSchedule reads them.
func FormatSchedule(phases []Phase) string {
	parts := make([]string, len(phases))
	for i, p := range phases {
		parts[i] = strconv.Itoa(p.Steps) + "@" + p.Spec
	}
	return strings.Join(parts, ",")
}

// RandomKMinRatio is the least random-k ratio this project measured to
// keep accuracy: on the digits MLP (4 ranks, 10 epochs, error feedback,
// compression pinned on; scripts/digits-momentum.py's setup) random-k
// 0.25 matched the dense all-reduce while 0.1 and 0.05 lost 2–3 points
// and 0.01 6 (random-k sends its values unscaled, so each step moves the
// model by about the ratio's share of the gradient). Below it the engine
// says so in every bucket's BucketStats.Reason; it still runs.
const RandomKMinRatio = 0.25

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 60 * time.Second

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
	advice     string              // a caution about the configuration (RandomKMinRatio), or ""
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

// phase is a schedule phase as the core runs it: steps numbered below end
// use comp, whose memories' compressors are mem1 and mem2.
type phase struct {
	end        uint64
	spec       string // canonical
	comp       compress.Compressor
	mem1, mem2 compress.Compressor
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

	readyAt, doneAt time.Time // Ready's call, the end of decode (verification's measure)
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

// withDefaults is cfg with the defaults of Timeout and Workers filled in.
func withDefaults(cfg Config) Config {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	return cfg
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

// configurePhases builds the Schedule's phases, then target's: each a
// compressor of the target's strategy, no lossless stage.
func (c *core) configurePhases(target compress.Compressor, strategyFor func(Strategy, compress.Codec, int) (Strategy, error)) error {
	if len(c.cfg.Schedule) == 0 {
		return nil
	}
	end := uint64(c.cfg.Warmup)
	for i, p := range c.cfg.Schedule {
		comp, err := compress.Parse(p.Spec, compress.WithWorkers(c.cfg.Workers))
		if err != nil {
			return fmt.Errorf("schedule phase %d: %w", i, err)
		}
		st, err := strategyFor(c.cfg.Strategy, comp.Codec(), c.size)
		switch {
		case err != nil:
			return fmt.Errorf("schedule phase %d (%s): %w", i, comp.Spec(), err)
		case comp.Codec() == compress.CodecNone || comp.Spec().Lossless != compress.LosslessNone:
			return fmt.Errorf("schedule phase %d (%s): a phase compresses, without a lossless stage", i, comp.Spec())
		case st != c.strategy:
			return fmt.Errorf("schedule phase %d (%s) takes strategy %v, Spec %s takes %v: a schedule keeps one strategy", i, comp.Spec(), st, target.Spec(), c.strategy)
		}
		end += uint64(p.Steps)
		mem1, mem2 := c.memories(comp)
		c.phases = append(c.phases, phase{end: end, spec: comp.Spec().String(), comp: comp, mem1: mem1, mem2: mem2})
	}
	mem1, mem2 := c.memories(target)
	c.phases = append(c.phases, phase{end: math.MaxUint64, spec: target.Spec().String(), comp: target, mem1: mem1, mem2: mem2})
	for i := range len(c.phases) - 1 {
		a, b := c.phases[i].comp.Spec(), c.phases[i+1].comp.Spec()
		fa, la := strength(a)
		fb, lb := strength(b)
		switch {
		case fa != fb:
			return fmt.Errorf("schedule phase %d (%s) and the next (%s) are of different kinds of codec: a warm-up leads to Spec %s by milder settings of its kind", i, a, b, target.Spec())
		case la > lb:
			return fmt.Errorf("schedule phase %d (%s) compresses more than the next (%s): a warm-up leads from milder settings to Spec %s", i, a, b, target.Spec())
		}
	}
	return nil
}

// strength places a compressing spec on the scale a warm-up climbs: its
// kind (top-k, random-k, the quantizers with sign, fp16/bf16) and, within
// the kind, how much it compresses (the inverse ratio, or 32 over the
// bits per element).
func strength(s compress.Spec) (kind compress.Codec, level float64) {
	switch s.Codec {
	case compress.CodecTopK, compress.CodecRandomK:
		return s.Codec, 1 / s.Ratio
	case compress.CodecInt8:
		return compress.CodecInt8, 4
	case compress.CodecInt4:
		return compress.CodecInt8, 8
	case compress.CodecInt2:
		return compress.CodecInt8, 16
	case compress.CodecSign:
		return compress.CodecInt8, 32
	}
	return compress.CodecFP16, 2 // fp16, bf16
}

// activate makes phase p the one comp, mem1 and mem2 are of, and moves
// the backend to it.
func (c *core) activate(p int) {
	ph := c.phases[p]
	c.comp, c.mem1, c.mem2, c.active = ph.comp, ph.mem1, ph.mem2, p
	c.be.usePhase()
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

// phaseAt returns the phase of step num (warm-up steps: the first).
func (c *core) phaseAt(num uint64) int {
	for i, p := range c.phases {
		if num < p.end {
			return i
		}
	}
	return len(c.phases) - 1
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
			b.compressed, b.reason = true, "pinned: compressed"
		}
	case DecideDense:
		for _, b := range c.buckets {
			b.reason = "pinned: dense"
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
		if path {
			if err := c.be.prepare(b); err != nil {
				cancel()
				return &StepError{Step: st.num, Bucket: i, Stage: "prepare", Err: err}
			}
		}
		st.runs[i] = &run{b: b, compressed: path && !flush, flush: flush, key: compress.Key{Bucket: uint64(i), Step: st.num},
			stats: BucketStats{Bucket: i, Elements: b.n, Strategy: c.strategy, Reason: b.reason, Trial: trial, Guarded: flush,
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
		if fatal == nil && nf == nil {
			c.guardStep(st)
		}
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

// guardStep updates the accuracy guard after a step that succeeded: a
// bucket flushed is done with it, a compressed one whose ρ passed
// Config.Guard on some rank flushes next time. Every rank sees the same
// outcomes and ρ, so they decide alike.
func (c *core) guardStep(st *step) {
	if c.cfg.Guard == 0 {
		return
	}
	for _, r := range st.runs {
		switch {
		case r.flush && r.outcome == pathDense && !r.nonFinite:
			r.b.guard = ""
		case r.outcome == pathCompressed && r.heldBack > c.cfg.Guard:
			r.b.guard = fmt.Sprintf("step %d held back ‖e‖ = %.3g·‖g‖ > %g", st.num, r.heldBack, c.cfg.Guard)
			r.stats.Reason += "; accuracy guard: " + r.b.guard + ", the next compressed step flushes"
		}
	}
}

// The bytes one rank sends in each collective, by the usual ring and
// pairwise algorithms (NCCL's accounting): an all-reduce of S bytes
// 2(N−1)/N·S, an all-gather of s bytes per rank (N−1)·s, an all-to-all of
// S bytes per rank (N−1)/N·S.
func allReduceVolume(n, bytes int) int64 { return int64(2 * (n - 1) * bytes / n) }
func allGatherVolume(n, bytes int) int64 { return int64((n - 1) * bytes) }
func allToAllVolume(n, bytes int) int64  { return int64((n - 1) * bytes / n) }

// checkConfig checks what every backend requires of cfg and of the bucket
// sizes on ranks ranks.
func checkConfig(cfg Config, sizes []int, ranks int) error {
	switch {
	case cfg.Timeout < 0:
		return fmt.Errorf("Timeout %v is negative", cfg.Timeout)
	case cfg.Workers < 0:
		return fmt.Errorf("Workers %d is negative", cfg.Workers)
	case cfg.Warmup < 0:
		return fmt.Errorf("Warmup %d is negative", cfg.Warmup)
	case !(cfg.Momentum >= 0 && cfg.Momentum < 1):
		return fmt.Errorf("Momentum %v is not in [0, 1)", cfg.Momentum)
	case cfg.MomentumMasking && cfg.Momentum == 0:
		return fmt.Errorf("MomentumMasking needs Momentum: without momentum correction there is nothing to mask")
	case !(cfg.Guard >= 0 && cfg.Guard <= math.MaxFloat32):
		return fmt.Errorf("Guard %v is not a finite threshold ≥ 0", cfg.Guard)
	case cfg.Guard > 0 && !cfg.ErrorFeedback:
		return fmt.Errorf("Guard %v needs ErrorFeedback: without it nothing is held back", cfg.Guard)
	case cfg.Decision < DecideAuto || cfg.Decision > DecideDense:
		return fmt.Errorf("unknown Decision %v", cfg.Decision)
	case cfg.NodeSpec != "" && cfg.Strategy != StrategyHier && cfg.Strategy != StrategyAuto:
		return fmt.Errorf("NodeSpec %q is the codec of strategy hier's node stages, not of strategy %v", cfg.NodeSpec, cfg.Strategy)
	case len(sizes) == 0:
		return fmt.Errorf("no buckets")
	case int64(len(sizes)) > math.MaxUint32 || ranks > math.MaxUint16:
		return fmt.Errorf("%d buckets on %d ranks: at most %d buckets and %d ranks", len(sizes), ranks, uint64(math.MaxUint32), math.MaxUint16)
	}
	for i, n := range sizes {
		if n < 1 || int64(n) > compress.MaxElements {
			return fmt.Errorf("bucket %d has %d elements, want 1 to %d", i, n, uint64(compress.MaxElements))
		}
	}
	if err := checkShapes(cfg.Shapes, sizes); err != nil {
		return err
	}
	for i, p := range cfg.Schedule {
		if p.Steps < 1 {
			return fmt.Errorf("schedule phase %d (%s) has %d steps, want at least 1", i, p.Spec, p.Steps)
		}
	}
	if _, err := nodeCodec(cfg.NodeSpec); err != nil {
		return err
	}
	return nil
}

// checkShapes checks Config.Shapes against the bucket sizes: one list per
// bucket, positive sides, and tensors that add up to the bucket.
func checkShapes(shapes [][]Shape, sizes []int) error {
	if shapes == nil {
		return nil
	}
	if len(shapes) != len(sizes) {
		return fmt.Errorf("Shapes has %d buckets, the engine %d", len(shapes), len(sizes))
	}
	tensors := 0
	for i, ts := range shapes {
		if tensors += len(ts); tensors > maxTensors {
			return fmt.Errorf("Shapes gives more than %d tensors", maxTensors)
		}
		total := int64(0)
		for j, s := range ts {
			if s.Rows < 1 || s.Cols < 1 || int64(s.Rows) > compress.MaxElements || int64(s.Cols) > compress.MaxElements {
				return fmt.Errorf("bucket %d, tensor %d: shape %d×%d, want positive sides", i, j, s.Rows, s.Cols)
			}
			if total += int64(s.Rows) * int64(s.Cols); total > int64(sizes[i]) {
				return fmt.Errorf("bucket %d: its tensors 0 to %d already hold %d elements, the bucket %d", i, j, total, sizes[i])
			}
		}
		if total != int64(sizes[i]) {
			return fmt.Errorf("bucket %d: its %d tensors hold %d elements, the bucket %d", i, len(ts), total, sizes[i])
		}
	}
	return nil
}

// shapesName is bucket i's shapes as the handshake compares them.
func shapesName(shapes [][]Shape, i int) string {
	if shapes == nil {
		return "none"
	}
	parts := make([]string, len(shapes[i]))
	for j, s := range shapes[i] {
		parts[j] = strconv.Itoa(s.Rows) + "x" + strconv.Itoa(s.Cols)
	}
	return strings.Join(parts, ",")
}

// nodeCodec is the compressor of the node stages NodeSpec names (nil for
// float32).
func nodeCodec(spec string) (compress.Compressor, error) {
	if spec == "" {
		return nil, nil
	}
	c, err := compress.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("NodeSpec: %w", err)
	}
	switch c.Codec() {
	case compress.CodecNone:
		return nil, nil
	case compress.CodecBF16, compress.CodecFP16, compress.CodecInt8:
		if c.Spec().Lossless == compress.LosslessNone {
			return c, nil
		}
	}
	return nil, fmt.Errorf("NodeSpec %q: want bf16, fp16 or int8 (options allowed, no lossless stage)", spec)
}
