package overlap

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"time"

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
	// delivered, u is zeroed at the coordinates it sent. Top-k with bits=
	// (quantized values) is refused with it. Off by default:
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
	// BucketStats.HeldBack, Guarded and Guard report it and Reason says
	// why.
	// Each codec's ρ settles at a level of its own (the README's accuracy
	// section gives measured ones): set Guard above that level, to catch
	// a memory that keeps growing.
	Guard float64
	// FeedbackDecay is β, the factor error-feedback memory decays by
	// (SparseLoCo's error feedback: e ← β·e + g; c ← C(e); e ← e − D(c)):
	// 0 means 1, no decay (the zero Config is unchanged); valid
	// values are (0, 1], and a β other than 1 needs ErrorFeedback. Every
	// step that leaves a compressed bucket's memory holding the residual
	// of its payload multiplies that residual by β: with s = e + g (after
	// momentum correction: e + u), the memory becomes
	// e' = β·(s − D(C(s))), each element float32(β)·v, one float32
	// product rounded to nearest even (kernels.ScaleStep; β itself is
	// rounded to float32 once, and a β that rounds to 0 is refused), the
	// same bits on both backends. It is the formulation above with the
	// decay of a step moved to its end: a memory e' after this step is
	// the decayed β·e of the next one's. Which memories: the rank's own
	// first memory (stage 1 of every strategy; PowerSGD's residual
	// M − P̂·Qᵀ); under StrategyHier's sharded shape, the engine across
	// nodes' first memory of this rank's shard; not SRA's second memory
	// (its memory of the re-encoded average, one quantization's error,
	// which no rank's stale gradient enters), not PowerSGD's warm start Q
	// and not momentum correction's velocity u (m is its decay). The
	// memory is left as it was, undecayed, wherever a step does not
	// commit a residual: dense steps (Decision, verification's dense
	// trials, a codec that goes dense, a dense fallback of a non-finite
	// or unrepresentable value), warm-up steps, a skipped step
	// (FailOnNonFinite: every memory untouched) and a failed step
	// (Engine keeps e + g, DeviceEngine e, neither decayed). A flush of
	// the accuracy guard empties the memory (0, decayed or not). Guard's
	// ρ measures the residual before the decay. Both backends; part of
	// the handshake and of the state (a state of another β is refused;
	// one older than format version 6 is of β = 1).
	FeedbackDecay float64
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

// RandomKMinRatio is the least random-k ratio this project measured to
// keep accuracy: on the digits MLP (4 ranks, 10 epochs, error feedback,
// compression pinned on; scripts/digits-momentum.py's setup) random-k
// 0.25 matched the dense all-reduce while 0.1 and 0.05 lost 2–3 points
// and 0.01 6 (random-k sends its values unscaled, so each step moves the
// model by about the ratio's share of the gradient). Below it the engine
// says so in every bucket's BucketStats (Caution CautionRandomKRatio,
// and Reason); it still runs.
const RandomKMinRatio = 0.25

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 60 * time.Second

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

// decay is FeedbackDecay's β: 1 for 0 (no decay).
func (cfg Config) decay() float64 {
	if cfg.FeedbackDecay == 0 {
		return 1
	}
	return cfg.FeedbackDecay
}

// decaying reports whether error-feedback memory decays (β ≠ 1), and by
// what factor in float32.
func (cfg Config) decaying() (float32, bool) {
	b := cfg.decay()
	return float32(b), b != 1
}

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
	case !(cfg.FeedbackDecay >= 0 && cfg.FeedbackDecay <= 1):
		return fmt.Errorf("FeedbackDecay %v is not in (0, 1] (0 means 1: no decay)", cfg.FeedbackDecay)
	case cfg.FeedbackDecay > 0 && float32(cfg.FeedbackDecay) == 0:
		return fmt.Errorf("FeedbackDecay %v rounds to 0 as a float32: the memory would be dropped every step (turn ErrorFeedback off for that)", cfg.FeedbackDecay)
	case cfg.decay() != 1 && !cfg.ErrorFeedback:
		return fmt.Errorf("FeedbackDecay %v needs ErrorFeedback: without it there is no memory to decay", cfg.FeedbackDecay)
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
