package overlap

import (
	"fmt"

	"github.com/gradcomp/gradcomp/compress"
)

// Strategy is how a compressed bucket crosses the wire (docs/DESIGN.md,
// "Strategies"; the package doc gives each one's exact result).
type Strategy int

// The strategies.
const (
	// StrategyAuto picks from the codec: none, fp16, bf16 → StrategyDense;
	// randomk → StrategySharedIndex; topk (chunk= and bits= included: its
	// payload's size is fixed by n too) → StrategySparseGather;
	// powersgd → StrategyLowRank; int8, int4, int2, sign →
	// StrategyQuantSRA, or StrategyQuantAllGather with two ranks or fewer (the same volume in one collective, without the
	// second quantization). On a comm that places the ranks on two nodes
	// or more of two ranks or more (comm.Topologist, comm.Splitter), New
	// then times a few steps of that flat strategy and of StrategyHier and
	// keeps StrategyHier where it is more than 10% faster (shape.go);
	// Strategy says which. A state saved by one loads only into the same
	// shape: to resume, configure the strategy the state records
	// (InspectState) rather than auto.
	StrategyAuto Strategy = iota
	// StrategyDense is the fp32 all-reduce (codec none) or, for fp16 and
	// bf16, the SRA path with a 16-bit wire (comm has no 16-bit reduction).
	StrategyDense
	// StrategySharedIndex all-reduces the k random-k values, whose indices
	// every rank derives from (seed, step, bucket). Codec randomk only.
	StrategySharedIndex
	// StrategySparseGather all-gathers fixed-size payloads and decodes and
	// adds each one. Meant for topk; any codec works.
	StrategySparseGather
	// StrategyQuantSRA is scatter-reduce-allgather: an all-to-all of
	// quantized chunks, a sum per chunk on its owner, re-quantization with a
	// second error-feedback memory, and an all-gather. Meant for
	// int8/int4/int2/sign; any codec works.
	StrategyQuantSRA
	// StrategyQuantAllGather all-gathers whole quantized payloads (the
	// mechanism of StrategySparseGather; cheaper than SRA for small N).
	StrategyQuantAllGather
	// StrategyHier is the hierarchical exchange over a comm that knows its
	// nodes (comm.Topologist, comm.Splitter). Top-k, random-k and
	// powersgd keep their flat strategy over two-level collectives (each
	// payload crosses between nodes once per node; powersgd's
	// all-reduces are a reduce-scatter in the node, an all-reduce
	// across nodes, an all-gather in the node). Every other codec is
	// sharded: a float32 reduce-scatter of the bucket among the ranks of
	// each node, then each rank's shard (a node's average over 1/L of
	// the bucket, L ranks per node) exchanged across nodes, with the
	// ranks of the same local rank, by an engine of its own with the
	// configured codec and the strategy StrategyAuto picks for it on that
	// many nodes (dense for codec none), then an all-gather among the
	// ranks of each node; compression, error feedback and momentum apply
	// to the shards. See hier.go.
	StrategyHier
	// StrategyLowRank is PowerSGD (spec powersgd:R): each tensor of a
	// bucket (Config.Shapes) that is worth it is approximated by P·Qᵀ of
	// rank R; one all-reduce sums every P of the bucket together with
	// the bucket's other tensors, uncompressed; P is orthogonalized; a
	// second all-reduce sums every Q = Mᵀ·P. Codec powersgd only. See
	// lowrank.go.
	StrategyLowRank
)

var strategyNames = [...]string{
	StrategyAuto: "auto", StrategyDense: "dense", StrategySharedIndex: "shared-index",
	StrategySparseGather: "sparse-gather", StrategyQuantSRA: "sra", StrategyQuantAllGather: "allgather",
	StrategyHier: "hier", StrategyLowRank: "low-rank",
}

// String returns the name ParseStrategy accepts, or "Strategy(N)".
func (s Strategy) String() string { return enumString(strategyNames[:], s, "Strategy") }

