package overlap

import "time"

// BucketStats describes one bucket in one step, on this rank.
type BucketStats struct {
	Bucket   int
	Elements int
	Strategy Strategy // the engine's strategy (StrategyAuto resolved)
	// Compressed is true when the bucket crossed the wire compressed this
	// step; false when it went dense (decided so, or a fallback).
	Compressed bool
	// Reason gives the decision and its inputs (the cost model's
	// predictions, or "pinned"), then what happened this step if the bucket
	// fell back to dense or was not exchanged (who had a NaN, where). It is
	// written for people: Origin, Caution, Guard and the other fields say
	// the same for programs.
	Reason string
	// BytesSent is what this rank put on the wire for the bucket, by the
	// accounting of the package doc (2(N−1)/N·S for an all-reduce of S
	// bytes, (N−1)·s for an all-gather of s bytes per rank, (N−1)/N·S for
	// an all-to-all of S bytes).
	BytesSent int64
	// BytesInNode is the part of BytesSent that stays inside the node:
	// StrategyHier's node stages; 0 for the flat strategies, whose every
	// byte may cross between nodes.
	BytesInNode int64
	// Time in each stage: compressing (SRA: both quantizations), in
	// collectives, decoding and averaging (SRA: the owner's sum too).
	Compress, Exchange, Decompress time.Duration
	// The cost model's predictions for the bucket (zero unless DecideAuto).
	PredictedDense, PredictedCompressed time.Duration
	// Verification's measurements (DecideAuto): per path, the slowest
	// rank's smallest time the bucket added to a step in the latest
	// verification window (from the later of its Ready and the previous
	// bucket's end to its own end of decode); zero until a window ends.
	// The decision itself compares whole steps (see the package doc).
	MeasuredDense, MeasuredCompressed time.Duration
	// Trial is true when this step ran the buckets in verification's
	// alternative configuration, to measure it (DecideAuto).
	Trial bool
	// Switched is true when the verification window that ended with this
	// step changed the decisions (Reason gives the new one).
	Switched bool
	// NonFinite is true when some rank's gradient held NaN or Inf (or the
	// average overflowed) this step.
	NonFinite bool
	// HeldBack is the accuracy guard's measure (Config.Guard) of a bucket
	// that went compressed: the largest over the ranks of ‖e‖/‖g‖, the
	// norm of what error feedback holds back after the step against the
	// norm of the step's gradient; 0 without the guard.
	HeldBack float64
	// Guarded is true when the accuracy guard sent the bucket dense with
	// its residual this step (a flush, which empties the memory).
	Guarded bool
	// Guard is the accuracy guard's state of the bucket after the step:
	// GuardTripped when HeldBack passed GuardThreshold (the next compressed
	// step flushes), GuardPending while a flush waits, GuardOff without the
	// guard.
	Guard GuardState
	// GuardThreshold is Config.Guard, the bound the guard compares
	// HeldBack with (0: no guard).
	GuardThreshold float64
	// Origin is what chose the bucket's path this step: its decision
	// (pinned, the cost model's, verification's) or what overrode it
	// (warm-up, a trial, the guard, a fallback).
	Origin Origin
	// Caution warns about the configuration (CautionNone: nothing to say).
	Caution Caution
	// Delegated is true when the caller all-reduced the bucket itself
	// (Engine.Delegate, DeviceEngine.Delegate); BytesSent is then a ring
	// all-reduce's, Exchange and NonFinite are not measured (nor, on the
	// device, Compress and Decompress).
	Delegated bool
}

// StepStats describes one step on this rank.
type StepStats struct {
	Step          uint64
	Buckets       []BucketStats
	BytesSent     int64         // sum over buckets
	Total         time.Duration // Step() to Wait()'s return
	ExchangeTotal time.Duration // sum of the buckets' Exchange
	// Exposed is the communication not hidden behind the caller's work:
	// the time Wait spent blocked.
	Exposed time.Duration
}
