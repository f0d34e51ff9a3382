package overlap

// The verdicts behind a bucket's path in a step, as BucketStats carries
// them: who chose the path (Origin), the configuration's caution
// (Caution) and the accuracy guard's state (GuardState). Reason says the
// same for people; these are what a program reads.

// Origin says what chose a bucket's path in a step (BucketStats.Origin),
// the same on every rank.
type Origin int

// The origins. A step takes the path of the bucket's decision
// (OriginCodec, OriginPinned, OriginCostModel, OriginVerification) unless
// warm-up, a verification trial, the accuracy guard or a fallback
// overrides it (each of those over the ones before it).
const (
	// OriginCodec: codec none has no compressed path; the dense
	// all-reduce is the only one.
	OriginCodec Origin = iota
	// OriginPinned: Config.Decision pinned the path (DecideCompressed,
	// DecideDense).
	OriginPinned
	// OriginCostModel: DecideAuto's cost model chose it at New, and no
	// verification window has ended since.
	OriginCostModel
	// OriginVerification: DecideAuto's latest verification window chose
	// it (kept or switched the decision; BucketStats.Switched says which).
	OriginVerification
	// OriginWarmup: a warm-up step (Config.Warmup) sent the bucket, decided
	// compressed, dense.
	OriginWarmup
	// OriginTrial: a verification trial step ran the alternative
	// configuration to time it (BucketStats.Trial).
	OriginTrial
	// OriginGuard: the accuracy guard sent the bucket dense with its
	// residual (BucketStats.Guarded), after a step that tripped it.
	OriginGuard
	// OriginFallback: the step did not take the path chosen for it: a
	// rank's payload could not carry the bucket (NaN or Inf, or a value
	// the codec cannot hold) and it went dense instead of compressed, or
	// a NaN or Inf skipped it (Config.FailOnNonFinite).
	OriginFallback
)

var originNames = [...]string{
	OriginCodec: "codec", OriginPinned: "pinned", OriginCostModel: "cost-model", OriginVerification: "verification",
	OriginWarmup: "warm-up", OriginTrial: "trial", OriginGuard: "guard", OriginFallback: "fallback",
}

// String returns the origin's name ("cost-model", ...), or "Origin(N)".
func (o Origin) String() string { return enumString(originNames[:], o, "Origin") }

// Origins returns every origin, in value order.
func Origins() []Origin { return enumValues[Origin](originNames[:]) }

// Caution is a warning about the engine's configuration, the same for
// every bucket and step (BucketStats.Caution): it runs, but accuracy or
// speed is likely to suffer.
type Caution int

// The cautions.
const (
	// CautionNone: nothing to warn about.
	CautionNone Caution = iota
	// CautionRandomKRatio: random-k keeps fewer than RandomKMinRatio of
	// each bucket, unscaled; accuracy at the same step budget suffers.
	CautionRandomKRatio
)

var cautionNames = [...]string{CautionNone: "none", CautionRandomKRatio: "random-k-ratio"}

// String returns the caution's name ("random-k-ratio", ...), or
// "Caution(N)".
func (c Caution) String() string { return enumString(cautionNames[:], c, "Caution") }

// Cautions returns every caution, CautionNone first, in value order.
func Cautions() []Caution { return enumValues[Caution](cautionNames[:]) }

// GuardState is the accuracy guard's state of a bucket after a step
// (Config.Guard; BucketStats.Guard), the same on every rank.
type GuardState int

// The guard states.
const (
	// GuardOff: the engine has no accuracy guard (Config.Guard 0).
	GuardOff GuardState = iota
	// GuardClear: no flush is pending (HeldBack stayed within
	// Config.Guard, or a flush emptied the memory).
	GuardClear
	// GuardTripped: this step's HeldBack passed Config.Guard: the
	// bucket's next compressed step flushes.
	GuardTripped
	// GuardPending: a flush is pending from an earlier step (or a loaded
	// state) and this step did not carry it out (it did not take the
	// compressed path, or the flush met a NaN).
	GuardPending
)

var guardNames = [...]string{GuardOff: "off", GuardClear: "clear", GuardTripped: "tripped", GuardPending: "pending"}

// String returns the state's name ("tripped", ...), or "GuardState(N)".
func (g GuardState) String() string { return enumString(guardNames[:], g, "GuardState") }

// GuardStates returns every guard state, GuardOff first, in value order.
func GuardStates() []GuardState { return enumValues[GuardState](guardNames[:]) }