// ParseStrategy returns the strategy named s: auto, dense, shared-index,
// sparse-gather, sra, allgather, hier or low-rank.
func ParseStrategy(s string) (Strategy, error) {
	return enumParse[Strategy](strategyNames[:], s, "strategy")
}

// Strategies returns every strategy, StrategyAuto first, in value order:
// their names are the canonical list of the strategies' names.
func Strategies() []Strategy { return enumValues[Strategy](strategyNames[:]) }

// resolve returns the strategy Auto stands for with codec c on size ranks,
// or checks that s can carry c.
func resolve(s Strategy, c compress.Codec, size int) (Strategy, error) {
	dense := c == compress.CodecNone || c == compress.CodecFP16 || c == compress.CodecBF16
	switch s {
	case StrategyAuto:
		switch {
		case dense:
			return StrategyDense, nil
		case c == compress.CodecRandomK:
			return StrategySharedIndex, nil
		case c == compress.CodecPowerSGD:
			return StrategyLowRank, nil
		case c == compress.CodecTopK:
			return StrategySparseGather, nil
		case size <= 2:
			return StrategyQuantAllGather, nil
		}
		return StrategyQuantSRA, nil
	case StrategyDense:
		if !dense {
			return 0, fmt.Errorf("overlap: strategy dense carries codecs none, fp16 and bf16, not %s", c)
		}
	case StrategySharedIndex:
		if c != compress.CodecRandomK {
			return 0, fmt.Errorf("overlap: strategy shared-index needs indices shared by every rank: codec randomk, not %s", c)
		}
	case StrategyHier:
		// Every codec: the engine across nodes resolves its own
		// strategy, or the flat one runs over two-level collectives.
	case StrategyLowRank:
		if c != compress.CodecPowerSGD {
			return 0, fmt.Errorf("overlap: strategy low-rank carries codec powersgd, not %s", c)
		}
	case StrategySparseGather, StrategyQuantSRA, StrategyQuantAllGather:
		switch c {
		case compress.CodecNone:
			return 0, fmt.Errorf("overlap: codec none is exchanged by the dense all-reduce, not strategy %v", s)
		case compress.CodecPowerSGD:
			return 0, fmt.Errorf("overlap: codec powersgd is exchanged by strategy low-rank, not %v", s)
		}
	default:
		return 0, fmt.Errorf("overlap: unknown strategy %v", s)
	}
	return s, nil
}

// mechanism returns the exchange that runs strategy s (resolved) for
// codec c on size ranks, the same on every backend: s itself, but
// StrategyDense with a 16-bit codec runs SRA with a 16-bit wire, and
// StrategyHier runs twoLevelMech's.
func mechanism(s Strategy, c compress.Codec, size int) Strategy {
	switch {
	case s == StrategyDense && c != compress.CodecNone:
		return StrategyQuantSRA
	case s == StrategyHier:
		return twoLevelMech(c, size)
	}
	return s
}

// Decision says, per bucket, who chooses between the compressed path and
// the dense fp32 all-reduce.
type Decision int

// The decisions.
const (
	DecideAuto       Decision = iota // the cost model at New, then verified online by timing both paths (verify.go)
	DecideCompressed                 // always the compressed path (pinned)
	DecideDense                      // always dense (pinned)
)

var decisionNames = [...]string{DecideAuto: "auto", DecideCompressed: "compressed", DecideDense: "dense"}

// String returns the name ParseDecision accepts, or "Decision(N)".
func (d Decision) String() string { return enumString(decisionNames[:], d, "Decision") }

// ParseDecision returns the decision named s: auto, compressed or dense.
func ParseDecision(s string) (Decision, error) {
	return enumParse[Decision](decisionNames[:], s, "decision")
}

// Decisions returns every decision, DecideAuto first, in value order.
func Decisions() []Decision { return enumValues[Decision](decisionNames[:]) }
